"""Gaps a second mutation audit of ``commands/layout_args.py`` found: --dist-timeout's stated range, 1 s to a
day, both ends included (the help says "1 to 86400")."""

from __future__ import annotations

import argparse

import pytest

from nonstop.commands.layout_args import dist_timeout


@pytest.mark.parametrize("text, seconds", [("1", 1.0), ("86400", 86400.0), ("120", 120.0)])
def test_the_ends_of_the_dist_timeout_range_are_accepted(text, seconds):
    """Catches either end of [1, 86400] made exclusive (``--dist-timeout 1`` or ``86400`` refused although
    the help offers it)."""
    assert dist_timeout(text) == seconds


@pytest.mark.parametrize("text", ["0.5", "86401"])
def test_just_outside_the_dist_timeout_range_is_refused(text):
    """The neighbours of the ends stay refused, naming the range."""
    with pytest.raises(argparse.ArgumentTypeError, match="expected seconds from 1 to 86400"):
        dist_timeout(text)


@pytest.mark.parametrize(
    "code, said",
    [
        (-1, "nonstop: error: rank 1 was killed by SIGHUP (the first rank to end); the other ranks were stopped\n"),
        (-9, "nonstop: error: rank 1 was killed by SIGKILL (the first rank to end); the other ranks were stopped\n"),
        (3, ""),
    ],
)
def test_a_rank_killed_by_any_signal_is_named_by_the_launcher(monkeypatch, capsys, code, said):
    """A rank a signal ended printed nothing itself: the launcher names it, whatever the signal (SIGHUP is
    -1, the smallest). A rank that exited with a status said why itself. Catches the signal test narrowed
    (a rank hung up on left unexplained)."""
    import types

    import nonstop.commands.layout_args as la
    import nonstop.dist.launch as launch
    from nonstop.dist.layout import Layout

    def spawn(*a, **k):
        raise launch.RankExited(1, code, "", [None, code])

    monkeypatch.setattr(launch, "spawn", spawn)
    assert la.start_ranks(types.SimpleNamespace(threads=None), Layout.make(1, 2)) == 1
    err = capsys.readouterr().err
    assert err.split("\n", 1)[1] == said, err


@pytest.mark.parametrize("stopping, status", [(True, 0), (False, 3)])
def test_a_following_rank_cut_off_by_a_stop_ends_with_status_0(monkeypatch, capsys, stopping, status):
    """A rank other than 0 whose collective fails after a stop was announced (rank 0 left mid-step) ends
    quietly with 0; without a stop the failure is status 3. Catches the stop reported as a failure."""
    import signal
    import types

    import nonstop.commands.layout_args as la
    import nonstop.dist.comm as comm_mod
    import nonstop.dist.launch as launch
    import nonstop.engine.distributed as engine_dist
    import nonstop.weights.resolve as resolve

    def broken(*a, **k):
        raise comm_mod.RankFailure("rank 1: receiving the next step from rank 0 failed (closed)")

    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setattr(resolve, "resolve_model", lambda model: (None, None))
    monkeypatch.setattr(resolve, "parse_dtype", lambda dtype, device: None)
    monkeypatch.setattr(engine_dist, "build_worker", broken)
    monkeypatch.setattr(comm_mod, "shutdown", lambda: None)
    monkeypatch.setattr(launch, "stopping", lambda: stopping)
    monkeypatch.setattr(launch, "leave_failure", lambda line: True)  # print nothing
    args = types.SimpleNamespace(
        model="m", dtype=None, device="cpu", preflight=False, backend="auto", chunks=None, overlap=None, exchange="auto"
    )
    comm = types.SimpleNamespace(layout=None, rank=1, device=None)
    assert la.follow_rank(args, comm) == status
