"""Attention weights that are views with padded rows (``gqa.py``, ``mla.py``).

The launches pass each weight's own row stride (``w_qkv``, ``w_in``, ``q_b``: stride(0); ``w_uk`` / ``w_uv``:
the head and row strides of the [N, P|V, L] views of ``kv_b_proj``) and only assume a unit column stride. The
lowered weights are contiguous (or, for ``w_uk`` / ``w_uv``, views whose row stride equals their width), so
the existing tests cannot tell a launch that hard-codes the contiguous row stride from one that passes the
real stride. Here each weight is replaced by a view into a larger buffer (junk in the padding): a kernel that
assumed contiguous rows reads shifted, partly padding rows. The twin computes from the model's own parameters.
"""

from __future__ import annotations

import pytest
import torch

import tests.kernels.harness as harness
from nonstop.kernels import gqa, mla
from tests.kernels.harness import check_kernel
from tests.tiny_configs import LLAMA_GQA, TINY_CONFIGS

_original_lower = harness.lower


def _padded(t: torch.Tensor) -> torch.Tensor:
    """The same values as a view whose last-but-one dimension has 2 more rows and whose rows are 3 elements
    longer (junk 7 in the padding): every stride but the last differs from the contiguous one."""
    *lead, n, k = t.shape
    big = torch.full((*lead, n + 2, k + 3), 7, dtype=t.dtype)
    view = big[..., 1 : n + 1, :k]
    view.copy_(t)
    assert view.stride(-1) == 1 and not view.is_contiguous()
    return view


def _padding(kind: str, roles: tuple[str, ...]):
    def lower(model):
        program = _original_lower(model)
        seen = 0
        for op in program.ops:
            if op.kind == kind:
                for role in roles:
                    op.weights[role] = _padded(op.weights[role])
                    seen += 1
        assert seen, f"no {kind} op with {roles}"
        return program

    return lower


@pytest.mark.parametrize("T", [1, 3])
def test_gqa_qkv_rope_honours_the_row_stride_of_a_padded_w_qkv(T, monkeypatch):
    """``gqa_qkv_rope`` passes ``w.stride(0)``: a launch passing K (the contiguous row stride) instead reads
    every q/k/v channel but the first from the wrong row."""
    monkeypatch.setattr(harness, "lower", _padding("gqa_qkv_rope", ("w_qkv",)))
    kernel = gqa.KERNELS["gqa_qkv_rope"]
    assert check_kernel("gqa_qkv_rope", TINY_CONFIGS["llama"], kernel, torch.float32, B=2, T=T, seed=3) > 0


def test_mla_in_proj_honours_the_row_stride_of_a_padded_w_in(monkeypatch):
    """``mla_in_proj`` passes ``w.stride(0)`` for the packed [W_qa | W_kva | W_g]: a hard-coded K reads the
    wrong rows for q_in, kv and the gate logits."""
    monkeypatch.setattr(harness, "lower", _padding("mla_in_proj", ("w_in",)))
    kernel = mla.KERNELS["mla_in_proj"]
    assert check_kernel("mla_in_proj", TINY_CONFIGS["kimi_k3"], kernel, torch.float32, B=2, T=2, seed=5) > 0


def test_mla_q_up_honours_the_strides_of_padded_q_b_and_w_uk(monkeypatch):
    """``mla_q_up`` passes ``q_b.stride(0)`` and W_UK's head and row strides: hard-coding Q, P·L or L (the
    contiguous strides) reads q_nope / q_pe and the absorbed query from the wrong rows."""
    monkeypatch.setattr(harness, "lower", _padding("mla_q_up", ("q_b", "w_uk")))
    kernel = mla.KERNELS["mla_q_up"]
    assert check_kernel("mla_q_up", TINY_CONFIGS["deepseek_v3"], kernel, torch.float32, B=2, T=2, seed=7) > 0


def test_mla_attn_honours_the_strides_of_a_padded_w_uv(monkeypatch):
    """``mla_attn``'s combine tile reads W_UV[h] at h·stride(0) + v·stride(1): hard-coding V·L or L reads
    the value projection of the wrong head / rows (here with the output gate of K3)."""
    monkeypatch.setattr(harness, "lower", _padding("mla_attn", ("w_uv",)))
    kernel = mla.KERNELS["mla_attn"]
    assert check_kernel("mla_attn", TINY_CONFIGS["kimi_k3"], kernel, torch.float32, B=2, T=2, seed=9) > 0


def _random_qkv_bias(model):
    program = _original_lower(model)
    gen = torch.Generator().manual_seed(13)
    for op in program.ops:
        if op.kind == "gqa_qkv_rope":
            b = op.weights["b_qkv"]
            op.weights["b_qkv"] = torch.randn(b.shape, generator=gen).to(b.dtype)
    return program


@pytest.mark.parametrize("raw", ["llama", "llama_gqa"])
def test_gqa_qkv_rope_adds_each_channels_own_bias(raw, monkeypatch):
    """``random_model`` leaves the q/k/v biases at zero, so the kernel's bias add is otherwise untested: with
    random biases, each packed head must add its own bias slice (base + channel) to both channels of each
    RoPE pair before rotating (a kernel that skipped the bias, or read head 0's slice, or one channel twice,
    passed every other test)."""
    monkeypatch.setattr(harness, "lower", _random_qkv_bias)
    config = TINY_CONFIGS["llama"] if raw == "llama" else LLAMA_GQA
    kernel = gqa.KERNELS["gqa_qkv_rope"]
    assert check_kernel("gqa_qkv_rope", config, kernel, torch.float32, B=2, T=2, seed=4) > 0


def _column_major(kind: str, role: str):
    def lower(model):
        program = _original_lower(model)
        for op in program.ops:
            if op.kind == kind:
                op.weights[role] = op.weights[role].t().contiguous().t()  # same values, column stride = rows
        return program

    return lower


@pytest.mark.parametrize(
    "kind,role,config",
    [
        ("gqa_qkv_rope", "w_qkv", "llama"),
        ("mla_in_proj", "w_in", "deepseek_v3"),
        ("mla_q_up", "q_b", "deepseek_v3"),
    ],
)
def test_attention_launches_refuse_a_column_major_weight(kind, role, config, monkeypatch):
    """The kernels read a weight row's elements at unit stride and checked nothing: a column-major weight
    (the same values, transposed in memory) was read as garbage, q/k/v or the MLA projections wrong with no
    error. The launch now refuses it, naming the weight."""
    monkeypatch.setattr(harness, "lower", _column_major(kind, role))
    kernel = (gqa.KERNELS if kind.startswith("gqa") else mla.KERNELS)[kind]
    with pytest.raises(ValueError, match=f"{kind}: {role} needs unit column strides"):
        check_kernel(kind, TINY_CONFIGS[config], kernel, torch.float32, B=2, T=1)
