"""Gaps a mutation audit of ``runtime/executors.py`` found: the registry's clear errors (an unknown backend
name, a backend whose Triton is not installed) and ``auto`` resolving by device."""

from __future__ import annotations

import pytest
import torch

from nonstop.runtime import executors
from nonstop.runtime.executors import make_executor, resolve_backend
from tests.runtime.helpers import tiny_model


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def test_an_unknown_backend_names_the_choices(llama):
    """A misspelt backend is a ValueError listing the backends, not a KeyError from the registry."""
    with pytest.raises(ValueError, match=r"unknown backend 'warp'; choose one of: reference, superop"):
        make_executor("warp", llama)


def test_a_backend_without_triton_says_how_to_install_it(llama, monkeypatch):
    """A backend whose import fails on the missing ``triton`` package is a ValueError with the pip command,
    not a bare ModuleNotFoundError traceback."""

    def needs_triton(model):
        raise ModuleNotFoundError("No module named 'triton'", name="triton")

    monkeypatch.setitem(executors.BACKENDS, "reference", needs_triton)
    with pytest.raises(ValueError, match=r"backend 'reference' needs Triton: pip install 'triton>=3.6'"):
        make_executor("reference", llama)


def test_another_missing_module_is_not_disguised(llama, monkeypatch):
    """A missing third-party module other than Triton propagates as itself (no misleading advice)."""

    def needs_other(model):
        raise ModuleNotFoundError("No module named 'somepkg'", name="somepkg")

    monkeypatch.setitem(executors.BACKENDS, "reference", needs_other)
    with pytest.raises(ModuleNotFoundError, match="somepkg"):
        make_executor("reference", llama)


@pytest.mark.parametrize("device, want", [("cpu", "cpu"), (torch.device("cpu"), "cpu"), ("meta", "reference")])
def test_auto_resolves_by_device_and_names_pass_through(device, want):
    """``auto`` is the compiled CPU path on a CPU and the reference elsewhere; a named backend is kept."""
    assert resolve_backend("auto", device) == want
    assert resolve_backend("reference", "cpu") == "reference"
    assert resolve_backend("superop", device) == "superop"
