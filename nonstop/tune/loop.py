"""The tuning loop: rounds of propose -> verify -> time (GPU) -> keep the best in the tuning store.

Round r: the proposer writes up to ``candidates`` files (it sees the verdicts of round r-1); each is
verified (``verify.verify``: static checks, then the sandboxed dynamic checks and, on a GPU, the
timing); a progress line per candidate and per round. Each verified candidate that becomes the best for a
shape is written to the store at once, so what was verified is kept whatever ends the rounds (a proposer
that stops, e.g. an endpoint that no longer answers, an error, Ctrl-C). On a GPU the built-in kernel is verified and
timed first, in the same harness: a candidate is kept for a shape only when its median beats the
built-in's there. Without a GPU nothing is timed: the first verified candidate is kept for each shape
as *verified, untimed* (the store never holds an invented speed). The report lists candidates tried,
rejections by reason, acceptances, and per shape the best time against the built-in kernel and the
op's bandwidth floor.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from nonstop.runtime.tuned import device_name
from nonstop.tune import store
from nonstop.tune.candidate import Candidate, Outcome, RoundContext
from nonstop.tune.target import Target
from nonstop.tune.verify import builtin_source, verify

# rejection categories: the first phrase found in a verdict's first reason
CATEGORIES = [
    ("syntax error", "syntax error"),
    ("is not allowed", "forbidden construct"),
    ("not allowed", "forbidden construct"),
    ("no launch(", "no launch()"),
    ("no Triton kernel", "no Triton kernel"),
    ("importing the candidate", "import failed"),
    ("launch raised", "raised an error"),
    ("torch operator", "torch compute"),
    ("reads tensor values", "host reads"),
    ("host data", "host reads"),
    ("guard band", "wrote outside its outputs"),
    ("modified an input", "modified an input"),
    ("no longer the tensor", "replaced a tensor"),
    ("NaN", "output not written"),
    ("differ from the twin", "wrong result"),
    ("leaves as they are", "wrote what the twin leaves"),
    ("not deterministic", "nondeterministic"),
    ("timed out", "timed out"),
    ("bandwidth floor", "faster than the floor"),
    ("died", "crashed"),
    ("replaced", "patched the harness"),
    ("thread", "started threads"),
]


def category(reasons: list[str]) -> str:
    first = reasons[0] if reasons else ""
    return next((name for phrase, name in CATEGORIES if phrase in first), "other")


@dataclass
class Report:
    target: Target
    proposer: str
    outcomes: list[Outcome] = field(default_factory=list)
    baseline: dict = field(default_factory=dict)  # shape key -> built-in timing (GPU)
    best: dict = field(default_factory=dict)  # shape key -> (Outcome, timing entry or None)
    stored: list[str] = field(default_factory=list)  # shape keys written to the store
    store_path: Path | None = None
    seconds: float = 0.0

    def lines(self) -> list[str]:
        t = self.target
        rejected = [o for o in self.outcomes if not o.accepted and not o.candidate.error]
        accepted = [o for o in self.outcomes if o.accepted]
        failed = [o for o in self.outcomes if o.candidate.error]
        out = [
            f"tuned {t.describe()} with {self.proposer} in {self.seconds:.0f} s: {len(self.outcomes)} candidates, "
            f"{len(accepted)} accepted, {len(rejected)} rejected" + (f", {len(failed)} not produced" if failed else "")
        ]
        for name, n in Counter(category(o.reasons) for o in rejected).most_common():
            out.append(f"  rejected, {name}: {n}")
        for s in t.shapes:
            base = self.baseline.get(s.key)
            best = self.best.get(s.key)
            floor_us = base["floor_ms"] * 1e3 if base else None
            if best is None:
                line = "no verified candidate"
            elif best[1] is None:
                line = f"{best[0].candidate.id} verified, untimed (no GPU)"
            else:
                ms = best[1]["median_ms"]
                line = f"{best[0].candidate.id} {ms * 1e3:.2f} us" + (
                    f" vs built-in {base['median_ms'] * 1e3:.2f} us ({base['median_ms'] / ms:.2f}x)" if base else ""
                )
                if floor_us:
                    line += f", {floor_us / (ms * 1e3):.0%} of the bandwidth floor ({floor_us:.2f} us)"
            if best is None and base:
                line += f" (built-in {base['median_ms'] * 1e3:.2f} us, floor {floor_us:.2f} us)"
            out.append(f"  {s.key}: {line}" + ("  [stored]" if s.key in self.stored else ""))
        for why in t.skipped:
            out.append(f"  not verified here: {why}")
        if self.store_path is not None:
            out.append(f"store: {self.store_path}" + ("" if self.stored else " (unchanged)"))
        return out


def _keep(report: Report, outcome: Outcome, shape_keys: list[str]) -> list[str]:
    """Make ``outcome`` the best for the shapes where it is (see the module docstring); returns them."""
    kept = []
    for key in shape_keys:
        timed = outcome.timing.get(key)
        current = report.best.get(key)
        base = report.baseline.get(key)
        if timed is not None:
            if (base is None or timed["median_ms"] < base["median_ms"]) and (
                current is None or current[1] is None or timed["median_ms"] < current[1]["median_ms"]
            ):
                report.best[key] = (outcome, timed)
                kept.append(key)
        elif current is None and not report.baseline:
            report.best[key] = (outcome, None)
            kept.append(key)
    return kept


def tune(
    target: Target, proposer, rounds: int, candidates: int, store_path: Path | None, timeout_s: float = 300.0, say=print
) -> Report:
    """Run the loop (see the module docstring); returns the report (winners written to the store as they come)."""
    t0 = time.perf_counter()
    report = Report(target, proposer.name, store_path=store_path)
    if not target.shapes:
        raise ValueError(
            f"no tuned shape of {target.kind} can be verified on this machine: " + "; ".join(target.skipped)
        )
    keys = [s.key for s in target.shapes]
    if target.device.type == "cuda":
        say("timing the built-in kernel ...")
        base = verify(builtin_source(target.kind), target, trusted=True, timeout_s=timeout_s)
        if not base.accepted:
            raise RuntimeError("the built-in kernel failed verification: " + "; ".join(base.reasons[:2]))
        report.baseline = base.timing
    previous: list[Outcome] = []
    for r in range(1, rounds + 1):
        context = RoundContext(r, rounds, target, previous, report.baseline, report.best)
        proposed: list[Candidate] = proposer.propose(context, candidates)
        if not proposed:
            say(f"round {r}/{rounds}: the proposer has nothing new; stopping")
            break
        previous = []
        for c in proposed:
            if c.error:
                outcome = Outcome(c, False, [c.error])
                say(f"  {c.id}: not produced ({c.error})")
            else:
                v = verify(c.source, target, timeout_s=timeout_s)
                outcome = Outcome(c, v.accepted, v.reasons, v.timing, v.record)
                verdict = (
                    "accepted" + ("" if v.timing else " (untimed)")
                    if v.accepted
                    else f"rejected ({category(v.reasons)}): {v.reasons[0][:160]}"
                )
                say(f"  {c.id}{' [' + c.note + ']' if c.note else ''}: {verdict}")
                if v.accepted:
                    kept = _keep(report, outcome, keys)
                    if store_path is not None:
                        _store(report, store_path, target, kept)
            previous.append(outcome)
        report.outcomes += previous
        n_ok = sum(o.accepted for o in previous)
        missing = sum(bool(o.candidate.error) for o in previous)
        counts = f"{n_ok} accepted, {len(previous) - n_ok - missing} rejected"
        counts += f", {missing} not produced" if missing else ""
        say(
            f"round {r}/{rounds}: {len(previous)} candidates, {counts}; "
            f"best so far for {sum(k in report.best for k in keys)}/{len(keys)} shape(s)"
        )
        if proposer.stopped:
            say(f"round {r}/{rounds}: {proposer.stopped}; no more rounds (what was verified is kept)")
            break
    report.seconds = time.perf_counter() - t0
    return report


def _store(report: Report, path: Path, target: Target, keys: list[str]) -> None:
    """Record the best of each shape in ``keys`` in the store at ``path`` (``store.record`` keeps what is better)."""
    device = device_name(target.device)
    covered = {s.key: list(s.variants) for s in target.shapes}
    for key in keys:
        outcome, timed = report.best[key]
        base = report.baseline.get(key)
        entry = {
            "proposer": outcome.candidate.proposer,
            "round": int(outcome.candidate.id[1:].split("c")[0]),
            "candidate": outcome.candidate.id,
            "note": outcome.candidate.note,
            "model": target.model,
            "timed": timed is not None,
            "time_ms": timed["median_ms"] if timed else None,
            "builtin_ms": base["median_ms"] if base else None,
            "floor_ms": base["floor_ms"] if base else None,
            "verification": outcome.record,
            "variants": covered.get(key, []),
        }
        if store.record(path, device, target.kind, key, outcome.candidate.source, entry) and key not in report.stored:
            report.stored.append(key)
