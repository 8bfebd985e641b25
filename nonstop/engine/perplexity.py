"""Perplexity of a token sequence under a model: whole-window forwards, no cache.

The ids x_0 .. x_N are cut into windows of ``context + 1`` ids that overlap by one id, so that
every id after the first is predicted exactly once, from the ids before it in its window:
  window k = x[k·C .. k·C + C],  NLL_k = Σ_t -log p(x_{k·C+t+1} | x_{k·C} .. x_{k·C+t}),  t = 0..C-1
  mean NLL = Σ_k NLL_k / N   (nats),   perplexity = exp(mean NLL).
Full windows run ``batch_size`` at a time; the shorter last window runs alone. A forward of B windows
of C tokens holds B·C·V fp32 logits twice (the logits and their log-softmax): ``largest_forward`` and
``logits_bytes`` say how much the largest one needs, for a check before scoring starts.

``leading_token_ids`` finds the first ids of a long text by reading and tokenizing only a prefix of it, so
that scoring a few tokens of a large file neither waits for the whole file to be tokenized nor holds it all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

SCORING_LOGIT_COPIES = 2  # a forward's fp32 logits and the log-softmax that cross_entropy makes of them
FIRST_PREFIX_CHARS_PER_ID = 6  # the first prefix tried: this many characters for each id wanted (~4 in English)
MIN_PREFIX_CHARS = 4096


def leading_token_ids(
    encode: Callable[[str], list[int]],
    text: str | Callable[[int | None], tuple[str, bool]],
    count: int | None = None,
    announce: Callable[[int, int | None], None] | None = None,
) -> tuple[list[int], bool]:
    """(ids, whole). whole True: ids is ``encode(text)``, the text encoded whole (``count`` None, or the
    prefixes below reached its end). whole False: ids are the first ``count`` ids of ``encode(text)``, found
    by encoding prefixes of ``text`` only. The ids near the end of a prefix may differ from the whole text's
    (a word cut in two), the ids well before it do not: the prefix doubles until two successive prefixes agree
    on their first ``count`` ids. ``text`` is the text, or ``read(n)`` -> (its first ``n`` characters, all
    of them when ``n`` is None; whether that is the whole text), so that a file is read no further than the
    prefixes need. ``announce(chars, total)`` is called before each encoding of ``chars`` characters of the
    text's ``total`` (None where the text is read by prefixes and not read to its end)."""
    if isinstance(text, str):
        total: int | None = len(text)
        read = lambda n: (text[:n], n is None or n >= len(text))  # noqa: E731 - the text as a reader
    else:
        total, read = None, text
    if count is not None:
        size = max(MIN_PREFIX_CHARS, FIRST_PREFIX_CHARS_PER_ID * count)
        before: list[int] | None = None
        while True:
            prefix, whole = read(size)
            if whole:
                break
            if announce is not None:
                announce(size, total)
            ids = encode(prefix)
            if before is not None and len(before) >= count and before[:count] == ids[:count]:
                return ids[:count], False
            before, size = ids, 2 * size
    else:
        prefix, _ = read(None)
    if announce is not None:
        announce(len(prefix), len(prefix))
    return encode(prefix), True


@dataclass(frozen=True)
class PerplexityResult:
    tokens: int  # ids scored (all but the first)
    total_nll: float  # nats

    @property
    def mean_nll(self) -> float:
        return self.total_nll / self.tokens

    @property
    def perplexity(self) -> float:
        """exp(mean NLL); inf past what a float holds (a mean above ~709.78 nats, a broken checkpoint)."""
        try:
            return math.exp(self.mean_nll)
        except OverflowError:
            return math.inf


def _windows(ids: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """ids [N+1] -> (full windows [W, C+1], last partial window [1, L] or None)."""
    n = ids.numel() - 1
    full = n // context
    idx = torch.arange(full)[:, None] * context + torch.arange(context + 1)[None, :]
    rest = ids[full * context :]
    return ids[idx], (rest[None] if rest.numel() > 1 else None)


def largest_forward(tokens: int, context: int, batch_size: int) -> tuple[int, int]:
    """(windows, tokens per window) of the largest forward ``score_token_ids`` runs to score ``tokens`` ids
    (``tokens`` + 1 given) in windows of ``context``, ``batch_size`` windows at a time; (0, 0) for no ids."""
    window = min(context, tokens)
    if window < 1:
        return 0, 0
    return min(batch_size, tokens // window), window


def logits_bytes(windows: int, window: int, vocab: int) -> int:
    """Bytes a forward over ``windows`` windows of ``window`` tokens holds for its fp32 logits over ``vocab``
    ids and their log-softmax (``window_nll``), before anything else it allocates."""
    return SCORING_LOGIT_COPIES * 4 * windows * window * vocab


@torch.no_grad()
def window_nll(model, windows: torch.Tensor) -> float:
    """Σ -log p over windows [B, L] (targets windows[:, 1:]) with one cache-free forward (fp64 sum)."""
    logits = model(windows[:, :-1])
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), windows[:, 1:].reshape(-1), reduction="sum")
    return float(nll.double())


def score_token_ids(
    model,
    ids,
    context: int = 512,
    batch_size: int = 4,
    max_tokens: int | None = None,
    device=None,
    progress: Callable[[int, int], None] | None = None,
) -> PerplexityResult:
    """Perplexity of ``ids`` (a list or 1-D tensor of ≥ 2 ids) under ``model`` (a ``CausalLM``:
    input_ids [B, T] -> logits [B, T, V]); at most ``max_tokens`` ids are scored. ``progress(scored, total)``
    is called after each forward."""
    if context < 1:
        raise ValueError(f"context must be positive, got {context}")
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    if max_tokens is not None:
        ids = ids[: max_tokens + 1]
    if ids.numel() < 2:
        raise ValueError(f"need at least 2 tokens to score, got {ids.numel()}")
    if device is not None:
        ids = ids.to(device)
    n = ids.numel() - 1
    full, last = _windows(ids.cpu(), min(context, n))
    total = 0.0
    for start in range(0, len(full), batch_size):
        total += window_nll(model, full[start : start + batch_size].to(ids.device))
        if progress is not None:
            progress(min(start + batch_size, len(full)) * min(context, n), n)
    if last is not None:
        total += window_nll(model, last.to(ids.device))
        if progress is not None:
            progress(n, n)
    return PerplexityResult(tokens=n, total_nll=total)
