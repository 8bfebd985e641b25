"""Verify one candidate kernel file: static checks, then the dynamic checks in a sandboxed child.

``verify(source, target)``:
1. ``static_check`` (skipped for the built-in kernels, which are trusted code): a rejection here costs
   no process.
2. The plan: the target's tuned shapes (every variant of the op that shares a tuned shape's store key
   among them) plus hidden shapes (``cases.hidden_config``: odd widths, random
   B and T, one speculative ``keep_states`` step), at least ``MIN_CASES`` in all, drawn from a fresh
   random seed per verification; per case two independent states A and B (``cases.build_state``);
   the twin runs here on each.
3. One child process (``sandbox.run_child``) runs the calls of ``call_plan`` (A, a fresh copy of A,
   B; in the first cases also A's inputs with B's weights and B's inputs with A's weights), case after
   case; on a GPU it then times each tuned shape (``child_run.time_shape``).
   When every call is clean it runs the candidate once more the way the executor runs it (``exec_check``:
   a short decode through the ``superop`` executor with the candidate as its stored winner).
4. ``judge`` decides; the executor run's logits are compared with the reference executor's (run here);
   timing is checked against the twin on the timed launches' outputs and against the op's bandwidth floor
   (``timing.floor_seconds``): faster than the floor is impossible.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nonstop.tune.cases import CaseSpec, State, build_state, hidden_config, run_twin, twin_on
from nonstop.tune.exec_check import judge_executor_run, plan_executor_run
from nonstop.tune.judge import TOLERANCE, judge_call, judge_determinism, no_op_detectable
from nonstop.tune.sandbox import run_child
from nonstop.tune.state import Packed, pack, snapshot
from nonstop.tune.static_check import static_check
from nonstop.tune.target import Target, TunedShape
from nonstop.tune.timing import TimingPlan, judge_timing, plan_timing

MIN_CASES = 5
HIDDEN_CASES = 3
MIXED_CASES = 2  # cases that also swap weights between A and B (see ``call_plan``)
LONG_CONTEXT = 300  # tokens cached in one hidden case: > 2 KV splits of the built-in min_split (128)


@dataclass
class Verdict:
    """accepted, or the reasons not; ``record``: how it was verified (the store keeps it); ``timing``:
    per tuned shape key, the measured times (GPU only) or nothing (``untimed``)."""

    accepted: bool
    reasons: list[str] = field(default_factory=list)
    record: dict = field(default_factory=dict)
    timing: dict[str, dict] = field(default_factory=dict)

    @property
    def stage(self) -> str:
        return self.record.get("stage", "")


@dataclass
class Prepared:
    spec: CaseSpec
    packed: Packed
    after: list[torch.Tensor]
    outputs: list[int]


def builtin_source(kind: str) -> str:
    """A candidate file that is the built-in kernel of ``kind``."""
    from nonstop.kernels import KERNELS

    fn = KERNELS[kind]
    return f'"""The built-in {kind} kernel."""\n\nfrom {fn.__module__} import {fn.__name__} as launch  # noqa: F401\n'


def plan(target: Target, rng: random.Random, hidden: int = HIDDEN_CASES) -> list[CaseSpec]:
    """The tuned shapes; then, at the first step shape of each, the other variants sharing its store key
    (``TunedShape.others``: the executor runs them too); each of these of T > 1 again as a speculative step
    (``keep_states``); then hidden shapes (at least ``MIN_CASES`` cases in all): one sequence, three with
    ``LONG_CONTEXT`` to twice that cached, a speculative step of drawn B and T > 1, then drawn ones."""
    tuned = [(s, s.variant) for s in target.shapes]
    first_of: dict[int, TunedShape] = {}  # variant -> its first tuned shape
    for s in target.shapes:
        first_of.setdefault(s.variant, s)
    tuned += [(s, v) for s in first_of.values() for v in s.others]
    specs = [
        CaseSpec("tuned", target.cfg, target.dtype, s.B, s.T, False, v, spare_slots=rng.randint(2, 9)) for s, v in tuned
    ]
    # a step of T > 1 tokens has the same key whether it is a speculative step or not: verify both
    specs += [dataclasses.replace(c, keep_states=True) for c in specs if c.T > 1]
    n_hidden = max(hidden, MIN_CASES - len(specs))
    spec_step = (rng.randint(1, 4), rng.randint(2, 4))  # the speculative step's shape is drawn, not fixed
    shapes = [(1, 1), (3, 1), spec_step] + [(rng.randint(1, 4), rng.randint(1, 4)) for _ in range(n_hidden)]
    for i in range(n_hidden):
        B, T = shapes[i]
        specs.append(
            CaseSpec(
                "hidden",
                hidden_config(target.cfg, rng),
                target.dtype,
                B,
                T,
                keep_states=i == 2,
                # one case past several pages and more than one KV split (attention that stops early shows)
                context=rng.randint(LONG_CONTEXT, 2 * LONG_CONTEXT) if i == 1 else None,
                variant=i,
                spare_slots=rng.randint(2, 9),
            )
        )
    return specs


def with_weights_of(a: Prepared, b: Prepared, kind: str, device) -> Prepared:
    """State ``a`` with the op's weights of ``b`` (same case: same weight shapes), its twin run here."""
    storages = list(a.packed.storages)
    for path, index in a.packed.paths.items():
        if path.startswith("op."):
            sa, sb = a.packed.views[index].storage, b.packed.views[b.packed.paths[path]].storage
            if storages[sa].numel() != b.packed.storages[sb].numel():
                raise RuntimeError(f"verifier: {kind} weights of one case differ in size at {path}")
            storages[sa] = b.packed.storages[sb]
    packed = Packed(a.packed.skeleton, a.packed.views, storages, a.packed.paths)
    after = twin_on(packed, device)
    outputs = [i for i, (x, y) in enumerate(zip(packed.storages, after)) if not torch.equal(x, y)]
    return Prepared(a.spec, packed, after, outputs)


def prepare(spec: CaseSpec, kind: str, device, weight_seed: int, input_seed: int) -> Prepared:
    state: State = build_state(spec, kind, device, weight_seed, input_seed)
    packed = pack(state.roots())
    run_twin(state)
    after = snapshot(state.roots(), packed)
    outputs = [i for i, (a, b) in enumerate(zip(packed.storages, after)) if not torch.equal(a, b)]
    if not outputs or not no_op_detectable(packed, after, outputs, TOLERANCE[spec.dtype]):
        raise RuntimeError(
            f"verifier: the {kind} twin changes nothing a do-nothing kernel would miss at {spec.describe()}"
        )
    return Prepared(spec, packed, after, outputs)


@dataclass
class Call:
    state: int  # index into the prepared states
    label: str
    same_as: int | None = None  # index of an earlier call on a copy of the same state (determinism)


def call_plan(cases: list[Prepared], specs: list[CaseSpec], kind: str, device) -> tuple[list[Prepared], list[Call]]:
    """Per case: A, a fresh copy of A (determinism), then B right after (a stale answer shows). The first
    ``MIXED_CASES`` cases also run A's inputs with B's weights right after A, and B's inputs with A's weights
    right after B: a result cached by inputs alone or by weights alone is stale there."""
    states = list(cases)
    calls: list[Call] = []
    for c, spec in enumerate(specs):
        a, b = 2 * c, 2 * c + 1
        name = f"case {c + 1} ({spec.describe()})"
        calls += [Call(a, f"{name}, call on A"), Call(a, f"{name}, call on A again", same_as=len(calls))]
        if c < MIXED_CASES:
            states.append(with_weights_of(cases[a], cases[b], kind, device))
            calls.append(Call(len(states) - 1, f"{name}, call on A's inputs with B's weights"))
        calls.append(Call(b, f"{name}, call on B"))
        if c < MIXED_CASES:
            states.append(with_weights_of(cases[b], cases[a], kind, device))
            calls.append(Call(len(states) - 1, f"{name}, call on B's inputs with A's weights"))
    return states, calls


def _write_job(
    jobdir: Path, source: str, target: Target, states: list[Prepared], calls: list[Call], timing, executor: dict
) -> None:
    (jobdir / "candidate.py").write_text(source)
    job = {
        "executor": executor["job"],
        "kind": target.kind,
        "device": str(target.device),
        "candidate": str(jobdir / "candidate.py"),
        "states": [p.packed for p in states],
        "outputs": [p.outputs for p in states],
        "calls": [{"state": c.state} for c in calls],
        "timing": {key: plan.job() for key, plan in timing.items()},
    }
    torch.save(job, jobdir / "job.pt")


def verify(
    source: str,
    target: Target,
    *,
    trusted: bool = False,
    time_it: bool = True,
    timeout_s: float = 300.0,
    seed: int | None = None,
    progress=None,
) -> Verdict:
    """Verify (and on a GPU time) a candidate file's source for ``target``; see the module docstring."""
    say = progress or (lambda _msg: None)
    record: dict = {
        "kind": target.kind,
        "model": target.model,
        "device": str(target.device),
        "dtype": str(target.dtype).removeprefix("torch."),
    }
    if not trusted:
        problems = static_check(source, target.kind)
        if problems:
            return Verdict(False, problems, {**record, "stage": "static"})
    master = seed if seed is not None else random.SystemRandom().randrange(2**31)
    rng = random.Random(master)
    specs = plan(target, rng)
    t0 = time.perf_counter()
    cases: list[Prepared] = []
    for spec in specs:
        for _ in range(2):
            cases.append(prepare(spec, target.kind, target.device, rng.randrange(2**31), rng.randrange(2**31)))
    timing: dict[str, TimingPlan] = {}
    if target.device.type == "cuda" and time_it:
        for shape in target.shapes:
            spec = CaseSpec(
                "tuned",
                target.cfg,
                target.dtype,
                shape.B,
                shape.T,
                False,
                shape.variant,
                context=target.context,
                spare_slots=rng.randint(2, 9),
            )
            timing[shape.key] = plan_timing(shape.key, spec, target.kind, target.device, rng)
    states, calls = call_plan(cases, specs, target.kind, target.device)
    record.update(
        master_seed=master,
        cases=[s.describe() for s in specs],
        calls=len(calls),
        build_s=round(time.perf_counter() - t0, 2),
    )
    say(
        f"{len(specs)} cases ({sum(s.label == 'hidden' for s in specs)} hidden), {len(calls)} calls"
        + (f", timing {len(timing)} shape(s)" if timing else "")
    )
    jobdir = Path(tempfile.mkdtemp(prefix="nonstop-verify-"))
    try:
        executor = plan_executor_run(target, source, jobdir, rng, hidden_cfg=specs[-1].cfg)
        _write_job(jobdir, source, target, states, calls, timing, executor)
        if target.device.type == "cuda":
            torch.cuda.empty_cache()  # leave the child the memory this process's allocator holds
        t1 = time.perf_counter()
        run = run_child(jobdir, target.device, timeout_s)
        record.update(child_s=round(time.perf_counter() - t1, 2), network_namespace=run.network_namespace)
    finally:
        if os.environ.get("NONSTOP_TUNE_KEEP") != "1":  # keep the job directory to rerun a child by hand
            shutil.rmtree(jobdir, ignore_errors=True)
    if run.result is None:
        if run.problem is not None:
            return Verdict(False, [f"the verification process exited, but {run.problem}"], {**record, "stage": "run"})
        why = (
            f"timed out after {timeout_s:.0f} s" if run.timed_out else f"the verification process died ({run.ending()})"
        )
        tail = run.stderr.strip().splitlines()[-1:] if run.stderr.strip() else []
        return Verdict(False, [why + (f": {tail[0][:300]}" if tail else "")], {**record, "stage": "run"})
    return _judge(run.result, target, states, calls, timing, record, executor)


def _judge(
    result: dict,
    target: Target,
    states: list[Prepared],
    calls: list[Call],
    timing: dict[str, TimingPlan],
    record: dict,
    executor: dict,
) -> Verdict:
    if result.get("import_error"):
        return Verdict(
            False, [f"importing the candidate failed: {result['import_error']}"], {**record, "stage": "import"}
        )
    problems = []
    if result.get("patched_on_import"):
        problems.append(f"importing the candidate replaced {', '.join(result['patched_on_import'])}")
    if result.get("threads_on_import"):
        problems.append(f"importing the candidate started {result['threads_on_import']} thread(s)")
    recs = result["calls"]
    gpu = target.device.type == "cuda"
    for call, rec in zip(calls, recs):
        p = states[call.state]
        problems += judge_call(rec, p.packed, p.after, p.outputs, TOLERANCE[p.spec.dtype], call.label)
        if not problems and call.same_as is not None:
            problems += judge_determinism(recs[call.same_as], rec, p.packed, target.kind, gpu, call.label)
        if problems:
            break
    if not problems and len(recs) != len(calls):
        problems.append(f"the verification stopped after {len(recs)} of {len(calls)} calls")
    if not problems:
        got = result.get("executor") or {}
        problems = judge_executor_run(executor, result.get("executor_builtin"), got, TOLERANCE[target.dtype])
        record["executor_run"] = {
            "B": executor["job"]["B"],
            "T": executor["job"]["T"],
            "steps": len(executor["job"]["steps"]),
            **{k: got.get(k) for k in ("tuned_calls", "graphs", "pdl")},
        }
    record["stage"] = "dynamic"
    if problems:
        return Verdict(False, problems[:6], record)
    verdict = Verdict(True, [], {**record, "checks_passed": CHECKS})
    if timing:
        problems = _judge_timing(result.get("timing", {}), target, timing, verdict)
        if problems:
            return Verdict(False, problems[:6], {**record, "stage": "timing"})
    return verdict


def _judge_timing(measured: dict, target: Target, timing: dict[str, TimingPlan], verdict: Verdict) -> list[str]:
    shapes = {s.key: s for s in target.shapes}
    for key, plan in timing.items():
        problems, entry = judge_timing(
            plan, measured.get(key), shapes[key].bytes_moved, target.device, TOLERANCE[target.dtype]
        )
        if problems:
            return problems
        verdict.timing[key] = entry
    return []


CHECKS = [
    "static",
    "sandbox: -I, rlimits, no network",
    "fresh memory + guard bands per call",
    "outputs poisoned (NaN)",
    "inputs/weights/caches unchanged",
    "within dtype tolerance of the twin",
    "determinism (A twice)",
    "new inputs after old (B)",
    "swapped weights / inputs (no result cache)",
    "executor run: the superop executor with the candidate stored gives the reference's logits",
    "no torch compute / host reads in the candidate",
    "Triton launch ran",
    "no patched functions, no threads",
    "hidden odd shapes",
    ">= 5 seeds",
]
