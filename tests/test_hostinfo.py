"""The benchmark helper (``nonstop/hostinfo.py``): environment record, step clock, copy bandwidth, floor."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from nonstop.hostinfo import (
    Clock,
    command_line,
    copy_bandwidth,
    decode_floor,
    environment,
    last_level_cache_bytes,
    memory_sized_bytes,
    timed,
    write_result,
)


def test_environment_names_the_machine_and_versions():
    env = environment("cpu")
    assert env["torch"] == torch.__version__ and env["cores"] == os.cpu_count() and env["gpu"] is None
    assert env["threads"] == torch.get_num_threads() and env["cpu"] and env["python"].count(".") == 2
    assert len(env["load_average"]) == 3
    assert command_line().split()[0].startswith("python")


def test_clock_measures_a_known_delay():
    delay = 0.004
    stats = Clock("cpu").time_steps(lambda: time.sleep(delay), steps=7, warmup=1)
    assert stats["steps"] == 7 and stats["warmup"] == 1
    assert delay * 1e3 <= stats["min_ms"] <= stats["p10_ms"] <= stats["ms_per_token"] <= stats["p90_ms"]
    assert stats["loop_ms_per_step"] >= stats["min_ms"]
    assert delay <= timed(lambda: time.sleep(delay))


def test_clock_quantiles_are_nearest_rank(monkeypatch):
    """p10 / p90 of the timed steps by nearest rank (the ceil(p·n)-th smallest): of 10 steps taking 1..10 ms
    the p90 is 9 ms, not the slowest step, and the p10 1 ms; of 7 steps, the 7th and 1st; of 20, 18th and 2nd."""
    import random

    import nonstop.hostinfo as hostinfo

    for n, p10, p90 in [(10, 1, 9), (7, 1, 7), (20, 2, 18), (1, 1, 1)]:
        durations = [k / 1e3 for k in range(1, n + 1)]
        random.Random(n).shuffle(durations)
        feed = iter(durations)
        monkeypatch.setattr(hostinfo, "timed", lambda step, feed=feed: next(feed))
        stats = Clock("cpu").time_steps(lambda: None, steps=n, warmup=0)
        assert (stats["p10_ms"], stats["p90_ms"], stats["min_ms"]) == pytest.approx((p10, p90, 1)), n
        assert stats["ms_per_token"] == pytest.approx((n + 1) / 2)


def test_memory_sized_buffers_outgrow_every_cache():
    llc = last_level_cache_bytes()
    listed = Path("/sys/devices/system/cpu/cpu0/cache")
    for entry in listed.glob("index*/size") if listed.is_dir() else ():
        text = entry.read_text().strip()
        size = int(text.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(text[-1:], 0)
        assert llc >= size, (entry, text, llc)  # no cache the kernel lists is larger
    assert memory_sized_bytes(minimum=1) == 2 * llc
    assert memory_sized_bytes(minimum=1 << 40) == 1 << 40


def test_copy_bandwidth_and_floor():
    bw = copy_bandwidth("cpu", nbytes=1 << 20, reps=3)
    assert bw["bytes"] == 1 << 20 and bw["copy_GBps"] > 0 and bw["read_sum_GBps"] > 0
    floor = decode_floor(2_000_000_000, 100.0)  # 2 GB per token at 100 GB/s: 20 ms, 50 tokens/s
    assert floor == {
        "copy_GBps": 100.0,
        "bytes_per_token": 2_000_000_000,
        "floor_ms_per_token": 20.0,
        "floor_tokens_per_s": 50.0,
    }


def test_a_floor_under_a_microsecond_keeps_its_digits():
    """1.2 MB per token at 4,800 GB/s is 0.25 us: rounded to 3 decimals of a millisecond it read 0.0 ms (a
    floor of zero beside a tokens/s floor of 4 million)."""
    floor = decode_floor(1_200_000, 4800.0)
    assert floor["floor_ms_per_token"] == 0.00025 and floor["floor_tokens_per_s"] == 4_000_000.0
    assert decode_floor(123_456_789, 1000.0)["floor_ms_per_token"] == 0.1235  # 4 significant digits under 1 ms
    assert decode_floor(23_312_800, 1.0)["floor_ms_per_token"] == 23.313  # 3 decimals from 1 ms up


def test_results_json_leads_with_name_command_and_environment(tmp_path):
    out = tmp_path / "new" / "folder" / "r.json"
    fields = {"rows": [{"N": 3, "GBps": 1.5}], "threads": torch.get_num_threads()}
    written = write_result(out, "bench_x", fields)
    on_disk = json.loads(out.read_text())
    assert on_disk == written
    assert list(on_disk)[:3] == ["benchmark", "command", "environment"] and on_disk["benchmark"] == "bench_x"
    assert on_disk["command"] == command_line() and on_disk["environment"]["torch"] == torch.__version__
    assert {k: on_disk[k] for k in fields} == fields
