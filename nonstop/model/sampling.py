"""The sampling math, once: which tokens a sampled step may pick and with what weight.

Everything works on one row of logits l [V]. ``filter_logits`` gives x [V] (float64) with
softmax(x) the distribution to draw from; ``penalize`` adjusts l for repetition, presence and
frequency before that. The host sampler (``engine/sampling``), the speculative verifier, the
``sample`` super-op's twin (``program/reference``) and its Triton kernel all use this definition.

Numerics: x_i = (l_i - max l) / temperature in float64. Subtracting the maximum first keeps every x
finite or -inf for any finite temperature > 0 (1e-300 included: all but the largest logits go to
-inf, which is the greedy limit), and masses are summed in float64, so any top_p or min_p in (0, 1]
keeps at least the most likely token. Nothing here can produce a NaN from finite logits.
"""

from __future__ import annotations

import math

import torch


def filter_logits(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float = 0.0
) -> torch.Tensor:
    """logits [V] -> x [V] float64: (l - max l) / temperature on the kept tokens, -inf elsewhere.

    Kept, in this order (the order vLLM applies them; top-k and min-p commute):
      top-k:  tokens whose tempered logit is >= the k-th largest (ties at the k-th value all kept);
      min-p:  p_i >= min_p · max_j p_j, i.e. x_i >= log(min_p) (x is max-shifted);
      top-p:  on the distribution renormalised over what is left, the smallest prefix of the stable
              descending order (ties: lowest id first, like the device sampler) whose mass reaches
              top_p: a token is dropped when the mass strictly above it is already >= top_p.
    ``top_k <= 0``, ``top_p >= 1`` and ``min_p <= 0`` switch those filters off.
    """
    wide = logits.double()
    x = (wide - wide.max()) / temperature
    if 0 < top_k < x.shape[-1]:
        kth = torch.topk(x, top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if min_p > 0:
        x = x.masked_fill(x < math.log(min_p), float("-inf"))
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True, stable=True)
        probs = torch.softmax(sorted_x, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass strictly above each token
        x = x.scatter(0, order, sorted_x.masked_fill(before >= top_p, float("-inf")))
    return x


def gumbel_max(x: torch.Tensor, seed: int, offset: int) -> int:
    """The Gumbel-max draw argmax_{i: x_i finite} (x_i + g_i) from x [V] (``filter_logits``' output), with g the
    Philox noise of key ``seed`` at counter ``offset`` (``philox.gumbel_noise``): an exact draw from
    softmax(x) over its finite entries, fixed by (seed, offset) alone. The device sampler
    (``kernels/sample.py``) draws the same token. The noise is drawn only where the winner can be: g lies in
    [GUMBEL_MIN, GUMBEL_MAX], so an entry below max x + GUMBEL_MIN - GUMBEL_MAX never wins (first index on
    ties, as a full argmax)."""
    from nonstop.model.philox import GUMBEL_MAX, GUMBEL_MIN, gumbel_noise, gumbel_noise_at

    finite = torch.isfinite(x)
    if not bool(finite.any()):
        return 0  # nothing to draw from (NaN or -inf everywhere): the full argmax's first index
    reach = float(x[finite].max()) + GUMBEL_MIN - GUMBEL_MAX - 1e-3  # a margin for fp32 rounding of x + g
    index = torch.nonzero(finite & (x >= reach))[:, 0]
    if 4 * index.numel() > x.shape[-1]:  # a flat row: the whole vocabulary's noise costs less than picking
        noise = gumbel_noise(seed, offset, x.shape[-1])[index.cpu()].to(x.device)
    else:
        noise = gumbel_noise_at(seed, offset, index).to(x.device)
    return int(index[(x[index] + noise).argmax()])


def penalize(
    logits: torch.Tensor,
    seen_ids: torch.Tensor,
    output_ids: torch.Tensor,
    output_counts: torch.Tensor,
    repetition: float = 1.0,
    presence: float = 0.0,
    frequency: float = 0.0,
) -> torch.Tensor:
    """logits [V] -> penalised logits [V] (a copy, same dtype), as vLLM and transformers define them:

      repetition r (tokens of the prompt or the output so far, ``seen_ids``):
          l_t <- l_t / r  if l_t > 0  else  l_t · r
      presence a, frequency f (tokens of the output so far, ``output_ids`` with ``output_counts`` c_t):
          l_t <- l_t - a - f · c_t

    seen_ids, output_ids: int64 [S], [O] distinct token ids; output_counts [O] (occurrences).
    r = 1, a = f = 0 leave the logits unchanged.

    A penalised logit that overflows the dtype upwards (a tiny r divides, a negative a or f adds) is held
    at the dtype's largest finite value: +inf would reach the sampler as an infinite probability
    (NaN after softmax). Overflow downwards, to -inf, is left: that token is never picked, the limit.
    """
    out = logits.clone()
    top = torch.finfo(out.dtype).max
    if repetition != 1.0 and seen_ids.numel():
        vals = out[seen_ids]
        vals = torch.where(vals > 0, vals / repetition, vals * repetition)
        out[seen_ids] = vals.clamp(max=top)
    if (presence or frequency) and output_ids.numel():
        vals = out[output_ids] - (presence + frequency * output_counts.to(out.dtype)).to(out.dtype)
        out[output_ids] = vals.clamp(max=top)
    return out
