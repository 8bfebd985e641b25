"""The megakernel's one tiling: how each op of a step splits into the tasks the kernel runs.

``tile_step(program, ops, launches, plan, B, T, start, persistent)`` tiles every op of the step (the
program's ops plus ``sample`` and ``advance``) with the block sizes and tile counts its recorded launch
chose (``TILINGS[kind](ctx, op, args)``), checks that each op's stages have exactly the tile counts of
the kernel's stages (``ScheduleError`` otherwise), adds a READ of ``start`` to every tile of an op whose
launch takes the step's start positions, and derives counters and waits (``waits.assemble``). So the
validator, the simulator, the audit and the kernel all see one schedule: the one that runs.

Modules: ``context`` (buffers, regions, weight slices), ``dense``, ``attention``, ``moe``, ``sampling``
(the per-kind tilings), ``waits`` (counters and waits from regions).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from nonstop.runtime.megakernel.tasks import Access, OpTiles, Schedule, ScheduleError, StageSpec
from nonstop.runtime.megakernel.tiling import attention, dense, moe, sampling
from nonstop.runtime.megakernel.tiling.context import TileContext
from nonstop.runtime.megakernel.tiling.waits import assemble

TILINGS = {
    "embed": dense.embed,
    "attnres_mix_norm": dense.attnres_mix_norm,
    "linear_residual": dense.linear_residual,
    "lm_head": dense.lm_head,
    "mlp": dense.mlp,
    "gqa_qkv_rope": attention.gqa_qkv_rope,
    "gqa_attn": attention.gqa_attn,
    "mla_in_proj": attention.mla_in_proj,
    "mla_q_up": attention.mla_q_up,
    "mla_attn": attention.mla_attn,
    "kda_in_proj": attention.kda_in_proj,
    "kda_core": attention.kda_core,
    "moe_front": moe.moe_front,
    "moe_experts": moe.moe_experts,
    "moe_tail": moe.moe_tail,
    "sample": sampling.sample,
    "advance": sampling.advance,
}


def tile_op(ctx: TileContext, op, runs: list, launches: list) -> list[StageSpec]:
    """Stages of ``op`` matching its kernel's stages ``runs`` (``plan.StageRun``) tile for tile."""
    if len(launches) != 1:
        raise ScheduleError(f"{op.name}: {len(launches)} launches; the megakernel schedule needs one launch per op")
    if op.kind not in TILINGS:
        raise ScheduleError(f"{op.name}: no megakernel tiling for kind {op.kind!r}")
    stages = TILINGS[op.kind](ctx, op, launches[0].args)
    got = [(s.name, len(s.tiles)) for s in stages]
    want = [(r.name, r.ntiles) for r in runs]
    if got != want:
        raise ScheduleError(f"{op.name}: schedule tiles {got} do not match the kernel's stages {want}")
    return stages


def reads_tensor(launches: list, tensor) -> bool:
    """Does any of ``launches`` take ``tensor`` (by address) as an argument?"""
    return any(
        isinstance(v, torch.Tensor) and v.data_ptr() == tensor.data_ptr()
        for launch in launches
        for v in launch.args.values()
    )


def tile_step(
    program,
    ops: list,
    launches: list[list],
    plan,
    B: int,
    T: int,
    start=None,
    persistent: bool = True,
    split_counters: bool = True,
) -> tuple[Schedule, list[int], list[int], list[int]]:
    """(Schedule, opcode, instance and tile count per task) of a step of ``ops`` with their recorded
    ``launches`` and ``plan`` (``codegen.plan``). ``start``: the step's start tensor. ``persistent``: steps run
    back to back in one launch (waits on the previous step's counters too)."""
    ctx = TileContext(program, B, T)
    tiled = []
    for i, (op, runs, ls) in enumerate(zip(ops, plan.stages, launches)):
        stages = tile_op(ctx, op, runs, ls)
        if start is not None and op.kind != "advance" and reads_tensor(ls, start):
            box = ctx.box(ctx.start(), Access.READ)
            stages = [StageSpec(s.name, [replace(t, regions=(*t.regions, box)) for t in s.tiles]) for s in stages]
        tiled.append(OpTiles(op.name, op.kind, i, stages, dict(ls[0].args)))
    schedule = assemble(ctx.buffers, tiled, persistent, B, T, None, split_counters)
    codes = [plan.stages[t.op][t.stage].opcode for t in schedule.tasks]
    instances = [plan.stages[t.op][t.stage].instance for t in schedule.tasks]
    ntiles = [plan.stages[t.op][t.stage].ntiles for t in schedule.tasks]
    return schedule, codes, instances, ntiles
