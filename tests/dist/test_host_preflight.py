"""The host memory preflight of CPU ranks counts each rank's own process (Python, torch, nonstop: about
230 MB before it loads anything), not only its part of the model: ``--world 256`` of k3-nano passed the
check with 9 GB of parts on a 24 GB host, and 256 processes of 230 MB would have been OOM-killed."""

from __future__ import annotations

import pytest
import torch

from nonstop.dist.layout import Layout
from nonstop.engine import layout_preflight
from nonstop.engine.layout_preflight import check_host_memory, process_bytes, rank_bytes
from nonstop.program.preflight import PreflightError
from nonstop.weights.resolve import resolve_model

CFG = resolve_model("k3-nano")[0]


def _parts(layout: Layout) -> int:
    return sum(w + c for w, c in rank_bytes(CFG, layout, range(layout.world), torch.float32).values())


def test_each_rank_process_counts_on_top_of_its_part():
    layout = Layout.make(1, 2)
    need, per_rank = _parts(layout), 10**8
    check_host_memory("nano", CFG, layout, range(2), torch.float32, free=need + 2 * per_rank, per_rank=per_rank)
    with pytest.raises(PreflightError) as e:
        check_host_memory("nano", CFG, layout, range(2), torch.float32, free=need + 2 * per_rank - 1, per_rank=per_rank)
    assert "(200 MB for the rank processes themselves, 100 MB each before loading; " in str(e.value), e.value
    assert str(e.value).endswith("free (pass --no-preflight to try anyway)"), e.value


def test_process_bytes_is_this_process_own_memory():
    """At least torch's own heap (this process has imported it), at most what it has resident."""
    rss = int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS:")).split()[1]) * 1024
    assert 50 * 10**6 < process_bytes() <= rss


def test_a_world_too_large_for_the_hosts_memory_is_refused_before_any_rank_starts(monkeypatch):
    from nonstop.cli import build_parser
    from nonstop.commands.layout_args import check_before_start, layout_from_args

    monkeypatch.delenv("RANK", raising=False)
    args = build_parser().parse_args(["generate", "--world", "256", "hi"])
    layout = layout_from_args(args)
    parts = _parts(layout)  # 256 copies of k3-nano: about 9 GB
    monkeypatch.setattr(layout_preflight, "available_memory", lambda device: parts + 10**9)
    with pytest.raises(
        PreflightError,
        match=r"k3-nano on 256 local ranks .* for the rank processes (themselves|alone)",
    ):
        check_before_start(args, layout)
