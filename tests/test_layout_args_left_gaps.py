"""Gaps the k8 mutation audit found in how the launcher prints the failure line a rank left (``leave_failure`` /
``RankExited.left``, ``commands/layout_args.start_ranks``), checked without starting ranks."""

from __future__ import annotations

import types


def _layout(world: int = 2):
    return types.SimpleNamespace(world=world, describe=lambda routed: "tp 2")


def _start(monkeypatch, exc) -> int:
    import nonstop.dist.launch as launch
    from nonstop.commands.layout_args import start_ranks

    def spawn(*a, **k):
        raise exc

    monkeypatch.setattr(launch, "spawn", spawn)
    return start_ranks(types.SimpleNamespace(threads=None), _layout())


def test_the_line_a_rank_left_is_printed_once_by_the_launcher(monkeypatch, capsys):
    """Rank 1 ended with status 3 (a collective failed) and printed nothing: the launcher prints the line it
    left, once, and the launch's status is rank 0's (3)."""
    from nonstop.dist.launch import RankExited

    exc = RankExited(1, 3, codes=[3, 3])
    exc.left = "nonstop: error: rank 1: receiving the next step from rank 0 failed (closed)"
    assert _start(monkeypatch, exc) == 3
    err = capsys.readouterr().err.splitlines()
    assert err[1:] == ["nonstop: error: rank 1: receiving the next step from rank 0 failed (closed)"]


def test_nothing_left_and_a_rank_that_said_why_adds_no_line(monkeypatch, capsys):
    """Rank 0 printed its own error (status 2): the launcher adds nothing after its start line."""
    from nonstop.dist.launch import RankExited

    assert _start(monkeypatch, RankExited(0, 2, codes=[2, 3])) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("nonstop: starting 2 local ranks")


def test_a_rank_failed_in_a_launch_leaves_its_line_to_the_launcher(tmp_path, monkeypatch, capsys):
    """In a launch (``NONSTOP_RANK_REPORTS`` set) a rank's ``RankFailure`` prints nothing itself: ranks failing
    together would each print a line; its line is left in the reports file for the launcher. Status 3."""
    from nonstop.commands.layout_args import _rank_failed
    from nonstop.dist.launch import left_failure

    reports = tmp_path / "reports"
    reports.write_text("")
    monkeypatch.setenv("NONSTOP_RANK_REPORTS", str(reports))
    assert _rank_failed(RuntimeError("rank 1: gone")) == 3
    assert capsys.readouterr().err == ""
    assert left_failure(str(reports)) == "nonstop: error: rank 1: gone"
