"""``--tp / --ep / --world`` and the other flags of a multi-rank layout (``nonstop.dist``)."""

from __future__ import annotations

import argparse

from nonstop.commands.common import positive_int


def add_layout_args(p: argparse.ArgumentParser, run: bool = True) -> None:
    """The layout flags; ``run``: also the flags of running one (timeouts, overlap, threads)."""
    g = p.add_argument_group("parallel layout (nonstop.dist)")
    g.add_argument("--tp", type=positive_int, default=1, help="tensor parallelism: attention and dense weights split over T ranks (default 1)")
    g.add_argument("--ep", type=positive_int, default=1, help="expert parallelism: routed experts split over E ranks (default 1)")
    g.add_argument("--world", type=positive_int, default=None, help="ranks in all (default max(T, E)); T and E must divide it; world / T attention groups run data-parallel")
    g.add_argument("--chunks", type=positive_int, default=None, help="pieces the MoE token exchange is cut into (default 2 on CUDA, 1 on CPU)")
    if run:
        g.add_argument("--no-overlap", dest="overlap", action="store_false", default=None, help="run the chunks of the MoE exchange one after another instead of overlapping communication with the experts' compute (same outputs)")
        g.add_argument("--dist-timeout", type=float, default=120.0, help="seconds a collective may wait for another rank before every rank stops with an error (default 120)")


def layout_from_args(args):
    """The ``Layout`` the flags ask for (LayoutError, a ValueError, when they do not fit)."""
    from nonstop.dist.layout import Layout

    return Layout.make(args.tp, args.ep, args.world)


def wants_layout(args) -> bool:
    return args.tp > 1 or args.ep > 1 or (args.world or 1) > 1
