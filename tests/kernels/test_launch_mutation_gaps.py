"""Gaps a mutation audit of ``kernels/launch.py`` found: workspaces grow to every size asked for, a
generated launcher keeps its tile function's default arguments and passes ``num_tiles``, a multi-phase
declaration needs ``PHASE``, and a PDL prefetch computes its weight offset in 64 bits."""

from __future__ import annotations

import inspect

import pytest
import torch

triton = pytest.importorskip("triton")
tl = triton.language

from nonstop.kernels import launch  # noqa: E402


@triton.jit
def _fill_tile(pid, out_ptr, value=7):
    tl.store(out_ptr + pid, value)


@triton.jit
def _count_tile(pid, num_tiles, out_ptr):
    tl.store(out_ptr + pid, num_tiles)


@triton.jit
def _no_phase_tile(pid, out_ptr):
    tl.store(out_ptr + pid, 1)


@triton.jit
def _weights_tile(pid, w_ptr, out_ptr, N):
    tl.store(out_ptr + pid, tl.load(w_ptr + pid * N))


def test_a_workspace_grows_to_every_size_asked_for():
    """Asked for one element more than it holds, a workspace is reallocated (at least 16 elements)."""
    name = "test_launch_mutation_gaps.grow"
    first = launch.workspace(name, 40, torch.float32, "cpu")
    assert first.numel() >= 40
    grown = launch.workspace(name, first.numel() + 1, torch.float32, "cpu")
    assert grown.numel() >= first.numel() + 1
    assert launch.workspace(name, 5, torch.float32, "cpu") is grown  # never shrunk
    assert launch.workspace("test_launch_mutation_gaps.small", 1, torch.int32, "cpu").numel() == 16


def test_a_launcher_keeps_the_tile_functions_default_arguments():
    kernel = launch.launcher(_fill_tile, name="test_fill_kernel")
    out = torch.zeros(3, dtype=torch.int32)
    kernel[(3,)](out)  # value left to its default
    assert out.tolist() == [7, 7, 7]
    kernel[(2,)](out, value=4)
    assert out.tolist() == [4, 4, 7]


def test_a_launcher_passes_the_number_of_tiles():
    """A tile function whose second parameter is ``num_tiles`` gets the grid size; the launcher does not
    take it as an argument."""
    kernel = launch.launcher(_count_tile, name="test_count_kernel")
    assert launch.declaration(kernel).num_tiles is True
    assert "num_tiles" not in inspect.signature(launch.python_function(kernel)).parameters
    out = torch.zeros(5, dtype=torch.int32)
    kernel[(5,)](out)
    assert out.tolist() == [5] * 5


def test_a_multi_phase_launcher_needs_a_phase_parameter():
    with pytest.raises(TypeError, match="takes PHASE"):
        launch.launcher(_no_phase_tile, phases=("a", "b"), first="n", name="test_no_phase_kernel")


def test_the_prefetch_offset_of_a_program_is_computed_in_64_bits():
    """pid * N passes 2^31 elements in large weights: the generated prefetch widens pid first."""
    kernel = launch.launcher(_weights_tile, name="test_weights_kernel", prefetch=("w_ptr", "pid * N", "N"))
    source = inspect.getsource(launch.python_function(kernel))
    assert "pid.to(tl.int64) * N" in source and "prefetch_l2(" in source
    w, out = torch.arange(12, dtype=torch.float32), torch.zeros(3)
    kernel[(3,)](w, out, 4)  # without PDL the prefetch is not compiled: the tile runs as declared
    assert out.tolist() == [0.0, 4.0, 8.0]
