"""The megakernel on configurations the family configs of ``tests/tiny_configs.py`` leave out, against the
reference executor, step by step: every step's logits (fp32: rtol 1e-4 of the logits' scale), the greedy
tokens the kernel sampled on the device, and the caches (attention pools at every written position, KDA
recurrent and conv states) after the steps.

Each case prefills three sequences of different lengths one by one (B = 1 steps of their own shapes),
then runs three decode steps of all three together (B = 3, rows at different positions), in slots
out of order, with a page size that does not divide the lengths and a pool that grows mid-decode.

Cases (found uncovered while fuzzing the megakernel differentially, work/fuzz_mk*.py):
* llama with a vocabulary of 2053 (two 2048-logit sampler chunks, the second of 5 entries), hidden 131,
  an untied head;
* deepseek_v3 with every layer MoE (first_k_dense_replace 0), no shared expert, one expert per token out
  of 5 (several tokens pick the same expert, some experts none), no q LoRA and a tied head;
* kimi_linear with only KDA layers (no attention cache at all) and two dense layers first;
* kimi_k3 with an AttnRes block of 1 layer, no shared expert and a tied head.
"""

from __future__ import annotations

import copy

import pytest
import torch

from nonstop.cache.state import KDAState, ModelCache
from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from nonstop.runtime.executors import ReferenceExecutor
from tests.tiny_configs import DEEPSEEK, KIMI_K3, KIMI_LINEAR_RELEASE, LLAMA

pytest.importorskip("triton")

from nonstop.runtime.megakernel.executor import MegakernelExecutor  # noqa: E402


def _llama_wide_vocab():
    return {
        **LLAMA,
        "vocab_size": 2053,
        "hidden_size": 131,
        "num_hidden_layers": 1,
        "tie_word_embeddings": False,
    }


def _deepseek_all_moe():
    c = {
        **DEEPSEEK,
        "num_hidden_layers": 2,
        "first_k_dense_replace": 0,
        "n_routed_experts": 5,
        "n_group": 1,
        "topk_group": 1,
        "num_experts_per_tok": 1,
        "q_lora_rank": None,
        "tie_word_embeddings": True,
    }
    c.pop("n_shared_experts")
    return c


def _kimi_linear_kda_only():
    c = copy.deepcopy(KIMI_LINEAR_RELEASE)
    c["num_hidden_layers"] = 3
    c["first_k_dense_replace"] = 2
    c["num_shared_experts"] = 0
    c["linear_attn_config"]["kda_layers"] = [1, 2, 3]
    c["linear_attn_config"]["full_attn_layers"] = []
    return c


def _k3_block_of_one():
    c = copy.deepcopy(KIMI_K3)
    t = c["text_config"]
    t["num_hidden_layers"] = 3
    t["attn_res_block_size"] = 1
    t["num_shared_experts"] = 0
    t["linear_attn_config"]["kda_layers"] = [1, 3]
    t["linear_attn_config"]["full_attn_layers"] = [2]
    c["tie_word_embeddings"] = True
    return c


CASES = {
    "llama_vocab_2053": _llama_wide_vocab,
    "deepseek_all_moe_top1_no_shared_tied": _deepseek_all_moe,
    "kimi_linear_kda_only_two_dense": _kimi_linear_kda_only,
    "kimi_k3_attnres_block_1_tied": _k3_block_of_one,
}
SLOTS = [2, 0, 3]  # three sequences in four slots, out of order
PROMPTS = [[5, 9, 2, 7, 11], [4], [8, 3, 6]]


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    scale = max(float(want.abs().max()), 1e-3)
    assert torch.isfinite(got).all()
    assert float((got - want).abs().max()) <= 1e-4 * scale + 1e-6


def _cache_contents(cache: ModelCache) -> list[torch.Tensor]:
    out = []
    for layer in cache.layers:
        if isinstance(layer, KDAState):
            out += [layer.recurrent[SLOTS], layer.conv[SLOTS]]
            continue
        for name in sorted(layer.tensors):
            for s in SLOTS:
                pos = torch.arange(int(cache.lengths[s]))[None]
                out.append(layer.tensors[name][layer.pages.rows(torch.tensor([s]), pos)[0]])
    return out


@pytest.mark.parametrize("case", list(CASES))
@torch.inference_mode()
def test_megakernel_steps_equal_the_reference(case):
    """Catches a megakernel task that mis-tiles or mis-orders one of these shapes (a sampler chunk tail, an
    expert no token picked, a layer stack with no attention cache, a one-layer AttnRes block, a tied head):
    a step's logits or sampled tokens differ from the reference, or a cache holds other values."""
    cfg = ModelConfig.from_hf_dict(CASES[case]())
    model = random_model(cfg, torch.float32, seed=11)
    mk, ref = MegakernelExecutor(model, graphs=False), ReferenceExecutor(model)
    caches = [ModelCache(cfg, 4, capacity=1, page_size=3) for _ in range(2)]  # the pool grows as it goes
    vocab = cfg.vocab_size
    last = []
    for slot, prompt in zip(SLOTS, PROMPTS):
        ids = torch.tensor([[t * 37 % vocab for t in prompt]])
        outs = []
        for ex, cache in zip((mk, ref), caches):
            batch = cache.batch([slot], ids.shape[1])
            outs.append(ex.forward(ids, cache, batch))
            cache.advance(batch)
        _close(outs[0], outs[1])
        last.append(int(outs[1][0, -1].argmax()))
    for _ in range(3):
        ids = torch.tensor(last)[:, None]
        outs = []
        for ex, cache in zip((mk, ref), caches):
            batch = cache.batch(SLOTS, 1)
            outs.append(ex.forward(ids, cache, batch))
            cache.advance(batch)
        _close(outs[0], outs[1])
        last = outs[1][:, -1].argmax(-1).tolist()
        assert mk.next_ids(3).flatten().tolist() == last  # the greedy token the kernel sampled
    assert torch.equal(caches[0].lengths, caches[1].lengths)
    for got, want in zip(_cache_contents(caches[0]), _cache_contents(caches[1])):
        _close(got.float(), want.float())
