"""Gaps a mutation audit of ``runtime/executors.py`` / ``runtime/interface.py`` found: the kernel backends'
clear error off CUDA without the interpreter, ``cpu-bf16`` keeping 16-bit weights, a backend module missing
from the build, and the engine's cache taking the page size it is given."""

from __future__ import annotations

import pytest
import torch

from nonstop.runtime import executors
from nonstop.runtime.executors import ReferenceExecutor, make_executor
from tests.runtime.helpers import tiny_model


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.mark.parametrize("backend", ["superop", "megakernel"])
def test_kernel_backends_on_a_cpu_need_the_interpreter(llama, monkeypatch, backend):
    monkeypatch.setattr(executors, "triton_interpreter", lambda: False)
    with pytest.raises(ValueError, match=f"backend '{backend}' runs Triton kernels: it needs a CUDA device"):
        make_executor(backend, llama)


def test_cpu_bf16_packs_16_bit_weights(llama):
    ex = make_executor("cpu-bf16", llama)
    assert ex.stats["weights"] == "bfloat16"
    assert make_executor("cpu", llama).stats["weights"] == "float32"


def test_a_backend_missing_from_the_build_is_a_clear_error(llama, monkeypatch):
    def missing(model):
        raise ModuleNotFoundError("No module named 'nonstop.runtime.gone'", name="nonstop.runtime.gone")

    monkeypatch.setitem(executors.BACKENDS, "reference", missing)
    with pytest.raises(ValueError, match="backend 'reference' is not available in this build"):
        make_executor("reference", llama)


@pytest.mark.parametrize("page_size", [2, 8])
def test_the_default_cache_takes_the_page_size(llama, page_size):
    cache = ReferenceExecutor(llama).new_cache(llama.cfg, 2, torch.float32, torch.device("cpu"), page_size)
    assert cache.pages.page_size == page_size and cache.lengths.tolist() == [0, 0]
