"""Softmax attention over cached keys, and the GQA (Llama) attention layer."""

from __future__ import annotations

import torch
from torch import nn

from nonstop.cache.state import KVCache, StepBatch
from nonstop.config import GQAConfig
from nonstop.model.linear import Linear
from nonstop.model.rope import Rotary
from nonstop.model.rows import many_rows, per_query


def attention_probs(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax over the last dim of fp32 ``scores`` [B, H, T, S] where ``mask`` [B, T, S] is True."""
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    return torch.softmax(scores, dim=-1)


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """o = softmax(scale · q kᵀ, masked) v, key/value heads shared by H/Hkv query heads.

    q: [B, T, H, D]; k: [B, S, Hkv, D]; v: [B, S, Hkv, Dv]; mask: [B, T, S] bool -> [B, T, H, Dv] (q.dtype).
    Scores and softmax in fp32. In ``row_exact()`` mode one query row at a time over its visible keys.
    """
    if many_rows(q):
        return per_query(gqa_attention, (q,), (k, v), mask, scale)
    B, T, H, D = q.shape
    Hkv = k.shape[2]
    qg = q.float().view(B, T, Hkv, H // Hkv, D)
    scores = torch.einsum("btgrd,bsgd->bgrts", qg, k.float()).reshape(B, H, T, -1) * scale
    probs = attention_probs(scores, mask).view(B, Hkv, H // Hkv, T, -1)
    out = torch.einsum("bgrts,bsgd->btgrd", probs, v.float())
    return out.reshape(B, T, H, v.shape[-1]).to(q.dtype)


class GQAAttention(nn.Module):
    """Llama attention: q/k/v projections, RoPE on q and k, grouped-query softmax attention, o_proj."""

    def __init__(self, cfg: GQAConfig, hidden: int, rotary: Rotary):
        super().__init__()
        self.cfg = cfg
        self.rotary = rotary
        H, Hkv, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = Linear(hidden, H * D, cfg.bias)
        self.k_proj = Linear(hidden, Hkv * D, cfg.bias)
        self.v_proj = Linear(hidden, Hkv * D, cfg.bias)
        self.o_proj = Linear(H * D, hidden, cfg.out_bias)

    def forward(self, x: torch.Tensor, batch: StepBatch, cache: KVCache | None) -> torch.Tensor:
        """x: [B, T, hidden] -> [B, T, hidden]; appends this step's k/v to ``cache`` when given."""
        B, T, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(B, T, c.num_heads, c.head_dim)
        k = self.k_proj(x).view(B, T, c.num_kv_heads, c.head_dim)
        v = self.v_proj(x).view(B, T, c.num_kv_heads, c.head_dim)
        cos, sin = self.rotary.cos_sin(batch.positions)
        q = self.rotary(q, cos[:, :, None], sin[:, :, None])
        k = self.rotary(k, cos[:, :, None], sin[:, :, None])
        if cache is not None:
            cache.write(batch, k=k, v=v)
            k, v = cache.read(batch, "k"), cache.read(batch, "v")
        mask = batch.attention_mask(k.shape[1])
        o = gqa_attention(q, k, v, mask, c.head_dim**-0.5)
        return self.o_proj(o.reshape(B, T, -1))
