"""Prompt-lookup n-gram drafting (no model): find the latest earlier occurrence of the sequence's
last n tokens (n from ``max_n`` down to ``min_n``) and propose the k tokens that followed it."""

from __future__ import annotations

from nonstop.engine.speculative.drafter import Draft


def lookup(ids: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """Up to k tokens that followed the latest earlier match of ids' last n tokens (longest n first).

    ids [L]; a match at i means ids[i:i+n] == ids[L-n:] with i + n < L (an earlier occurrence), and
    proposes ids[i+n : i+n+k]. Returns [] when no suffix of length >= min_n recurs.
    """
    L = len(ids)
    if k <= 0:
        return []
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = ids[L - n :]
        first = suffix[0]
        for i in range(L - n - 1, -1, -1):  # latest match first
            if ids[i] == first and ids[i : i + n] == suffix:
                return ids[i + n : i + n + k]
    return []


class NgramDrafter:
    """Prompt lookup over the request's prompt and output. Deterministic drafts (one-hot q)."""

    taps: tuple[int, ...] = ()

    def __init__(self, max_n: int = 4, min_n: int = 2):
        for name, value in (("max_n", max_n), ("min_n", min_n)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"n-gram size {name} must be an integer, got {type(value).__name__} {value!r}")
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.max_n, self.min_n = max_n, min_n

    def start(self, req) -> None:
        pass

    def observe(self, req, hidden: dict) -> None:
        pass

    def propose(self, req, k: int) -> Draft:
        return Draft(lookup(req.all_ids, k, self.max_n, self.min_n))
