"""Page-pool growth, commit / reset contracts and per-token cache bytes: checks a mutation audit found missing.

Expected values come from the definitions (page arithmetic, the docstrings' contracts, the configs' shapes).
"""

from __future__ import annotations

import pytest
import torch

from nonstop.cache.pages import PageTable
from nonstop.cache.state import KDAState, ModelCache
from nonstop.config import ModelConfig
from tests.engine.tiny_models import TINY_MODELS


def test_a_page_size_below_one_is_refused():
    with pytest.raises(ValueError, match="page_size"):
        PageTable(num_slots=1, page_size=0)


def test_the_pool_grows_only_when_the_free_list_is_short_and_then_doubles():
    pages = PageTable(num_slots=1, page_size=4, num_pages=2)
    pages.reserve(0, 8)  # ceil(8 / 4) = 2 pages, exactly the 2 free ones: no growth
    assert pages.num_pages == 2 and pages.free_pages == []
    pages.reserve(0, 9)  # a 3rd page with none free: the pool doubles to 4
    assert pages.num_pages == 4 and len(pages.free_pages) == 1
    pages.reserve(0, 17)  # 5 pages, 1 free + 1 short: doubling (8) covers it
    assert pages.num_pages == 8 and pages.used_pages == 5


def _k3() -> ModelConfig:
    return ModelConfig.from_file(TINY_MODELS["k3"])


def test_commit_refuses_a_batch_made_without_keep_states():
    cfg = ModelConfig.from_file(TINY_MODELS["llama"])  # attention only: no KDA history would catch it
    cache = ModelCache(cfg, num_slots=1)
    batch = cache.batch([0], 3)
    with pytest.raises(ValueError, match="keep_states"):
        cache.commit(batch, [2])
    assert cache.lengths.tolist() == [0]


def test_reset_zeroes_the_slots_recurrent_state_and_conv_window_only():
    cache = ModelCache(_k3(), num_slots=2)
    kda = [layer for layer in cache.layers if isinstance(layer, KDAState)]
    assert kda
    for layer in kda:
        layer.recurrent.fill_(1.0)
        layer.conv.fill_(1.0)
    cache.reset(1)
    for layer in kda:
        assert not layer.recurrent[1].any() and not layer.conv[1].any()
        assert bool((layer.recurrent[0] == 1).all()) and bool((layer.conv[0] == 1).all())


@pytest.mark.parametrize(
    ("name", "dtype", "expected"),
    [
        # llama: 2 GQA layers x (k + v) x 2 kv heads x head_dim 16 = 128 values per token
        ("llama", torch.float32, 128 * 4),
        ("llama", torch.bfloat16, 128 * 2),
        # k3: one MLA layer caching kv_lora_rank 16 + qk_rope_head_dim 8 = 24 values (KDA layers: per sequence)
        ("k3", torch.float32, 24 * 4),
    ],
)
def test_bytes_per_token_counts_bytes_not_elements(name, dtype, expected):
    cache = ModelCache(ModelConfig.from_file(TINY_MODELS[name]), num_slots=1, dtype=dtype)
    assert cache.bytes_per_token() == expected


def test_a_longer_keep_states_step_gets_a_longer_history():
    state = KDAState(num_slots=1, num_heads=1, head_dim=2, conv_size=2, dtype=torch.float32, device="cpu")
    slots = torch.tensor([0])
    for T in (2, 4):  # verification rows of 2 tokens, then of 4 (more draft tokens)
        after = torch.arange(float(T))[None, :, None, None, None].expand(1, T, 1, 2, 2)  # state after token t = t
        state.keep_recurrent(slots, after)
        state.keep_conv(slots, torch.arange(float(T))[None, :, None, None, None].expand(1, T, 3, 2, 1))
        state.select(slots, torch.tensor([T - 1]))
        assert torch.equal(state.recurrent[0], torch.full((1, 2, 2), float(T - 1)))
        assert torch.equal(state.conv[0], torch.full((3, 2, 1), float(T - 1)))
