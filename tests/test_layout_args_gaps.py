"""Gaps a mutation audit of ``commands/layout_args.py`` found: the flags' stated defaults, which flags
count as asking for a layout, the rank-only flags refused without one (each named, as the user spelt
it), what ``llm_class`` hands the ranks (the collective timeout's default, the flags of the exchange),
and the launcher's exit statuses. Parsing, or ``llm_class`` with the process group replaced: no rank
starts and no weights load here."""

from __future__ import annotations

import types

import pytest

from nonstop.cli import build_parser


def _parse(argv):
    return build_parser().parse_args(argv)


def test_the_layout_flags_default_to_one_rank():
    """The help says --tp and --ep default to 1 and --world to max(T, E): catches another default."""
    from nonstop.commands.layout_args import layout_from_args, wants_layout

    args = _parse(["generate"])
    assert (args.tp, args.ep, args.world, args.chunks, args.exchange) == (1, 1, None, None, "auto")
    assert (args.overlap, args.dist_timeout) == (None, None)
    assert not wants_layout(args)
    made = layout_from_args(_parse(["generate", "--ep", "3"]))
    assert (made.tp, made.ep, made.world) == (1, 3, 3)


@pytest.mark.parametrize(
    "argv, wanted",
    [
        (["--tp", "2"], True),
        (["--ep", "2"], True),
        (["--world", "2"], True),
        (["--tp", "1", "--ep", "1"], False),
        (["--world", "1"], False),
    ],
)
def test_two_ranks_of_any_flag_ask_for_a_layout(argv, wanted):
    """Catches a threshold off by one on any of the three flags (2 ranks is a layout, 1 is not)."""
    from nonstop.commands.layout_args import wants_layout

    assert wants_layout(_parse(["generate", *argv])) is wanted


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--chunks", "1"], ["--chunks"]),
        (["--exchange", "static"], ["--exchange"]),
        (["--exchange", "dynamic"], ["--exchange"]),
        (["--exchange", "auto"], []),
        (["--overlap"], ["--overlap"]),
        (["--no-overlap"], ["--no-overlap"]),
        (["--dist-timeout", "30"], ["--dist-timeout"]),
        (["--chunks", "2", "--no-overlap", "--dist-timeout", "5"], ["--chunks", "--no-overlap", "--dist-timeout"]),
    ],
)
def test_the_rank_flags_given_are_named_as_spelt(argv, named):
    """Catches --exchange auto (the default) counted as given, --overlap and --no-overlap swapped in the
    message, and a flag left out (or one not given named)."""
    from nonstop.commands.layout_args import rank_flags_given

    assert rank_flags_given(_parse(["generate", *argv])) == named


@pytest.mark.parametrize(
    "given, message",
    [
        (["--chunks"], "--chunks describes the ranks of a layout of several ranks"),
        (["--chunks", "--overlap"], "--chunks, --overlap describe the ranks of a layout of several ranks"),
    ],
)
def test_rank_flags_without_a_layout_are_refused(given, message):
    """One flag or several: catches a single flag let through."""
    from nonstop.commands.layout_args import refuse_flags_without_layout

    with pytest.raises(ValueError, match=message):
        refuse_flags_without_layout(given)
    refuse_flags_without_layout([])


def test_llm_class_without_a_layout_is_the_llm_and_refuses_rank_flags():
    """Catches the rank flags accepted (and ignored) when no layout is asked for."""
    from nonstop.commands.layout_args import llm_class
    from nonstop.engine.llm import LLM

    assert llm_class(_parse(["generate"])) is LLM
    with pytest.raises(ValueError, match="--dist-timeout describes"):
        llm_class(_parse(["generate", "--dist-timeout", "30"]))


@pytest.fixture
def rank0(monkeypatch):
    """``llm_class`` in rank 0 of a started launch, its checks and the process group replaced."""
    import nonstop.commands.layout_args as la
    import nonstop.dist.comm as comm_mod

    seen = {}

    def init(layout, device, timeout):
        seen.update(layout=layout, device=device, timeout=timeout)
        return types.SimpleNamespace(rank=0, layout=layout)

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(la, "check_before_start", lambda *a, **k: None)
    monkeypatch.setattr(comm_mod, "init", init)
    monkeypatch.setattr("atexit.register", lambda fn: fn)
    return seen


def test_the_ranks_wait_the_default_collective_timeout_unless_told(rank0):
    """docs/distributed.md: --dist-timeout defaults to 120 s. Catches the flag ignored or the default lost."""
    from nonstop.commands.layout_args import DIST_TIMEOUT_DEFAULT_S, llm_class

    llm_class(_parse(["generate", "--ep", "2"]))
    assert rank0["timeout"] == DIST_TIMEOUT_DEFAULT_S == 120.0
    made = llm_class(_parse(["generate", "--ep", "2", "--dist-timeout", "7"]))
    assert rank0["timeout"] == 7.0 and (rank0["layout"].tp, rank0["layout"].ep) == (1, 2)
    assert made.keywords["chunks"] is None and made.keywords["exchange"] == "auto"


def test_rank_0_gets_the_exchange_flags(rank0):
    """Catches --chunks / --overlap / --exchange not reaching rank 0's DistributedLLM."""
    from nonstop.commands.layout_args import llm_class

    made = llm_class(_parse(["generate", "--ep", "2", "--chunks", "3", "--no-overlap", "--exchange", "static"]))
    assert (made.keywords["chunks"], made.keywords["overlap"], made.keywords["exchange"]) == (3, False, "static")


def test_a_rank_failed_is_status_3_with_one_line(monkeypatch, capsys):
    """A ``RankFailure`` outside a launch: its line on stderr and status 3 (docs: 3 = another rank failed)."""
    from nonstop.commands.layout_args import _rank_failed

    monkeypatch.delenv("NONSTOP_RANK_REPORTS", raising=False)
    assert _rank_failed(RuntimeError("rank 1: gone")) == 3
    assert capsys.readouterr().err == "nonstop: error: rank 1: gone\n"


@pytest.mark.parametrize("world, shared", [(2, False), (3, True)])
def test_the_start_line_says_when_ranks_outnumber_the_cores(monkeypatch, capsys, world, shared):
    """2 cores: 2 ranks fit, 3 share them. Catches the warning at equality (or never)."""
    import nonstop.commands.layout_args as la
    import nonstop.dist.launch as launch
    from nonstop.dist.layout import Layout

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr(launch, "spawn", lambda *a, **k: None)
    assert la.start_ranks(types.SimpleNamespace(threads=None), Layout.make(1, world)) == 0
    err = capsys.readouterr().err
    assert (f"; {world} ranks share 2 CPU cores" in err) is shared, err


@pytest.mark.parametrize("codes, status", [([0, 3], 1), ([2, None], 2), ([None, 1], 1), ([-9, 0], 1)])
def test_the_launch_exits_with_rank_0s_failure_status_else_1(monkeypatch, capsys, codes, status):
    """Rank 0's own status when it failed with one (>0), else 1 - never 0 after a rank failed. Catches
    rank 0's 0 or a signal's negative number returned."""
    import nonstop.commands.layout_args as la
    import nonstop.dist.launch as launch
    from nonstop.dist.layout import Layout

    def spawn(*a, **k):
        raise launch.RankExited(1, codes[1], "rank 1 ended", codes)

    monkeypatch.setattr(launch, "spawn", spawn)
    assert la.start_ranks(types.SimpleNamespace(threads=None), Layout.make(1, 2)) == status


def test_the_program_command_has_no_run_flags_and_names_none_given():
    """``nonstop program`` takes the layout flags without the run flags (no --overlap, --dist-timeout):
    catches a missing flag read as given, which refused every one-rank ``nonstop program``."""
    from nonstop.commands.layout_args import rank_flags_given

    args = _parse(["program"])
    assert not hasattr(args, "dist_timeout") and not hasattr(args, "overlap")
    assert rank_flags_given(args) == []
    assert rank_flags_given(_parse(["program", "--chunks", "2"])) == ["--chunks"]


def _check_before_start(argv, monkeypatch):
    from nonstop.commands.layout_args import check_before_start, layout_from_args

    monkeypatch.delenv("RANK", raising=False)
    args = _parse(argv)
    check_before_start(args, layout_from_args(args))


@pytest.mark.parametrize("tp", ["3", "8"])
def test_heads_the_tp_does_not_divide_are_refused_before_any_rank_starts(monkeypatch, tp):
    """k3-nano has 4 KDA and 4 MLA heads: --tp 3 or 8 cannot split them. Catches the model check
    skipped in the launcher (every rank started, loaded and failed on its own)."""
    from nonstop.dist.layout import LayoutError

    with pytest.raises(LayoutError, match=f"--tp {tp} must divide linear_attn_config.num_heads"):
        _check_before_start(["generate", "--no-preflight", "--tp", tp], monkeypatch)


def test_a_single_process_backend_names_the_layouts_ranks(monkeypatch):
    """Catches the refusal naming another number of ranks than the layout's world (--ep 2 --world 4)."""
    with pytest.raises(ValueError, match=r"under a multi-rank layout \(4 ranks\)"):
        _check_before_start(
            ["generate", "--no-preflight", "--ep", "2", "--world", "4", "--backend", "cpu"], monkeypatch
        )


@pytest.mark.parametrize(
    "local, visible, refused", [(None, 3, True), (None, 4, False), ("2", 2, False), ("2", 1, True)]
)
def test_cuda_ranks_need_one_visible_gpu_each_on_this_host(monkeypatch, local, visible, refused):
    """--tp 2 --ep 4 (4 ranks) on CUDA: the launcher needs 4 GPUs; a torchrun rank on a host of
    LOCAL_WORLD_SIZE 2 needs 2. Catches the count off by one and LOCAL_WORLD_SIZE's default."""
    import torch

    import nonstop.commands.layout_args as la
    import nonstop.weights.resolve as resolve

    monkeypatch.setattr(resolve, "check_device", lambda device: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(la, "host_ranks", lambda layout: None)  # this rank checks no files or memory
    if local is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    argv = ["generate", "--device", "cuda", "--tp", "2", "--ep", "4"]
    if refused:
        with pytest.raises(ValueError, match=f"the layout needs 4 ranks.*one GPU each, but {visible} are visible"):
            _check_before_start(argv, monkeypatch)
    else:
        _check_before_start(argv, monkeypatch)


def test_the_launchers_memory_check_counts_every_slot(monkeypatch):
    """``serve --max-batch 5`` decodes 5 sequences: the host check must count 5 caches. Catches the
    slots dropped (1 counted: a host too small for the server's caches let through)."""
    import nonstop.engine.layout_preflight as lp
    from nonstop.commands.layout_args import check_before_start, layout_from_args

    seen = {}
    monkeypatch.setattr(lp, "check_host_memory", lambda *a, **k: seen.update(args=a))
    monkeypatch.delenv("RANK", raising=False)
    args = _parse(["generate", "--ep", "2"])
    check_before_start(args, layout_from_args(args), 5)
    assert seen["args"][-1] == 5 and list(seen["args"][-3]) == [0, 1]
