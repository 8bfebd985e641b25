"""Gaps in ``runtime/cuda_graph.py`` that no GPU is needed to see: the ``graphs`` argument's check, which cache
layers are pools and that ``fit_pools`` grows them, the storage signature (every tensor a captured step
addresses: pools, page table, lengths, KDA states, kernel workspaces) changing exactly when an address or
shape does, the module containers it watches, and ``CapturedStep``'s bookkeeping (emulated)."""

from __future__ import annotations

import types

import pytest
import torch

from nonstop.cache.state import ModelCache
from nonstop.config import ModelConfig
from nonstop.runtime import cuda_graph
from nonstop.runtime.cuda_graph import (
    CapturedStep,
    _tensor_leaves,
    check_graphs,
    fit_pools,
    module_containers,
    new_pool,
    storage_signature,
    token_caches,
)
from tests.tiny_configs import TINY_CONFIGS


def _cache(name: str = "kimi_k3", capacity: int = 8) -> ModelCache:
    return ModelCache(ModelConfig.from_hf_dict(TINY_CONFIGS[name]), 2, capacity=capacity, page_size=4)


@pytest.mark.parametrize("ok", [True, False, "auto", "emulate"])
def test_check_graphs_accepts_the_four_choices(ok):
    """The documented choices pass."""
    check_graphs(ok)


@pytest.mark.parametrize("bad", [1, 0, "no", "on", None, 1.0])
def test_check_graphs_refuses_anything_else(bad):
    """1 and 0 compare equal to True and False: only a real bool (or one of the two strings) may pass, or a
    truthy "no" / 1 would switch capture on where the caller meant something else."""
    with pytest.raises(ValueError, match="graphs must be"):
        check_graphs(bad)


def test_token_caches_are_the_pooled_layers_and_fit_pools_grows_them():
    """kimi_k3's tiny config: layers 3 and 6 are MLA (paged pools), the five KDA layers hold states only; after
    a step reserves pages past the pool, ``fit_pools`` grows every pool to pages x page_size rows."""
    cache = _cache()
    pooled = token_caches(cache)
    assert pooled == [cache.layers[3], cache.layers[6]]
    cache.batch([0, 1], 30)  # 30 tokens a slot: 8 pages of 4 each, more than the 2 x 2 reserved up front
    assert all(layer.capacity < cache.pages.num_pages * 4 for layer in pooled)
    fit_pools(cache)
    assert all(layer.capacity == cache.pages.num_pages * 4 == 64 for layer in pooled)


def test_tensor_leaves_reach_two_levels_of_containers():
    """Tensors directly or in dicts / lists / tuples two levels deep (a layer's dict of pools, a workspace
    list of tuples) are in the signature; deeper ones and non-tensors are not."""
    a, b, c, d = (torch.zeros(i + 1) for i in range(4))
    assert _tensor_leaves(a) == [a]
    got = _tensor_leaves({"x": a, "y": [b, (c,)], "z": 3, "w": "s"})
    assert len(got) == 2 and got[0] is a and got[1] is b  # c is three levels down
    got = _tensor_leaves([{"k": a}, (b, c)])
    assert len(got) == 3 and all(x is y for x, y in zip(got, [a, b, c]))
    assert _tensor_leaves([[[d]]]) == [] and _tensor_leaves(None) == []


def test_the_storage_signature_changes_exactly_when_an_address_or_shape_does():
    """Unchanged cache: the same signature (a graph replays); another cache object, a grown pool, a wider page
    table, new lengths, a replaced KDA state, or a kept workspace that grew: a different one (re-capture)."""
    cache = _cache()
    workspace = {"w": torch.zeros(4)}
    base = storage_signature(cache, [workspace])
    assert storage_signature(cache, [workspace]) == base
    cache.lengths.add_(1)  # contents change in place: still valid
    assert storage_signature(cache, [workspace]) == base
    assert storage_signature(_cache(), [workspace]) != base  # another cache
    changes = [
        lambda: setattr(cache, "lengths", cache.lengths.clone()),
        lambda: cache.layers[0].__setattr__("recurrent", cache.layers[0].recurrent.clone()),
        lambda: workspace.__setitem__("w", torch.zeros(8)),
        lambda: setattr(cache.pages, "table", torch.zeros(2, 5, dtype=torch.long)),
        lambda: (cache.batch([0, 1], 30), fit_pools(cache)),
    ]
    for change in changes:
        before = storage_signature(cache, [workspace])
        change()
        assert storage_signature(cache, [workspace]) != before
    same = torch.zeros(3)
    view = same.view(3, 1)  # one address, another shape
    assert storage_signature(cache, [[same]]) != storage_signature(cache, [[view]])


def test_module_containers_are_the_modules_dicts_and_lists():
    """A kernel module's workspace may be a dict or a list (both watched), never a dunder like ``__all__``."""
    m = types.ModuleType("fake_kernels")
    m.WORKSPACE, m.CACHE, m.TUPLE, m.N, m.__all__ = {}, [], (1,), 3, ["x"]
    m._private = {}
    assert sorted(name for mod, name in module_containers([m]) if mod is m) == ["CACHE", "WORKSPACE", "_private"]


def test_an_emulated_captured_step_replays_the_latest_capture_until_released():
    """``ready`` follows the signature, captures are counted, replay runs the latest capture, a released step
    is not ready and replays nothing; graph pools exist only on CUDA."""
    calls = []
    step = CapturedStep(emulate=True)
    assert not step.ready and step.captures == 0
    step.capture(lambda: calls.append("a"), ("s1",))
    assert step.ready and step.signature == ("s1",) and step.captures == 1
    step.replay()
    step.capture(lambda: calls.append("b"), ("s2",))
    step.replay()
    assert calls == ["a", "b"] and step.signature == ("s2",) and step.captures == 2
    step.release()
    assert not step.ready and step.signature is None
    with pytest.raises(TypeError):
        step.replay()  # nothing captured: a released step never replays an old capture
    assert new_pool("cpu") is None


def test_graphs_wanted_with_an_env_other_than_zero_keeps_capture(monkeypatch):
    """Only NONSTOP_CUDA_GRAPHS=0 turns capture off; graphs=True on a CUDA device captures."""
    monkeypatch.setenv(cuda_graph.GRAPHS_ENV, "1")
    assert cuda_graph.graphs_wanted("cuda", True, True) == (True, "on")
    monkeypatch.setenv(cuda_graph.GRAPHS_ENV, "0")
    assert cuda_graph.graphs_wanted("cuda", True, True)[0] is False


def test_pdl_is_off_off_cuda_and_under_the_interpreter(monkeypatch):
    """PDL is a CUDA feature (a meta or CPU device says so), and the Triton interpreter cannot run it even on
    a device of compute capability 9.0 (stubbed: no GPU needed)."""
    monkeypatch.delenv(cuda_graph.PDL_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    for device in ("cpu", "meta"):
        assert cuda_graph.pdl_support(device) == (False, f"device {device} (PDL is a CUDA feature)")
    monkeypatch.setattr(cuda_graph, "interpreting", lambda: True)
    assert cuda_graph.pdl_support("cuda") == (False, "Triton interpreter")


@pytest.mark.parametrize("bad", ["no", "off", 0, None])
def test_an_executor_refuses_a_graphs_value_it_would_read_as_truthy(bad):
    """``graphs="no"`` (or 0, "off", None) once meant capture on a CUDA device and nothing said on the CPU: every
    executor now refuses it, on the CPU too, naming the four choices."""
    from nonstop.runtime.superop import SuperOpExecutor
    from tests.runtime.helpers import tiny_model

    with pytest.raises(ValueError, match="graphs must be True, False, 'auto' or 'emulate'"):
        cuda_graph.graphs_wanted("cuda", True, bad)
    with pytest.raises(ValueError, match="graphs must be True, False, 'auto' or 'emulate'"):
        SuperOpExecutor(tiny_model("llama"), use_kernels=False, graphs=bad)
