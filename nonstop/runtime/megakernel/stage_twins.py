"""Plain-torch twins of the stages a megakernel tiling adds inside one super-op.

Most kinds run as one stage whose twin is the op's own (``program/reference.py``). Kinds split into
stages, or whose tiles add partial sums, get a twin per stage here (same math, from ``nonstop/model``):
  mlp/gate_up        act = glu(x̂ W_gateᵀ, x̂ W_upᵀ)                 -> scratch mlp_act_{I}
  mlp/down           target (+)= act W_downᵀ
  mla_attn/split     per row, head and KV split s: (m, l, Σ p c) over the split's visible keys
                     (m = max score, l = Σ e^{score-m})            -> scratch mla_partial
  mla_attn/combine   M = max_s m_s; ō = Σ_s e^{m_s-M} acc_s / Σ_s e^{m_s-M} l_s; out = (W_UV ō) ⊙ σ(g)
  moe_experts        tile (slot, chunk): the contribution of the slot-th distinct selected expert over
                     its intermediate chunk (``tile_delta``; the simulator adds it at the tile's end)
Twins take ``(op, env, task, schedule)``; ``env`` is a ``program.reference.StepEnv``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nonstop.model.activations import glu
from nonstop.model.mla import unabsorb_output
from nonstop.model.mlp import gated_mlp
from nonstop.model.moe import select_experts
from nonstop.program.reference import REFERENCE, emit, op_input


def mlp_act_name(op) -> str:
    return f"mlp_act_{op.weights['gate'].shape[0]}"


def mlp_gate_up(op, env, task, s) -> None:
    x = op_input(op, env)
    a = op.attrs
    gate = F.linear(x, op.weights["gate"], op.weights.get("gate_b"))
    up = F.linear(x, op.weights["up"], op.weights.get("up_b"))
    env.buf[mlp_act_name(op)].copy_(glu(gate, up, a["act"], a["beta"], a["linear_beta"]))


def mlp_down(op, env, task, s) -> None:
    emit(op, env, F.linear(env.buf[mlp_act_name(op)], op.weights["down"], op.weights.get("down_b")))


def _mla_dims(op, env):
    a = op.attrs
    return env.B, env.T, a["heads"], a["kv_lora"], a["rope"]


def mla_split(op, env, task, s) -> None:
    B, T, N, L, Rr = _mla_dims(op, env)
    cfg = s.config
    cached = env.cache.layers[op.attrs["cache_layer"]].read(env.batch, "latent").float()
    latent, k_pe = cached[..., :L], cached[..., L:]
    q_lat = env.seq(env.buf[op.reads[0]]).view(B, T, N, L).float()
    q_pe = env.seq(env.buf[op.reads[1]]).view(B, T, N, Rr).float()
    scores = torch.einsum("btnl,bsl->btns", q_lat, latent) + torch.einsum("btnr,bsr->btns", q_pe, k_pe)
    scores = scores * op.attrs["scale"]
    keys = torch.arange(latent.shape[1])
    visible = env.batch.attention_mask(latent.shape[1])
    out = torch.zeros(B, T, cfg.attn_splits, N, L + 2)
    for split in range(cfg.attn_splits):
        inside = visible & (keys >= split * cfg.attn_split) & (keys < (split + 1) * cfg.attn_split)
        sc = scores.masked_fill(~inside[:, :, None, :], float("-inf"))
        m = sc.max(dim=-1).values
        p = torch.exp(sc - torch.where(torch.isinf(m), torch.zeros_like(m), m)[..., None])
        out[:, :, split, :, 0] = m
        out[:, :, split, :, 1] = p.sum(-1)
        out[:, :, split, :, 2:] = torch.einsum("btns,bsl->btnl", p, latent)
    env.buf["mla_partial"].copy_(out.view(B * T, -1))


def mla_combine(op, env, task, s) -> None:
    B, T, N, L, Rr = _mla_dims(op, env)
    part = env.buf["mla_partial"].view(B, T, s.config.attn_splits, N, L + 2)
    m, den, acc = part[..., 0], part[..., 1], part[..., 2:]
    top = m.max(dim=2, keepdim=True).values
    w = torch.where(torch.isinf(m), torch.zeros_like(m), torch.exp(m - top))
    o = (acc * w[..., None]).sum(2) / (den * w).sum(2)[..., None]
    o = unabsorb_output(o, op.weights["w_uv"]).reshape(B * T, -1)
    if op.attrs["gated"]:
        o = o * torch.sigmoid(env.buf[op.reads[2]].float())
    env.buf[op.writes[0]].copy_(o)


def moe_tile_delta(op, env, task, s) -> None:
    """env's moe_out (zeroed by the caller) <- this tile's share of Σ_k p_k E_k(moe_in)."""
    a = op.attrs
    mc = a["moe"]
    bn = s.config.block("moe_experts")
    chunks = -(-mc.intermediate_size // bn)
    slot, j = divmod(task.tile, chunks)
    lo, hi = j * bn, min((j + 1) * bn, mc.intermediate_size)
    weights, ids = select_experts(env.buf[op.reads[0]], op.weights["bias"], mc)
    chosen = torch.unique(ids)
    if slot >= chosen.numel():
        return
    e = int(chosen[slot])
    rows, k = torch.nonzero(ids == e, as_tuple=True)
    x = env.buf[op.reads[1]]
    w1, w3, w2 = (a["experts"].weight(n, e, x.dtype) for n in ("w1", "w3", "w2"))
    y = gated_mlp(x[rows], w1[lo:hi], w3[lo:hi], w2[:, lo:hi], a["act"], a["beta"], a["linear_beta"])
    env.buf[op.writes[0]].index_add_(0, rows, y.float() * weights[rows, k, None])


STAGE_TWINS = {
    ("mlp", "gate_up"): mlp_gate_up,
    ("mlp", "down"): mlp_down,
    ("mla_attn", "split"): mla_split,
    ("mla_attn", "combine"): mla_combine,
    ("moe_experts", "main"): moe_tile_delta,
}


def stage_twin(kind: str, stage: str):
    """The twin of a (kind, stage): a stage twin above, else the op's reference twin."""
    if (kind, stage) in STAGE_TWINS:
        return STAGE_TWINS[(kind, stage)]
    twin = REFERENCE[kind]
    return lambda op, env, task, s: twin(op, env)
