"""``nonstop/threads.py`` and ``nonstop/hostinfo.py`` fed crafted /proc and /sys contents: the busy / total
ticks of /proc/stat (iowait and idle free, steal busy, guest not counted twice, only this process's CPUs),
the load sample's edges, hyper-thread siblings, OMP_NUM_THREADS out of range, and /proc/cpuinfo fields and
cache sizes as Linux writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

import nonstop.hostinfo as hostinfo
import nonstop.threads as threads


def _files(monkeypatch, module, contents: dict[str, str], tmp_path: Path) -> None:
    """``module.Path(p)`` reads ``contents[p]`` for the paths given (written under ``tmp_path``)."""
    for path, text in contents.items():
        target = tmp_path / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def fake(p):
        p = str(p)
        return Path(tmp_path / p.lstrip("/")) if p.startswith(("/proc", "/sys")) else Path(p)

    monkeypatch.setattr(module, "Path", fake)


# user nice system idle iowait irq softirq steal guest guest_nice
PROC_STAT = """cpu  1000 1000 1000 1000 1000 1000 1000 1000 0 0
cpu0 10 1 2 100 5 3 4 6 7 8
cpu1 20 0 0 50 30 0 0 0 0 0
cpu2 500 0 0 0 0 0 0 0 0 0
intr 12345 0 0
ctxt 999
"""


def test_proc_stat_ticks_of_this_process_cpus(monkeypatch, tmp_path):
    """cpu0: 131 ticks in the first 8 fields (guest time is already in user), 131 - 100 idle - 5 iowait =
    26 busy (steal counts as busy); cpu1: 100 ticks, 20 busy; cpu2 and the all-CPU line are not ours."""
    _files(monkeypatch, threads, {"/proc/stat": PROC_STAT}, tmp_path)
    assert threads._cpu_jiffies({0, 1}) == (26 + 20, 131 + 100)
    assert threads._cpu_jiffies({0}) == (26, 131)


def _sample(monkeypatch, before, after, own_s: float, cpus=(0, 1)):
    """busy_elsewhere over 1 s with /proc/stat's (busy, total) ``before`` and ``after`` and ``own_s`` of this
    process's CPU time in the window."""
    ticks = iter([before, after])
    clock = iter([100.0, 100.0 + own_s])
    monkeypatch.setattr(threads, "_cpu_jiffies", lambda cpus: next(ticks))
    monkeypatch.setattr(threads.time, "process_time", lambda: next(clock))
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(cpus), raising=False)
    return threads.busy_elsewhere(1.0)


def test_busy_elsewhere_arithmetic(monkeypatch):
    # 2 CPUs, 200 ticks in the window, 100 busy: one CPU's worth, of which this process used 0.25 s of 1 s
    assert _sample(monkeypatch, (1000, 5000), (1100, 5200), 0.25) == pytest.approx(0.75)


def test_busy_elsewhere_is_never_negative(monkeypatch):
    """This process's own time can exceed the busy ticks seen (tick granularity): no negative load."""
    assert _sample(monkeypatch, (1000, 5000), (1010, 5200), 0.5) == 0.0


def test_busy_elsewhere_with_no_ticks_in_the_window_is_unknown_not_a_crash(monkeypatch):
    assert _sample(monkeypatch, (1000, 5000), (1000, 5000), 0.0) == 0.0


def test_hyper_thread_siblings_are_one_core(monkeypatch, tmp_path):
    siblings = {
        f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list": f"{c % 2},{c % 2 + 2}\n" for c in range(4)
    }
    _files(monkeypatch, threads, siblings, tmp_path)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert threads.physical_cores() == 2


@pytest.fixture
def no_choice(monkeypatch):
    monkeypatch.setattr(threads, "_chosen", None)
    for var in ("NONSTOP_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(threads, "physical_cores", lambda: 7)
    monkeypatch.setattr(threads, "busy_elsewhere", lambda seconds=0: 0.0)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(7)), raising=False)


@pytest.mark.parametrize("value", ["0", "57"])  # 57 > 8 threads x 7 CPUs
def test_an_omp_num_threads_out_of_range_is_not_taken(no_choice, monkeypatch, value):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert threads.default_threads(29_000_000) == 7


def test_the_thread_limit_itself_is_accepted(no_choice, monkeypatch):
    assert threads.check_thread_count(56) == 56  # 8 per CPU x 7 CPUs
    monkeypatch.setenv("NONSTOP_THREADS", "57")
    with pytest.raises(ValueError, match="NONSTOP_THREADS 57 is more than 8 threads"):
        threads.default_threads(29_000_000)


def test_an_explicit_count_is_configured_as_given(no_choice):
    import torch

    before = torch.get_num_threads()
    try:
        assert threads.configure_threads(3, 29_000_000) == 3 == torch.get_num_threads()
        with threads.one_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7B13
cache size\t: 512 KB

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
"""


def test_cpuinfo_fields(monkeypatch, tmp_path):
    _files(monkeypatch, hostinfo, {"/proc/cpuinfo": CPUINFO}, tmp_path)
    assert hostinfo.cpu_vendor() == "AuthenticAMD"
    assert hostinfo.cpu_name() == "AMD EPYC 7B13"


def test_cpuinfo_without_a_vendor_says_none(monkeypatch, tmp_path):
    _files(monkeypatch, hostinfo, {"/proc/cpuinfo": "processor\t: 0\nmodel name\t: Neoverse\n"}, tmp_path)
    assert hostinfo.cpu_vendor() == ""


def _sysconf(values: dict[str, int]):
    def sysconf(name):
        if name not in values:
            raise ValueError(f"unrecognized configuration name {name}")
        return values[name]

    return sysconf


def test_the_last_level_cache_is_the_largest_level_sysconf_knows(monkeypatch):
    """glibc reports a level the CPU lacks as 0 (no L4 here): the L3's 32 MiB, not the L2's 1 MiB."""
    monkeypatch.setattr(
        hostinfo.os,
        "sysconf",
        _sysconf({"SC_LEVEL4_CACHE_SIZE": 0, "SC_LEVEL3_CACHE_SIZE": 32 << 20, "SC_LEVEL2_CACHE_SIZE": 1 << 20}),
    )
    assert hostinfo.last_level_cache_bytes() == 32 << 20


def test_the_last_level_cache_from_sys_when_sysconf_does_not_say(monkeypatch, tmp_path):
    """sysfs writes sizes in binary units ("32768K" is 32 MiB); the largest index wins wherever it is listed."""
    monkeypatch.setattr(hostinfo.os, "sysconf", _sysconf({}))
    base = "/sys/devices/system/cpu/cpu0/cache"
    sizes = {"index0": "32768K\n", "index1": "32K\n", "index2": "1M\n", "index3": "48K\n"}
    _files(monkeypatch, hostinfo, {f"{base}/{i}/size": s for i, s in sizes.items()}, tmp_path)
    assert hostinfo.last_level_cache_bytes() == 32 << 20


def test_nothing_is_announced_when_no_core_is_taken(no_choice, capsys):
    import torch

    before = torch.get_num_threads()
    try:
        assert threads.configure_threads(None, 29_000_000, announce=True) == 7
    finally:
        torch.set_num_threads(before)
    assert capsys.readouterr().err == ""


def test_copy_bandwidth_counts_the_bytes_read_and_written(monkeypatch):
    """A copy of 1 MB in 1 ms moves 2 MB (read + written): 2 GB/s; the read-only sum of 1 MB in 1 ms: 1 GB/s.
    The floor of 1 GB per token at 100 GB/s: 10 ms, 100 tokens/s."""
    monkeypatch.setattr(hostinfo.Clock, "time_steps", lambda self, step, steps, warmup: {"ms_per_token": 1.0})
    got = hostinfo.copy_bandwidth("cpu", nbytes=1_000_000)
    assert got["copy_GBps"] == pytest.approx(2.0) and got["read_sum_GBps"] == pytest.approx(1.0)
    floor = hostinfo.decode_floor(10**9, 100.0)
    assert floor["floor_ms_per_token"] == 10.0 and floor["floor_tokens_per_s"] == 100.0
