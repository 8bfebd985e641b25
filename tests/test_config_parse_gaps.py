"""More gaps in the config parser's tests (mutation audit of config_parse.py): values of the wrong JSON type or
out of range that must be refused with a ConfigError naming the field (not accepted, not a traceback), and
defaults / alternative spellings checked against transformers' config classes or hand arithmetic."""

from __future__ import annotations

import copy

import pytest
import transformers

from nonstop.config import ConfigError, ModelConfig
from tests.tiny_configs import DEEPSEEK, KIMI_K3, KIMI_LINEAR_LAYER_TYPES, KIMI_LINEAR_RELEASE, LLAMA


def _without(raw: dict, *keys: str) -> dict:
    return {k: copy.deepcopy(v) for k, v in raw.items() if k not in keys}


def _refused(raw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_hf_dict(raw)


def _k3(**text_changes) -> dict:
    raw = copy.deepcopy(KIMI_K3)
    raw["text_config"].update(text_changes)
    return raw


def _kimi_lac(**lac_changes) -> dict:
    raw = copy.deepcopy(KIMI_LINEAR_RELEASE)
    raw["linear_attn_config"].update(lac_changes)
    return raw


# ----------------------------------------------------------------------------- wrong JSON types


@pytest.mark.parametrize(
    "base, change, message",
    [
        # JSON true is an int to Python: it must not be read as 1 layer / 1.0 eps
        (LLAMA, {"num_hidden_layers": True}, "'num_hidden_layers' must be an integer, got True"),
        (LLAMA, {"rms_norm_eps": True}, "'rms_norm_eps' must be a number, got True"),
        (LLAMA, {"rope_theta": True}, "'rope_theta' must be a positive finite number, got True"),
        (LLAMA, {"hidden_act": 5}, "'hidden_act' must be a string, got 5"),
        (DEEPSEEK, {"moe_router_activation_func": 1}, "'moe_router_activation_func' must be a string, got 1"),
    ],
)
def test_wrong_json_types_are_refused(base, change, message):
    """A bool where a number belongs (True == 1 to Python) or a number where a string belongs is a bad
    config, refused with the field's name, not silently taken as 1 / 1.0 or refused with a vaguer message."""
    _refused(dict(copy.deepcopy(base), **change), message)


def test_layer_bound_is_inclusive():
    """MAX_LAYERS is 4096: 4097 layers is refused (one past the limit), 4096 is accepted."""
    _refused(dict(LLAMA, num_hidden_layers=4097), "'num_hidden_layers' is 4097: more than any model has")
    assert ModelConfig.from_hf_dict(dict(LLAMA, num_hidden_layers=4096)).num_hidden_layers == 4096


# ----------------------------------------------------------------------------- out of range


@pytest.mark.parametrize(
    "base, change, message",
    [
        (DEEPSEEK, {"first_k_dense_replace": -1}, "'first_k_dense_replace' must be >= 0, got -1"),
        (DEEPSEEK, {"n_shared_experts": -1}, "'num_shared_experts' must be >= 0, got -1"),
        (LLAMA, {"bos_token_id": -1}, "'bos_token_id' must be >= 0, got -1"),
        (LLAMA, {"rope_theta": 0}, "'rope_theta' must be a positive finite number, got 0"),
        (
            LLAMA,
            {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 0}},
            "'rope_parameters.original_max_position_embeddings' must be >= 1, got 0",
        ),
        (
            LLAMA,
            {"rope_scaling": dict(LLAMA["rope_scaling"], low_freq_factor=0)},
            "'rope_parameters.low_freq_factor' must be > 0.0",
        ),
        (
            DEEPSEEK,
            {"rope_scaling": dict(DEEPSEEK["rope_scaling"], beta_slow=0)},
            "'rope_parameters.beta_slow' must be > 0.0",
        ),
        (
            DEEPSEEK,
            {"rope_scaling": dict(DEEPSEEK["rope_scaling"], mscale=-1.0)},
            "'rope_parameters.mscale' must be >= 0.0, got -1.0",
        ),
        (
            DEEPSEEK,
            {"rope_scaling": dict(DEEPSEEK["rope_scaling"], mscale_all_dim=-1.0)},
            "'rope_parameters.mscale_all_dim' must be >= 0.0, got -1.0",
        ),
        (
            LLAMA,
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 0}},
            "'rope_parameters.attention_factor' must be > 0.0",
        ),
        # n_group 0: 8 % 0 would be a ZeroDivisionError traceback
        (DEEPSEEK, {"n_group": 0}, r"num_experts \(8\) must divide into num_expert_group \(0\) groups"),
        (DEEPSEEK, {"topk_group": 5}, r"topk_group \(5\) must be between 1 and num_expert_group \(4\)"),
        (DEEPSEEK, {"topk_group": 0}, r"topk_group \(0\) must be between 1 and num_expert_group \(4\)"),
        # 8 groups of one expert: grouped top-k picks the best two of a group, so a group needs two
        (DEEPSEEK, {"n_group": 8, "topk_group": 3}, "grouped top-k needs at least 2 experts per group"),
        (DEEPSEEK, {"scoring_func": "tanh"}, "'moe_router_activation_func' must be sigmoid or softmax, got 'tanh'"),
        (DEEPSEEK, {"routed_scaling_factor": 0}, "'routed_scaling_factor' must be > 0.0, got 0.0"),
    ],
)
def test_out_of_range_values_are_refused(base, change, message):
    """Negative counts / ids, a zero theta or rope factor, group counts that cannot route: refused, naming
    the field, at parse time instead of giving a broken model or a traceback later."""
    _refused(dict(copy.deepcopy(base), **change), message)


def test_kimi_topk_group_zero_is_refused():
    """Kimi groups default to one group; topk_group 0 would select no experts at all."""
    _refused(dict(copy.deepcopy(KIMI_LINEAR_RELEASE), topk_group=0), r"topk_group \(0\) must be between 1")


def test_kimi_negative_rope_dim_is_refused():
    """NoPE Kimi MLA still caches qk_rope_head_dim channels per token: a negative width is refused."""
    _refused(dict(copy.deepcopy(KIMI_LINEAR_RELEASE), qk_rope_head_dim=-2), "'qk_rope_head_dim' must be >= 0")


def test_eos_id_zero_is_a_token_id():
    """Token id 0 is a valid id (DeepSeek's bos is 0): an eos list holding 0 is accepted as given."""
    cfg = ModelConfig.from_hf_dict(dict(DEEPSEEK, eos_token_id=[0, 1]))
    assert cfg.eos_token_ids == (0, 1)


def test_k3_null_outer_ids_fall_back_to_text_config():
    """A null top-level bos/pad id means 'not given' (as a missing one): text_config's value is kept."""
    raw = _k3(bos_token_id=7, pad_token_id=8)
    raw.update(bos_token_id=None, pad_token_id=None)
    cfg = ModelConfig.from_hf_dict(raw)
    assert (cfg.bos_token_id, cfg.pad_token_id) == (7, 8)


def test_k3_outer_ids_must_be_non_negative():
    """The top-level K3 ids override text_config's and are checked like them."""
    raw = copy.deepcopy(KIMI_K3)
    raw["bos_token_id"] = -1
    _refused(raw, "'bos_token_id' must be >= 0, got -1")


# ----------------------------------------------------------------------------- defaults and spellings


def test_router_scoring_and_renormalisation_are_read():
    """DeepSeek's 'scoring_func' selects the router's activation; norm_topk_prob defaults to True as in
    transformers' DeepseekV3Config and KimiLinearConfig."""
    assert ModelConfig.from_hf_dict(dict(DEEPSEEK, scoring_func="softmax")).moe.scoring == "softmax"
    ds = _without(DEEPSEEK, "norm_topk_prob")
    assert ModelConfig.from_hf_dict(ds).moe.renormalize is transformers.DeepseekV3Config(**ds).norm_topk_prob is True
    kl = _without(KIMI_LINEAR_LAYER_TYPES, "moe_renormalize", "norm_topk_prob")
    assert ModelConfig.from_hf_dict(kl).moe.renormalize is transformers.KimiLinearConfig(**kl).norm_topk_prob is True


def test_kimi_linear_has_no_mla_output_gate_and_no_latent_norm_without_latent_experts():
    """mla_use_output_gate defaults to off (Kimi Linear has no gate; only K3 turns it on), and
    latent_moe_use_norm means nothing without a routed_expert_hidden_size."""
    cfg = ModelConfig.from_hf_dict(dict(copy.deepcopy(KIMI_LINEAR_RELEASE), latent_moe_use_norm=True))
    assert cfg.mla.output_gate is False
    assert cfg.moe.latent_size is None and cfg.moe.latent_norm is False


def test_kimi_layer_types_format_defaults_to_one_dense_layer_as_transformers():
    """A Kimi Linear config in the layer_types format without first_k_dense_replace: only layer 0 is dense
    (KimiLinearConfig's default 1), not DeepSeek's 3."""
    raw = _without(KIMI_LINEAR_LAYER_TYPES, "first_k_dense_replace")
    theirs = transformers.KimiLinearConfig(**copy.deepcopy(raw)).mlp_layer_types
    assert ModelConfig.from_hf_dict(raw).mlp_types == tuple("moe" if t == "sparse" else t for t in theirs)
    assert theirs == ["dense", "sparse", "sparse", "sparse", "sparse"]


def test_moe_layer_freq_zero_is_refused():
    """moe_layer_freq 0 would divide by zero (i % 0) while laying out the MoE layers."""
    _refused(dict(copy.deepcopy(DEEPSEEK), moe_layer_freq=0), "'moe_layer_freq' must be >= 1")


# ----------------------------------------------------------------------------- layer lists


@pytest.mark.parametrize(
    "raw, message",
    [
        (
            dict(DEEPSEEK, mlp_layer_types=["dense", "moe", "sparse"]),
            r"'mlp_layer_types' has unknown entries \['moe'\]",
        ),
        (dict(KIMI_LINEAR_RELEASE, linear_attn_config="kda"), "'linear_attn_config' must be an object, got 'kda'"),
        (_kimi_lac(full_attn_layers=None), "linear_attn_config needs both 'kda_layers' and 'full_attn_layers' lists"),
        (_kimi_lac(kda_layers=5), "linear_attn_config needs both 'kda_layers' and 'full_attn_layers' lists"),
        (
            # half of the release spelling beside layer_types: refused, not silently left out
            dict(KIMI_LINEAR_LAYER_TYPES, linear_attn_config={"kda_layers": [1, 3, 4]}),
            "linear_attn_config needs both 'kda_layers' and 'full_attn_layers' lists",
        ),
        (_kimi_lac(full_attn_layers=[4, 6]), r"linear_attn_config.full_attn_layers: layer 6 outside 1..5"),
        (_kimi_lac(full_attn_layers=["4"]), r"linear_attn_config.full_attn_layers: layer '4' outside 1..5"),
        (
            dict(KIMI_LINEAR_LAYER_TYPES, layer_types=["linear_attention"] * 4),
            "'layer_types' must list 5 entries",
        ),
        (
            dict(KIMI_LINEAR_LAYER_TYPES, layer_types=["linear_attention"] * 4 + ["mla"]),
            r"'layer_types' has unknown entries \['mla'\]",
        ),
    ],
)
def test_bad_layer_lists_are_refused(raw, message):
    """Layer lists of the wrong type, length or vocabulary, or naming a layer past the last: a ConfigError
    naming the field, not a KeyError / TypeError / IndexError traceback or a model of the wrong depth."""
    _refused(copy.deepcopy(raw), message)


@pytest.mark.parametrize(
    "raw, message",
    [
        (_kimi_lac(num_heads=0), "'linear_attn_config.num_heads' must be positive, got 0"),
        (_kimi_lac(head_dim=-8), "'linear_attn_config.head_dim' must be positive, got -8"),
        (dict(KIMI_LINEAR_LAYER_TYPES, linear_num_heads=0), "'linear_num_heads' must be positive, got 0"),
        (dict(KIMI_LINEAR_LAYER_TYPES, linear_head_dim="10"), "'linear_head_dim' must be an integer, got '10'"),
        (_k3(activation_situ_beta=0), "'text_config.activation_situ_beta' must be > 0.0, got 0.0"),
        (_k3(activation_situ_linear_beta=0.0), "'text_config.activation_situ_linear_beta' must be > 0.0, got 0.0"),
    ],
)
def test_bad_kda_and_situ_values_are_refused(raw, message):
    """KDA head counts / widths (in linear_attn_config or the flat layer_types spelling) must be positive
    integers, and the SiTU soft-caps positive (they divide): refused with the field's name."""
    _refused(copy.deepcopy(raw), message)


def test_off_by_default_flags_match_transformers():
    """tie_word_embeddings defaults to False (LlamaConfig, DeepseekV3Config), and Kimi Linear's KDA output
    gate is the low-rank one unless use_full_rank_gate says otherwise (only K3 sets it)."""
    for base, cls in ((LLAMA, transformers.LlamaConfig), (DEEPSEEK, transformers.DeepseekV3Config)):
        raw = _without(base, "tie_word_embeddings")
        assert ModelConfig.from_hf_dict(raw).tie_word_embeddings is cls(**copy.deepcopy(raw)).tie_word_embeddings
        assert cls(**copy.deepcopy(raw)).tie_word_embeddings is False
    assert ModelConfig.from_hf_dict(KIMI_LINEAR_RELEASE).kda.full_rank_output_gate is False


# ----------------------------------------------------------------------------- Llama attention shape


@pytest.mark.parametrize(
    "change, message",
    [
        # 0 KV heads: heads % 0 would be a ZeroDivisionError traceback
        ({"num_key_value_heads": 0}, r"num_attention_heads \(5\) must be a multiple of num_key_value_heads \(0\)"),
        # 42 / 5 is not whole: the head width would silently be 8 (40 of the 42 channels)
        (
            {"hidden_size": 42, "head_dim": None},
            r"hidden_size \(42\) is not divisible by num_attention_heads \(5\); give 'head_dim'",
        ),
        ({"head_dim": -2}, r"head_dim \(-2\) must be positive and even"),
    ],
)
def test_llama_inconsistent_head_shapes_are_refused(change, message):
    """GQA head shapes that cannot describe the attention weights are refused, naming the fields."""
    _refused(dict(copy.deepcopy(LLAMA), **change), message)


def test_llama_attention_bias_defaults_off_as_transformers():
    """No attention_bias in config.json: q/k/v/o projections have no bias (LlamaConfig's default False)."""
    raw = _without(LLAMA, "attention_bias")
    gqa = ModelConfig.from_hf_dict(raw).gqa
    assert gqa.bias is gqa.out_bias is transformers.LlamaConfig(**copy.deepcopy(raw)).attention_bias is False
    assert ModelConfig.from_hf_dict(LLAMA).gqa.out_bias is True  # attention_bias also biases o_proj


def test_llama_mlp_bias_defaults_off_as_transformers():
    """No mlp_bias in config.json: the SwiGLU projections have no bias (LlamaConfig's default False)."""
    raw = _without(LLAMA, "mlp_bias")
    assert ModelConfig.from_hf_dict(raw).mlp_bias is transformers.LlamaConfig(**copy.deepcopy(raw)).mlp_bias is False
    assert ModelConfig.from_hf_dict(dict(LLAMA, mlp_bias=True)).mlp_bias is True


# ----------------------------------------------------------------------------- MLA rope


@pytest.mark.parametrize("raw", [dict(DEEPSEEK, qk_rope_head_dim=0), _without(DEEPSEEK, "qk_rope_head_dim")])
def test_deepseek_needs_a_rope_dimension(raw):
    """DeepSeek MLA always rotates its decoupled rope key: a zero (or missing) qk_rope_head_dim is refused,
    not built as a model whose rope slice is empty."""
    _refused(raw, "'qk_rope_head_dim' must be positive and even, got 0")


def test_kimi_mla_is_nope_unless_told_otherwise():
    """Kimi Linear MLA is NoPE by default (mla_use_nope absent = true); with RoPE turned on the rotation
    pairs channels GPT-J style (rope_interleave default true, as DeepseekV3Config's)."""
    assert "mla_use_nope" not in KIMI_LINEAR_RELEASE
    cfg = ModelConfig.from_hf_dict(KIMI_LINEAR_RELEASE)
    assert cfg.rope is None and cfg.mla.use_rope is False
    roped = ModelConfig.from_hf_dict(dict(KIMI_LINEAR_RELEASE, mla_use_nope=False))
    assert roped.mla.use_rope and roped.rope.interleaved is transformers.DeepseekV3Config().rope_interleave is True


def test_k3_latent_width_must_be_positive():
    """routed_expert_hidden_size 0 would build the routed experts at full width while the checkpoint holds
    latent-width ones."""
    _refused(_k3(routed_expert_hidden_size=0), "'routed_expert_hidden_size' must be positive")
    _refused(_k3(routed_expert_hidden_size=-4), "'routed_expert_hidden_size' must be positive")


@pytest.mark.parametrize("raw", [[LLAMA], "llama", None])
def test_config_that_is_not_an_object_is_refused(raw):
    """A config.json holding a list / string / null is a ConfigError, not an AttributeError traceback."""
    _refused(raw, "config must be a JSON object")


@pytest.mark.parametrize(
    "raw, message",
    [
        (dict(LLAMA, model_type=["llama"]), r"'model_type' must be a string, got \['llama'\]"),
        (dict(LLAMA, model_type=7), "'model_type' must be a string, got 7"),
        (dict(KIMI_K3, text_config="kimi_linear"), "missing required field 'text_config'"),
        (dict(KIMI_K3, text_config=[KIMI_K3["text_config"]]), "missing required field 'text_config'"),
    ],
)
def test_wrong_model_type_or_text_config_types_are_refused(raw, message):
    """A model_type that is not a string (a list would be an unhashable-type traceback) or a kimi_k3
    text_config that is not an object (an AttributeError deep in the parser) is refused by name."""
    _refused(copy.deepcopy(raw), message)


def test_fp8_block_of_three_sizes_is_refused():
    """weight_block_size is [rows, columns]: a three-entry list is refused, not read as a 3-tuple block."""
    quant = {"quant_method": "fp8", "weight_block_size": [128, 128, 128]}
    _refused(dict(copy.deepcopy(DEEPSEEK), quantization_config=quant), "two positive integers, got \\[128, 128, 128\\]")
