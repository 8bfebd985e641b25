"""What every drafter offers the speculative step.

A drafter proposes up to k tokens to follow a request's emitted tokens; the target then verifies
them in one step (``verify.py``). Per-request drafter state lives in ``request.draft_state``.

    taps                        target layers whose residual stream the drafter reads (() = none)
    start(req)                  a request entered the engine
    observe(req, hidden)        hidden {tap: [n, d]} of the next n positions the target committed
    propose(req, k) -> Draft    up to k tokens following req.all_ids
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Draft:
    """tokens: the proposed ids (possibly none); probs [len(tokens), V]: the distribution each token
    was drawn from, or None when the drafter is deterministic (one-hot, e.g. n-gram or greedy DSpark)."""

    tokens: list[int]
    probs: torch.Tensor | None = None

    @staticmethod
    def empty() -> Draft:
        return Draft([])
