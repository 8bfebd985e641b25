"""Gaps a mutation audit of the superop executor's host side found: the max_rows boundary (a step of exactly
max_rows rows runs the program), sample_tokens' step count, the device sampler's row / position check,
CUDA-graph switches (decided without a GPU) and launch-grid sizes."""

from __future__ import annotations

import pytest
import torch

from nonstop.cache.state import ModelCache
from nonstop.runtime.cuda_graph import GRAPHS_ENV, graphs_wanted
from nonstop.runtime.device_sampling import SampleRow, fill_sample_rows
from nonstop.runtime.launch_count import _grid_size
from nonstop.runtime.superop import SuperOpExecutor
from tests.runtime.helpers import tiny_model


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def test_a_step_of_exactly_max_rows_rows_runs_the_program(llama):
    """``max_rows`` rows still go through the program; one more goes to the reference (the docstring's rule)."""
    ex = SuperOpExecutor(llama, use_kernels=False)
    R = ex.max_rows
    cache = ModelCache(llama.cfg, 1, capacity=2 * R + 2)
    batch = cache.batch([0], R)
    got = ex.forward(torch.arange(R).view(1, R) % llama.cfg.vocab_size, cache, batch)
    assert ex.stats["program_steps"] == 1 and ex.stats["reference_steps"] == 0
    assert got.shape == (1, R, llama.cfg.vocab_size)


@pytest.mark.parametrize("n", [0, -2])
def test_sample_tokens_refuses_a_non_positive_step_count(llama, n):
    ex = SuperOpExecutor(llama, graphs=False)
    cache = ModelCache(llama.cfg, 1, capacity=8)
    with pytest.raises(ValueError, match="n >= 1"):
        ex.sample_tokens(torch.tensor([[5]]), cache, [0], n, [SampleRow()])
    assert "device_sampled_steps" not in ex.stats
    assert int(cache.lengths[0]) == 0


def test_fill_sample_rows_needs_one_position_per_row():
    """A single position for two rows must not broadcast silently into both rows' noise counters."""
    buf = {
        "sample_temperature": torch.zeros(4),
        "sample_top_k": torch.zeros(4, dtype=torch.int64),
        "sample_top_p": torch.ones(4),
        "sample_seed": torch.zeros(4, dtype=torch.int64),
        "sample_offset": torch.zeros(4, dtype=torch.int64),
    }
    rows = [SampleRow(0.5, 3, 0.9, 7), SampleRow(1.0, -1, 1.0, -2)]
    with pytest.raises(ValueError, match="2 sampling rows for 1 positions"):
        fill_sample_rows(buf, rows, torch.tensor([9]))
    fill_sample_rows(buf, rows, torch.tensor([9, 4]))
    assert buf["sample_offset"].tolist() == [9, 4, 0, 0]
    assert buf["sample_temperature"].tolist() == [0.5, 1.0, 0.0, 0.0]
    assert buf["sample_top_k"].tolist() == [3, -1, 0, 0]
    assert buf["sample_top_p"][:2].tolist() == pytest.approx([0.9, 1.0])
    assert buf["sample_seed"].tolist() == [7, -2, 0, 0]


def test_graphs_wanted_on_a_cuda_device(monkeypatch):
    """The capture decision for a CUDA device (no GPU needed: only the device's type is read): "auto" captures
    kernel steps, not the twins (they sync with the host); True forces it; NONSTOP_CUDA_GRAPHS=0 turns it off."""
    monkeypatch.delenv(GRAPHS_ENV, raising=False)
    assert graphs_wanted("cuda", True, "auto") == (True, "on")
    assert graphs_wanted("cuda", False, "auto")[0] is False
    assert graphs_wanted("cuda", False, True) == (True, "on")
    assert graphs_wanted("cuda", True, False)[0] is False
    assert graphs_wanted("cpu", True, True)[0] is False
    monkeypatch.setenv(GRAPHS_ENV, "1")
    assert graphs_wanted("cuda", True, "auto")[0] is True
    monkeypatch.setenv(GRAPHS_ENV, "0")
    assert graphs_wanted("cuda", True, "auto") == (False, f"{GRAPHS_ENV}=0")


def test_grid_sizes():
    assert _grid_size(3) == 3 and _grid_size(0) == 0
    assert _grid_size((2, 3)) == 6 and _grid_size((4, 0, 2)) == 0
    assert _grid_size(lambda meta: (1,)) is None


def test_allocations_are_not_launches():
    """``empty`` / ``empty_strided`` / ``empty_like`` and views allocate or describe memory: no launch; a
    fill or an add is one launch each."""
    from nonstop.runtime.launch_count import LaunchCounter

    with LaunchCounter("cpu") as c:
        x = torch.empty(4)
        torch.empty_strided((2, 2), (1, 2))
        torch.empty_like(x)
        x.view(2, 2)
    assert c.total == 0, c.summary()["torch_ops"]
    with LaunchCounter("cpu") as c:
        x.fill_(1.0)
        x.add_(1.0)
    assert c.total == 2 and c.syncs.total() == 0


def test_weight_roles_split_streamed_weights_side_streams_and_the_rest():
    """Streamed: matrices of at least a quarter of the op's largest; side streams: from 1/32 up to (not
    including) a quarter; smaller matrices and vectors neither."""
    from types import SimpleNamespace

    from nonstop.runtime.megakernel.codegen.record import _storage, weight_roles

    w = {
        "big": torch.zeros(64, 64),  # 4096 elements
        "quarter": torch.zeros(16, 64),  # 1024: exactly a quarter
        "under_quarter": torch.zeros(1023, 1),
        "thirty_second": torch.zeros(2, 64),  # 128: exactly 1/32
        "tiny": torch.zeros(127, 1),
        "vector": torch.zeros(4096),
    }
    streamed, side = weight_roles(SimpleNamespace(weights=w))
    names = {_storage(t): n for n, t in w.items()}
    assert {names[s] for s in streamed} == {"big", "quarter"}
    assert {names[s] for s in side} == {"under_quarter", "thirty_second"}
