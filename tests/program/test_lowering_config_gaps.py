"""The lowered Program (run through its plain-torch twins) against the reference model on config branches and
weights that the tiny family configs with ``random_model`` weights leave unreached: a YaRN cos/sin magnitude
other than 1 (GQA and MLA), non-unit norm weights of the K3 output mix and final norm, non-zero GQA/MLP biases,
SiTU soft caps other than K3's defaults, a new sequence in a slot that still holds KDA state, and a
speculative verification step (keep_states) followed by commit."""

from __future__ import annotations

import pytest
import torch

from nonstop.cache.state import ModelCache
from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from nonstop.runtime.superop import SuperOpExecutor
from tests.tiny_configs import DEEPSEEK, KIMI_K3, KIMI_LINEAR_RELEASE, LLAMA


def _steps_match(model, seed: int = 0, prompt_lens=(5, 3)):
    """Prefill every slot with the reference model, then decode steps (T = 1, 1, 2) through the Program and
    through the model on twin caches: the logits agree at every step."""
    cfg = model.cfg
    ex = SuperOpExecutor(model, use_kernels=False)
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=gen) for n in prompt_lens]
    caches = [ModelCache(cfg, len(prompts), capacity=16) for _ in range(2)]
    for cache in caches:
        for slot, p in enumerate(prompts):
            b = cache.batch([slot], len(p))
            model(p[None], cache, b)
            cache.advance(b)
    slots = list(range(len(prompts)))
    for T in (1, 1, 2):
        ids = torch.randint(0, cfg.vocab_size, (len(prompts), T), generator=gen)
        ref_batch, prog_batch = caches[0].batch(slots, T), caches[1].batch(slots, T)
        want = model(ids, caches[0], ref_batch)
        got = ex.forward(ids, caches[1], prog_batch)
        caches[0].advance(ref_batch)
        caches[1].advance(prog_batch)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert ex.stats["program_steps"] == 3


YARN_NO_MSCALE = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


@pytest.mark.parametrize(
    "raw",
    [
        {**LLAMA, "rope_theta": 10000.0, "rope_scaling": YARN_NO_MSCALE},
        {**DEEPSEEK, "rope_scaling": YARN_NO_MSCALE},
    ],
    ids=["gqa", "mla"],
)
def test_yarn_magnitude_reaches_the_program(raw):
    """YaRN without mscale fields scales cos/sin by 0.1·ln(factor) + 1: the lowered rope ops carry it."""
    cfg = ModelConfig.from_hf_dict(raw)
    model = random_model(cfg, torch.float32, seed=5)
    rotary = next(layer.self_attn.rotary for layer in model.layers)
    assert rotary.magnitude == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1)
    with torch.no_grad():  # large rotary parts, so the magnitude visibly moves the scores
        for layer in model.layers:
            attn = layer.self_attn
            for p in attn.parameters():
                if p.dim() == 2:
                    p.mul_(6.0)
    _steps_match(model)


def test_k3_final_mix_and_head_use_their_own_norm_weights():
    """The output attention-residual query is γ_out ⊙ p_out and the LM head reads RMSNorm(mix; model.norm):
    checkpoints hold non-unit weights there (random models hold ones)."""
    cfg = ModelConfig.from_hf_dict(KIMI_K3)
    model = random_model(cfg, torch.float32, seed=11)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=gen) * 3 - 1)
            elif name.endswith("res_proj.weight"):
                p.mul_(20.0)  # sharp depth mixes, so the query's norm weight matters
    _steps_match(model)


def test_gqa_and_mlp_biases_reach_the_program():
    """attention_bias / mlp_bias checkpoints: every bias is applied (random models hold zero biases)."""
    cfg = ModelConfig.from_hf_dict({**LLAMA, "mlp_bias": True})
    assert cfg.gqa.bias and cfg.mlp_bias
    model = random_model(cfg, torch.float32, seed=7)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    _steps_match(model)


def test_situ_soft_caps_from_the_config_reach_the_program():
    raw = {
        **KIMI_K3,
        "text_config": {**KIMI_K3["text_config"], "activation_situ_beta": 1.5, "activation_situ_linear_beta": 3.0},
    }
    cfg = ModelConfig.from_hf_dict(raw)
    model = random_model(cfg, torch.float32, seed=4)
    with torch.no_grad():  # pre-activations of several units, where the soft caps bite
        for name, p in model.named_parameters():
            if any(k in name for k in ("gate_proj", "up_proj")):
                p.mul_(30.0)
    _steps_match(model)


def test_a_new_sequence_in_a_used_slot_starts_from_zero_kda_state():
    """A prompt short enough for the Program (start == 0) in a slot whose KDA conv window and recurrent state
    still hold an earlier sequence: the twins start from zeros, as the model does."""
    cfg = ModelConfig.from_hf_dict(KIMI_LINEAR_RELEASE)
    model = random_model(cfg, torch.float32, seed=8)
    ex = SuperOpExecutor(model, use_kernels=False)
    gen = torch.Generator().manual_seed(9)
    a, b = (torch.randint(0, cfg.vocab_size, (1, 6), generator=gen) for _ in range(2))
    clean = ModelCache(cfg, num_slots=1, capacity=16)
    want = model(b, clean, clean.batch([0], 6))
    used = ModelCache(cfg, num_slots=1, capacity=16)
    first = used.batch([0], 6)
    ex.forward(a, used, first)
    used.advance(first)
    used.lengths[0] = 0  # the slot's KDA state still holds sequence a
    got = ex.forward(b, used, used.batch([0], 6))
    assert ex.stats["program_steps"] == 2
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_verification_step_keeps_the_kda_states_it_commits():
    """A keep_states step of 3 rows through the Program, committing the first 2: the next decode step equals
    the reference model's after the same verification and commit."""
    cfg = ModelConfig.from_hf_dict(KIMI_LINEAR_RELEASE)
    model = random_model(cfg, torch.float32, seed=6)
    ex = SuperOpExecutor(model, use_kernels=False)
    gen = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, cfg.vocab_size, (1, 5), generator=gen)
    draft = torch.randint(0, cfg.vocab_size, (1, 3), generator=gen)
    nxt = torch.randint(0, cfg.vocab_size, (1, 1), generator=gen)
    outs = []
    for run in (model, ex.forward):
        cache = ModelCache(cfg, num_slots=1, capacity=16)
        b = cache.batch([0], 5)
        model(prompt, cache, b)
        cache.advance(b)
        v = cache.batch([0], 3, keep_states=True)
        verify = run(draft, cache, v)
        cache.commit(v, [2])
        d = cache.batch([0], 1)
        outs.append((verify, run(nxt, cache, d)))
    assert ex.stats["program_steps"] == 2
    for got, want in zip(outs[1], outs[0]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
