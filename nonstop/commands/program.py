"""``nonstop program``: print a model's decode Program (super-ops, weights, traffic, FLOPs, tiles)."""

from __future__ import annotations

from nonstop.commands.common import positive_int
from nonstop.commands.layout_args import add_layout_args, layout_from_args, wants_layout
from nonstop.commands.program_table import print_ops

INSTANTIATE_LIMIT = 2e9  # bytes of fp32 weights up to which the real-shaped model is built on the CPU


def add_parser(sub) -> None:
    p = sub.add_parser("program", help="print the decode program of a model", description="Lower a model's decode step into its Program of super-operators and print it: per op the weights it streams, bytes read and written, FLOPs and tile count, with totals, and the line 'eager ops per step: N, super-ops per step: M' where N is counted by running one reference decode step under an aten dispatch-counting mode. Models too large for this machine are lowered on the meta device and their ops counted on a narrow twin with the same layers (op counts do not depend on widths). With --tp / --ep it prints one rank's Program under that layout from shapes alone (no weights built): its ops with the collective super-ops, the weight bytes every rank holds, the collectives per step with the bytes each sends, and bytes on the wire per token per rank.")
    p.add_argument("--model", "-m", default="k3-nano", help="checkpoint directory, bundled model or preset")
    p.add_argument("--num-layers", type=positive_int, help="keep only the first N layers")
    p.add_argument("--rows", type=positive_int, default=1, help="rows per step (batch × tokens), default 1")
    p.add_argument("--context", type=int, default=1024, help="cached tokens per sequence for attention traffic (default 1024)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"], help="weight dtype for byte counts (default bfloat16)")
    p.add_argument("--summary", action="store_true", help="one row per op kind instead of one per op")
    add_layout_args(p, run=False)
    p.add_argument("--rank", type=int, default=0, help="with a layout: the rank whose ops are listed (default 0)")
    p.set_defaults(run=run)


def run(args) -> int:
    import torch

    from nonstop.engine.llm import DTYPES, resolve_model
    from nonstop.model.build import random_model
    from nonstop.model.stack import CausalLM
    from nonstop.program.count import count_decode_ops
    from nonstop.program.lower import lower
    from nonstop.program.twin import narrow_twin
    from nonstop.weights.footprint import footprint

    cfg, _ = resolve_model(args.model)
    if args.num_layers:
        cfg = cfg.with_num_layers(args.num_layers)
    dtype = DTYPES[args.dtype]
    if wants_layout(args):
        from nonstop.commands.program_table import print_rank_program

        return print_rank_program(args, cfg, layout_from_args(args), dtype)
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
    print(f"decode program of {args.model} ({cfg.family}, {cfg.num_hidden_layers} layers, {args.dtype}), {args.rows} row(s), context {args.context}")
    print_ops(program, args.rows, args.context, args.summary)
    print(f"(bytes in B, FLOPs per step; eager ops counted on {counted_on})")
    print(f"eager ops per step: {eager}, super-ops per step: {len(program.ops)}")
    return 0
