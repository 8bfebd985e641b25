"""A candidate kernel file and what proposers share: the feedback of the previous round.

A proposer (``search.SearchProposer``, ``llm.LLMProposer``) has ``name``,
``propose(context, n) -> list[Candidate]`` and ``stopped`` (None, or why it can propose no more: the loop
ends its rounds after the current one); the loop verifies what it proposes and hands back the verdicts in
the next round's ``RoundContext``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nonstop.tune.target import Target


@dataclass
class Candidate:
    id: str  # "r2c3": round 2, third candidate
    source: str
    proposer: str  # "search", "llm:<model>", "file"
    note: str = ""  # what it changes (search) or the proposer's own words
    error: str | None = None  # the proposer failed to produce a file (e.g. the endpoint did not answer)


@dataclass
class Outcome:
    candidate: Candidate
    accepted: bool
    reasons: list[str]
    timing: dict = field(default_factory=dict)  # shape key -> {"median_ms", ...} (GPU)
    record: dict = field(default_factory=dict)  # how it was verified (``Verdict.record``)

    def message(self) -> str:
        """One block of verifier feedback for a proposer."""
        if self.candidate.error:
            return f"{self.candidate.id}: no file ({self.candidate.error})"
        if not self.accepted:
            return f"{self.candidate.id}: REJECTED\n" + "\n".join(f"  - {r}" for r in self.reasons)
        if not self.timing:
            return f"{self.candidate.id}: ACCEPTED (verified; untimed on this machine)"
        times = ", ".join(f"{k}: {v['median_ms'] * 1e3:.1f} us" for k, v in self.timing.items())
        return f"{self.candidate.id}: ACCEPTED, median {times}"


@dataclass
class RoundContext:
    round: int
    rounds: int
    target: Target
    previous: list[Outcome]  # the last round's outcomes (empty in round 1)
    baseline: dict  # shape key -> built-in kernel's timing (GPU) or {}
    best: dict  # shape key -> (Outcome, timing entry) so far


FENCE = r"```[^\S\n]*(?:[\w+.-]+[^\S\n]*)?\n"  # a block's opening line, whatever its info string (python3, Python)
CODE_BLOCK = re.compile(FENCE + r"(.*?)```", re.DOTALL)
DEFINES_LAUNCH = re.compile(r"^def launch\(", re.MULTILINE)


def extract_code(reply: str) -> str:
    """The Python file in a model's reply: the longest fenced block (```python ... ```, whatever its info
    string) that defines ``launch`` (a top-level ``def launch(``), else the longest block, else the reply."""
    blocks = CODE_BLOCK.findall(reply)
    if not blocks:
        open_block = re.search(FENCE + r"(.*)$", reply, re.DOTALL)  # an answer cut off by max_tokens
        return (open_block.group(1) if open_block else reply).strip() + "\n"
    with_launch = [b for b in blocks if DEFINES_LAUNCH.search(b)]
    return max(with_launch or blocks, key=len).strip() + "\n"
