"""An absurd layout size on the command line (``--ep 1000000``) must be refused at once, in one line.

The launcher's memory preflight (``engine/layout_preflight.check_host_memory``) builds a meta rank state
for every one of the ranks before it compares anything with the free memory (about 0.7 ms a rank on this
machine): ``nonstop generate --ep 1000000`` sat silent for over 5 minutes (``--ep 100000``: over a
minute) before saying what the per-rank process memory alone (230 MB x ranks) shows at once.
"""

from __future__ import annotations

import subprocess

import pytest
import torch

from tests.dist.procs import launched


@pytest.mark.timeout(90)
def test_generate_refuses_a_million_ranks_quickly():
    """Catches the preflight costing each of a million ranks one by one (minutes of silence) instead of
    refusing a layout whose rank processes alone cannot fit; the answer is one ``nonstop: error:`` line
    within 45 s, no traceback, and no rank started."""
    argv = ["-m", "nonstop", "generate", "-n", "2", "--temperature", "0", "--ep", "1000000", "Hi"]
    with launched(argv) as proc:
        try:
            _, err = proc.communicate(timeout=45)
        except subprocess.TimeoutExpired:
            pytest.fail("`nonstop generate --ep 1000000` still running after 45 s (the preflight costs every rank)")
        assert proc.returncode == 2, err
        assert "Traceback" not in err
        assert "nonstop: error:" in err and "starting" not in err, err


@pytest.mark.timeout(60)
def test_generate_refuses_ranks_that_do_not_fit_in_one_line():
    """Promised behaviour (passes on base): a layout whose ranks need more memory than the host has is
    refused before any rank starts (``--ep 1000``: 1000 rank processes of ~230 MB)."""
    argv = ["-m", "nonstop", "generate", "-n", "2", "--temperature", "0", "--ep", "1000", "Hi"]
    with launched(argv) as proc:
        _, err = proc.communicate(timeout=50)
        assert proc.returncode == 2, err
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines[-1].startswith("nonstop: error: k3-nano on 1000 local ranks"), err
        assert "--no-preflight" in lines[-1] and "starting" not in err


def test_the_host_check_refuses_rank_processes_alone_before_costing_any_part(monkeypatch):
    """``check_host_memory`` with a million ranks of 230 MB against 64 GB free: refused by the processes'
    memory alone, before a single rank's part is costed (``rank_bytes`` must not be called)."""
    from nonstop.engine import layout_preflight
    from nonstop.program.preflight import PreflightError
    from nonstop.weights.resolve import resolve_model

    monkeypatch.setattr(layout_preflight, "rank_bytes", lambda *a, **k: pytest.fail("costed the ranks' parts"))
    cfg, _ = resolve_model("k3-nano")
    layout = layout_preflight.Layout.make(1, 10**6)
    with pytest.raises(PreflightError) as e:
        layout_preflight.check_host_memory(
            "k3-nano", cfg, layout, range(10**6), torch.float32, 1, 64 << 30, 230_000_000
        )
    assert "1000000 local ranks" in str(e.value) and "230 TB for the rank processes alone" in str(e.value)
