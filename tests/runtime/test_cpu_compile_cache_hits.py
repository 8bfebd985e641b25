"""Whether a step was compiled or loaded from inductor's on-disk cache (``compile_cache.compiled_anew_since``),
and what the user is told: a warm run of the ``cpu`` backend traces the step and loads its compiled code,
which the progress line and ``generate``'s metrics line must not call compiling "cached for later runs"."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from nonstop.runtime.cpu.compile_cache import announced, compiled_anew_since, fx_graph_cache_counts

_COMPILE_TWICE = textwrap.dedent(
    """
    import torch
    from nonstop.runtime.cpu.compile_cache import compiled_anew_since, fx_graph_cache_counts

    def f(x):
        return torch.sin(x) * 3.0 + x.cos()

    for _ in range(2):  # a cold compile, then (dynamo forgotten, inductor's disk cache kept) a warm one
        torch._dynamo.reset()
        before = fx_graph_cache_counts()
        torch.compile(f)(torch.randn(7))
        print("anew" if compiled_anew_since(before) else "cached")
    """
)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("cache", ["on", "off"])
def test_a_second_compile_of_the_same_graph_is_told_apart_from_a_first(tmp_path, cache):
    """A fresh inductor cache: the first compile of a graph compiles (a miss), the same graph again loads from
    the cache. With the FX-graph cache off nothing is looked up: every compile is a compile."""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    if cache == "off":
        env["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"
    done = subprocess.run(
        [sys.executable, "-c", _COMPILE_TWICE], env={**os.environ, **env}, capture_output=True, text=True, timeout=220
    )
    assert done.returncode == 0, done.stderr[-2000:]
    expected = ["anew", "cached"] if cache == "on" else ["anew", "anew"]
    assert done.stdout.split() == expected


def test_compiled_anew_since_reads_the_deltas_of_hits_misses_and_bypasses(monkeypatch):
    """Only what happened since the counts taken before matters: hits alone mean loaded; a miss or a bypass
    among them, or no lookup at all, mean compiled."""
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    before = fx_graph_cache_counts()
    assert compiled_anew_since(before)  # nothing looked up since
    inductor["fxgraph_cache_hit"] += 2
    assert not compiled_anew_since(before)
    for kind in ("fxgraph_cache_miss", "fxgraph_cache_bypass"):
        mid = fx_graph_cache_counts()
        inductor[kind] += 1
        assert compiled_anew_since(before)
        inductor["fxgraph_cache_hit"] += 1
        assert compiled_anew_since(mid)  # the miss / bypass since mid still counts beside the hit
        after = fx_graph_cache_counts()
        inductor["fxgraph_cache_hit"] += 1
        assert not compiled_anew_since(after)  # earlier misses are not charged to a later load


def test_announced_appends_the_note_the_block_left(capsys):
    with announced("preparing x", every_s=60) as timing:
        timing["note"] = "loaded from the cache"
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("nonstop cpu: preparing x: done in ") and err[-1].endswith(" s (loaded from the cache)")


@pytest.mark.timeout(300)
def test_the_executor_counts_a_step_loaded_from_the_cache_apart_from_one_compiled(tmp_path, monkeypatch, capsys):
    """Two executors of one model over a fresh inductor cache: the first compiles its step (all of its
    ``compiling_s`` is ``compiled_anew_s``, stderr says "compiled"), the second finds the graphs on disk
    (``compiled_anew_s`` stays 0, stderr says it loaded them)."""
    from nonstop.cache.state import ModelCache
    from nonstop.runtime.cpu import CPUExecutor
    from tests.runtime.helpers import tiny_model

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model = tiny_model("llama")
    notes = []
    for _ in range(2):
        ex = CPUExecutor(model, compile=True, progress=True)
        cache = ModelCache(model.cfg, 1, capacity=8, page_size=4)
        batch = cache.batch([0], 1)
        ex.forward(torch.tensor([[5]]), cache, batch)
        notes.append((ex.stats["compiling_s"], ex.stats["compiled_anew_s"]))
    (cold, cold_anew), (warm, warm_anew) = notes
    assert cold > 0 and cold_anew == cold
    assert warm > 0 and warm_anew == 0.0
    done = [line for line in capsys.readouterr().err.splitlines() if ": done in " in line]
    assert len(done) == 2
    assert done[0].endswith("(compiled, cached for later runs)")
    assert done[1].endswith("(loaded from the cache: traced, not compiled)")
