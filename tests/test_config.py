"""ModelConfig parsing: every family and format, presets with full shapes, and clear errors."""

from __future__ import annotations

import copy
import json

import pytest

from nonstop.config import ConfigError, ModelConfig, preset_names
from tests.tiny_configs import DEEPSEEK, KIMI_K3, KIMI_LINEAR_LAYER_TYPES, KIMI_LINEAR_RELEASE, LLAMA


def test_presets_have_full_shapes():
    assert {"llama-3.2-1b", "kimi-linear-48b-a3b", "kimi-k2", "kimi-k3"} <= set(preset_names())
    k3 = ModelConfig.preset("kimi-k3")
    assert k3.family == "kimi_k3" and k3.hidden_size == 7168 and k3.num_hidden_layers == 93
    assert k3.attn_types.count("kda") == 69 and k3.attn_types.count("mla") == 24
    assert k3.attn_types[91] == k3.attn_types[92] == "mla" and k3.mlp_types[0] == "dense"
    assert k3.moe.latent_size == 3584 and k3.moe.expert_format == "mxfp4" and k3.kda.gate_lower_bound == -5.0
    assert k3.mla.output_gate and not k3.mla.use_rope and k3.attn_res_block_size == 12
    kl = ModelConfig.preset("kimi-linear-48b-a3b")
    assert [i for i, t in enumerate(kl.attn_types) if t == "mla"] == [3, 7, 11, 15, 19, 23, 26]
    k2 = ModelConfig.preset("kimi-k2")
    assert k2.family == "deepseek_v3" and k2.rope.kind == "yarn" and k2.rope.interleaved
    assert k2.mla.softmax_scale == pytest.approx(192**-0.5 * (0.1 * __import__("math").log(32) + 1) ** 2)
    ll = ModelConfig.preset("llama-3.2-1b")
    assert ll.gqa.num_kv_heads == 8 and ll.tie_word_embeddings and ll.rope.kind == "llama3"


def test_both_kimi_linear_formats_agree():
    a = ModelConfig.from_hf_dict(KIMI_LINEAR_RELEASE)
    assert a.attn_types == ("kda", "kda", "kda", "mla", "kda")
    b = ModelConfig.from_hf_dict(KIMI_LINEAR_LAYER_TYPES)
    assert b.attn_types == ("kda", "mla", "kda", "kda", "mla") and b.kda.num_heads == 2 and b.kda.conv_size == 3
    both = dict(KIMI_LINEAR_RELEASE, layer_types=["linear_attention"] * 3 + ["full_attention", "linear_attention"])
    assert ModelConfig.from_hf_dict(both).attn_types == a.attn_types


def test_k3_outer_config_reads_text_config():
    cfg = ModelConfig.from_hf_dict(KIMI_K3)
    assert cfg.weight_prefix == "language_model.model." and cfg.lm_head_name == "language_model.lm_head.weight"
    assert cfg.eos_token_ids == (2,) and cfg.hidden_act == "situ"


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c.pop("hidden_size"), "'hidden_size'"),
        (lambda c: c.pop("model_type"), "'model_type'"),
        (lambda c: c.update(model_type="gpt9"), "unsupported model_type"),
        (lambda c: c.update(num_key_value_heads=2), "num_key_value_heads"),
        (lambda c: c.update(hidden_size="wide"), "'hidden_size' must be an integer"),
        (lambda c: c.update(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "original_max_position_embeddings"),
    ],
)
def test_llama_errors_name_the_field(mutate, message):
    raw = copy.deepcopy(LLAMA)
    mutate(raw)
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_hf_dict(raw)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c["linear_attn_config"].update(kda_layers=[1, 2, 3, 4, 5]), "listed twice"),
        (lambda c: c["linear_attn_config"].update(kda_layers=[1, 2]), "neither kda_layers nor full_attn_layers"),
        (lambda c: c.update(layer_types=["linear_attention"] * 5), "contradictory fields: 'layer_types'"),
        (lambda c: c.update(num_local_experts=9), "contradictory fields"),
        (lambda c: c.update(num_experts_per_token=9), "exceeds num_experts"),
        (lambda c: c.pop("linear_attn_config"), "linear_attn_config.kda_layers"),
        (lambda c: c["linear_attn_config"].pop("head_dim"), "linear_attn_config.head_dim"),
        (lambda c: c.update(kv_lora_rank=None), "'kv_lora_rank'"),
        (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    ],
)
def test_kimi_errors_name_the_field(mutate, message):
    raw = copy.deepcopy(KIMI_LINEAR_RELEASE)
    mutate(raw)
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_hf_dict(raw)


def test_k3_without_text_config_and_grouping_errors():
    with pytest.raises(ConfigError, match="text_config"):
        ModelConfig.from_hf_dict({"model_type": "kimi_k3"})
    raw = copy.deepcopy(DEEPSEEK)
    raw["n_group"] = 3
    with pytest.raises(ConfigError, match="num_expert_group"):
        ModelConfig.from_hf_dict(raw)


def test_from_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        ModelConfig.from_file(tmp_path)
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_file(tmp_path)


def test_slicing_rewrites_the_layer_lists():
    cfg = ModelConfig.preset("kimi-k3").with_num_layers(5)
    hf = cfg.to_hf_dict()["text_config"]
    assert hf["num_hidden_layers"] == 5 and hf["linear_attn_config"]["full_attn_layers"] == [4]
    assert ModelConfig.from_hf_dict(json.loads(json.dumps(cfg.to_hf_dict()))).attn_types == cfg.attn_types


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c.update(rms_norm_eps=float("inf")), "'rms_norm_eps' must be a finite number, got inf"),
        (lambda c: c.update(rms_norm_eps=float("nan")), "'rms_norm_eps' must be a finite number, got nan"),
        (lambda c: c.update(rope_theta=float("inf")), "'rope_theta' must be a positive finite number, got inf"),
        (lambda c: c["rope_scaling"].update(factor=float("inf")), "'rope_parameters.factor' must be a finite number"),
        (lambda c: c.update(rope_scaling="yarn"), r"'rope_scaling' must be an object \(or null\), got 'yarn'"),
        (lambda c: c.update(rope_scaling=[1, 2]), r"'rope_scaling' must be an object \(or null\), got \[1, 2\]"),
        (lambda c: c.update(rope_parameters="default"), r"'rope_parameters' must be an object \(or null\)"),
        # a scaling rope without its factor: transformers refuses it (KeyError); 1.0 would silently not scale
        (lambda c: c["rope_scaling"].pop("factor"), r"missing required field 'rope_parameters.factor' \(rope type"),
        (
            lambda c: c.update(rope_scaling={"rope_type": "yarn", "original_max_position_embeddings": 128}),
            r"missing required field 'rope_parameters.factor' \(rope type 'yarn'",
        ),
        (lambda c: c.update(rope_scaling={"type": "linear", "factor": None}), "'rope_parameters.factor'"),
        (lambda c: c.update(eos_token_id=131), r"'eos_token_id' is 131, outside the vocabulary \(vocab_size 131\)"),
        (lambda c: c.update(eos_token_id=[2, 99999]), "'eos_token_id' is 99999, outside the vocabulary"),
        (lambda c: c.update(bos_token_id=500), "'bos_token_id' is 500, outside the vocabulary"),
    ],
)
def test_non_finite_numbers_odd_rope_scaling_and_ids_outside_the_vocabulary(mutate, message):
    """json reads NaN / Infinity; an eos id past the vocabulary is never sampled (generation never stops)."""
    raw = copy.deepcopy(LLAMA)
    mutate(raw)
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_hf_dict(raw)


def test_rope_scaling_null_and_k3_ids_checked_after_the_outer_config():
    assert ModelConfig.from_hf_dict(dict(LLAMA, rope_scaling=None)).rope.kind == "default"
    k3 = copy.deepcopy(KIMI_K3)
    k3["text_config"]["linear_attn_config"]["gate_lower_bound"] = float("-inf")
    with pytest.raises(ConfigError, match="'linear_attn_config.gate_lower_bound' must be a finite number"):
        ModelConfig.from_hf_dict(k3)
    k3 = copy.deepcopy(KIMI_K3)
    k3["eos_token_id"] = k3["text_config"]["vocab_size"]
    with pytest.raises(ConfigError, match="'eos_token_id' is .*, outside the vocabulary"):
        ModelConfig.from_hf_dict(k3)


@pytest.mark.parametrize("raw, text", [(KIMI_LINEAR_RELEASE, None), (KIMI_K3, "text_config")])
def test_kimi_rope_dimension_must_be_even(raw, text):
    """RoPE rotates pairs of channels: an odd ``qk_rope_head_dim`` with RoPE on (``mla_use_nope: false``) is
    refused at parse time, not left to fail in the first attention step."""
    raw = copy.deepcopy(raw)
    fields = raw[text] if text else raw
    fields.update(mla_use_nope=False, qk_rope_head_dim=5)
    with pytest.raises(ConfigError, match="'qk_rope_head_dim' must be even .* got 5"):
        ModelConfig.from_hf_dict(raw)
    fields.update(qk_rope_head_dim=6)
    assert ModelConfig.from_hf_dict(raw).rope is not None
