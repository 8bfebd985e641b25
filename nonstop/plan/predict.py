"""One prediction: a model, a chip, a layout, a batch and context, optionally speculative decoding.

rows per sequence  = K + 1 (K drafts verified with the current token; 1 without speculation)
tokens per step    = A (mean accepted length incl. the bonus token; 1 without speculation)
ms per token       = T_step / A            (what one user waits per generated token)
tokens/s per user  = 1000 · A / T_step;    in total = batch · tokens/s per user

With the requests' lengths (``Requests``: I prompt and O generated tokens each) also the prefill of one
prompt, the same time model over one sequence of I rows at mean context I / 2 (its causal attention):

    P = T_step(rows = I, sequences = 1, context = I / 2)     time to first token of a request served alone

(the LM head and its logits gather for the last prompt row only: the engine samples the first token from
it and computes no other prompt logits unless prompt log-probabilities are asked for)

and, in an aggregated server (prefill and decode on the same chips) under a serving benchmark at
concurrency c whose requests share their lengths, what the requests' prefills cost each other. Such a
benchmark runs in waves: c requests start together, finish together and are replaced together, and each
of the D attention groups prefills its n = c / D newcomers one after another (the groups in parallel)
while the ones already prefilled wait in the lockstep decode. The k-th of a wave gets its first token
after k prefills and then waits for the n - k after it:

    mean time to first token = (n + 1) / 2 · P      (SGLang's B300 cells: 3.5 s at c16, 11.6 s at c64)
    stall per token          = (n - 1) / 2 · P / (O - 1)     reported apart, not in ms per token
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path

from nonstop.plan.chips import EXECUTORS, Chip
from nonstop.plan.draft import draft_shape, eager_draft_ops
from nonstop.plan.layout import (
    Layout,
    check_layout,
    collectives,
    rank_ops,
    rank_workload,
    resident_bytes,
    stage_sends,
)
from nonstop.plan.timing import Constants, StepTime, step_time
from nonstop.plan.workload import FORMAT_BYTES, PlanError, Workload, cfg_json
from nonstop.program.preflight import size_text

USABLE_HBM = 0.92  # of HBM left for weights, KV/KDA state and cache (runtime context, activations, comm buffers)


DEFAULT_CONTEXT = 4096  # cached tokens per sequence unless given (capped at the model's positions)


def default_context(cfg) -> int:
    """The context a plan assumes when none is given: 4096 cached tokens, or the model's positions if fewer."""
    return min(DEFAULT_CONTEXT, cfg.max_position_embeddings)


def check_positions(workload: Workload, longest: int) -> None:
    """Refuse a sequence of ``longest`` tokens beyond the model's position limit (``max_position_embeddings``):
    its rotary tables and trained context end there, so a plan for it would describe a model that cannot run."""
    limit = workload.cfg.max_position_embeddings
    if longest > limit:
        raise PlanError(
            f"a sequence of {longest:,} tokens exceeds {workload.name}'s {limit:,} positions "
            "(max_position_embeddings); give a shorter --context or --input-len + --output-len"
        )


@dataclass(frozen=True)
class Spec:
    accept: float  # mean accepted length per step, incl. the bonus token (1 <= A <= K + 1)
    drafts: int  # K tokens drafted per step

    def __post_init__(self):
        if self.drafts < 1:
            raise PlanError(f"--spec-draft must be >= 1, got {self.drafts}")
        if not 1.0 <= self.accept <= self.drafts + 1:
            raise PlanError(
                f"--spec-accept must lie in [1, spec-draft + 1] = [1, {self.drafts + 1}], got {self.accept}"
            )


@dataclass(frozen=True)
class Requests:
    """A serving workload's requests: ``input_len`` prompt tokens and ``output_len`` generated tokens each."""

    input_len: int
    output_len: int

    def __post_init__(self):
        if self.input_len < 1 or self.output_len < 1:
            raise PlanError(f"--input-len and --output-len must be >= 1, got {self.input_len} and {self.output_len}")

    @property
    def context(self) -> int:
        """Mean cached tokens over a request's decode steps (what the step time is costed at)."""
        return self.input_len + self.output_len // 2

    @property
    def peak(self) -> int:
        """Cached tokens at a request's last step: what its cache must hold (the requests of a batch start and
        end together, so every sequence reaches it at once)."""
        return self.input_len + self.output_len


@dataclass
class Prediction:
    workload: Workload
    chip: Chip
    layout: Layout
    batch: int
    context: int
    spec: Spec | None
    executor: str
    time: StepTime
    resident: dict  # bytes per rank: weights, state, cache (+ draft); with pipeline stages, the fullest one
    requests: Requests | None = None
    prefill: StepTime | None = None  # one request's prompt in one step (with ``requests``)

    @property
    def chips(self) -> float:
        return self.layout.world / self.chip.devices_per_chip

    @property
    def tokens_per_step(self) -> float:
        return self.spec.accept if self.spec else 1.0

    @property
    def ms_per_token(self) -> float:
        return self.time.total_ms / self.tokens_per_step

    @property
    def tokens_per_s_per_user(self) -> float:
        return 1e3 / self.ms_per_token

    @property
    def tokens_per_s_total(self) -> float:
        return self.batch * self.tokens_per_s_per_user

    @property
    def prefill_ms(self) -> float | None:
        """Time to first token of one request served alone: its prompt's prefill step."""
        return self.prefill.total_ms if self.prefill else None

    @property
    def wave(self) -> float:
        """Requests one attention group prefills per wave of a fixed-length serving benchmark."""
        return max(self.batch / self.layout.dp, 1.0)

    @property
    def ttft_ms(self) -> float | None:
        """Mean time to first token over a wave of ``batch`` requests that start together."""
        return None if self.prefill is None else (self.wave + 1) / 2 * self.prefill.total_ms

    @property
    def prefill_stall_ms_per_token(self) -> float | None:
        """What the wave's later prefills add per generated token, on average, in an aggregated server."""
        if self.prefill is None:
            return None
        if self.requests.output_len == 1:  # the first token is the last: nothing waits after it
            return 0.0
        return (self.wave - 1) / 2 * self.prefill.total_ms / (self.requests.output_len - 1)

    @property
    def bytes_per_rank(self) -> float:
        return sum(self.resident.values())

    @property
    def capacity_per_rank(self) -> float:
        return self.chip.rank_hbm_bytes * USABLE_HBM

    @property
    def fits(self) -> bool:
        return self.bytes_per_rank <= self.capacity_per_rank

    def resident_parts(self, sep: str) -> str:
        """What a rank holds by kind, each with its unit (``size_text``: GB, MB ...): weights, KDA state (a model
        with KDA layers only), attention cache (a model with attention layers only), the speculative drafter's
        weights and cache (with --spec-accept)."""
        r, ops = self.resident, self.workload.ops
        parts = [("weights", r["weights"])]
        if r["state"] or any(o.state_bytes_per_seq for o in ops):
            parts.append(("KDA state", r["state"]))
        if r["cache"] or any(o.cache_bytes_per_seq_ctx for o in ops):
            parts.append(("attention cache", r["cache"]))
        if "draft" in r:
            parts.append(("draft model", r["draft"]))
        return sep.join(f"{name} {size_text(b)}" for name, b in parts)

    def why_not(self) -> str:
        """Why it does not fit: what a rank needs against what it offers, in the chip's own memory (a CPU's
        RAM, an accelerator's HBM)."""
        gb = 1e9
        return (
            f"needs {self.bytes_per_rank / gb:.1f} GB per rank ({self.resident_parts(' + ')}) but a rank of "
            f"{self.chip.key} offers {self.capacity_per_rank / gb:.1f} GB ({USABLE_HBM:.0%} of "
            f"{self.chip.rank_hbm_bytes / gb:.1f} GB {self.chip.memory})"
        )

    def to_json(self) -> dict:
        t = self.time
        dpc = self.chip.devices_per_chip
        return {
            "model": self.workload.name,
            "chip": self.chip.key,
            "chips": int(self.chips) if float(self.chips).is_integer() else self.chips,
            "layout": {
                "tp": self.layout.tp,
                "dp": self.layout.dp,
                "ep": self.layout.ep,
                "pp": self.layout.pp,
                "dcp": self.layout.dcp,
                "ranks": self.layout.world,
                "devices_per_chip": dpc,
            },
            "precision": self.workload.precision.__dict__,
            "executor": self.executor,
            "batch": self.batch,
            "context": self.context,
            "spec": None
            if self.spec is None
            else {"accept": self.spec.accept, "drafts": self.spec.drafts, "verify_rows": self.spec.drafts + 1},
            "step_ms": t.total_ms,
            "ms_per_token": self.ms_per_token,
            "tokens_per_s_per_user": self.tokens_per_s_per_user,
            "tokens_per_s_total": self.tokens_per_s_total,
            "tokens_per_s_per_chip": self.tokens_per_s_total / self.chips,
            "fits": self.fits,
            "bytes_per_chip": self.bytes_per_rank * dpc,
            "bytes_per_chip_detail": {k: v * dpc for k, v in self.resident.items()},
            "capacity_per_chip": self.capacity_per_rank * dpc,
            "hbm_per_chip": self.chip.hbm_bytes,  # as the driver reports it; capacity is USABLE_HBM of it
            "bound": t.bound(),
            "breakdown_ms": {
                "weights": t.weights_ms,
                "state_and_cache": t.state_ms,
                "compute": t.compute_ms,
                "expert_fetch": t.expert_fetch_ms,
                "collectives": t.collectives_ms,
                "launch": t.launch_ms,
                "host": t.host_ms,
                "draft": t.draft_ms,
            },
            "kernels_per_step": t.kernels,
            "requests": None if self.requests is None else dict(self.requests.__dict__),
            "prefill_ms": self.prefill_ms,
            "ttft_ms": self.ttft_ms,
            "prefill_stall_ms_per_token": self.prefill_stall_ms_per_token,
            "collectives": [
                {
                    "label": c.label,
                    "kind": c.kind,
                    "ranks": c.ranks,
                    "count": c.count,
                    "wire_bytes": c.wire_bytes,
                    "latency_ms": c.latency_ms,
                    "bandwidth_ms": c.bandwidth_ms,
                    "crosses_scale_out": c.crosses_scale_out,
                }
                for c in t.collectives
            ],
        }


@functools.lru_cache(maxsize=8)
def _eager_ops(cfg_text: str, rows: int = 1) -> int:
    """aten ops of one reference decode step of ``rows`` rows a sequence (the speculative verify step when
    rows > 1), counted on a narrow twin: the count does not depend on widths."""
    import torch

    from nonstop.model.build import random_model
    from nonstop.plan.workload import shapes_from_json
    from nonstop.program.count import count_decode_ops
    from nonstop.program.twin import narrow_twin

    cfg = shapes_from_json(cfg_text)
    return count_decode_ops(random_model(narrow_twin(cfg), torch.float32), rows=rows).total


def predict(
    workload: Workload,
    chip: Chip,
    layout: Layout,
    batch: int = 1,
    context: int | None = None,
    spec: Spec | None = None,
    executor: str = "kernels",
    consts: Constants | None = None,
    model_dir: Path | None = None,
    requests: Requests | None = None,
) -> Prediction:
    """The step time and resident bytes of ``batch`` sequences at ``context`` cached tokens each (default:
    ``default_context``); with ``requests``, the context is theirs and their prefill is predicted too."""
    if executor not in EXECUTORS:
        raise PlanError(f"unknown executor {executor!r}; choose one of: {', '.join(EXECUTORS)}")
    if context is None:
        context = requests.context if requests else default_context(workload.cfg)
    held = requests.peak if requests else context  # the cached tokens memory must hold
    check_positions(workload, held)
    if batch < 1 or context < 0:
        raise PlanError(f"--batch must be >= 1 and --context >= 0, got {batch} and {context}")
    check_layout(workload, layout)
    stage = layout.stage
    rank = rank_workload(workload, stage)
    consts = consts or Constants.load()
    rows_per_seq = spec.drafts + 1 if spec else 1
    # pipeline: up to pp micro-batches in flight; one user's token passes every stage of its micro-batch in
    # turn, so a token takes the whole model's time at the micro-batch's rows plus the sends between stages
    micro = min(layout.pp, math.ceil(batch / layout.dp))
    step_batch = math.ceil(batch / micro)
    group_seqs = math.ceil(step_batch / layout.dp)  # a micro-batch's sequences in one attention group
    ops = rank_ops(rank, stage, step_batch, context, rows_per_seq)
    colls = collectives(rank, stage, step_batch, rows_per_seq)
    colls += stage_sends(layout, chip.up_domain_ranks, group_seqs * rows_per_seq, workload.cfg.hidden_size * 2)
    eager = None
    if executor == "eager":
        eager = _eager_ops(cfg_json(workload.cfg), rows_per_seq)
    draft = draft_shape(workload.cfg, model_dir, spec.drafts) if spec else None
    if draft is not None and executor == "eager":  # the eager drafter: its own aten ops, not one per weight
        accepted = math.ceil(spec.accept)
        draft = dataclasses.replace(draft, kernels=eager_draft_ops(workload.cfg, model_dir, spec.drafts, accepted))
    slots = group_seqs * spec.drafts if spec else 0
    draft_cache = group_seqs * draft.context_bytes(context) / layout.tp if draft is not None else 0.0
    t = step_time(ops, colls, chip, consts, executor, eager, draft, layout, slots, draft_cache)
    busiest = layout.fullest_stage_share(workload.cfg.num_hidden_layers)
    resident = {k: v * busiest for k, v in resident_bytes(rank, stage, batch, held).items()}
    if draft is not None:  # the drafter's weights and its cache of every sequence, split like the target's heads
        seqs = math.ceil(batch / layout.dp)
        resident["draft"] = (draft.params * FORMAT_BYTES["bf16"] + seqs * draft.context_bytes(held)) / layout.tp
    prefill = None
    if requests is not None:  # one sequence of I rows at its mean causal context I / 2, logits of its last row
        n = requests.input_len
        p_colls = collectives(rank, stage, 1, n, logit_rows_per_seq=1)
        p_colls += stage_sends(layout, chip.up_domain_ranks, n, workload.cfg.hidden_size * 2)
        one_row = eager if rows_per_seq == 1 or eager is None else _eager_ops(cfg_json(workload.cfg))
        p_ops = rank_ops(rank, stage, 1, n // 2, n, logit_rows_per_seq=1)
        prefill = step_time(p_ops, p_colls, chip, consts, executor, one_row)
    return Prediction(workload, chip, layout, batch, context, spec, executor, t, resident, requests, prefill)
