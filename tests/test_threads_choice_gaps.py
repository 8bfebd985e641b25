"""Gaps in the tests of ``nonstop/threads.py`` found by mutation: the explicit choice remembered by
``set_threads`` and the core count when /sys does not say."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import nonstop.threads as threads


@pytest.fixture
def keep_torch_threads(monkeypatch):
    monkeypatch.setattr(threads, "_chosen", None)
    for var in ("NONSTOP_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_set_threads_is_remembered_as_the_users_choice(keep_torch_threads, monkeypatch):
    """After ``set_threads(n)`` (every command's --threads) ``default_threads`` returns n for any model, even a
    tiny one whose rule says 1: forgetting the choice would let a later executor reset torch to the default."""
    monkeypatch.setattr(threads, "physical_cores", lambda: 7)
    monkeypatch.setattr(threads, "busy_elsewhere", lambda seconds=0: 0.0)
    assert threads.set_threads(2) == 2
    assert threads.default_threads(500_000) == 2
    assert threads.default_threads(29_000_000) == 2
    assert threads.set_threads(None) == 2  # None keeps the setting


def test_cpus_without_a_sibling_list_count_one_core_each(monkeypatch):
    """Where /sys has no thread_siblings_list (containers, other kernels), each CPU this process may run on is
    a core of its own: 4 CPUs are 4 cores, not 1."""

    class Unreadable(type(Path())):
        def read_text(self, *args, **kwargs):
            raise OSError("no such file")

    monkeypatch.setattr(threads, "Path", Unreadable)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 5, 9}, raising=False)
    assert threads.physical_cores() == 4


def test_nonstop_threads_with_surrounding_blanks_is_taken(keep_torch_threads, monkeypatch):
    """NONSTOP_THREADS=" 3" or "3\\n" (a value pasted or read from a file) is 3, not refused as not a number."""
    monkeypatch.setattr(threads, "physical_cores", lambda: 7)
    monkeypatch.setattr(threads, "busy_elsewhere", lambda seconds=0: 0.0)
    for value in (" 3", "3\n", "\t3 "):
        monkeypatch.setenv("NONSTOP_THREADS", value)
        assert threads.default_threads(29_000_000) == 3


def test_one_core_takes_one_thread_without_sampling_the_load(keep_torch_threads, monkeypatch):
    """On one physical core the default is 1 at once: the load sample (LOAD_SAMPLE_S of sleep per executor)
    cannot change it and is not taken."""

    def no_sample(seconds=0):
        raise AssertionError("sampled the load of a one-core machine")

    monkeypatch.setattr(threads, "physical_cores", lambda: 1)
    monkeypatch.setattr(threads, "busy_elsewhere", no_sample)
    assert threads.default_threads(29_000_000) == 1
