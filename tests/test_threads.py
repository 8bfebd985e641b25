"""The default CPU thread count (``nonstop/threads.py``): explicit choices first, then the model-size rule."""

from __future__ import annotations

import pytest

import nonstop.threads as threads


@pytest.fixture
def no_choice(monkeypatch):
    monkeypatch.setattr(threads, "_chosen", None)
    for var in ("NONSTOP_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(threads, "physical_cores", lambda: 7)  # a count no rule produces by accident


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
    monkeypatch.setenv("NONSTOP_THREADS", "not a number")
    monkeypatch.setattr(threads, "_chosen", None)
    assert threads.default_threads(29_000_000) == 3  # an unusable value falls through to the next
