"""The default CPU thread count (``nonstop/threads.py``): explicit choices first, then the model-size rule, then
the cores other processes leave free."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

import nonstop.threads as threads


@pytest.fixture
def no_choice(monkeypatch):
    monkeypatch.setattr(threads, "_chosen", None)
    for var in ("NONSTOP_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(threads, "physical_cores", lambda: 7)  # a count no rule produces by accident
    monkeypatch.setattr(threads, "busy_elsewhere", lambda seconds=0: 0.0)


def test_models_above_the_small_size_use_every_physical_core(no_choice):
    k3_nano_bytes = 29_000_000
    assert threads.default_threads(k3_nano_bytes) == 7
    assert threads.default_threads(threads.SMALL_MODEL_BYTES) == 7
    assert threads.default_threads(None) == 7


def test_tiny_models_use_one_thread(no_choice):
    assert threads.default_threads(500_000) == 1  # the suite's tiny kimi_k3 config
    assert threads.default_threads(threads.SMALL_MODEL_BYTES - 1) == 1


def test_explicit_choices_win_in_order(no_choice, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.default_threads(500_000) == 3
    monkeypatch.setenv("NONSTOP_THREADS", "5")
    assert threads.default_threads(29_000_000) == 5
    monkeypatch.setattr(threads, "_chosen", 2)
    assert threads.default_threads(29_000_000) == 2
    monkeypatch.setattr(threads, "_chosen", None)
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")  # OpenMP's nested form is not ours to judge: skipped
    monkeypatch.delenv("NONSTOP_THREADS")
    assert threads.default_threads(500_000) == 1


@pytest.mark.parametrize("value", ["not a number", "0", "-3", "99999999"])
def test_an_unusable_nonstop_threads_is_an_error_not_ignored(no_choice, monkeypatch, value):
    monkeypatch.setenv("NONSTOP_THREADS", value)
    with pytest.raises(ValueError, match="NONSTOP_THREADS"):
        threads.default_threads(29_000_000)


def test_a_thread_count_far_beyond_the_cpus_is_refused(monkeypatch, capsys):
    """torch segfaults at --threads 10000: every command's --threads (and set_threads) stops at
    THREADS_PER_CPU_LIMIT per logical CPU, with the machine's count in the message."""
    from nonstop.cli import main

    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert threads.thread_limit() == 3 * threads.THREADS_PER_CPU_LIMIT
    with pytest.raises(ValueError, match="more than 8 threads for each of this machine's 3 CPUs"):
        threads.set_threads(25)
    for command in (["program", "--summary"], ["train", "--out", "x"]):
        with pytest.raises(SystemExit) as e:
            main([*command, "--threads", "10000"])
        assert e.value.code == 2
        assert "--threads: 10000 is more than 8 threads for each of this machine's 3 CPUs" in capsys.readouterr().err


def test_cores_busy_elsewhere_are_left_to_their_processes(no_choice, monkeypatch, capsys):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(7)), raising=False)
    monkeypatch.setattr(threads, "busy_elsewhere", lambda seconds=0: 2.8)  # 2.8 CPUs: 3 cores taken
    assert threads.default_threads(29_000_000) == 4
    assert threads.default_threads(500_000) == 1  # tiny models: one thread whatever the load
    monkeypatch.setenv("NONSTOP_THREADS", "6")
    assert threads.default_threads(29_000_000) == 6  # an explicit choice is kept under load
    monkeypatch.delenv("NONSTOP_THREADS")
    import torch

    before = torch.get_num_threads()
    try:
        assert threads.configure_threads(None, 29_000_000, announce=True) == 4 == torch.get_num_threads()
        err = capsys.readouterr().err
        assert "other processes keep 2.8 CPUs busy: 4 thread(s) for 7 cores" in err and "--threads" in err
        assert threads.configure_threads(None, 29_000_000) == 4 and capsys.readouterr().err == ""  # quiet
    finally:
        torch.set_num_threads(before)


def test_cores_left_counts_a_core_taken_from_most_of_one_busy():
    assert threads.cores_left(2, 0.0) == 2
    assert threads.cores_left(2, 0.6) == 2  # under 1 - BUSY_SLACK of a core: still ours
    assert threads.cores_left(2, 0.7 + 1e-9) == 1
    assert threads.cores_left(2, 1.9) == 1 and threads.cores_left(2, 5.0) == 1  # never below one
    assert threads.cores_left(4, 2.0, logical=8) == 3  # 2 of 8 hyper-threads busy: one core's worth
    assert threads.cores_left(8, 3.2) == 5


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_busy_elsewhere_sees_another_process():
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # let it start
        assert threads.busy_elsewhere(0.5) >= 0.6  # one spinning process: about one CPU's worth, more if others run
    finally:
        spin.kill()
        spin.wait(timeout=10)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_busy_elsewhere_does_not_count_this_process():
    """A thread spinning in this process adds nothing: measured against the load of the window just before,
    since other processes (the suite's other workers under ``-n auto``) come and go; best of three tries.
    Counting its own time would add about one CPU whenever a core is free for the spinner."""
    stop = threading.Event()
    excess = []
    for _ in range(3):
        before = threads.busy_elsewhere(0.3)
        stop.clear()
        spinner = threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)])
        spinner.start()
        try:
            excess.append(threads.busy_elsewhere(0.3) - before)
        finally:
            stop.set()
            spinner.join(timeout=10)
        if excess[-1] < 0.5:
            break
    assert min(excess) < 0.5, f"this process's own CPU time counted as another's: {excess}"
