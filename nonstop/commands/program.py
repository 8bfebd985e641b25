"""``nonstop program``: print a model's decode Program (super-ops, weights, traffic, FLOPs, tiles)."""

from __future__ import annotations

from nonstop.commands.common import add_threads_arg, positive_int

INSTANTIATE_LIMIT = 2e9  # bytes of fp32 weights up to which the real-shaped model is built on the CPU


def add_parser(sub) -> None:
    p = sub.add_parser("program", help="print the decode program of a model", description="Lower a model's decode step into its Program of super-operators and print it: per op the weights it streams, bytes read and written, FLOPs and tile count, with totals, and the line 'eager ops per step: N, super-ops per step: M' where N is counted by running one reference decode step under an aten dispatch-counting mode. Models too large for this machine are lowered on the meta device and their ops counted on a narrow twin with the same layers (op counts do not depend on widths).")
    p.add_argument("--model", "-m", default="k3-nano", help="checkpoint directory, bundled model or preset")
    p.add_argument("--num-layers", type=positive_int, help="keep only the first N layers")
    p.add_argument("--rows", type=positive_int, default=1, help="rows per step (batch × tokens), default 1")
    p.add_argument("--context", type=int, default=1024, help="cached tokens per sequence for attention traffic (default 1024)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"], help="weight dtype for byte counts (default bfloat16)")
    p.add_argument("--summary", action="store_true", help="one row per op kind instead of one per op")
    add_threads_arg(p)
    p.set_defaults(run=run)


def _fmt(n: float) -> str:
    from nonstop.weights.footprint import human

    return human(n)


def run(args) -> int:
    import torch

    from nonstop.model.build import random_model
    from nonstop.model.stack import CausalLM
    from nonstop.program.count import count_decode_ops
    from nonstop.program.lower import lower
    from nonstop.program.twin import narrow_twin
    from nonstop.threads import set_threads
    from nonstop.weights.footprint import footprint
    from nonstop.weights.resolve import DTYPES, resolve_model

    set_threads(args.threads)
    cfg, _ = resolve_model(args.model)
    if args.num_layers:
        cfg = cfg.with_num_layers(args.num_layers)
    dtype = DTYPES[args.dtype]
    if footprint(cfg, "float32").weight_bytes <= INSTANTIATE_LIMIT:
        model = random_model(cfg, dtype)
        counted_on = "this model"
        program = lower(model)
        eager = count_decode_ops(model).total
    else:
        with torch.device("meta"):
            model = CausalLM(cfg).to(dtype)
        program = lower(model)
        eager = count_decode_ops(random_model(narrow_twin(cfg), torch.float32)).total
        counted_on = "a narrow twin (same layers, kinds and top-k; tiny widths)"
    rows = []
    if args.summary:
        groups: dict = {}
        for op in program.ops:
            g = groups.setdefault(op.kind, [op.kind, 0, None, 0])
            g[1] += 1
            c = op.cost(args.rows, args.context)
            g[2] = c if g[2] is None else g[2] + c
            g[3] += op.tiles(args.rows)
        rows = [(f"{k} ×{n}", "", c, t) for k, n, c, t in groups.values()]
    else:
        rows = [(op.name, op.kind, op.cost(args.rows, args.context), op.tiles(args.rows)) for op in program.ops]
    print(f"decode program of {args.model} ({cfg.family}, {cfg.num_hidden_layers} layers, {args.dtype}), {args.rows} row(s), context {args.context}")
    header = f"{'op':<24} {'kind':<18} {'weights':>9} {'read':>9} {'written':>9} {'FLOPs':>9} {'tiles':>6}"
    print(header)
    print("-" * len(header))
    for name, kind, c, t in rows:
        print(f"{name:<24} {kind:<18} {_fmt(c.weight_bytes):>9} {_fmt(c.bytes_read):>9} {_fmt(c.bytes_written):>9} {_fmt(c.flops):>9} {t:>6}")
    total = program.total_cost(args.rows, args.context)
    print("-" * len(header))
    print(f"{'total':<24} {'':<18} {_fmt(total.weight_bytes):>9} {_fmt(total.bytes_read):>9} {_fmt(total.bytes_written):>9} {_fmt(total.flops):>9} {sum(op.tiles(args.rows) for op in program.ops):>6}")
    print(f"(bytes in B, FLOPs per step; eager ops counted on {counted_on})")
    print(f"eager ops per step: {eager}, super-ops per step: {len(program.ops)}")
    return 0
