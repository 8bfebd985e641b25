"""Verification of a draft block against the target's logits: which tokens a request emits.

The target ran the T = k+1 rows [x, d_1..d_k] (x = the last emitted token); row i of its logits is
the target's distribution for the token after d_i (row 0: after x). Both rules emit between 1 and
k+1 tokens and never change what plain decoding would produce:

* greedy: accept d_i while d_i = argmax(row i-1); then emit argmax of the first row not matched
  (a correction) or of row k when all k were accepted (the bonus token). The argmax is the one plain
  decoding takes (``sampling.sample``), so the tokens are exactly plain greedy decoding's.
* sampling (Leviathan et al. 2023; Chen et al. 2023): with p_i = the target's sampling distribution
  of row i (temperature, top-k, top-p applied) and q_i the distribution d_i was drawn from (one-hot
  for a deterministic drafter), accept d_i with probability min(1, p_{i-1}(d_i) / q_i(d_i)); at the
  first rejection emit a draw from norm(max(0, p_{i-1} - q_i)) and stop; if all are accepted emit a
  bonus draw from p_k. Every emitted token is then distributed exactly as under plain sampling.
"""

from __future__ import annotations

import torch

from nonstop.engine.sampling import SamplingParams, sample, sampling_probs


def greedy_verify(draft: list[int], logits: torch.Tensor) -> list[int]:
    """draft [k] token ids, target logits [>= k+1, V] (fp32) -> the emitted tokens (1..k+1)."""
    out: list[int] = []
    for i, d in enumerate(draft):
        if int(logits[i].argmax()) != d:
            break
        out.append(d)
    out.append(int(logits[len(out)].argmax()))
    return out


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) [V]; p itself if the residual has no mass (p = q up to rounding)."""
    r = (p - q).clamp_min(0)
    total = r.sum()
    return r / total if float(total) > 0 else p


def sample_verify(
    draft: list[int], draft_probs: torch.Tensor | None, target_probs: torch.Tensor, generator: torch.Generator | None
) -> list[int]:
    """The exact speculative-sampling rule.

    draft [k]; draft_probs q [k, V] (the distribution each d_i was drawn from) or None for a
    deterministic drafter (q_i = one-hot(d_i)); target_probs p [>= k+1, V]; generator: the request's
    RNG (CPU). Returns the emitted tokens (accepted drafts, then one corrected or bonus token).
    """
    out: list[int] = []
    for i, d in enumerate(draft):
        p = target_probs[i]
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, d])
        u = float(torch.rand((), generator=generator))
        if u * q_d < float(p[d]):  # u < p(d) / q(d), without dividing by a zero q(d)
            out.append(d)
            continue
        q = torch.zeros_like(p) if draft_probs is None else draft_probs[i].to(p.dtype)
        if draft_probs is None:
            q[d] = 1.0
        out.append(int(torch.multinomial(residual_distribution(p, q), 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(target_probs[len(draft)], 1, generator=generator)))
    return out


def verify(
    draft: list[int],
    draft_probs: torch.Tensor | None,
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> list[int]:
    """Emitted tokens for one request: ``greedy_verify`` at temperature 0, else ``sample_verify``
    against the request's sampling distribution of each row. logits [>= k+1, V] fp32."""
    if params.greedy:
        if not draft:
            return [sample(logits[0], params, generator)]
        return greedy_verify(draft, logits)
    rows = len(draft) + 1
    target = torch.stack([sampling_probs(logits[i].float().cpu(), params) for i in range(rows)])
    return sample_verify(draft, draft_probs, target, generator)
