"""Gap the k8 mutation audit found in ``spawn`` (``dist/launch.py``): the failure line a rank left for the launcher
(``leave_failure``) must reach ``RankExited.left``, where ``commands/layout_args.start_ranks`` prints it. Ranks here
import nothing but the launcher: a few seconds per spawn."""

from __future__ import annotations

import os

import pytest

from nonstop.dist.launch import RankExited, spawn

LINE = "nonstop: error: rank 1: receiving the next step from rank 0 failed (closed)"


def rank_1_leaves_a_failure() -> None:
    from nonstop.dist.launch import leave_failure

    if os.environ["RANK"] == "1":
        assert leave_failure(LINE)  # in a launch: left, not printed
        os._exit(3)


@pytest.mark.timeout(120)
def test_the_line_a_rank_left_reaches_the_launchers_exception(capfd):
    with pytest.raises(RankExited) as exc:
        spawn(rank_1_leaves_a_failure, 2, timeout=100)
    assert (exc.value.rank, exc.value.code) == (1, 3)
    assert exc.value.left == LINE
    assert LINE not in capfd.readouterr().err  # the rank itself printed nothing
