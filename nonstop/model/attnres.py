"""Block attention residuals (Kimi K3): each sublayer reads a softmax mix over depth.

Sources v_s [d] (the embedding, completed block sums, the running intra-block partial sum) are mixed
with a learned query w = γ ⊙ p (the checkpoint's ``*_res_norm.weight`` γ [d] and ``*_res_proj.weight`` p [1, d]):
  logit_s = ⟨w, v_s⟩ / sqrt(mean(v_s²) + eps)         (the score of RMSNorm(v_s; γ) against p)
  α = softmax_s(logit);  out = Σ_s α_s v_s             (mix the raw, un-normalised sources)
in fp32, each row on its own (no matrix product across rows, sources on the last axes), so a row's
result does not depend on how many rows the step holds. Blocks close every ``attn_res_block_size``
layers; see ``stack.py`` for the bookkeeping.
"""

from __future__ import annotations

import torch


def attn_res_mix(sources: list[torch.Tensor], query: torch.Tensor, eps: float) -> torch.Tensor:
    """sources: S tensors [..., d]; query w [d] -> [..., d] in the sources' dtype."""
    if len(sources) == 1:
        return sources[0]
    v = torch.stack(sources, dim=-2).float()  # [..., S, d]
    inv_rms = torch.rsqrt(v.pow(2).mean(-1) + eps)
    logits = (v * query.float()).sum(-1) * inv_rms  # [..., S]
    alpha = torch.softmax(logits, dim=-1)
    return (alpha[..., None] * v).sum(-2).to(sources[0].dtype)


def attn_res_query(norm_weight: torch.Tensor, proj_weight: torch.Tensor) -> torch.Tensor:
    """w = γ ⊙ p from ``*_res_norm.weight`` γ [d] and ``*_res_proj.weight`` p [1, d]."""
    return norm_weight * proj_weight[0]
