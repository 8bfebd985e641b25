"""Gaps in the config parser's tests: defaults that must match the transformers config class of each
family, derived values (rope frequencies, MLA softmax scale, MoE layer layout) checked against transformers
or hand arithmetic, and bad values that must be refused with a ConfigError naming the field."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, yarn_apply_mscale

from nonstop.config import ConfigError, ModelConfig
from nonstop.model.rope import rope_inv_freq
from tests.tiny_configs import DEEPSEEK, KIMI_K3, KIMI_LINEAR_LAYER_TYPES, KIMI_LINEAR_RELEASE, LLAMA

# Optional DeepSeek-V3 / Kimi Linear fields whose defaults come from transformers' config classes.
DEEPSEEK_OPTIONAL = ("n_group", "topk_group", "routed_scaling_factor", "n_shared_experts", "first_k_dense_replace")
KIMI_OPTIONAL = ("routed_scaling_factor", "num_shared_experts", "rms_norm_eps")


def _without(raw: dict, *keys: str) -> dict:
    return {k: copy.deepcopy(v) for k, v in raw.items() if k not in keys}


def _refused(raw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_hf_dict(raw)


# ----------------------------------------------------------------------------- defaults against transformers


def test_deepseek_moe_defaults_match_transformers():
    """n_group 8, topk_group 4, routed_scaling_factor 2.5, n_shared_experts 1, first_k_dense_replace 3."""
    raw = dict(_without(DEEPSEEK, *DEEPSEEK_OPTIONAL), n_routed_experts=16, num_hidden_layers=5)
    ours = ModelConfig.from_hf_dict(raw)
    theirs = transformers.DeepseekV3Config(**raw)
    assert (ours.moe.num_groups, ours.moe.topk_groups) == (theirs.n_group, theirs.topk_group) == (8, 4)
    assert ours.moe.routed_scaling_factor == theirs.routed_scaling_factor == 2.5
    assert ours.moe.num_shared_experts == theirs.n_shared_experts == 1
    dense = [i for i in range(5) if i < theirs.first_k_dense_replace]  # DeepseekV3DecoderLayer's rule
    assert [i for i, t in enumerate(ours.mlp_types) if t == "dense"] == dense == [0, 1, 2]


def test_kimi_linear_defaults_match_transformers():
    """routed_scaling_factor 2.446, one shared expert, rms_norm_eps 1e-5, short conv of 4 (KimiLinearConfig)."""
    raw = _without(KIMI_LINEAR_LAYER_TYPES, *KIMI_OPTIONAL, "linear_conv_kernel_dim")
    ours = ModelConfig.from_hf_dict(raw)
    theirs = transformers.KimiLinearConfig(**raw)
    assert ours.moe.routed_scaling_factor == theirs.routed_scaling_factor == 2.446
    assert ours.moe.num_shared_experts == theirs.n_shared_experts == 1
    assert ours.rms_norm_eps == theirs.rms_norm_eps == 1e-5
    assert ours.kda.conv_size == theirs.linear_conv_kernel_dim == 4


def test_k3_latent_moe_norm_is_read():
    cfg = ModelConfig.from_hf_dict(KIMI_K3)
    assert cfg.moe.latent_size == KIMI_K3["text_config"]["routed_expert_hidden_size"] and cfg.moe.latent_norm
    off = copy.deepcopy(KIMI_K3)
    off["text_config"]["latent_moe_use_norm"] = False
    assert not ModelConfig.from_hf_dict(off).moe.latent_norm


# ----------------------------------------------------------------------------- rope and the MLA scale


def _transformers_inv_freq(cls, raw: dict) -> tuple[torch.Tensor, float]:
    cfg = cls(**copy.deepcopy(raw))
    params = cfg.rope_parameters
    if params["rope_type"] == "default":
        dim = cfg.head_dim
        return 1.0 / params["rope_theta"] ** (torch.arange(0, dim, 2).float() / dim), 1.0
    return ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, "cpu")


@pytest.mark.parametrize(
    "rope",
    [
        # rope_theta inside rope_parameters wins over the top-level field (transformers: setdefault)
        {"rope_parameters": {"rope_type": "default", "rope_theta": 123456.0}},
        # "rope_type" wins over the legacy "type" key
        {"rope_scaling": {"type": "default", "rope_type": "linear", "factor": 3.0}},
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "original_max_position_embeddings": 64,
                "low_freq_factor": 2.0,
                "high_freq_factor": 8.0,
            }
        },
    ],
)
def test_llama_rope_matches_transformers(rope):
    raw = dict(_without(LLAMA, "rope_scaling"), **rope)
    inv, magnitude = rope_inv_freq(ModelConfig.from_hf_dict(raw).rope)
    ref, attention_factor = _transformers_inv_freq(transformers.LlamaConfig, raw)
    torch.testing.assert_close(inv, ref.float(), rtol=1e-6, atol=0)
    assert magnitude == pytest.approx(attention_factor)


def test_llama3_frequency_factors_default_to_llama_3_values():
    """low_freq_factor 1 and high_freq_factor 4 (Llama 3.1's published values) when the config omits them."""
    # original 100: the 55.8-position wavelength lies between original/4 and original/1 (the smoothed band)
    scaling = dict(LLAMA["rope_scaling"], original_max_position_embeddings=100)
    explicit = ModelConfig.from_hf_dict(dict(LLAMA, rope_scaling=scaling))  # gives low 1.0 / high 4.0
    scaling = _without(scaling, "low_freq_factor", "high_freq_factor")
    omitted = ModelConfig.from_hf_dict(dict(LLAMA, rope_scaling=scaling))
    torch.testing.assert_close(rope_inv_freq(omitted.rope)[0], rope_inv_freq(explicit.rope)[0], rtol=0, atol=0)


def test_mla_scale_without_mscale_all_dim_is_plain():
    """YaRN without mscale_all_dim leaves the MLA softmax scale at qk_head_dim**-0.5 (transformers)."""
    raw = copy.deepcopy(DEEPSEEK)
    del raw["rope_scaling"]["mscale_all_dim"]
    cfg = ModelConfig.from_hf_dict(raw)
    qk = DEEPSEEK["qk_nope_head_dim"] + DEEPSEEK["qk_rope_head_dim"]
    expected = yarn_apply_mscale(transformers.DeepseekV3Config(**raw).rope_parameters, qk**-0.5)
    assert cfg.mla.softmax_scale == pytest.approx(expected) == pytest.approx(qk**-0.5)


# ----------------------------------------------------------------------------- MoE layer layout


def test_moe_layer_freq_spaces_the_moe_layers():
    """DeepSeek's rule: layer i is MoE iff i >= first_k_dense_replace and i % moe_layer_freq == 0."""
    cfg = ModelConfig.from_hf_dict(dict(DEEPSEEK, num_hidden_layers=5, first_k_dense_replace=1, moe_layer_freq=2))
    assert cfg.mlp_types == ("dense", "dense", "moe", "dense", "moe")


def test_intermediate_size_is_required_only_with_dense_layers():
    _refused(_without(LLAMA, "intermediate_size"), "missing required field 'intermediate_size'")
    all_moe = ModelConfig.from_hf_dict(dict(_without(DEEPSEEK, "intermediate_size"), first_k_dense_replace=0))
    assert all_moe.mlp_types == ("moe",) * 3 and all_moe.intermediate_size == 0


# ----------------------------------------------------------------------------- bad values refused


@pytest.mark.parametrize(
    "base, change, message",
    [
        (LLAMA, {"num_hidden_layers": 0}, "'num_hidden_layers' must be positive, got 0"),
        (LLAMA, {"num_hidden_layers": 10**6}, "'num_hidden_layers' is 1000000: more than any model has"),
        (DEEPSEEK, {"n_routed_experts": 1 << 17}, "'num_experts' is 131072: more than any model has"),
        (LLAMA, {"rms_norm_eps": 0}, "'rms_norm_eps' must be > 0.0, got 0.0"),
        (LLAMA, {"rope_scaling": {"rope_type": "linear", "factor": 0}}, "'rope_parameters.factor' must be > 0.0"),
        (LLAMA, {"tie_word_embeddings": "false"}, "'tie_word_embeddings' must be true or false, got 'false'"),
        (DEEPSEEK, {"q_lora_rank": 0}, "'q_lora_rank' must be positive or null"),
        (DEEPSEEK, {"num_experts_per_tok": 9}, r"num_experts_per_token \(9\) exceeds num_experts \(8\)"),
        # 4 groups of 2 experts, top-1 group: at most 2 experts can be picked
        (DEEPSEEK, {"topk_group": 1}, r"num_experts_per_token \(3\) exceeds the experts of topk_group groups"),
        (DEEPSEEK, {"mlp_layer_types": ["dense", "dense", "sparse"]}, "'mlp_layer_types' disagrees"),
        (DEEPSEEK, {"mlp_layer_types": ["dense", "sparse"]}, "'mlp_layer_types' must list 3 entries"),
    ],
)
def test_bad_values_are_refused(base, change, message):
    _refused(dict(copy.deepcopy(base), **change), message)


def test_kimi_bad_values_are_refused():
    raw = copy.deepcopy(KIMI_LINEAR_RELEASE)
    raw["linear_attn_config"].update(kda_layers=[0, 1, 2, 3], full_attn_layers=[4, 5])  # 0-based by mistake
    _refused(raw, r"linear_attn_config.kda_layers: layer 0 outside 1..5")
    raw = copy.deepcopy(KIMI_LINEAR_RELEASE)
    raw["linear_attn_config"]["gate_lower_bound"] = 0.0
    _refused(raw, "'linear_attn_config.gate_lower_bound' must be negative")
    raw = dict(copy.deepcopy(KIMI_LINEAR_RELEASE), linear_num_heads=5)  # linear_attn_config.num_heads is 3
    _refused(raw, r"contradictory fields: linear_attn_config.num_heads=3, linear_num_heads=5")


def test_kimi_rms_norm_eps_default_differs_from_deepseek():
    assert ModelConfig.from_hf_dict(_without(KIMI_LINEAR_RELEASE, "rms_norm_eps")).rms_norm_eps == 1e-5
    assert ModelConfig.from_hf_dict(_without(DEEPSEEK, "rms_norm_eps")).rms_norm_eps == 1e-6
    assert math.isclose(transformers.DeepseekV3Config().rms_norm_eps, 1e-6)


def test_deepseek_context_default_matches_transformers():
    assert ModelConfig.from_hf_dict(_without(DEEPSEEK, "max_position_embeddings")).max_position_embeddings == 4096
    assert transformers.DeepseekV3Config().max_position_embeddings == 4096


def test_llama_kv_heads_default_to_the_query_heads():
    raw = _without(LLAMA, "num_key_value_heads")
    assert ModelConfig.from_hf_dict(raw).gqa.num_kv_heads == transformers.LlamaConfig(**raw).num_key_value_heads == 5


@pytest.mark.parametrize(
    "base, change, message",
    [
        (LLAMA, {"head_dim": 9}, r"head_dim \(9\) must be positive and even"),
        (DEEPSEEK, {"qk_rope_head_dim": 5}, "'qk_rope_head_dim' must be positive and even, got 5"),
        (KIMI_LINEAR_RELEASE, {"attn_res_block_size": 0}, "'attn_res_block_size' must be positive"),
        (
            DEEPSEEK,
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}},
            r"'quantization_config.weight_block_size' must be two positive integers, got \[128\]",
        ),
        (
            DEEPSEEK,
            {
                "quantization_config": {
                    "quant_method": "compressed-tensors",
                    "format": "pack-quantized",
                    "config_groups": {"g": {"weights": {"type": "int", "num_bits": 8}}},
                }
            },
            "unsupported quantization_config format 'pack-quantized'",
        ),
    ],
)
def test_more_bad_values_are_refused(base, change, message):
    _refused(dict(copy.deepcopy(base), **change), message)


def test_k3_situ_betas_default_to_the_published_values():
    """SiTU: beta1 = 4 (gate soft-cap), beta2 = 25 (up soft-cap) when text_config omits them."""
    raw = copy.deepcopy(KIMI_K3)
    del raw["text_config"]["activation_situ_beta"], raw["text_config"]["activation_situ_linear_beta"]
    cfg = ModelConfig.from_hf_dict(raw)
    assert (cfg.situ_beta, cfg.situ_linear_beta) == (4.0, 25.0)


def test_k3_outer_ids_and_tying_win_over_text_config():
    raw = copy.deepcopy(KIMI_K3)
    raw.update(bos_token_id=5, pad_token_id=6, tie_word_embeddings=True)
    raw["text_config"].update(bos_token_id=1, pad_token_id=0, tie_word_embeddings=False)
    cfg = ModelConfig.from_hf_dict(raw)
    assert (cfg.bos_token_id, cfg.pad_token_id, cfg.tie_word_embeddings) == (5, 6, True)


def test_slicing_a_layer_types_config_round_trips():
    cfg = ModelConfig.from_hf_dict(dict(KIMI_LINEAR_LAYER_TYPES, mlp_layer_types=["dense"] + ["sparse"] * 4))
    cut = cfg.with_num_layers(2)
    hf = cut.to_hf_dict()
    assert hf["layer_types"] == ["linear_attention", "full_attention"] and hf["mlp_layer_types"] == ["dense", "sparse"]
    again = ModelConfig.from_hf_dict(hf)
    assert (again.attn_types, again.mlp_types) == (("kda", "mla"), ("dense", "moe"))


@pytest.mark.parametrize("n", [0, 6])
def test_slicing_outside_the_layers_is_refused(n):
    with pytest.raises(ConfigError, match=f"cannot slice 5 layers to {n}"):
        ModelConfig.from_hf_dict(KIMI_LINEAR_RELEASE).with_num_layers(n)


@pytest.mark.parametrize("max_positions", [8192, 3000])
def test_yarn_without_its_original_context_uses_the_stated_one_as_transformers_does(max_positions):
    """YaRN with only a factor: transformers takes max_position_embeddings as the original context (its
    correction range and the frequencies it gives); nonstop took max_position_embeddings / factor, 43% off
    on some channels."""
    raw = {**LLAMA, "max_position_embeddings": max_positions, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    ours = ModelConfig.from_hf_dict(copy.deepcopy(raw)).rope
    theirs = transformers.LlamaConfig(**copy.deepcopy(raw))
    assert ours.original_max_position == theirs.rope_parameters["original_max_position_embeddings"]
    inv, scale = rope_inv_freq(ours)
    ref, ref_scale = _transformers_inv_freq(transformers.LlamaConfig, raw)
    torch.testing.assert_close(inv, ref, rtol=1e-6, atol=0)
    assert scale == pytest.approx(ref_scale)


@pytest.mark.parametrize("value", ["false", 0, 1, []])
def test_full_rank_gate_must_be_a_bool(value):
    """'false' was read as True (bool of a non-empty string), 0 and [] as False."""
    raw = copy.deepcopy(KIMI_K3)
    raw["text_config"]["linear_attn_config"]["use_full_rank_gate"] = value
    _refused(raw, "use_full_rank_gate' must be true or false")


@pytest.mark.parametrize("value", ["false", 0])
def test_rope_truncate_must_be_a_bool(value):
    raw = {**LLAMA, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "truncate": value}}
    _refused(raw, "truncate' must be true or false")
