"""Paged attention kernels on a step whose slots are out of order, whose rows cross page boundaries inside the
step, and whose pages are smaller and oddly sized.

``tests/kernels/harness.check_kernel`` by default steps slots 0..B-2 plus the fresh last slot (ascending), with
16-token pages; the rows of a T = 3 step never cross a page there. Here the step's slots are [3, 0, 2] (row b
is not slot b, and a later row has a lower slot) with 5-token pages, T = 3 rows per sequence (the causal mask
inside the new tokens of speculative verification), and prompts of 12, 4 and 14 tokens: row 0 (slot 3,
fresh) writes positions 0..2, row 1 (slot 0) 12..14, row 2 (slot 2) 14..16 (16 starts a new page). The
kernel's outputs and cache writes are compared with the plain-torch twins (``check_kernel`` with ``slots``).
"""

from __future__ import annotations

import functools

import pytest

from nonstop.kernels import gqa, mla
from tests.kernels.harness import check_kernel
from tests.tiny_configs import LLAMA_GQA, TINY_CONFIGS

PROMPTS = (12, 9, 14)  # slots 0, 1, 2; slot 3 is fresh
SLOTS = [3, 0, 2]


def _check(kind, raw, kernel):
    return check_kernel(kind, raw, kernel, T=3, prompt_lens=PROMPTS, seed=11, slots=SLOTS, page_size=5)


CASES = [("qkv", None), ("attn", 4), ("attn", None)]  # split 4 rounds up to the 16-key tile


@pytest.mark.parametrize("part,split", CASES)
def test_gqa_on_out_of_order_slots_and_small_pages(part, split):
    """Each row must read and write the pages of ``slots[b]`` at positions ``start[b] + t`` (a kernel that used
    b as the slot, or one sequence's start for another, or a 16-token page, writes or reads the wrong rows).
    gqa_attn with 16-key splits: the 15..17-key rows merge two splits, rows 14 and 15 of slot 2 see nothing
    of the second; with the default (one split of several 16-key tiles) those rows see nothing of the second
    tile, whose all-masked scores must not lower the running max (exp(max - (-1e30)) overflows to inf)."""
    kind = f"gqa_{part}_rope" if part == "qkv" else "gqa_attn"
    fn = gqa.KERNELS[kind]
    if kind == "gqa_attn":
        fn = functools.partial(fn, split_tokens=split)
    _check(kind, LLAMA_GQA, fn)


@pytest.mark.parametrize("part,split", CASES)
def test_mla_on_out_of_order_slots_and_small_pages(part, split):
    """As the GQA test, for the latent cache of deepseek_v3 (RoPE on k_pe at the row's position)."""
    kind = "mla_q_up" if part == "qkv" else "mla_attn"
    fn = mla.KERNELS[kind]
    if kind == "mla_attn":
        fn = functools.partial(fn, split_tokens=split)
    _check(kind, TINY_CONFIGS["deepseek_v3"], fn)


def test_gqa_attn_combine_with_several_kv_heads_and_item_blocks(monkeypatch):
    """Combine tile (b, g, mb) = (tile // (Hkv·MB), tile // MB % Hkv, tile % MB): with 2 KV heads and 2 item
    blocks (8 items of the 3·3 per group) a combine tile that took g = tile % Hkv merged group g = mb twice and
    left the other two (group, block) pairs unwritten; the existing tests have one KV head or one item block
    (and with MB coprime to Hkv that wrong map is still a permutation of the tiles)."""
    monkeypatch.setattr(gqa, "ATTN_BLOCK_M", 8)
    _check("gqa_attn", LLAMA_GQA, functools.partial(gqa.KERNELS["gqa_attn"], split_tokens=16))
