"""Cost of each super-op per step: weight bytes streamed, bytes read / written, FLOPs, nominal tiles.

rows = R tokens in the step; context = tokens already cached per sequence (attention reads them);
sequences = B (rows = B·T; default: one token per sequence). KDA state and conv windows move once per
sequence, whatever T.
Routed experts stream only the distinct experts the rows select: min(E, rows·top_k) of them.
"""

from __future__ import annotations

import math

from nonstop.program.ir import Cost, Program, SuperOp

TILE_N = 64  # nominal output rows per GEMV tile


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _expert_bytes(op: SuperOp, rows: int) -> tuple[int, int]:
    """(bytes, matmul elements) of the experts that ``rows`` rows can touch."""
    mc = op.attrs["moe"]
    experts = {n: t for n, t in op.weights.items() if n != "bias"}
    per_expert = sum(_nbytes(t) for t in experts.values()) // mc.num_experts
    # packed MXFP4 holds two weights per byte; its scales are not matmul elements
    elements = sum(2 * t.numel() if n.endswith("_packed") else t.numel() for n, t in experts.items() if not n.endswith("_scale")) // mc.num_experts
    distinct = min(mc.num_experts, rows * mc.top_k)
    return per_expert * distinct + _nbytes(op.weights["bias"]), elements * rows * mc.top_k


def make_cost(op: SuperOp, program: Program):
    buffers = program.buffers
    elt = {"model": program.dtype.itemsize, "float32": 4, "int64": 8}
    act_in = sum(buffers[b].row_numel * elt[buffers[b].dtype] for b in op.reads)
    act_out = sum(buffers[b].row_numel * elt[buffers[b].dtype] for b in op.writes)
    matmul = sum(t.numel() for n, t in op.weights.items() if t.dim() >= 2 and n not in ("embed", "conv"))
    cfg = program.cfg
    mdt = program.dtype.itemsize

    def cost(rows: int, context: int, sequences: int | None = None) -> Cost:
        seqs = rows if sequences is None else sequences
        weight = sum(_nbytes(t) for t in op.weights.values())
        flops = 2 * matmul * rows
        extra_read = extra_write = 0
        if op.kind == "embed":
            weight = rows * cfg.hidden_size * mdt
            flops = 0
        elif op.kind == "moe_experts":
            weight, elements = _expert_bytes(op, rows)
            flops = 2 * elements
        elif op.kind == "mla_attn":
            m = cfg.mla
            keys = context + 1
            extra_read = rows * keys * m.cache_dim * mdt
            flops += 2 * rows * keys * m.num_heads * (m.cache_dim + m.kv_lora_rank)
        elif op.kind == "gqa_attn":
            g = cfg.gqa
            keys = context + 1
            extra_read = rows * keys * 2 * g.num_kv_heads * g.head_dim * mdt
            flops += 4 * rows * keys * g.num_heads * g.head_dim
        elif op.kind in ("mla_q_up", "gqa_qkv_rope"):
            extra_write = rows * (cfg.mla.cache_dim if op.kind == "mla_q_up" else 2 * cfg.gqa.num_kv_heads * cfg.gqa.head_dim) * mdt
        elif op.kind == "kda_core":
            k = cfg.kda
            state = k.num_heads * k.head_dim * k.head_dim * 4
            extra_read, extra_write = seqs * state, seqs * state
            flops += 6 * rows * k.num_heads * k.head_dim * k.head_dim
        elif op.kind == "kda_in_proj":
            window = 3 * cfg.kda.proj_dim * (cfg.kda.conv_size - 1) * mdt
            extra_read, extra_write = seqs * window, seqs * window
        elif op.kind == "attnres_mix_norm":  # reads only the n_blocks live sources of "blocks"
            sources = op.attrs["n_blocks"] + 1
            read = weight + rows * sources * cfg.hidden_size * mdt
            stored = rows * cfg.hidden_size * mdt if op.attrs.get("store_block") is not None else 0
            return Cost(weight, read, rows * act_out + stored, 4 * rows * sources * cfg.hidden_size)
        return Cost(weight, weight + rows * act_in + extra_read, rows * act_out + extra_write, flops)

    return cost


def make_tiles(op: SuperOp, program: Program):
    cfg = program.cfg

    def tiles(rows: int, sequences: int | None = None) -> int:
        if op.kind == "kda_core":  # one tile per (sequence, head)
            return cfg.kda.num_heads * (rows if sequences is None else sequences)
        if op.kind in ("mla_attn", "gqa_attn"):
            heads = cfg.mla.num_heads if op.kind == "mla_attn" else cfg.gqa.num_kv_heads
            return heads * rows
        if op.kind == "moe_experts":
            mc = op.attrs["moe"]
            return min(mc.num_experts, rows * mc.top_k) * math.ceil(mc.intermediate_size / TILE_N)
        if op.kind in ("embed", "attnres_mix_norm"):
            return rows
        out = sum(t.shape[0] for n, t in op.weights.items() if t.dim() >= 2 and n not in ("embed", "conv"))
        return max(1, math.ceil(out / TILE_N))

    return tiles


def attach_costs(program: Program) -> None:
    for op in program.ops:
        op.cost = make_cost(op, program)
        op.tiles = make_tiles(op, program)
