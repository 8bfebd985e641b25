"""Tiny, deliberately odd-shaped configs of every family (HF config.json dicts)."""

from __future__ import annotations

import torch

LLAMA = {
    "model_type": "llama",
    "vocab_size": 131,
    "hidden_size": 40,
    "intermediate_size": 68,
    "num_hidden_layers": 3,
    "num_attention_heads": 5,
    "num_key_value_heads": 1,
    "head_dim": 10,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
    "attention_bias": True,
    "rope_theta": 50000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    },
    "bos_token_id": 1,
    "eos_token_id": 2,
}

DEEPSEEK = {
    "model_type": "deepseek_v3",
    "vocab_size": 127,
    "hidden_size": 36,
    "intermediate_size": 52,
    "moe_intermediate_size": 20,
    "num_hidden_layers": 3,
    "num_attention_heads": 3,
    "num_key_value_heads": 3,
    "q_lora_rank": 22,
    "kv_lora_rank": 14,
    "qk_nope_head_dim": 10,
    "qk_rope_head_dim": 6,
    "v_head_dim": 11,
    "n_routed_experts": 8,
    "num_experts_per_tok": 3,
    "n_shared_experts": 1,
    "n_group": 4,
    "topk_group": 2,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1,
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 512,
    "rope_interleave": True,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 128,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "rope_theta": 10000.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
}

_KL_COMMON = {
    "model_type": "kimi_linear",
    "vocab_size": 113,
    "hidden_size": 42,
    "intermediate_size": 58,
    "moe_intermediate_size": 18,
    "num_hidden_layers": 5,
    "num_attention_heads": 3,
    "num_key_value_heads": 3,
    "kv_lora_rank": 14,
    "qk_nope_head_dim": 10,
    "qk_rope_head_dim": 6,
    "v_head_dim": 9,
    "num_experts": 7,
    "num_experts_per_token": 2,
    "num_shared_experts": 1,
    "routed_scaling_factor": 2.446,
    "rms_norm_eps": 1e-5,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
KIMI_LINEAR_RELEASE = {
    **_KL_COMMON,
    "linear_attn_config": {
        "head_dim": 6,
        "num_heads": 3,
        "short_conv_kernel_size": 4,
        "kda_layers": [1, 2, 3, 5],
        "full_attn_layers": [4],
    },
    "first_k_dense_replace": 1,
}
KIMI_LINEAR_LAYER_TYPES = {
    **_KL_COMMON,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_num_heads": 2,
    "linear_head_dim": 10,
    "linear_conv_kernel_dim": 3,
    "q_lora_rank": 12,
}

KIMI_K3 = {
    "model_type": "kimi_k3",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "kimi_linear",
        "vocab_size": 301,
        "hidden_size": 44,
        "num_hidden_layers": 7,
        "num_attention_heads": 3,
        "num_key_value_heads": 3,
        "intermediate_size": 52,
        "first_k_dense_replace": 1,
        "num_experts": 6,
        "num_experts_per_token": 2,
        "num_shared_experts": 2,
        "moe_intermediate_size": 20,
        "routed_expert_hidden_size": 22,
        "latent_moe_use_norm": True,
        "moe_router_activation_func": "sigmoid",
        "num_expert_group": 1,
        "topk_group": 1,
        "moe_renormalize": True,
        "routed_scaling_factor": 1.0,
        "hidden_act": "situ",
        "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0,
        "q_lora_rank": 18,
        "kv_lora_rank": 14,
        "qk_nope_head_dim": 10,
        "qk_rope_head_dim": 6,
        "v_head_dim": 9,
        "mla_use_nope": True,
        "mla_use_output_gate": True,
        "attn_res_block_size": 3,
        "rms_norm_eps": 1e-5,
        "linear_attn_config": {
            "head_dim": 8,
            "num_heads": 3,
            "short_conv_kernel_size": 4,
            "gate_lower_bound": -5.0,
            "use_full_rank_gate": True,
            "full_attn_layers": [4, 7],
            "kda_layers": [1, 2, 3, 5, 6],
        },
    },
}
KIMI_K3_MXFP4 = {
    **KIMI_K3,
    "text_config": {
        **KIMI_K3["text_config"],
        "quantization_config": {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized"},
    },
}

# Shapes that the family configs above leave out; kept out of TINY_CONFIGS (which many suites sweep) and
# used by the kernel tests that need them.
LLAMA_GQA = {  # 6 query heads in 2 groups of 3 (KV heads 0 and 1), head dim 10
    **LLAMA,
    "num_hidden_layers": 2,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
}
DEEPSEEK_MANY_EXPERTS = {  # 36 routed experts (4 groups of 9, top 4): router rows past the first 16
    **DEEPSEEK,
    "num_hidden_layers": 2,
    "n_routed_experts": 36,
    "num_experts_per_tok": 4,
}

TINY_CONFIGS = {
    "llama": LLAMA,
    "deepseek_v3": DEEPSEEK,
    "kimi_linear": KIMI_LINEAR_RELEASE,
    "kimi_linear_layer_types": KIMI_LINEAR_LAYER_TYPES,
    "kimi_k3": KIMI_K3,
    "kimi_k3_mxfp4": KIMI_K3_MXFP4,
}


def hf_model_from_dict(raw: dict):
    """A transformers model (random init, fp32, eval) for a config dict of a transformers family."""
    import transformers

    raw = dict(raw)
    model_type = raw.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **raw)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32, experts_implementation="eager")
    # transformers initialises the correction bias to zero; make it matter for expert selection
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buf.copy_(torch.randn_like(buf) * 0.05)
    return model.eval()
