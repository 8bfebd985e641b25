"""Config shapes the tiny parity configs leave out, against transformers (found passing by a differential
fuzz): DeepSeek-V3 without a query LoRA, with non-interleaved rope, unrenormalised top-k, no shared
expert and three expert groups; Llama with MLP biases and YaRN rope; Kimi Linear with KDA layers only
(a conv window of 2, unrenormalised routing). Weights are random at unit scale (norm gains and biases
off their defaults), so every term moves the logits."""

from __future__ import annotations

import sys

import pytest
import torch

from nonstop import LLM, SamplingParams

DEEPSEEK_NO_QLORA = {
    "model_type": "deepseek_v3",
    "vocab_size": 97,
    "hidden_size": 24,
    "intermediate_size": 30,
    "moe_intermediate_size": 14,
    "num_hidden_layers": 2,
    "num_attention_heads": 3,
    "num_key_value_heads": 3,
    "q_lora_rank": None,
    "kv_lora_rank": 6,
    "qk_nope_head_dim": 6,
    "qk_rope_head_dim": 4,
    "v_head_dim": 5,
    "n_routed_experts": 9,
    "num_experts_per_tok": 4,
    "n_shared_experts": 0,
    "n_group": 3,
    "topk_group": 2,
    "routed_scaling_factor": 0.7,
    "first_k_dense_replace": 0,
    "norm_topk_prob": False,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 512,
    "rope_interleave": False,
    "rope_theta": 500.0,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
    },
    "bos_token_id": 0,
    "eos_token_id": 1,
}
LLAMA_BIASED_YARN = {
    "model_type": "llama",
    "vocab_size": 83,
    "hidden_size": 18,
    "intermediate_size": 27,
    "num_hidden_layers": 2,
    "num_attention_heads": 3,
    "num_key_value_heads": 1,
    "head_dim": 12,
    "rms_norm_eps": 1e-2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
    "attention_bias": True,
    "mlp_bias": True,
    "rope_theta": 10000.0,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "beta_fast": 16,
        "beta_slow": 2,
    },
    "bos_token_id": 1,
    "eos_token_id": 2,
}
KIMI_LINEAR_KDA_ONLY = {
    "model_type": "kimi_linear",
    "vocab_size": 89,
    "hidden_size": 30,
    "intermediate_size": 34,
    "moe_intermediate_size": 12,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "kv_lora_rank": 6,
    "qk_nope_head_dim": 4,
    "qk_rope_head_dim": 2,
    "v_head_dim": 5,
    "num_experts": 5,
    "num_experts_per_token": 3,
    "num_shared_experts": 1,
    "routed_scaling_factor": 1.0,
    "moe_renormalize": False,
    "first_k_dense_replace": 1,
    "rms_norm_eps": 1e-5,
    "layer_types": ["linear_attention", "linear_attention"],
    "linear_num_heads": 3,
    "linear_head_dim": 6,
    "linear_conv_kernel_dim": 2,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
CONFIGS = {"deepseek_no_qlora": DEEPSEEK_NO_QLORA, "llama_biased_yarn": LLAMA_BIASED_YARN}
CONFIGS["kimi_linear_kda_only"] = KIMI_LINEAR_KDA_ONLY
PROMPTS = [[5, 17, 33, 8, 80, 11, 9, 3], [40], list(range(3, 43))]  # the last spans two KDA chunks
NEW_TOKENS = 10


def _hf_model(raw: dict, seed: int):
    sys.modules.setdefault("fla", None)  # the torch path of kimi_linear, not fla's Triton kernels
    sys.modules.setdefault("causal_conv1d", None)
    import transformers

    raw = dict(raw)
    config = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32, experts_implementation="eager")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if not p.is_floating_point() or "inv_freq" in name or "A_log" in name or "dt_bias" in name:
                continue
            if name.endswith("e_score_correction_bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_((1.0 if "norm" in name else 0.0) + 0.3 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() == 3:  # a depthwise conv
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return model.eval()


def _hf_greedy(ref, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens by full uncached forwards (transformers' kimi_linear cache needs a full-attention
    layer), and the logits of the whole sequence."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            seq.append(int(ref(torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
        full = ref(torch.tensor([seq]), use_cache=False).logits[0].float()
    return seq[len(prompt) :], full


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    ref = _hf_model(CONFIGS[request.param], seed=11)
    path = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(path)
    (path / "generation_config.json").unlink(missing_ok=True)
    return request.param, LLM(str(path), dtype="float32", device="cpu", backend="reference"), ref


def test_logits_and_greedy_tokens_match_transformers(pair):
    """Catches a drift from transformers in a config shape the tiny parity configs leave out: the query
    projection without LoRA, non-interleaved or YaRN rope, routing without renormalisation across three
    groups, MLP biases, a KDA-only stack with a conv window of 2."""
    name, llm, ref = pair
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    for prompt in PROMPTS:
        expected, full = _hf_greedy(ref, prompt)
        with torch.no_grad():
            ours = llm.model(torch.tensor([prompt + expected]))[0].float()
        assert float((ours - full).abs().max() / full.abs().max()) < 1e-4, name
        assert llm.generate(prompt_token_ids=[prompt], sampling=params)[0].token_ids == expected, name


def test_batched_chunked_prefill_equals_one_at_a_time(pair):
    """Catches rows of a batch (two slots, prompts prefilled in chunks of 3) leaking into each other or a
    chunk boundary losing state: greedy tokens must equal each prompt's tokens alone."""
    name, llm, _ = pair
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    alone = [llm.generate(prompt_token_ids=[p], sampling=params)[0].token_ids for p in PROMPTS]
    chunked = LLM(llm.model_dir, dtype="float32", device="cpu", backend="reference", max_batch=2, prefill_chunk=3)
    assert [o.token_ids for o in chunked.generate(prompt_token_ids=PROMPTS, sampling=params)] == alone, name
