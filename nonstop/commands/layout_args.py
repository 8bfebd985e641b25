"""``--tp / --ep / --world`` and the other flags of a multi-rank layout (``nonstop.dist``)."""

from __future__ import annotations

import argparse

from nonstop.commands.common import positive_float, positive_int

DIST_TIMEOUT_S = (1.0, 86400.0)  # --dist-timeout's range: a second (ranks start, load and step seconds apart) to a day
DIST_TIMEOUT_DEFAULT_S = 120.0


def dist_timeout(text: str) -> float:
    """--dist-timeout: seconds in ``DIST_TIMEOUT_S``."""
    value = positive_float(text)
    low, high = DIST_TIMEOUT_S
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"expected seconds from {low:g} to {high:g} (a day), got {text}")
    return value


def add_layout_args(p: argparse.ArgumentParser, run: bool = True) -> None:
    """The layout flags; ``run``: also the flags of running one (timeouts, overlap, threads)."""
    g = p.add_argument_group("parallel layout (nonstop.dist)")
    g.add_argument(
        "--tp",
        type=positive_int,
        default=1,
        help="tensor parallelism: attention and dense weights split over T ranks (default 1)",
    )
    g.add_argument(
        "--ep", type=positive_int, default=1, help="expert parallelism: routed experts split over E ranks (default 1)"
    )
    g.add_argument(
        "--world",
        type=positive_int,
        default=None,
        help="ranks in all (default max(T, E)); T and E must divide it; world / T attention groups run data-parallel",
    )
    g.add_argument(
        "--chunks",
        type=positive_int,
        default=None,
        help="pieces the MoE token exchange is cut into (default 2 on CUDA, 1 on CPU)",
    )
    g.add_argument(
        "--exchange",
        choices=("auto", "static", "dynamic"),
        default="auto",
        help="MoE token exchange: dynamic sends exactly the routed tokens after exchanging their counts "
        "(read on the host); static sends fixed-capacity buffers (more bytes, the same split sizes "
        "every step: no host sync, capturable in a CUDA graph); auto (default) picks static for "
        "decode steps where it is cheaper, dynamic for prefills; same outputs either way",
    )
    if run:
        g.add_argument(
            "--overlap",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="overlap the chunks of the MoE exchange with the experts' compute, or (--no-overlap) run them one "
            "after another; same outputs (default: overlapped on CUDA, not on CPU, where it only costs time)",
        )
        g.add_argument(
            "--dist-timeout",
            type=dist_timeout,
            default=None,
            help="seconds a collective may wait for another rank before every rank stops with an error "
            f"({DIST_TIMEOUT_S[0]:g} to {DIST_TIMEOUT_S[1]:g}; default {DIST_TIMEOUT_DEFAULT_S:g}); the ranks get at "
            "least 60 s to meet",
        )


def layout_from_args(args):
    """The ``Layout`` the flags ask for (LayoutError, a ValueError, when they do not fit)."""
    from nonstop.dist.layout import Layout

    return Layout.make(args.tp, args.ep, args.world)


def wants_layout(args) -> bool:
    return args.tp > 1 or args.ep > 1 or (args.world or 1) > 1


def rank_flags_given(args) -> list[str]:
    """The flags given that only shape how the ranks of a layout run (--chunks, --exchange other than auto,
    --overlap / --no-overlap, --dist-timeout): without --tp / --ep / --world above 1 nothing reads them."""
    values = (
        ("--chunks", args.chunks),
        ("--exchange", None if args.exchange == "auto" else args.exchange),
        ("--overlap" if getattr(args, "overlap", None) else "--no-overlap", getattr(args, "overlap", None)),
        ("--dist-timeout", getattr(args, "dist_timeout", None)),
    )
    return [flag for flag, value in values if value is not None]


def refuse_flags_without_layout(given: list[str]) -> None:
    """A ValueError naming ``given``, flags of a layout of several ranks, when there is none."""
    if given:
        verb = "describes" if len(given) == 1 else "describe"
        raise ValueError(
            f"{', '.join(given)} {verb} the ranks of a layout of several ranks: give --tp, --ep or --world above 1 "
            "with them"
        )


def llm_class(args, slots: int = 1):
    """The class a command builds its model with: ``LLM``, or under --tp / --ep this rank's
    ``DistributedLLM``. In the process the user started (no RANK in the environment) it checks the
    layout, starts its ranks on this host - each runs the same command - and exits with rank 0's status;
    under torchrun (or in a started rank) it checks the layout the same way (torchrun starts the ranks
    unchecked), then joins the process group; a rank other than 0 follows rank 0's steps and exits. Only
    rank 0 returns. ``slots``: the sequences the engine decodes together (the memory preflight counts their
    caches)."""
    import atexit
    import functools
    import os

    from nonstop.engine.llm import LLM

    if not wants_layout(args):
        refuse_flags_without_layout(rank_flags_given(args))
        return LLM
    layout = layout_from_args(args)
    # in the launcher, and in each rank before it joins: torchrun checks nothing
    cfg = check_before_start(args, layout, slots)
    if "RANK" not in os.environ:
        raise SystemExit(start_ranks(args, layout, cfg.moe is not None))
    from nonstop.dist.comm import RankFailure, init, shutdown
    from nonstop.engine.distributed import print_failure_and_exit
    from nonstop.engine.distributed_llm import DistributedLLM

    try:
        comm = init(layout, args.device, args.dist_timeout or DIST_TIMEOUT_DEFAULT_S)
    except RankFailure as exc:  # the ranks did not meet
        raise SystemExit(_rank_failed(exc)) from None
    if comm.rank != 0:
        raise SystemExit(follow_rank(args, comm, slots))
    # rank 0 leaves the group at exit, after the LLM's own atexit hook has told the others to stop (hooks run
    # last-registered first): a process group left to the interpreter's teardown aborted rank 0 now and then
    # ("terminate called without an active exception", 1 in 6 torchrun runs under load)
    atexit.register(shutdown)
    return functools.partial(
        DistributedLLM,
        comm=comm,
        chunks=args.chunks,
        overlap=args.overlap,
        exchange=args.exchange,
        on_failure=print_failure_and_exit,
    )


def check_before_start(args, layout, slots: int = 1):
    """Refuse a layout the model or the backend cannot run before starting any rank (one clear error).
    The GPUs needed on this host: LOCAL_WORLD_SIZE in a rank (torchrun sets it), else the whole world.
    Where this host's ranks are checked (``host_ranks``), the checkpoint's files are too (their headers
    against the config: a truncated or broken file, a missing tensor), and unless --no-preflight, CPU
    ranks' memory: their processes' own (this process's, measured), their parts of the model and the
    caches of ``slots`` sequences (``engine/layout_preflight.py``). Returns the model's config."""

    import torch

    from nonstop.dist.comm import env_int
    from nonstop.dist.shard import check_layout
    from nonstop.runtime.distributed import check_backend
    from nonstop.weights.resolve import check_device, resolve_model

    cfg, model_dir = resolve_model(args.model)
    check_layout(cfg, layout)
    check_backend(args.backend, torch.device(check_device(args.device).type), layout.world)
    local = env_int("LOCAL_WORLD_SIZE", layout.world)
    if check_device(args.device).type == "cuda" and torch.cuda.device_count() < local:
        where = "" if local == layout.world else f" ({local} on this host)"
        raise ValueError(
            f"the layout needs {layout.world} ranks{where}, one GPU each, but {torch.cuda.device_count()} are visible"
        )
    ranks = host_ranks(layout)
    if ranks is not None and model_dir is not None:  # the files' headers: a broken checkpoint is one error, here
        from nonstop.weights.loader import resolve_checkpoint

        resolve_checkpoint(cfg, model_dir)
    if ranks is not None:
        _check_rank0_options(args, cfg, model_dir)
    if args.preflight and ranks is not None and check_device(args.device).type == "cpu":
        from nonstop.engine.layout_preflight import check_host_memory, process_bytes
        from nonstop.weights.resolve import parse_dtype

        dtype = parse_dtype(args.dtype, args.device)
        check_host_memory(args.model, cfg, layout, ranks, dtype, slots, per_rank=process_bytes())
    return cfg


def _check_rank0_options(args, cfg, model_dir) -> None:
    """What rank 0 refuses before it loads, refused here once instead, before any rank starts: the
    speculative options (and a DSpark drafter's files), the tokenizer and its chat template (a missing
    --chat-template file). Rank 0 refusing them later left the other ranks to report its end as a failure."""
    from nonstop.commands.common import spec_from_args
    from nonstop.engine.speculative.config import SpeculativeConfig, drafter_dir
    from nonstop.engine.tokenizer import Tokenizer

    if hasattr(args, "speculative"):
        spec = SpeculativeConfig.parse(spec_from_args(args))
        if spec is not None and spec.method == "dspark":
            drafter_dir(spec, model_dir)
    if hasattr(args, "tokenizer"):
        Tokenizer.load(model_dir, cfg.vocab_size, args.tokenizer, getattr(args, "chat_template", None))


def host_ranks(layout) -> range | None:
    """The ranks whose share of this host's memory this process checks: all of them in the process that
    starts them (no RANK in the environment); under torchrun (TORCHELASTIC_RUN_ID set), local rank 0
    checks its host's LOCAL_WORLD_SIZE ranks, before it joins the process group (no rank loads before all
    have joined); None in any other rank (a rank this launcher started was checked by it)."""
    import os

    if "RANK" not in os.environ:
        return range(layout.world)
    from nonstop.dist.comm import env_int

    if "TORCHELASTIC_RUN_ID" not in os.environ or env_int("LOCAL_RANK", 0) != 0:
        return None
    first = env_int("RANK", 0)
    return range(first, first + env_int("LOCAL_WORLD_SIZE", layout.world))


def _rank_main(args) -> None:
    """A started rank: the command, its errors printed as the CLI prints them but once per launch (a rank
    meeting an error another rank has printed prints nothing). Rank 0 stopped by a signal (Ctrl-C,
    ``Terminated``) says so and leaves at once: it may be mid-step, where telling the other ranks to stop
    would wait out the collective timeout; they know a stop is coming (``stopping``) and end quietly.
    Otherwise the ``atexit`` hooks run (rank 0 tells the others to stop; each rank leaves the group) and
    the rank ends there (``os._exit``): the C++ teardown after them, gloo's threads still running, aborted
    rank 0 now and then ("terminate called without an active exception", 2 server stops in 10)."""
    import atexit
    import contextlib
    import os
    import sys

    from nonstop.commands.errors import USER_ERRORS, user_errors
    from nonstop.dist.launch import first_report
    from nonstop.stops import Terminated, stop_behind, stop_status

    hooks = True
    try:
        with user_errors():
            try:
                code = int(args.run(args) or 0)
            except (KeyboardInterrupt, Terminated, Exception) as exc:
                stop = stop_behind(exc)  # a stop, or an error it caused on its way out
                if stop is not None:
                    word, code = stop_status(stop)
                    print(f"nonstop: {word}", file=sys.stderr)
                    hooks = False
                elif isinstance(exc, BrokenPipeError) or first_report(f"{type(exc).__name__}: {exc}"):
                    raise
                else:
                    code = 2 if isinstance(exc, USER_ERRORS) else 1
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    if hooks:
        atexit._run_exitfuncs()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def start_ranks(args, layout, routed_experts: bool = True) -> int:
    """Run the command on ``layout.world`` local processes (``nonstop.dist.spawn``); rank 0's exit status
    (1 when rank 0 ended without one of its own: killed, or stopped after another rank failed). The first
    rank to fail is named when it cannot have said why itself (a signal killed it). The line saying so
    also says when the ranks outnumber this host's CPU cores (they share them: slow)."""
    import os
    import sys

    from nonstop.dist.launch import RankExited, spawn
    from nonstop.stops import Terminated, stop_status

    threads = getattr(args, "threads", None)
    cores = os.cpu_count() or 1
    share = f"; {layout.world} ranks share {cores} CPU cores" if layout.world > cores else ""
    print(f"nonstop: starting {layout.world} local ranks ({layout.describe(routed_experts)}){share}", file=sys.stderr)
    try:
        spawn(_rank_main, layout.world, (args,), threads=threads, relay=True)
    except RankExited as exc:
        if exc.code is None or exc.code < 0 or "\n" in str(exc):  # a rank that printed nothing, or a traceback
            first = " (the first rank to end)" if exc.code is not None and "\n" not in str(exc) else ""
            print(f"nonstop: error: {exc}{first}; the other ranks were stopped", file=sys.stderr)
        elif exc.left is not None:  # a collective failed (a rank hung, or failed without saying why)
            print(exc.left, file=sys.stderr)
        rank0 = exc.codes[0] if exc.codes else None
        return rank0 if rank0 is not None and rank0 > 0 else 1
    except (KeyboardInterrupt, Terminated) as exc:  # every rank had to be stopped
        word, code = stop_status(exc)
        print(f"nonstop: {word}; all ranks stopped", file=sys.stderr)
        return code
    return 0


def follow_rank(args, comm, slots: int = 1) -> int:
    """A rank other than 0: load its part of the model (a CUDA rank's memory checked first, unless
    --no-preflight) and follow rank 0 until it says stop."""
    import signal

    from nonstop.dist.comm import RankFailure, shutdown
    from nonstop.dist.launch import mark_stopping, stopping
    from nonstop.engine.distributed import build_worker, follow
    from nonstop.engine.layout_preflight import check_rank_memory
    from nonstop.weights.resolve import parse_dtype, resolve_model

    # rank 0 (or the launcher) decides when to stop; a SIGINT only says a stop is coming (rank 0 may leave
    # mid-step: then the collective in flight fails, and that is no error)
    signal.signal(signal.SIGINT, mark_stopping)
    try:
        cfg, model_dir = resolve_model(args.model)
        dtype = parse_dtype(args.dtype, args.device)
        if args.preflight:
            check_rank_memory(args.model, cfg, comm.layout, comm.rank, dtype, comm.device, slots)
        worker = build_worker(
            comm,
            cfg,
            model_dir,
            dtype,
            args.backend,
            0,
            args.chunks,
            args.overlap,
            exchange=args.exchange,
        )
        follow(worker)
        return 0
    except RankFailure as exc:
        return 0 if stopping() else _rank_failed(exc)
    finally:
        shutdown()


def _rank_failed(exc) -> int:
    """A rank's ``RankFailure``: status 3 and its one line, printed here outside a launch of ours (torchrun)
    and left to the launcher in one (``leave_failure``: the launcher prints it unless a rank printed why it
    ended, a refused option, a missing file, or a signal killed one, which the launcher names)."""
    from nonstop.dist.launch import report_failure

    report_failure(f"nonstop: error: {exc}")
    return 3
