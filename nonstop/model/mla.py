"""Multi-head latent attention (DeepSeek-V2/V3, Kimi K2, Kimi Linear, Kimi K3).

Per token x [d] (after the layer's input norm), with N heads, P = qk_nope, R = qk_rope, V = v_head,
Lkv = kv_lora_rank:
  q      = W_q x                      or  W_qb RMSNorm(W_qa x)         -> [N, P+R] = [q_nope | q_pe]
  [c|kr] = W_kva x ;  c = RMSNorm(c)                                   c: [Lkv], k_pe: [R] shared by heads
  RoPE (if enabled) rotates q_pe and k_pe; NoPE models keep them unrotated but still score them.
  score_h(s) = scale · (q_nope,h · W_UK,h c_s + q_pe,h · k_pe(s)),     kv_b_proj rows per head = [W_UK (P); W_UV (V)]
  o_h = Σ_s softmax(score_h)_s · W_UV,h c_s
  K3 gated MLA: o ← o ⊙ σ(W_g x) per channel;  out = W_o concat_h o_h.
The cache holds [c | k_pe] (Lkv + R values) per token. Decode uses the weight-absorbed form
(q̃ = W_UKᵀ q_nope, attend over c directly, W_UV after), which equals the naive expanded form.
"""

from __future__ import annotations

import torch
from torch import nn

from nonstop.cache.state import LatentCache, StepBatch
from nonstop.config import MLAConfig
from nonstop.model.attention import attention_probs
from nonstop.model.linear import Linear
from nonstop.model.norms import RMSNorm
from nonstop.model.rope import Rotary
from nonstop.model.rows import many_rows, per_query, per_token


def split_kv_b(kv_b: torch.Tensor, cfg: MLAConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_b_proj.weight [N·(P+V), Lkv] -> W_UK [N, P, Lkv], W_UV [N, V, Lkv]."""
    w = kv_b.view(cfg.num_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)
    return w[:, : cfg.qk_nope_head_dim], w[:, cfg.qk_nope_head_dim :]


def mla_attend_naive(q_nope, q_pe, latent, k_pe, kv_b, mask, cfg: MLAConfig) -> torch.Tensor:
    """Expanded MLA: up-project every cached latent to per-head keys/values, then attend.

    q_nope [B,T,N,P], q_pe [B,T,N,R], latent [B,S,Lkv], k_pe [B,S,R], kv_b [N(P+V), Lkv],
    mask [B,T,S] bool -> o [B,T,N,V] (fp32).
    """
    w_uk, w_uv = split_kv_b(kv_b.float(), cfg)
    k_nope = torch.einsum("bsl,npl->bsnp", latent.float(), w_uk)
    values = torch.einsum("bsl,nvl->bsnv", latent.float(), w_uv)
    scores = torch.einsum("btnp,bsnp->bnts", q_nope.float(), k_nope)
    scores = scores + torch.einsum("btnr,bsr->bnts", q_pe.float(), k_pe.float())
    probs = attention_probs(scores * cfg.softmax_scale, mask)
    return torch.einsum("bnts,bsnv->btnv", probs, values)


def absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """q̃_h = W_UK,hᵀ q_nope,h: q_nope [..., N, P], W_UK [N, P, Lkv] -> [..., N, Lkv] (fp32)."""
    if q_nope.dim() == 4 and many_rows(q_nope):
        return per_token(lambda q: absorb_query(q, w_uk), q_nope)
    return torch.einsum("...np,npl->...nl", q_nope.float(), w_uk.float())


def latent_attention(q_lat, q_pe, latent, k_pe, mask, scale: float) -> torch.Tensor:
    """Attention of absorbed queries over the cached latents (one shared MQA head of dim Lkv + R whose
    value is the latent): q_lat [B,T,N,Lkv], q_pe [B,T,N,R], latent [B,S,Lkv], k_pe [B,S,R], mask [B,T,S]
    -> attended latent [B,T,N,Lkv] (fp32)."""
    if many_rows(q_lat):
        return per_query(latent_attention, (q_lat, q_pe), (latent, k_pe), mask, scale)
    scores = torch.einsum("btnl,bsl->bnts", q_lat.float(), latent.float())
    scores = scores + torch.einsum("btnr,bsr->bnts", q_pe.float(), k_pe.float())
    probs = attention_probs(scores * scale, mask)
    return torch.einsum("bnts,bsl->btnl", probs, latent.float())


def unabsorb_output(o_lat: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """o_h = W_UV,h ō_h: o_lat [..., N, Lkv], W_UV [N, V, Lkv] -> [..., N, V] (fp32)."""
    if o_lat.dim() == 4 and many_rows(o_lat):
        return per_token(lambda o: unabsorb_output(o, w_uv), o_lat)
    return torch.einsum("...nl,nvl->...nv", o_lat.float(), w_uv.float())


def mla_attend_absorbed(q_nope, q_pe, latent, k_pe, kv_b, mask, cfg: MLAConfig) -> torch.Tensor:
    """Weight-absorbed MLA (decode form): absorb W_UK into the query, attend over the latents, apply
    W_UV after. Same shapes and result as the naive form."""
    w_uk, w_uv = split_kv_b(kv_b, cfg)
    o_lat = latent_attention(absorb_query(q_nope, w_uk), q_pe, latent, k_pe, mask, cfg.softmax_scale)
    return unabsorb_output(o_lat, w_uv)


class MLAAttention(nn.Module):
    """MLA with optional q-LoRA, RoPE or NoPE, and the K3 sigmoid output gate."""

    def __init__(self, cfg: MLAConfig, hidden: int, rotary: Rotary | None):
        super().__init__()
        self.cfg = cfg
        self.rotary = rotary
        N, P, R, V = cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        if cfg.q_lora_rank is None:
            self.q_proj = Linear(hidden, N * (P + R))
        else:
            self.q_a_proj = Linear(hidden, cfg.q_lora_rank)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.lora_norm_eps)
            self.q_b_proj = Linear(cfg.q_lora_rank, N * (P + R))
        self.kv_a_proj_with_mqa = Linear(hidden, cfg.kv_lora_rank + R)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.lora_norm_eps)
        self.kv_b_proj = Linear(cfg.kv_lora_rank, N * (P + V))
        self.o_proj = Linear(N * V, hidden)
        if cfg.output_gate:
            self.g_proj = Linear(hidden, N * V)
        self.absorbed: bool | None = None  # None: naive for prefill (T > 1), absorbed for decode

    def project(self, x: torch.Tensor, batch: StepBatch):
        """x [B,T,d] -> q_nope [B,T,N,P], q_pe [B,T,N,R], latent [B,T,Lkv], k_pe [B,T,R] (rotated if RoPE)."""
        c = self.cfg
        B, T, _ = x.shape
        if c.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(B, T, c.num_heads, c.qk_head_dim)
        q_nope, q_pe = q[..., : c.qk_nope_head_dim], q[..., c.qk_nope_head_dim :]
        kv = self.kv_a_proj_with_mqa(x)
        latent = self.kv_a_layernorm(kv[..., : c.kv_lora_rank])
        k_pe = kv[..., c.kv_lora_rank :]
        if self.rotary is not None:
            cos, sin = self.rotary.cos_sin(batch.positions)
            q_pe = self.rotary(q_pe, cos[:, :, None], sin[:, :, None])
            k_pe = self.rotary(k_pe, cos, sin)
        return q_nope, q_pe, latent, k_pe

    def output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """o [B,T,N,V] (fp32) -> o_proj(gate ⊙ o) [B,T,d]."""
        B, T = x.shape[:2]
        o = o.reshape(B, T, -1)
        if self.cfg.output_gate:
            o = o * torch.sigmoid(self.g_proj(x).float())
        return self.o_proj(o.to(x.dtype))

    def forward(self, x: torch.Tensor, batch: StepBatch, cache: LatentCache | None) -> torch.Tensor:
        c = self.cfg
        q_nope, q_pe, latent, k_pe = self.project(x, batch)
        if cache is not None:
            cache.write(batch, latent=torch.cat([latent, k_pe], dim=-1))
            cached = cache.read(batch, "latent")
            latent, k_pe = cached[..., : c.kv_lora_rank], cached[..., c.kv_lora_rank :]
        mask = batch.attention_mask(latent.shape[1])
        absorbed = self.absorbed if self.absorbed is not None else batch.decode_form
        attend = mla_attend_absorbed if absorbed else mla_attend_naive
        o = attend(q_nope, q_pe, latent, k_pe, self.kv_b_proj.weight, mask, c)
        return self.output(o, x)
