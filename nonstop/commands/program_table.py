"""``nonstop program``'s tables: the ops of a Program, and one rank's Program under a layout (--tp / --ep)
from shapes alone."""

from __future__ import annotations


def _fmt(n: float) -> str:
    from nonstop.commands.common import human

    return human(n)


def layer_count(cfg) -> str:
    """'1 layer' / 'N layers'."""
    n = cfg.num_hidden_layers
    return f"{n} layer" + ("" if n == 1 else "s")


def print_ops(program, rows: int, context: int, summary: bool) -> None:
    """The table of ops (or op kinds) with weights, bytes read / written, FLOPs, tiles, and the total."""
    table = []
    if summary:
        groups: dict = {}
        for op in program.ops:
            g = groups.setdefault(op.kind, [op.kind, 0, None, 0])
            g[1] += 1
            c = op.cost(rows, context)
            g[2] = c if g[2] is None else g[2] + c
            g[3] += op.tiles(rows, context)
        table = [(f"{k} ×{n}", "", c, t) for k, n, c, t in groups.values()]
    else:
        table = [(op.name, op.kind, op.cost(rows, context), op.tiles(rows, context)) for op in program.ops]
    header = f"{'op':<24} {'kind':<18} {'weights':>9} {'read':>9} {'written':>9} {'FLOPs':>9} {'tiles':>6}"
    print(header)
    print("-" * len(header))
    for name, kind, c, t in table:
        print(
            f"{name:<24} {kind:<18} {_fmt(c.weight_bytes):>9} {_fmt(c.bytes_read):>9} {_fmt(c.bytes_written):>9} "
            f"{_fmt(c.flops):>9} {t:>6}"
        )
    total = program.total_cost(rows, context)
    print("-" * len(header))
    print(
        f"{'total':<24} {'':<18} {_fmt(total.weight_bytes):>9} {_fmt(total.bytes_read):>9} "
        f"{_fmt(total.bytes_written):>9} {_fmt(total.flops):>9} "
        f"{sum(op.tiles(rows, context) for op in program.ops):>6}"
    )


def _all_to_alls(step, moe_layers: int, ep: int) -> str:
    """The token exchanges of a step: dispatch + combine per MoE layer (and per chunk), none without EP."""
    a2a = step.token_all_to_alls
    if not moe_layers:
        return "none (no MoE layer)"
    if not a2a:
        return f"none (--ep {ep}: every rank holds every expert of the {moe_layers} MoE layer(s))"
    sizes = step.launches("all_to_all", ("split sizes",))
    return (
        f"{a2a} token exchanges (dispatch + combine: {a2a // moe_layers} per MoE layer x {moe_layers} MoE layers)"
        + f", {sizes} split-size exchanges"
    )


def print_rank_program(args, cfg, layout, dtype) -> int:
    from nonstop.dist.program import engine_exchange, rank_step
    from nonstop.dist.shard import check_layout

    check_layout(cfg, layout)
    if not 0 <= args.rank < layout.world:
        raise ValueError(f"--rank must be in 0..{layout.world - 1}, got {args.rank}")
    chunks = args.chunks or (2 if args.device == "cuda" else 1)  # the engine's default
    mode, reason = engine_exchange(cfg, layout, args.rows, chunks, dtype, args.device, args.exchange)
    step = rank_step(cfg, layout, args.rows, args.context, dtype, args.rank, chunks, mode)
    under = layout.describe(cfg.moe is not None)
    print(f"decode program of {args.model} ({cfg.family}, {layer_count(cfg)}, {args.dtype}) under {under}")
    tokens = f"{step.tokens} token" + ("s" if step.tokens > 1 else "")
    print(
        f"rank {args.rank}, {args.rows} row(s) per attention group ({tokens} per step), context {args.context}; "
        "shapes only (no weights built)"
    )
    if cfg.moe is not None:
        placement = layout.placement_for(
            next(i for i, t in enumerate(cfg.mlp_types) if t == "moe"), cfg.moe.num_experts
        )
        other = "dynamic" if mode == "static" else "static"
        chosen = "--exchange" if args.exchange != "auto" else "the engine picks it"
        print(
            f"experts: {placement.describe()}; MoE exchange in {chunks} chunk(s), {mode} on {args.device} "
            f"({chosen}: {reason}; --exchange {other} shows the other mode)"
        )
    print_ops(step.program, args.rows, args.context, args.summary)
    w = step.weight_bytes
    print(
        f"\nweights per rank: {_fmt(min(w))}B - {_fmt(max(w))}B (rank {args.rank}: {_fmt(w[args.rank])}B; all ranks "
        f"{_fmt(sum(w))}B)"
    )
    print(f"\ncollectives per step on rank {args.rank}:")
    header = f"  {'kind':<11} {'group':<9} {'launches':>8} {'bytes sent':>11}  purpose"
    print(header)
    for c in step.collectives:
        print(f"  {c.kind:<11} {f'{c.group}({c.ranks})':<9} {c.count:>8} {_fmt(c.wire_bytes) + 'B':>11}  {c.purpose}")
    print(
        f"  total: {sum(c.count for c in step.collectives)} launches, {_fmt(step.wire_bytes)}B sent by rank {args.rank}"
    )
    print(f"all-to-alls per step: {_all_to_alls(step, cfg.mlp_types.count('moe'), layout.ep)}")
    print(
        f"bytes on the wire per token per rank: {_fmt(step.wire_bytes_per_token)}B (the average rank's bytes sent "
        f"per step / {tokens} per step)"
    )
    print(f"super-ops per step: {len(step.program.ops)} (rank {args.rank}, collectives included)")
    return 0
