"""Our reference model against transformers' own llama, deepseek_v3 and kimi_linear on tiny odd-shaped
checkpoints written by ``save_pretrained``: logits, greedy tokens, prompt logprobs, cached decoding."""

from __future__ import annotations

import pytest
import torch

from nonstop import LLM, SamplingParams

FAMILIES = ["llama", "deepseek_v3", "kimi_linear", "kimi_linear_layer_types"]
PROMPTS = [[5, 17, 33, 8, 80, 11, 9, 3], [4, 8, 15], list(range(3, 76))]  # the last spans 2+ KDA chunks


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope="module")
def loaded(hf_checkpoints):
    return {name: (LLM(path, dtype="float32", device="cpu"), ref) for name, (path, ref) in hf_checkpoints.items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(loaded, family):
    llm, ref = loaded[family]
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            ours = llm.model(ids)
            theirs = ref(ids).logits.float()
        assert _rel_err(ours, theirs) < 1e-4, family


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_and_prompt_logprobs_match_transformers(loaded, family):
    llm, ref = loaded[family]
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True, prompt_logprobs=1)
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling=params)
    for prompt, out in zip(PROMPTS, outs):
        ids = torch.tensor([prompt])
        # transformers' greedy generate with its own caches; eos disabled (like ignore_eos), not suppressed
        expected = ref.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)[
            0, len(prompt) :
        ]
        with torch.no_grad():
            lp = torch.log_softmax(ref(ids).logits[0].float(), -1)
        assert out.token_ids == expected.tolist()
        assert out.prompt_logprobs[0] is None
        for t in range(1, len(prompt)):
            assert out.prompt_logprobs[t][prompt[t]] == pytest.approx(float(lp[t - 1, prompt[t]]), abs=2e-5)


@pytest.mark.parametrize("family", FAMILIES + ["kimi_k3"])
def test_whole_prompt_equals_token_by_token(loaded, family, tmp_path):
    """Prefilling a prompt at once and feeding it one token at a time through the caches give equal logits."""
    from nonstop.cache.state import ModelCache

    if family == "kimi_k3":
        from nonstop.config import ModelConfig
        from nonstop.model.build import random_model
        from tests.tiny_configs import KIMI_K3

        cfg = ModelConfig.from_hf_dict(KIMI_K3)
        model = random_model(cfg, torch.float32, seed=3)
    else:
        model = loaded[family][0].model
        cfg = model.cfg
    prompt = torch.tensor([PROMPTS[2]])
    whole = model(prompt)[0]
    cache = ModelCache(cfg, num_slots=2, capacity=8)
    steps = []
    for t in range(prompt.shape[1]):
        batch = cache.batch([1], 1)
        steps.append(model(prompt[:, t : t + 1], cache, batch)[0, 0])
        cache.advance(batch)
    assert _rel_err(torch.stack(steps), whole) < 1e-4
    # and a split prefill (two chunks) continues the caches exactly
    cache2 = ModelCache(cfg, num_slots=1, capacity=8)
    first = cache2.batch([0], 40)
    a = model(prompt[:, :40], cache2, first)[0]
    cache2.advance(first)
    second = cache2.batch([0], prompt.shape[1] - 40)
    b = model(prompt[:, 40:], cache2, second)[0]
    assert _rel_err(torch.cat([a, b]), whole) < 1e-4


@pytest.mark.parametrize("family", ["llama", "kimi_linear"])
def test_batch_of_prompts_equals_one_at_a_time(loaded, family):
    llm, _ = loaded[family]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    together = llm.generate(prompt_token_ids=PROMPTS, sampling=params)
    for prompt, out in zip(PROMPTS, together):
        alone = llm.generate(prompt_token_ids=[prompt], sampling=params)[0]
        assert alone.token_ids == out.token_ids


def test_synth_checkpoints_load_in_transformers(tmp_path):
    """`nonstop synth` writes names, shapes and configs that transformers' from_pretrained accepts, and
    both implementations then compute the same logits from the file."""
    import transformers

    from nonstop.config import ModelConfig
    from nonstop.model.build import load_model
    from nonstop.weights.synth import write_checkpoint
    from tests.tiny_configs import TINY_CONFIGS

    for name in FAMILIES:
        cfg = ModelConfig.from_hf_dict(TINY_CONFIGS[name])
        out = write_checkpoint(cfg, tmp_path / name, seed=7, dtype=torch.float32)
        ref = transformers.AutoModelForCausalLM.from_pretrained(
            out, dtype=torch.float32, experts_implementation="eager"
        ).eval()
        ours = load_model(cfg, out)
        ids = torch.tensor([PROMPTS[0]])
        with torch.no_grad():
            assert _rel_err(ours(ids), ref(ids).logits.float()) < 1e-4, name
