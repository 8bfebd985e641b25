"""Plain-torch twins of the stages a kernel's tiling adds inside one super-op (for the simulator).

Most kinds run as one stage whose twin is the op's own (``program/reference.py``). The multi-phase kinds
(``nonstop.kernels.launch``) get a twin per phase here, writing the workspace layout their tiling
declares (``tiling/``), with the split lengths and block sizes of the op's launch (``Schedule.ops[i].args``):
  mlp/gate_up        h = glu(x̂ W_gateᵀ, x̂ W_upᵀ)                        -> ``mlp.h`` (row r at r·I)
  mlp/down           target (+)= h W_downᵀ
  gqa_attn/split     per row, head and split s: (m, l, Σ p v) over the split's visible keys -> cells of
                     ``gqa_attn.partial``; and the attention output (split 0 writes it when a sequence's
                     keys fit one split)
  gqa_attn/combine   M = max_s m_s; o = Σ_s e^{m_s-M} acc_s / Σ_s e^{m_s-M} l_s over the valid splits
  mla_attn/split     per row, head and split: (m, l, Σ p c) -> cells of ``mla_attn.partial``
  mla_attn/combine   the merge, W_UV, the output gate
  moe_experts/gate_up  per distinct selected expert (slot, id order): act = glu(z W1ᵀ, z W3ᵀ) for every row
                     -> ``moe_experts.act``; (expert, row weights) per slot -> ``moe_experts.route``
  moe_experts/down   moe_out = (Σ_slot p · (act W2ᵀ rounded to the model dtype)).to(model dtype)
  attnres_mix_norm/dots  per (row, column chunk): ⟨w, v_s⟩ and Σ v_s² of its columns -> ``attnres.dots``; the
                     block store
  attnres_mix_norm/mix   per (row, chunk): softmax over the row's summed cells, the chunk's mix -> x, Σ mix² ->
                     ``attnres.sq``
  attnres_mix_norm/norm  per (row, chunk): x's chunk normalised with the row's Σ mix²
  sample/scan        zeros into its cells of ``sample.partial`` (what the kernel's pick reads there is its own)
  sample/verify      zeros into its cells of ``sample.verify``
  sample/pick        the op's twin on the logits row (and 0 into ``sample.path``)
Twins take ``(op, env, task, schedule)``; ``env`` is a ``program.reference.StepEnv``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nonstop.model.activations import glu
from nonstop.model.mla import unabsorb_output
from nonstop.model.moe import select_experts
from nonstop.program.reference import REFERENCE, emit, op_input


def _args(s, task) -> dict:
    return s.ops[task.op].args


# ----------------------------------------------------------------------------- dense MLP


def _h(env, op) -> torch.Tensor:
    R, I = env.buf[op.reads[0]].shape[0], op.weights["gate"].shape[0]
    return env.buf["mlp.h"].view(-1)[: R * I].view(R, I)


def mlp_gate_up(op, env, task, s) -> None:
    x = op_input(op, env)
    a = op.attrs
    gate = F.linear(x, op.weights["gate"], op.weights.get("gate_b"))
    up = F.linear(x, op.weights["up"], op.weights.get("up_b"))
    _h(env, op).copy_(glu(gate, up, a["act"], a["beta"], a["linear_beta"]))


def mlp_down(op, env, task, s) -> None:
    emit(op, env, F.linear(_h(env, op).to(op.weights["down"].dtype), op.weights["down"], op.weights.get("down_b")))


# ----------------------------------------------------------------------------- split-KV attention


def _split_partials(
    scores: torch.Tensor, values: torch.Tensor, visible: torch.Tensor, split: int, NS: int
) -> torch.Tensor:
    """scores [B, T, H, S] fp32, values [B, S, H, Dv] fp32 (per head), visible [B, T, S] -> cells
    [B, T, NS, H, Dv + 2] = (max, denominator, Σ p·v) over each split's visible keys."""
    B, T, H, S = scores.shape
    keys = torch.arange(S)
    out = torch.zeros(B, T, NS, H, values.shape[-1] + 2)
    for sp in range(NS):
        inside = visible & (keys >= sp * split) & (keys < (sp + 1) * split)
        sc = scores.masked_fill(~inside[:, :, None, :], float("-inf"))
        m = sc.max(dim=-1).values
        p = torch.exp(sc - torch.where(torch.isinf(m), torch.zeros_like(m), m)[..., None])
        out[:, :, sp, :, 0] = m
        out[:, :, sp, :, 1] = p.sum(-1)
        out[:, :, sp, :, 2:] = torch.einsum("bths,bshd->bthd", p, values)
    return out


def _merge(cells: torch.Tensor) -> torch.Tensor:
    """cells [..., NS, H, Dv + 2] -> [..., H, Dv]: the softmax-weighted values of all splits."""
    m, den, acc = cells[..., 0], cells[..., 1], cells[..., 2:]
    top = m.max(dim=-2, keepdim=True).values
    w = torch.where(torch.isinf(m), torch.zeros_like(m), torch.exp(m - top))
    return (acc * w[..., None]).sum(-3) / (den * w).sum(-2)[..., None]


def gqa_split(op, env, task, s) -> None:
    a, args = op.attrs, _args(s, task)
    H, HKV, D = a["heads"], a["kv_heads"], a["head_dim"]
    cache = env.cache.layers[a["cache_layer"]]
    k, v = (cache.read(env.batch, n).float().repeat_interleave(H // HKV, dim=2) for n in ("k", "v"))  # [B, S, H, D]
    q = env.seq(env.buf[op.reads[0]]).view(env.B, env.T, H, D).float()
    scores = torch.einsum("bthd,bshd->bths", q, k) * D**-0.5
    cells = _split_partials(scores, v, env.batch.attention_mask(k.shape[1]), args["SPLIT"], args["NS"])
    env.buf["gqa_attn.partial"].view(env.B, env.T, args["NS"], H, D + 2).copy_(cells)
    REFERENCE["gqa_attn"](op, env)


def gqa_combine(op, env, task, s) -> None:
    a, args = op.attrs, _args(s, task)
    H, D = a["heads"], a["head_dim"]
    cells = env.buf["gqa_attn.partial"].view(env.B * env.T, args["NS"], H, D + 2)
    env.buf[op.writes[0]].copy_(_merge(cells).reshape(env.B * env.T, H * D))


def mla_split(op, env, task, s) -> None:
    a, args = op.attrs, _args(s, task)
    N, L, Rr = a["heads"], a["kv_lora"], a["rope"]
    cached = env.cache.layers[a["cache_layer"]].read(env.batch, "latent").float()
    latent, k_pe = cached[..., :L], cached[..., L:]
    q_lat = env.seq(env.buf[op.reads[0]]).view(env.B, env.T, N, L).float()
    q_pe = env.seq(env.buf[op.reads[1]]).view(env.B, env.T, N, Rr).float()
    scores = (torch.einsum("btnl,bsl->btns", q_lat, latent) + torch.einsum("btnr,bsr->btns", q_pe, k_pe)) * a["scale"]
    values = latent[:, :, None, :].expand(-1, -1, N, -1)
    cells = _split_partials(scores, values, env.batch.attention_mask(latent.shape[1]), args["SPLIT"], args["NS"])
    env.buf["mla_attn.partial"].view(env.B, env.T, args["NS"], N, L + 2).copy_(cells)


def mla_combine(op, env, task, s) -> None:
    a, args = op.attrs, _args(s, task)
    N, L = a["heads"], a["kv_lora"]
    cells = env.buf["mla_attn.partial"].view(env.B, env.T, args["NS"], N, L + 2)
    o = unabsorb_output(_merge(cells), op.weights["w_uv"]).reshape(env.B * env.T, -1)
    if a["gated"]:
        o = o * torch.sigmoid(env.buf[op.reads[2]].float())
    env.buf[op.writes[0]].copy_(o)


# ----------------------------------------------------------------------------- routed experts


def moe_gate_up(op, env, task, s) -> None:
    a, args = op.attrs, _args(s, task)
    x = env.buf[op.reads[1]]
    R, I, slots = x.shape[0], args["I"], args["slots"]
    weights, ids = select_experts(env.buf[op.reads[0]], op.weights["bias"], a["moe"])
    act = env.buf["moe_experts.act"].view(-1)[: slots * R * I].view(slots, R, I)
    route = env.buf["moe_experts.route"][:slots, : 1 + R]
    act.zero_()  # slots past the distinct experts: never written by the kernel, never read
    route.zero_()
    route[:, 0] = -1
    for slot, e in enumerate(torch.unique(ids).tolist()):
        w1, w3 = (a["experts"].weight(n, e, x.dtype) for n in ("w1", "w3"))
        act[slot] = glu(F.linear(x, w1), F.linear(x, w3), a["act"], a["beta"], a["linear_beta"])
        rows, k = torch.nonzero(ids == e, as_tuple=True)
        route[slot, 0] = e
        route[slot, 1 + rows] = weights[rows, k]


def moe_down(op, env, task, s) -> None:
    a, args = op.attrs, _args(s, task)
    x = env.buf[op.reads[1]]
    R, I, slots = x.shape[0], args["I"], args["slots"]
    act = env.buf["moe_experts.act"].view(-1)[: slots * R * I].view(slots, R, I)
    route = env.buf["moe_experts.route"][:slots, : 1 + R]
    out = torch.zeros(R, x.shape[1])
    for slot in range(slots):
        e = int(route[slot, 0])
        if e >= 0:
            y = F.linear(act[slot].to(x.dtype), a["experts"].weight("w2", e, x.dtype))
            out += route[slot, 1:, None] * y.float()
    env.buf[op.writes[0]].copy_(out.to(x.dtype))


# ----------------------------------------------------------------------------- attention-residual mix


def _attnres_tiles(op, env, task, s):
    """Per tile of an attnres stage (every tile: the simulator keeps a stage twin's run for all its tiles):
    (row, chunk, columns, the chunk of every source [n + 1, cols] fp32, cells [R, NCH, 2·BLOCK_S], sq [R, NCH])."""
    args = _args(s, task)
    NCH, BC, BS = args["NCH"], args["BLOCK_C"], args["BLOCK_S"]
    blocks, partial = env.buf["blocks"], env.buf["partial"]
    R, d, n = partial.shape[0], partial.shape[1], op.attrs["n_blocks"]
    cells = env.buf["attnres.dots"].view(-1)[: R * NCH * 2 * BS].view(R, NCH, 2 * BS)
    sq = env.buf["attnres.sq"].view(-1)[: R * NCH].view(R, NCH)
    for r in range(R):
        for c in range(NCH):
            cols = slice(c * BC, min((c + 1) * BC, d))
            yield r, c, cols, torch.cat([blocks[r, :n, cols], partial[r, None, cols]]).float(), cells, sq


def attnres_dots(op, env, task, s) -> None:
    BS = _args(s, task)["BLOCK_S"]
    for r, c, cols, v, cells, _ in _attnres_tiles(op, env, task, s):
        cells[r, c].zero_()
        cells[r, c, : v.shape[0]] = (v * op.weights["query"][cols].float()).sum(-1)
        cells[r, c, BS : BS + v.shape[0]] = (v * v).sum(-1)
        if op.attrs.get("store_block") is not None:
            env.buf["blocks"][r, op.attrs["store_block"], cols] = env.buf["partial"][r, cols]


def attnres_mix(op, env, task, s) -> None:
    BS, d = _args(s, task)["BLOCK_S"], env.buf["partial"].shape[1]
    for r, c, cols, v, cells, sq in _attnres_tiles(op, env, task, s):
        sums, n = cells[r].sum(0), v.shape[0]
        logits = sums[:n] * torch.rsqrt(sums[BS : BS + n] / d + op.attrs["eps"])
        mix = (torch.softmax(logits, 0)[:, None] * v).sum(0).to(env.buf["partial"].dtype)
        env.buf[op.writes[0]][r, cols] = mix
        sq[r, c] = (mix.float() ** 2).sum()


def attnres_norm(op, env, task, s) -> None:
    x, dt, d = env.buf[op.writes[0]], env.buf["partial"].dtype, env.buf["partial"].shape[1]
    for r, _, cols, _, _, sq in _attnres_tiles(op, env, task, s):
        inv = torch.rsqrt(sq[r].sum() / d + op.attrs["eps"])
        x[r, cols] = (op.weights["norm"][cols].float() * (x[r, cols].float() * inv).to(dt).float()).to(dt)


# ----------------------------------------------------------------------------- sampling


def sample_scan(op, env, task, s) -> None:
    """The scan's cells: statistics only the kernel's pick reads; the twin's pick samples from the logits."""
    env.buf["sample.partial"].zero_()


def sample_verify(op, env, task, s) -> None:
    """The verify cells: sums only the kernel's pick reads."""
    env.buf["sample.verify"].zero_()


def sample_pick(op, env, task, s) -> None:
    REFERENCE["sample"](op, env)
    env.buf["sample.path"].zero_()


STAGE_TWINS = {
    ("mlp", "gate_up"): mlp_gate_up,
    ("mlp", "down"): mlp_down,
    ("gqa_attn", "split"): gqa_split,
    ("gqa_attn", "combine"): gqa_combine,
    ("mla_attn", "split"): mla_split,
    ("mla_attn", "combine"): mla_combine,
    ("moe_experts", "gate_up"): moe_gate_up,
    ("moe_experts", "down"): moe_down,
    ("attnres_mix_norm", "dots"): attnres_dots,
    ("attnres_mix_norm", "mix"): attnres_mix,
    ("attnres_mix_norm", "norm"): attnres_norm,
    ("sample", "scan"): sample_scan,
    ("sample", "verify"): sample_verify,
    ("sample", "pick"): sample_pick,
}


def stage_twin(kind: str, stage: str):
    """The twin of a (kind, stage): a stage twin above, else the op's reference twin."""
    if (kind, stage) in STAGE_TWINS:
        return STAGE_TWINS[(kind, stage)]
    twin = REFERENCE[kind]
    return lambda op, env, task, s: twin(op, env)
