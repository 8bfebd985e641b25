"""``nonstop program``: print a model's decode Program (super-ops, weights, traffic, FLOPs, tiles)."""

from __future__ import annotations

from nonstop.commands.common import DTYPE_CHOICES, add_threads_arg, non_negative_int, positive_int
from nonstop.commands.layout_args import (
    add_layout_args,
    layout_from_args,
    rank_flags_given,
    refuse_flags_without_layout,
    wants_layout,
)
from nonstop.commands.program_table import layer_count, print_ops


def add_parser(sub) -> None:
    p = sub.add_parser(
        "program",
        help="print the decode program of a model",
        description=(
            "Lower a model's decode step into its Program of super-operators and print it: per op the weights it "
            "streams, bytes read and written, FLOPs and tile count, with totals, and the line 'eager ops per step: N, "
            "super-ops per step: M' where N is counted by running one reference decode step under an aten "
            "dispatch-counting mode. Models too large for this machine are lowered on the meta device and their ops "
            "counted on a narrow twin with the same layers (op counts do not depend on widths). With --tp / --ep it "
            "prints one rank's Program under that layout from shapes alone (no weights built): its ops with the "
            "collective super-ops, the weight bytes every rank holds, the collectives per step with the bytes each "
            "sends, and bytes on the wire per token per rank, with the MoE exchange mode the engine would pick on "
            "--device (--exchange static|dynamic shows the other)."
        ),
    )
    p.add_argument("--model", "-m", default="k3-nano", help="checkpoint directory, bundled model or preset")
    p.add_argument("--num-layers", type=positive_int, help="keep only the first N layers")
    p.add_argument("--rows", type=positive_int, default=1, help="sequences in the step, one token each (default 1)")
    p.add_argument(
        "--context",
        type=non_negative_int,
        default=1024,
        help="cached tokens per sequence for attention traffic (default 1024)",
    )
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=DTYPE_CHOICES,
        help="weight dtype for byte counts (default bfloat16)",
    )
    p.add_argument("--summary", action="store_true", help="one row per op kind instead of one per op")
    add_layout_args(p, run=False)
    p.add_argument(
        "--rank", type=non_negative_int, default=None, help="with a layout: the rank whose ops are listed (default 0)"
    )
    p.add_argument(
        "--device",
        type=lambda text: text.split(":")[0],  # cuda:1 as generate takes it: the kind is what sets the defaults
        choices=("cuda", "cpu"),
        default=None,
        help="with a layout: the device the ranks would run on, which sets the engine's defaults shown - MoE "
        "chunks (2 on CUDA, 1 on CPU) and the exchange mode --exchange auto picks (default cuda)",
    )
    add_threads_arg(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from nonstop.program.count import decode_program
    from nonstop.threads import set_threads
    from nonstop.weights.resolve import DTYPES, resolve_model

    set_threads(args.threads)
    check_layout_flags(args)
    cfg, _ = resolve_model(args.model)
    if args.num_layers:
        cfg = cfg.with_num_layers(args.num_layers)
    dtype = DTYPES[args.dtype]
    if wants_layout(args):
        from nonstop.commands.program_table import print_rank_program

        args.rank = args.rank or 0
        args.device = args.device or "cuda"
        return print_rank_program(args, cfg, layout_from_args(args), dtype)
    program, eager, counted_on = decode_program(cfg, dtype)
    print(
        f"decode program of {args.model} ({cfg.family}, {layer_count(cfg)}, {args.dtype}), {args.rows} "
        f"row(s), context {args.context}"
    )
    print_ops(program, args.rows, args.context, args.summary)
    print(f"(bytes in B, FLOPs per step; eager ops counted on {counted_on})")
    print(f"eager ops per step: {eager}, super-ops per step: {len(program.ops)}")
    return 0


def check_layout_flags(args) -> None:
    """--rank, --device, --chunks and --exchange describe one rank of a layout: without --tp / --ep / --world
    they would be ignored, so they are refused."""
    if not wants_layout(args):
        given = [flag for flag, value in (("--rank", args.rank), ("--device", args.device)) if value is not None]
        refuse_flags_without_layout(given + rank_flags_given(args))
