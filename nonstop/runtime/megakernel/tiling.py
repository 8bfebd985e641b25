"""The tiling table: how each super-op kind splits into tasks, and the opcode of each (kind, stage).

``TILINGS[kind](ctx, op) -> [StageSpec]``; a stage's tiles run unordered among themselves, stages of
one op in order. The tile index of a task is the one the kind's Triton tile function takes
(``nonstop/kernels``), so the megakernel dispatches ``(opcode, op, tile)`` straight to it.

Per-kind tiles (R rows = B sequences x T tokens; block_n from ``TilingConfig``):
  embed, attnres_mix_norm, sample_greedy   one per row
  linear_residual, lm_head, moe_tail       block_n output columns
  mlp                                      gate_up: block_n intermediate columns; down: block_n outputs
  gqa_qkv_rope / gqa_attn                  one per q/k/v head / per (sequence, KV head)
  mla_in_proj, kda_in_proj, moe_front      block_n rows of the packed weight
  mla_q_up                                 one per head + the cache append
  mla_attn                                 split: (sequence, query block, KV split); combine: per head
  kda_core                                 one per (sequence, head)
  moe_experts                              (expert slot, block_n intermediate chunk)
"""

from __future__ import annotations

from nonstop.program.ir import Program
from nonstop.runtime.megakernel import tiles_attention, tiles_dense, tiles_moe
from nonstop.runtime.megakernel.schedule import OpTiles
from nonstop.runtime.megakernel.tilectx import TileContext, TilingConfig

TILINGS = {
    "embed": tiles_dense.embed,
    "attnres_mix_norm": tiles_dense.attnres_mix_norm,
    "linear_residual": tiles_dense.linear_residual,
    "lm_head": tiles_dense.lm_head,
    "mlp": tiles_dense.mlp,
    "gqa_qkv_rope": tiles_attention.gqa_qkv_rope,
    "gqa_attn": tiles_attention.gqa_attn,
    "mla_in_proj": tiles_attention.mla_in_proj,
    "mla_q_up": tiles_attention.mla_q_up,
    "mla_attn": tiles_attention.mla_attn,
    "kda_in_proj": tiles_attention.kda_in_proj,
    "kda_core": tiles_attention.kda_core,
    "moe_front": tiles_moe.moe_front,
    "moe_experts": tiles_moe.moe_experts,
    "moe_tail": tiles_moe.moe_tail,
}

# The megakernel's dispatch table: opcode = index. Append only (descriptors store the number).
OPCODES: tuple[tuple[str, str], ...] = (
    ("embed", "main"),
    ("attnres_mix_norm", "main"),
    ("linear_residual", "main"),
    ("lm_head", "main"),
    ("mlp", "gate_up"),
    ("mlp", "down"),
    ("gqa_qkv_rope", "main"),
    ("gqa_attn", "main"),
    ("mla_in_proj", "main"),
    ("mla_q_up", "main"),
    ("mla_attn", "split"),
    ("mla_attn", "combine"),
    ("kda_in_proj", "main"),
    ("kda_core", "main"),
    ("moe_front", "main"),
    ("moe_experts", "main"),
    ("moe_tail", "main"),
    ("sample_greedy", "main"),
)


def tile_program(program: Program, B: int, T: int, config: TilingConfig, persistent: bool) -> tuple[list, list[OpTiles]]:
    """(buffers, op tilings) of ``program`` for B sequences x T tokens; persistent schedules end with
    ``next_ids`` (greedy sampling into ``ids``) so the next step can start inside the same launch."""
    ctx = TileContext(program, B, T, config)
    ops = []
    for index, op in enumerate(program.ops):
        if op.kind not in TILINGS:
            raise ValueError(f"{op.name}: no megakernel tiling for kind {op.kind!r}")
        ops.append(OpTiles(op.name, op.kind, index, TILINGS[op.kind](ctx, op)))
    if persistent:
        ops.append(OpTiles("next_ids", "sample_greedy", None, tiles_dense.sample_greedy(ctx)))
    return ctx.buffers, ops
