"""Gaps a mutation audit of ``engine/layout_preflight.py`` found: ranks whose parts differ in shape (uneven
expert counts) are costed each on its own, a CUDA rank's cache counts every slot of its attention group
(and its line says how many), the host's line counts the ranks of this host, and ``process_bytes`` reads
the kB figure of /proc's ``Anonymous:`` line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nonstop.dist.layout import Layout
from nonstop.dist.model import rank_weight_bytes
from nonstop.engine import layout_preflight
from nonstop.engine.layout_preflight import check_host_memory, check_rank_memory, process_bytes, rank_bytes
from nonstop.program.preflight import PreflightError
from nonstop.weights.resolve import resolve_model

CFG = resolve_model("k3-nano")[0]  # 8 routed experts: 3, 3 and 2 on three ranks


def test_ranks_holding_uneven_expert_counts_are_costed_each_on_its_own():
    layout = Layout.make(1, 3)
    parts = rank_bytes(CFG, layout, range(3), torch.float32)
    want = rank_weight_bytes(CFG, layout, torch.float32)
    assert want[2] < want[0]  # two experts fewer
    assert [parts[r][0] for r in range(3)] == want


def test_a_cuda_ranks_cache_counts_its_groups_slots():
    """World 2 of one-rank groups (DP 2), 3 slots: rank 0 keeps slots 0 and 2, rank 1 slot 1."""
    layout = Layout.make(1, 1, 2)
    gpu = torch.device("cuda", 0)
    weights, cache_one = rank_bytes(CFG, layout, [0], torch.float32, 1)[0]
    assert rank_bytes(CFG, layout, [0], torch.float32, 3)[0] == (weights, 2 * cache_one)
    check_rank_memory("tiny", CFG, layout, 0, torch.float32, gpu, slots=3, free=weights + 2 * cache_one)
    with pytest.raises(PreflightError, match=r"of cache for 2 sequence\(s\)\); cuda:0 has"):
        check_rank_memory("tiny", CFG, layout, 0, torch.float32, gpu, slots=3, free=weights + 2 * cache_one - 1)
    with pytest.raises(PreflightError, match=r"tiny's rank 1 .* of cache for 1 sequence\(s\)"):
        check_rank_memory("tiny", CFG, layout, 1, torch.float32, gpu, slots=3, free=1000)


def test_the_host_line_counts_this_hosts_ranks():
    """Under torchrun local rank 0 checks its host's ranks only: 2 of a world of 4."""
    with pytest.raises(PreflightError, match=r"^tiny on 2 local ranks \(tp 2 x ep 2\) needs"):
        check_host_memory("tiny", CFG, Layout.make(2, 2, 4), range(2, 4), torch.float32, free=1000)


def test_process_bytes_reads_the_anonymous_kb(monkeypatch):
    rollup = "00400000-7fff0000 ---p 00000000 00:00 0 [rollup]\nRss:  900000 kB\nAnonymous:  250000 kB\n"
    real = Path.read_text

    def read_text(self, *args, **kwargs):
        return rollup if str(self) == "/proc/self/smaps_rollup" else real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    assert process_bytes() == 250000 * 1024
    rollup = "Rss:  900000 kB\n"  # no Anonymous line: the measured figure
    assert process_bytes() == layout_preflight.RANK_PROCESS_BYTES
