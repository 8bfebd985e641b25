"""The verification cases of one super-op kind: shapes, random step states and the twin's answers.

A *case* is one shape (a model config, dtype, B sequences × T tokens, speculative ``keep_states`` or
not, and which op of the kind) at which a candidate is called three times: on state A, on a fresh
copy of A (determinism), and right after on state B, an independent draw at the same shape (a stale or
cached answer shows). Every state is built from its own seed:

* weights: ``random_model(cfg, seed)``; weights that init to a constant (RMSNorm γ = 1, zero biases)
  get noise, so a kernel that skips them is wrong;
* caches: every sequence has a random prefix (the last row of a multi-row step starts a fresh
  sequence in a slot holding junk recurrent state), slots in random order, every pool row, state and
  history random;
* buffers: random normal (token ids uniform in the vocabulary); outputs the op writes without reading
  (its non-accumulating writes, the cache rows its step appends, the KDA histories of a
  ``keep_states`` step) are poisoned with NaN; accumulated outputs start small, so their increment
  shows.

Shapes: the *tuned* shapes (the model's own widths at the requested rows - what the proposer is
shown) and *hidden* ones drawn per verification from the model's narrow twin with odd widths and
random B, T (never shown to a proposer). The twin (``program/reference.py``) runs in this process on
a state's poisoned copy; the candidate never sees its answer.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from dataclasses import dataclass

import torch

from nonstop.cache.state import ModelCache, StepBatch, _TokenCache
from nonstop.config import ModelConfig
from nonstop.model.build import meta_model, random_model
from nonstop.program.ir import SuperOp
from nonstop.program.lower import lower
from nonstop.program.reference import REFERENCE, StepEnv
from nonstop.program.twin import narrow_twin
from nonstop.runtime.tuned import op_variant

MAX_PREFIX = 40  # tokens already cached per sequence in verification states (crosses 16-token pages)


@dataclass(frozen=True)
class CaseSpec:
    """One shape of a verification. ``label``: "tuned" (a shape the proposer sees) or "hidden"."""

    label: str
    cfg: ModelConfig
    dtype: torch.dtype
    B: int
    T: int
    keep_states: bool
    variant: int
    context: int | None = None  # tokens cached per sequence (None: random 1..MAX_PREFIX)
    spare_slots: int = 2  # cache slots beyond B (drawn per verification: a fixed count would tell its states)

    @property
    def rows(self) -> int:
        return self.B * self.T

    def describe(self) -> str:
        c = self.cfg
        mode = ", keep_states" if self.keep_states else ""
        which = f", variant {self.variant}" if self.variant and self.label == "tuned" else ""
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{self.label}: d={c.hidden_size} B={self.B} T={self.T}{mode} {dtype}{which}"


@dataclass
class State:
    """A step state ready for one call: the op (without its cost closures) and the env's parts."""

    op: SuperOp
    buf: dict[str, torch.Tensor]
    cache: ModelCache
    batch: StepBatch
    model: object = None  # the model the op's weights belong to (``build_state(..., model=)`` reuses it)

    def roots(self) -> dict:
        return {"op": self.op, "buf": self.buf, "cache": self.cache, "batch": self.batch}

    def env(self) -> StepEnv:
        return StepEnv(self.buf, self.cache, self.batch)


# ----------------------------------------------------------------------------- configs and ops


SMALL_MODEL_LAYERS = 8  # a model of at most this many layers is verified whole


def layers_for(cfg: ModelConfig, kind: str) -> int:
    """The leading layers a verification of ``kind`` builds: all of a small model; else the fewest that
    hold the first op of each variant of the kind (``op_variant``) among the first ``SMALL_MODEL_LAYERS``
    (at least the kind's first layer). A variant first met deeper (K3's attention residuals with more
    blocks) is not verified, and a stored winner does not run on it (``runtime/tuned.TunedKind.covers``)."""
    program = lower(meta_model(cfg))
    ops = [op for op in program.ops if op.kind == kind]
    if not ops:
        raise ValueError(f"model has no {kind!r} op; its kinds: {', '.join(sorted({op.kind for op in program.ops}))}")
    if cfg.num_hidden_layers <= SMALL_MODEL_LAYERS:
        return cfg.num_hidden_layers
    first: dict[str, int] = {}
    for op in ops:
        if op.layer is not None:  # not the op after the last layer (lm_head, attention residuals' final mix)
            first.setdefault(op_variant(op), op.layer)
    if not first:
        return 1
    near = [layer for layer in first.values() if layer < SMALL_MODEL_LAYERS] or [min(first.values())]
    return max(near) + 1


def variants(program, kind: str) -> list[SuperOp]:
    """The ops of ``kind`` that differ in weight shapes or static attributes (one of each)."""
    seen, out = set(), []
    for op in program.ops:
        if op.kind != kind:
            continue
        key = (
            tuple((n, tuple(t.shape), str(t.dtype)) for n, t in sorted(op.weights.items())),
            tuple(
                sorted(
                    (k, repr(v))
                    for k, v in op.attrs.items()
                    if isinstance(v, (int, float, bool, str, type(None), tuple, list)) and k != "cache_layer"
                )
            ),
        )
        if key not in seen:
            seen.add(key)
            out.append(op)
    return out


def hidden_config(cfg: ModelConfig, rng: random.Random) -> ModelConfig:
    """The model's narrow twin with odd widths drawn from ``rng`` (same layers, kinds and formats)."""
    twin = narrow_twin(cfg)
    odd = lambda lo, hi: rng.randrange(lo | 1, hi, 2)  # noqa: E731
    changes: dict = {"vocab_size": odd(97, 251), "hidden_size": odd(29, 63)}
    if twin.intermediate_size:
        changes["intermediate_size"] = rng.randrange(33, 91)
    if twin.gqa:
        heads = rng.choice([2, 3, 4])
        changes["gqa"] = dataclasses.replace(
            twin.gqa,
            num_heads=heads,
            num_kv_heads=rng.choice([h for h in (1, 2, heads) if heads % h == 0]),
            head_dim=rng.choice([6, 10, 12, 14]),
        )
        if twin.rope:
            changes["rope"] = dataclasses.replace(twin.rope, dim=changes["gqa"].head_dim)
    if twin.mla:
        m = twin.mla
        changes["mla"] = dataclasses.replace(
            m,
            num_heads=rng.choice([2, 3]),
            q_lora_rank=odd(13, 29) if m.q_lora_rank else None,
            kv_lora_rank=odd(9, 23),
            qk_nope_head_dim=odd(5, 15),
            v_head_dim=odd(5, 15),
        )
    if twin.kda:
        changes["kda"] = dataclasses.replace(twin.kda, num_heads=rng.choice([2, 3]), head_dim=rng.choice([6, 10, 12]))
    if twin.moe:
        m = twin.moe
        changes["moe"] = dataclasses.replace(
            m, intermediate_size=odd(15, 41), latent_size=odd(15, 41) if m.latent_size else None
        )
    return dataclasses.replace(twin, **changes)


# ----------------------------------------------------------------------------- states


def _noise_constants(op: SuperOp, gen: torch.Generator) -> None:
    """Weights initialised to one value (RMSNorm γ = 1, zero biases) get noise, in place (views stay views);
    RoPE frequencies each get a random factor in [0.5, 2), so a kernel computing its own (from a base
    frequency it assumes, ignoring ``inv_freq``) is wrong."""
    for name, t in op.weights.items():
        if name == "inv_freq":
            t.mul_((torch.rand(t.shape, generator=gen) * 1.5 + 0.5).to(t.device, t.dtype))
        elif t.is_floating_point() and t.numel() > 1 and bool((t == t.reshape(-1)[0]).all()):
            t.add_((torch.randn(t.shape, generator=gen) * 0.25).to(t.device, t.dtype))


def _randn_(t: torch.Tensor, gen: torch.Generator, scale: float = 1.0) -> None:
    t.copy_((torch.randn(t.shape, generator=gen) * scale).to(t.dtype))


def _fill_cache(cache: ModelCache, gen: torch.Generator) -> None:
    for layer in cache.layers:
        if isinstance(layer, _TokenCache):
            layer.fit_pool()
            for t in layer.tensors.values():
                _randn_(t, gen)
        else:
            _randn_(layer.recurrent, gen, 0.5)
            _randn_(layer.conv, gen)
            for hist in (layer.history_recurrent, layer.history_conv):
                if hist is not None:
                    _randn_(hist, gen)


def _step(
    cfg: ModelConfig, dtype, device, spec: CaseSpec, gen: torch.Generator, rng: random.Random
) -> tuple[ModelCache, StepBatch]:
    """A cache whose B sequences have random prefixes (the last of several starts fresh), and the step batch."""
    B, T = spec.B, spec.T
    num_slots = B + spec.spare_slots
    slots = rng.sample(range(num_slots), B)
    longest = (spec.context or MAX_PREFIX) + T
    cache = ModelCache(cfg, num_slots=num_slots, capacity=max(16, longest), dtype=dtype, device=device)
    for b, slot in enumerate(slots):
        fresh = B > 1 and b == B - 1
        n = 0 if fresh else (spec.context or rng.randint(1, MAX_PREFIX))
        if n:
            cache.advance(cache.batch([slot], n))
    batch = cache.batch(slots, T, keep_states=spec.keep_states)
    if spec.keep_states:  # the histories exist before the step, so twin and kernel write the same tensors
        for layer in cache.layers:
            if not isinstance(layer, _TokenCache):
                layer.history_for("recurrent", batch.slots, T)
                layer.history_for("conv", batch.slots, T)
                layer.history_rows.zero_()
    _fill_cache(cache, gen)
    return cache, batch


def _step_rows(op: SuperOp, state: State) -> dict[str, torch.Tensor] | None:
    layer = op.attrs.get("cache_layer")
    if layer is None or not isinstance(state.cache.layers[layer], _TokenCache):
        return None
    cache = state.cache.layers[layer]
    rows = cache.pages.rows(state.batch.slots, state.batch.positions)
    return {k: t[rows] for k, t in cache.tensors.items()}


def _poison(state: State) -> None:
    """NaN in everything the op writes without reading (see the module docstring)."""
    op = state.op
    for name in op.writes:
        t = state.buf[name]
        if not op.attrs.get("accumulate", False) and t.is_floating_point():
            t.fill_(float("nan"))
    probe = State(op, {k: v.clone() for k, v in state.buf.items()}, copy.deepcopy(state.cache), state.batch)
    before = _step_rows(op, probe)
    if before is not None:
        REFERENCE[op.kind](op, probe.env())
        after = _step_rows(op, probe)
        if any(
            not torch.equal(before[k].nan_to_num(), after[k].nan_to_num()) for k in before
        ):  # the op appends to its cache
            cache = state.cache.layers[op.attrs["cache_layer"]]
            rows = cache.pages.rows(state.batch.slots, state.batch.positions)
            for t in cache.tensors.values():
                t[rows] = float("nan")
    if state.batch.keep_states and op.kind in ("kda_in_proj", "kda_core"):
        layer = state.cache.layers[op.attrs["cache_layer"]]
        hist = layer.history_conv if op.kind == "kda_in_proj" else layer.history_recurrent
        hist[state.batch.slots, : state.batch.T] = float("nan")


def build_state(spec: CaseSpec, kind: str, device, weight_seed: int, input_seed: int, model=None) -> State:
    """A poisoned step state for one call of ``kind`` at ``spec`` (weights from ``weight_seed``, caches
    and buffers from ``input_seed``). ``model``: reuse a model built by an earlier call with the same
    ``spec`` and ``weight_seed`` (same weights, new inputs)."""
    fresh = model is None
    if fresh:
        model = random_model(spec.cfg, spec.dtype, device=device, seed=weight_seed)
        model.tune_program = lower(model)  # lowered once: lowering again would re-pack the weights
    program = model.tune_program
    ops = variants(program, kind)
    if not ops:
        raise ValueError(f"model has no {kind!r} op")
    op = dataclasses.replace(ops[spec.variant % len(ops)], cost=None, tiles=None)
    if fresh:
        _noise_constants(op, torch.Generator().manual_seed(weight_seed + 1))
    gen = torch.Generator().manual_seed(input_seed)
    rng = random.Random(input_seed)
    cache, batch = _step(spec.cfg, spec.dtype, device, spec, gen, rng)
    buf = program.allocate(spec.rows, device)
    for name, t in buf.items():
        if t.is_floating_point():
            scale = 0.1 if name in op.writes and op.attrs.get("accumulate", False) else 1.0
            _randn_(t, gen, scale)
        else:
            t.copy_(torch.randint(0, spec.cfg.vocab_size, t.shape, generator=gen))
    state = State(op, buf, cache, batch, model)
    _poison(state)
    return state


def twin_on(packed, device) -> list[torch.Tensor]:
    """The storages of a packed state (``state.Packed``) after the twin ran on a rebuilt copy of it."""
    from nonstop.tune.state import unpack

    rebuilt = unpack(packed, device, torch.Generator().manual_seed(0))
    roots = rebuilt.state
    run_twin(State(roots["op"], roots["buf"], roots["cache"], roots["batch"]))
    return [rebuilt.body(i).cpu().clone() for i in range(len(packed.storages))]


def run_twin(state: State) -> None:
    """The kind's plain-torch twin on ``state`` (in place)."""
    REFERENCE[state.op.kind](state.op, state.env())
