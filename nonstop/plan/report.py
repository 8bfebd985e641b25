"""Text for ``nonstop plan``: one prediction in full, a table of layouts, predicted beside measured."""

from __future__ import annotations

import dataclasses

from nonstop.plan.measured import Measurement, this_cpu
from nonstop.plan.predict import USABLE_HBM, Prediction, Spec, predict
from nonstop.plan.search import Candidate
from nonstop.plan.timing import Constants
from nonstop.plan.workload import Precision, build_workload, quantised_experts
from nonstop.program.preflight import size_text

GB = 1e9


def _sold_as(chip) -> str:
    """Where the driver's capacity differs from the figure the part is sold as, say both."""
    return f" the driver reports; sold as {chip.hbm_gb:g} GB" if chip.hbm_visible_gb else ""


def _prefill_lines(p: Prediction) -> list[str]:
    if p.prefill is None:
        return []
    r = p.requests
    lines = [f"  prefill, one prompt  {p.prefill_ms:8.1f} ms   ({r.input_len} tokens: first token when served alone)"]
    if p.batch > 1:
        lines += [
            f"  time to first token  {p.ttft_ms:8.1f} ms   mean over {p.batch} requests started together",
            f"  their prefills       {p.prefill_stall_ms_per_token:8.3f} ms   more per token in an aggregated server "
            f"({r.output_len} tokens a request; not in ms per token)",
        ]
    return lines


def _uneven_groups(p: Prediction) -> list[str]:
    """A note when the batch does not split evenly over the attention groups: every group steps together,
    so the step is the fullest group's (the others run padded rows, as vLLM's DP ranks do)."""
    groups = p.layout.dp
    if groups == 1 or p.batch % groups == 0:
        return []
    full = -(-p.batch // groups)
    return [
        f"  ({p.batch} sequences over {groups} attention groups: the fullest holds {full}, and every step waits for it)"
    ]


def describe(p: Prediction) -> str:
    """The full report of one prediction."""
    t, chip, lay = p.time, p.chip, p.layout
    spec = f", speculative: {p.spec.drafts} drafts, accepted length {p.spec.accept}" if p.spec else ""
    prec = p.workload.precision
    lines = [
        (
            f"{p.workload.name} on {p.chips:g} x {chip.key} ({chip.name}), {lay.describe(bool(p.workload.moe_ops))}"
            f" ({lay.world} ranks, {lay.sharding} sharding), {p.executor} executor"
        ),
        (
            f"batch {p.batch} sequence(s), context {p.context} tokens{spec}; weights {prec.dense},"
            f" experts {prec.experts if p.workload.moe_ops else '-'},"
            f"{f' attention weights {prec.attention},' if prec.attention else ''}"
            f" attention cache {prec.cache}"
        ),
        *_uneven_groups(p),
        "",
        f"  ms per step          {t.total_ms:8.3f}",
        f"  ms per token         {p.ms_per_token:8.3f}   (per user)",
        f"  tokens/s per user    {p.tokens_per_s_per_user:8.1f}",
        f"  tokens/s in total    {p.tokens_per_s_total:8.1f}   ({p.tokens_per_s_total / p.chips:.1f} per chip)",
        f"  bound                {t.bound()}",
        *_prefill_lines(p),
        "",
        (
            f"memory per chip: {size_text(p.bytes_per_rank * chip.devices_per_chip)} of "
            f"{size_text(p.capacity_per_rank * chip.devices_per_chip)}"
            f" usable ({USABLE_HBM:.0%} of {size_text(chip.hbm_bytes)} {chip.memory}{_sold_as(chip)})"
            f" -> {'fits' if p.fits else 'DOES NOT FIT'}"
        ),
    ]
    held = f" (the cache at {p.requests.peak} tokens a sequence: the requests' last step)" if p.requests else ""
    lines.append(f"  {p.resident_parts(', ')} per rank{held}")
    if not p.fits:
        lines.append(f"  {p.why_not()}")
    parts = [
        ("weight streaming", t.weights_ms),
        ("KV / KDA state reads", t.state_ms),
        ("compute-bound ops", t.compute_ms),
        ("expert fetch latency", t.expert_fetch_ms),
        ("collectives", t.collectives_ms),
        (f"launch gaps ({t.kernels} kernels)", t.launch_ms),
        ("engine host loop per step", t.host_ms),
        ("speculative draft", t.draft_ms),
    ]
    lines += ["", "step time (busiest rank):"]
    for name, ms in parts:
        if ms > 0 or name.startswith(("weight", "collect")):
            lines.append(f"  {name:<30} {ms:8.3f} ms  {ms / t.total_ms:6.1%}")
    if t.collectives:
        lines += ["", f"collectives per step ({sum(c.count for c in t.collectives)} calls):"]
        for c in sorted(t.collectives, key=lambda c: -c.ms):
            where = "scale-out" if c.crosses_scale_out else "scale-up"
            lines.append(
                f"  {c.count:4d} x {c.kind:<14} {c.ranks:4d} ranks {where:<9} {size_text(c.wire_bytes):>9} sent"
                f"  latency {c.latency_ms:7.3f} ms  bandwidth {c.bandwidth_ms:7.3f} ms  {c.label}"
            )
    return "\n".join(lines)


def layout_table(cands: list[Candidate], top: int, chip, routed_experts: bool = True) -> str:
    """The first ``top`` candidates of a search on ``chip``, one row each: GB/chip is a rank's bytes times the
    chip's devices (exact, or the search's lower bound for a layout it dropped); ``routed_experts`` False (a
    dense model) names no expert placement. The layout column is as wide as its longest name."""
    names = [c.layout.describe(routed_experts) for c in cands[:top]]
    w = max([22, *map(len, names)])
    header = f"{'layout':<{w}} {'ranks':>5} {'GB/chip':>8} {'fits':>5} {'ms/token':>9} {'tok/s/user':>10}"
    lines = [header + f" {'tok/s total':>11}  bound"]
    for c, name in zip(cands[:top], names):
        p = c.prediction
        fits = "yes" if c.fits else "no"
        row = f"{name:<{w}} {c.layout.world:>5} {c.bytes_per_rank * chip.devices_per_chip / GB:>8.1f} {fits:>5}"
        if c.fits:
            row += f" {p.ms_per_token:>9.3f} {p.tokens_per_s_per_user:>10.1f} {p.tokens_per_s_total:>11.1f}"
            row += f"  {p.time.bound()}"
        else:  # exact bytes when predicted in full, else the search's lower bound
            at_least = ">= " if p is None else ""
            row += f" {'-':>9} {'-':>10} {'-':>11}  (needs {at_least}{c.bytes_per_rank / GB:.1f} GB per rank)"
        lines.append(row)
    return "\n".join(lines)


def measured_side_by_side(rows: list[Measurement], chip, model_name: str, workload_for, consts=None) -> list[dict]:
    """Each measurement with the planner's prediction of the same run (its batch, dtype, executor,
    speculation and, on a CPU, the copy bandwidth that run measured); a bare step timed on the device
    (``engine_loop`` False) is predicted without the serving engine's host loop per step."""
    from nonstop.plan.layout import Layout

    consts = consts or Constants.load()
    out = []
    for m in rows:
        run_chip = dataclasses.replace(chip, hbm_gbps=m.copy_gbps) if m.copy_gbps else chip
        workload = workload_for(m)
        spec = Spec(m.spec_accept, m.spec_draft) if m.spec_accept else None
        run_consts = consts if m.engine_loop else consts.replace(step_overhead_us=0.0)
        p = predict(workload, run_chip, Layout(), m.batch, m.context, spec, m.executor, run_consts, _model_dir(m))
        out.append({"measurement": m, "predicted_ms_per_token": p.ms_per_token * m.serial, "prediction": p})
    return out


def _model_dir(m: Measurement):
    if m.model is None:
        return None
    from nonstop.weights.resolve import resolve_model

    try:
        return resolve_model(m.model)[1]
    except ValueError:
        return None


def recorded_on(m: Measurement) -> str:
    """Where a measurement was taken, as the side-by-side shows it: "this CPU", another CPU's name, or
    "-" (GPU results, named by their chip)."""
    if m.cpu is None:
        return "-"
    return "this CPU" if m.cpu == this_cpu() else m.cpu


def measured_table(rows: list[dict]) -> str:
    """The side-by-side, its run and "recorded on" columns as wide as their longest entry (nothing cut); a run
    recorded on another CPU is predicted with this machine's per-op cost and its own recorded bandwidth, so
    its ratio says little (the note under the table says so)."""
    wheres = [recorded_on(r["measurement"]) for r in rows]
    w = max([len("measured run"), *(len(r["measurement"].what) for r in rows)])
    v = max([len("recorded on"), *map(len, wheres)])
    head = f"{'measured run':<{w}} {'measured':>9} {'predicted':>9} {'pred/meas':>9}  {'recorded on':<{v}} source"
    lines = [head]
    other = bare = False
    for r, where in zip(rows, wheres):
        m = r["measurement"]
        other = other or where not in ("this CPU", "-")
        bare = bare or not m.engine_loop
        lines.append(
            f"{m.what:<{w}} {m.ms_per_token:>9.2f} {r['predicted_ms_per_token']:>9.2f}"
            f" {r['predicted_ms_per_token'] / m.ms_per_token:>9.2f}  {where:<{v}} bench/results/{m.source}"
        )
    if other:
        lines.append(
            "(runs recorded on another CPU are predicted with this machine's per-op cost: compare those of this CPU)"
        )
    if bare:
        lines.append(
            "(a GPU run is one bare step timed on the device, predicted without an engine's host loop: pred/meas is "
            "the share of the calibrated engines' speed that nonstop's kernels reach there)"
        )
    return "\n".join(lines)


def workload_for_measurement(precision_overrides: dict):
    """A function building the workload a measurement ran (its model, fp32 on a CPU)."""

    def build(m: Measurement):
        from nonstop.config import ModelConfig
        from nonstop.weights.resolve import resolve_model

        cfg = resolve_model(m.model)[0] if m.model else ModelConfig.from_hf_dict(m.hf_config)
        fmt = {"float32": "fp32", "bfloat16": "bf16", "float16": "bf16"}.get(m.dtype, "bf16")
        experts = None if quantised_experts(cfg) else fmt
        prec = Precision.released(cfg, **{"dense": fmt, "experts": experts, **precision_overrides})
        return build_workload(cfg, m.model or "(config in the result file)", prec)

    return build
