"""In-kernel expert selection (``select_experts`` of ``nonstop/model/moe.py``) from the fp32 router logits
(R <= 16 rows × E experts: a few KiB, L2-resident), computed once per program of ``moe_experts``.

Experts sit in BLOCK_G groups of BLOCK_EG columns: column c holds expert e = (c // BLOCK_EG)·EG +
c % BLOCK_EG (columns past a group's EG members are padding), so ids grow with c and the group limit is
a reshape to [BLOCK_G, BLOCK_EG] plus reductions over the last axis. Per row (one row at a time: a
[BLOCK_E] vector is 8 registers a thread at E = 896, where [16, BLOCK_E] tensors would spill):
  s = σ(l) or softmax(l);  c = s + bias (selection only)
  groups (G > 1): keep the topk_group groups with the largest top-2 sums of c, others c = -inf
  top-k of c (ties to the lower id), p_e = s_e / (Σ_sel s + 1e-20) (if renormalise) · scaling.
The result is a summary: ``present`` [BLOCK_E] (columns some row selected) and each row's choices
``sel_id`` / ``sel_w`` [BLOCK_R, BLOCK_TOPK]. Distinct experts are numbered in id order (the
``torch.unique`` order of the twin): ``slot_expert`` maps a slot to its expert and every row's weight.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def route_summary(
    logits_ptr,
    stride_l,
    bias_ptr,
    R,
    E,
    EG,
    top_k,
    topk_groups,
    scaling,
    SOFTMAX: tl.constexpr,
    RENORM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GROUPED: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_EG: tl.constexpr,
    BLOCK_TOPK: tl.constexpr,
):
    """Selection of rows 0..R-1 -> (present [BE] int32 0/1, ids [BE] int32 expert id of each column,
    sel_id [BLOCK_R, BLOCK_TOPK] int32 (row r's j-th choice; -1 pads), sel_w [BLOCK_R, BLOCK_TOPK] fp32
    its final weight), BE = BLOCK_G·BLOCK_EG."""
    BIG: tl.constexpr = 1 << 30
    BLOCK_E: tl.constexpr = BLOCK_G * BLOCK_EG
    col = tl.arange(0, BLOCK_E)
    ids = (col // BLOCK_EG) * EG + col % BLOCK_EG
    valid = (col % BLOCK_EG < EG) & (ids < E)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + ids, mask=valid, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros([BLOCK_E], dtype=tl.float32)
    rr = tl.arange(0, BLOCK_R)[:, None]
    jj = tl.arange(0, BLOCK_TOPK)[None, :]
    present = tl.zeros([BLOCK_E], dtype=tl.int32)
    sel_id = tl.full([BLOCK_R, BLOCK_TOPK], -1, tl.int32)
    sel_w = tl.zeros([BLOCK_R, BLOCK_TOPK], dtype=tl.float32)
    for r in range(R):
        logit = tl.load(logits_ptr + r * stride_l + ids, mask=valid, other=float("-inf"))
        if SOFTMAX:
            ex = tl.where(valid, tl.exp(logit - tl.max(logit, axis=0)), 0.0)
            s = ex / tl.sum(ex, axis=0)
        else:
            s = tl.sigmoid(logit)
        s = tl.where(valid, s, 0.0)
        c = tl.where(valid, s + bias, float("-inf"))
        if GROUPED:
            c2 = tl.reshape(c, [BLOCK_G, BLOCK_EG])
            j2 = tl.arange(0, BLOCK_EG)[None, :]
            top1 = tl.max(c2, axis=1)
            at1 = tl.min(tl.where(c2 == top1[:, None], j2, BIG), axis=1)
            gscore = top1 + tl.max(tl.where(j2 == at1[:, None], float("-inf"), c2), axis=1)  # [G]
            gids = tl.arange(0, BLOCK_G)
            keep = gids < 0
            for _ in range(topk_groups):
                ghit = gids == tl.min(tl.where(gscore == tl.max(gscore, axis=0), gids, BIG), axis=0)
                keep = keep | ghit
                gscore = tl.where(ghit, float("-inf"), gscore)
            c = tl.where(tl.reshape(tl.broadcast_to(keep[:, None], [BLOCK_G, BLOCK_EG]), [BLOCK_E]), c, float("-inf"))
        for j in range(top_k):  # the lowest-id column holding the row's max
            pick = tl.min(tl.where((c == tl.max(c, axis=0)) & valid, col, BIG), axis=0)
            hit = col == pick
            present = tl.maximum(present, hit.to(tl.int32))
            at = (rr == r) & (jj == j)
            sel_id = tl.where(at, (pick // BLOCK_EG) * EG + pick % BLOCK_EG, sel_id)
            sel_w = tl.where(at, tl.sum(tl.where(hit, s, 0.0), axis=0), sel_w)
            c = tl.where(hit, float("-inf"), c)
    if RENORM:
        sel_w = sel_w / (tl.sum(sel_w, axis=1) + 1e-20)[:, None]
    return present, ids, sel_id, sel_w * scaling


@triton.jit
def slot_expert(present, ids, sel_id, sel_w, slot):
    """The ``slot``-th distinct selected expert (id order) -> (expert id, p [BLOCK_R] every row's weight
    for it, 0 for rows that did not choose it). slot must be < Σ present."""
    mine = (present > 0) & (tl.cumsum(present, axis=0) == slot + 1)
    expert = tl.sum(tl.where(mine, ids, 0), axis=0)
    p_rows = tl.sum(tl.where(sel_id == expert, sel_w, 0.0), axis=1)
    return expert, p_rows


def routing_blocks(R: int, num_experts: int, num_groups: int, top_k: int) -> dict:
    """Constexpr block sizes of ``route_summary`` for R rows."""
    eg = num_experts // num_groups
    return dict(
        BLOCK_R=triton.next_power_of_2(max(R, 1)),
        BLOCK_G=triton.next_power_of_2(num_groups),
        BLOCK_EG=triton.next_power_of_2(eg),
        BLOCK_TOPK=triton.next_power_of_2(top_k),
    )
