"""MLA super-op kernels (``nonstop/kernels/mla.py``) against their twins inside a real decode step.

Configs: deepseek_v3 (q-LoRA, GPT-J RoPE with YaRN), kimi_linear (NoPE, no q-LoRA),
kimi_linear_layer_types (NoPE, q-LoRA), kimi_k3 (NoPE, q-LoRA, sigmoid output gate, AttnRes input
without a norm). Prompts of 37, 5 and 20 tokens (+ a fresh sequence) span several 16-token pages, and
the attention tests use 16- or 32-token KV splits so that a row's keys fall into up to 3 splits; they
also check that a sequence's rows come out bit-identical when it is launched alone. The
cache pages are scattered (``tests/kernels/paging.py``) so the kernels must follow the page table. Widened
latent and value heads with 16-column caps make q_up's and the combine's column loops take several steps.
A covering set of cases rather than the full cross product keeps the file inside the interpreter budget.
"""

from __future__ import annotations

import functools

import pytest
import torch

from nonstop.kernels import attn_tiles, launch, mla
from tests.kernels.harness import check_kernel
from tests.kernels.paging import first_sequence_agrees, scattered_pages
from tests.tiny_configs import TINY_CONFIGS

PROMPTS = (37, 5, 20)
F32, F16 = torch.float32, torch.float16

CASES = [  # kind, config, dtype, B, T, KV split tokens (mla_attn only)
    ("mla_in_proj", "deepseek_v3", F32, 3, 1, None),
    ("mla_in_proj", "kimi_linear", F16, 2, 3, None),
    ("mla_in_proj", "kimi_k3", F32, 3, 3, None),
    ("mla_in_proj", "kimi_k3", F16, 3, 1, None),
    ("mla_q_up", "deepseek_v3", F32, 3, 3, None),
    ("mla_q_up", "deepseek_v3", F16, 3, 1, None),
    ("mla_q_up", "kimi_linear", F32, 3, 1, None),
    ("mla_q_up", "kimi_linear_layer_types", F16, 2, 3, None),
    ("mla_q_up", "kimi_k3", F16, 3, 3, None),
    ("mla_attn", "deepseek_v3", F32, 3, 1, 16),
    ("mla_attn", "deepseek_v3", F16, 3, 3, 32),
    ("mla_attn", "kimi_linear", F16, 3, 1, 16),
    ("mla_attn", "kimi_linear_layer_types", F32, 2, 3, 16),
    ("mla_attn", "kimi_k3", F32, 3, 3, 16),
    ("mla_attn", "kimi_k3", F16, 3, 1, 32),
    ("mla_attn", "kimi_k3", F32, 2, 1, None),  # default split choice: one split on this machine
]
SMALL_BLOCKS = {"mla_attn-kimi_k3-float32-B3-T3"}  # 4 query items per block: 3 blocks per sequence


def _ids(cases) -> list[str]:
    return [f"{c[0]}-{c[1]}-{str(c[2])[6:]}-B{c[3]}-T{c[4]}" for c in cases]


def _kernel(kind: str, split_tokens: int | None):
    fn = mla.KERNELS[kind]
    if kind == "mla_attn":
        fn = first_sequence_agrees(functools.partial(fn, split_tokens=split_tokens))
    return fn if kind == "mla_in_proj" else scattered_pages(fn)


@pytest.mark.parametrize("kind,config,dtype,B,T,split", CASES, ids=_ids(CASES))
def test_mla_kernel_matches_twin(kind, config, dtype, B, T, split, request, monkeypatch):
    if request.node.callspec.id in SMALL_BLOCKS:
        monkeypatch.setattr(mla, "ATTN_BLOCK_M", 4)
    seed = sum(map(ord, config)) + T
    assert (
        check_kernel(kind, TINY_CONFIGS[config], _kernel(kind, split), dtype, B=B, T=T, prompt_lens=PROMPTS, seed=seed)
        > 0
    )
    assert launch.phase_counters("mla_attn", "cpu").eq(0).all(), (
        "mla_attn must leave its counters at zero for the next launch"
    )


def _wide(raw: dict) -> dict:
    """The tiny config with a 22-column latent and 21-column value heads (its text config for K3)."""
    if "text_config" in raw:
        return {**raw, "text_config": _wide(raw["text_config"])}
    return {**raw, "kv_lora_rank": 22, "v_head_dim": 21}


WIDE_CASES = [  # kind, config, dtype, B, T, KV split tokens (mla_attn only)
    ("mla_q_up", "deepseek_v3", F32, 3, 3, None),
    ("mla_q_up", "kimi_k3", F16, 2, 1, None),
    ("mla_attn", "deepseek_v3", F16, 2, 1, 16),
    ("mla_attn", "kimi_k3", F32, 3, 3, 16),
]


@pytest.mark.parametrize("kind,config,dtype,B,T,split", WIDE_CASES, ids=_ids(WIDE_CASES))
def test_latent_and_value_columns_in_several_steps(kind, config, dtype, B, T, split, monkeypatch):
    """16-column caps on q_up's W_UK step and the combine's W_UV step, over a 22-column latent and 21-column
    value heads: each loop takes a full and a ragged step, as K3's 512-column latent and 128-column heads take
    several (the tiny configs' 14 and 9 or 11 fit one)."""
    monkeypatch.setattr(mla, "Q_UP_BLOCK_LC", 16)
    monkeypatch.setattr(mla, "COMBINE_BLOCK_V", 16)
    seed = sum(map(ord, config)) + T
    raw = _wide(TINY_CONFIGS[config])
    assert check_kernel(kind, raw, _kernel(kind, split), dtype, B=B, T=T, prompt_lens=PROMPTS, seed=seed) > 0


def test_choose_split():
    assert attn_tiles.choose_split(40, 3, 16, "cpu", split_tokens=16) == (16, 3)
    assert attn_tiles.choose_split(40, 3, 16, "cpu", split_tokens=20) == (32, 2)  # rounded up to the key tile
    assert attn_tiles.choose_split(64, 3, 16, "cpu") == (64, 1)  # short context: one split
    split, ns = attn_tiles.choose_split(32768, 3, 32, "cpu", min_split=256)
    assert split % 32 == 0 and split >= 256 and split * ns >= 32768 and split * (ns - 1) < 32768
