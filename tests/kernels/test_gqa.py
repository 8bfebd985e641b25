"""GQA super-op kernels (``nonstop/kernels/gqa.py``) against their twins inside a real decode step.

The llama tiny config has 5 query heads sharing 1 KV head of dim 10, qkv bias, tied embeddings and
llama3 RoPE scaling. Prompts of 37, 5 and 20 tokens (+ a fresh sequence) span several 16-token pages;
16- or 32-token KV splits put a row's keys into up to 3 splits (merged by the second phase's tiles),
and the default split choice (one split here) exercises the direct-output path. Cache pages are
scattered (``tests/kernels/paging.py``) so the kernels must follow the page table. ``LLAMA_GQA`` (6 query
heads over 2 KV heads) checks that each group reads and writes its own KV head.
"""

from __future__ import annotations

import functools

import pytest
import torch

from nonstop.kernels import gqa, launch
from tests.kernels.harness import check_kernel
from tests.kernels.paging import first_sequence_agrees, scattered_pages
from tests.tiny_configs import LLAMA_GQA, TINY_CONFIGS

PROMPTS = (37, 5, 20)
F32, F16 = torch.float32, torch.float16

CASES = [  # kind, dtype, B, T, KV split tokens (gqa_attn only)
    ("gqa_qkv_rope", F32, 3, 1, None),
    ("gqa_qkv_rope", F16, 3, 3, None),
    ("gqa_qkv_rope", F32, 2, 3, None),
    ("gqa_attn", F32, 3, 1, 16),
    ("gqa_attn", F16, 3, 3, 16),
    ("gqa_attn", F32, 2, 3, 32),
    ("gqa_attn", F16, 3, 1, 32),
    ("gqa_attn", F32, 3, 3, None),
]
GQA_CASES = [("gqa_qkv_rope", F32, 3, 3, None), ("gqa_attn", F32, 3, 3, 16), ("gqa_attn", F16, 2, 1, None)]
SMALL_BLOCKS = {"gqa_qkv_rope-float16-B3-T3-splitNone", "gqa_attn-float16-B3-T3-split16"}  # 2 pairs / 4 items per tile


def _ids(cases):
    return [f"{c[0]}-{str(c[1])[6:]}-B{c[2]}-T{c[3]}-split{c[4]}" for c in cases]


@pytest.mark.parametrize("kind,dtype,B,T,split", CASES, ids=_ids(CASES))
def test_gqa_kernel_matches_twin(kind, dtype, B, T, split, request, monkeypatch):
    if request.node.callspec.id in SMALL_BLOCKS:
        monkeypatch.setattr(gqa, "PAIRS_PER_TILE", 2)
        monkeypatch.setattr(gqa, "ATTN_BLOCK_M", 4)
    _check(kind, TINY_CONFIGS["llama"], dtype, B, T, split)


@pytest.mark.parametrize("kind,dtype,B,T,split", GQA_CASES, ids=_ids(GQA_CASES))
def test_gqa_kernel_with_two_kv_heads(kind, dtype, B, T, split):
    """Query heads 3-5 use KV head 1: its K/V columns are written and read at offset D, not head 0's."""
    _check(kind, LLAMA_GQA, dtype, B, T, split)


def _check(kind, raw_config, dtype, B, T, split):
    """The kernel against its twin on scattered pages (gqa_attn: also alone on the first sequence)."""
    fn = gqa.KERNELS[kind]
    if kind == "gqa_attn":
        fn = first_sequence_agrees(functools.partial(fn, split_tokens=split))
    assert check_kernel(kind, raw_config, scattered_pages(fn), dtype, B=B, T=T, prompt_lens=PROMPTS, seed=T + B) > 0
    assert launch.phase_counters("gqa_attn", "cpu").eq(0).all(), (
        "gqa_attn must leave its counters at zero for the next launch"
    )
