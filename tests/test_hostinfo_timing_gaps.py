"""Gaps in the tests of ``nonstop/hostinfo.py`` found by mutation: the timing loop's counts, nearest-rank at
its low edge, cache sizes in megabytes, odd copy sizes, CUDA checks and the results file's last line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import nonstop.hostinfo as hostinfo


def test_time_steps_warms_up_and_times_exactly_as_asked(monkeypatch):
    """warmup=2, steps=4 calls the step 6 times; with steps of 1, 2, 3 and 10 ms (a fake clock) the result is
    median 2.5, p10 1 (1st of 4), p90 10 (ceil(3.6) = 4th), min 1, and the loop's 16 ms over 4 steps = 4 ms."""
    now = [0.0]
    monkeypatch.setattr(hostinfo.time, "perf_counter", lambda: now[0])
    durations = iter([0.5, 0.5, 0.001, 0.010, 0.003, 0.002])  # two warm-up calls, then the timed four
    calls = []

    def step():
        calls.append(1)
        now[0] += next(durations)

    got = hostinfo.Clock("cpu").time_steps(step, steps=4, warmup=2)
    assert len(calls) == 6
    assert got["steps"] == 4 and got["warmup"] == 2
    assert got["ms_per_token"] == pytest.approx(2.5)
    assert got["p10_ms"] == pytest.approx(1.0) and got["p90_ms"] == pytest.approx(10.0)
    assert got["min_ms"] == pytest.approx(1.0)
    assert got["loop_ms_per_step"] == pytest.approx(16.0 / 4)


def test_nearest_rank_at_zero_is_the_smallest():
    """The 0-quantile by nearest rank is the smallest value (rank at least 1), not the largest (index -1)."""
    assert hostinfo.nearest_rank([1.0, 2.0, 3.0], 0.0) == 1.0
    assert hostinfo.nearest_rank([1.0, 2.0, 3.0], 1.0) == 3.0


def test_a_cache_size_in_megabytes_from_sys(monkeypatch, tmp_path):
    """sysfs "2M" is 2 MiB, larger than "1024K" (1 MiB): an M read as KiB would pick the wrong level."""
    monkeypatch.setattr(hostinfo.os, "sysconf", lambda name: (_ for _ in ()).throw(ValueError(name)))
    base = tmp_path / "sys/devices/system/cpu/cpu0/cache"
    for index, size in (("index0", "48K\n"), ("index2", "1024K\n"), ("index3", "2M\n")):
        (base / index).mkdir(parents=True)
        (base / index / "size").write_text(size)

    def fake(p):
        p = str(p)
        return Path(tmp_path / p.lstrip("/")) if p.startswith("/sys") else Path(p)

    monkeypatch.setattr(hostinfo, "Path", fake)
    assert hostinfo.last_level_cache_bytes() == 2 << 20


def test_a_level_4_cache_is_the_last_level(monkeypatch):
    """A CPU with an L4 (eDRAM, 128 MiB) has that as its last level, ahead of its 32 MiB L3."""
    sizes = {
        "SC_LEVEL4_CACHE_SIZE": 128 << 20,
        "SC_LEVEL3_CACHE_SIZE": 32 << 20,
        "SC_LEVEL2_CACHE_SIZE": 1 << 20,
    }
    monkeypatch.setattr(hostinfo.os, "sysconf", lambda name: sizes[name])
    assert hostinfo.last_level_cache_bytes() == 128 << 20


def test_copy_bandwidth_of_an_odd_byte_count(monkeypatch):
    """An odd ``nbytes`` cannot be viewed as bf16: the read-only sum falls back to fp32 instead of raising."""

    def time_steps(self, step, steps, warmup):
        step()  # the step itself must run on these bytes
        return {"ms_per_token": 1.0}

    monkeypatch.setattr(hostinfo.Clock, "time_steps", time_steps)
    got = hostinfo.copy_bandwidth("cpu", nbytes=1001, reps=1)
    assert got["bytes"] == 1001 and got["read_sum_GBps"] == pytest.approx(1001 / 1e6)


def test_cuda_missing_counts_the_gpus_a_run_needs(monkeypatch):
    """Two ranks on a machine with two GPUs can run (None); three cannot, and the reason names the counts.
    A device other than CUDA never needs one."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert hostinfo.cuda_missing("cuda", ranks=2) is None
    assert hostinfo.cuda_missing("cuda", ranks=3) == "3 ranks need 3 GPUs, this machine has 2"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cpu", "meta", "mps"):
        assert hostinfo.cuda_missing(device) is None


def test_the_results_json_ends_with_a_newline(tmp_path):
    """A results file is one JSON document and a final newline (text tools and diffs expect one)."""
    out = tmp_path / "deeper" / "r.json"
    hostinfo.write_result(out, "bench", {"x": 1})
    text = out.read_text()
    assert text.endswith("}\n") and json.loads(text)["x"] == 1
