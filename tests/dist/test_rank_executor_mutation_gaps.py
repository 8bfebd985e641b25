"""Gaps a mutation audit of ``runtime/distributed.py`` found: ``auto`` is the reference executor under a
layout, superop on a CPU needs the Triton interpreter, an unknown MoE exchange is refused, and the
per-shape buffers are kept least-recently-used first out, at most ``SHAPES_KEPT`` of them."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

import nonstop.runtime.distributed as rd


def test_auto_is_the_reference_executor_under_a_layout():
    assert rd.rank_backend("auto") == "reference"
    assert rd.rank_backend("superop") == "superop"


def test_superop_on_a_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setattr(rd, "triton_interpreter", lambda: False)
    with pytest.raises(ValueError, match="backend 'superop' runs Triton kernels: it needs CUDA devices"):
        rd.check_backend("superop", torch.device("cpu"), 2)
    rd.check_backend("superop", torch.device("cuda", 0), 2)
    rd.check_backend("auto", torch.device("cpu"), 2)
    monkeypatch.setattr(rd, "triton_interpreter", lambda: True)
    rd.check_backend("superop", torch.device("cpu"), 2)


def test_an_unknown_exchange_is_refused():
    with pytest.raises(ValueError, match="unknown MoE exchange 'fast'; choose one of: auto, static, dynamic"):
        rd.check_exchange("fast")
    for mode in ("auto", "static", "dynamic"):
        rd.check_exchange(mode)


def test_kept_shapes_are_least_recently_used_first_out():
    cache: OrderedDict = OrderedDict()
    made = []

    def make(key):
        return lambda: made.append(key) or f"buffers {key}"

    for key in range(rd.SHAPES_KEPT):
        rd._kept(cache, key, make(key))
    assert rd._kept(cache, 0, make(0)) == "buffers 0" and made.count(0) == 1  # reused, now the most recent
    rd._kept(cache, "new", make("new"))  # one too many: the least recently used (1) goes
    assert len(cache) == rd.SHAPES_KEPT and 1 not in cache and 0 in cache
    assert list(cache)[-1] == "new"
