"""Bad config.json values the parser let through (found by the config_parse mutation audit): each is refused
with a ConfigError naming the field, not a TypeError traceback, a silently different model, or a torch error
while the model is built."""

from __future__ import annotations

import copy
import math

import pytest
import transformers

from nonstop.config import ConfigError, ModelConfig
from tests.tiny_configs import DEEPSEEK, KIMI_LINEAR_LAYER_TYPES, KIMI_LINEAR_RELEASE, LLAMA


@pytest.mark.parametrize("field", ["layer_types", "mlp_layer_types"])
@pytest.mark.parametrize("entry", [["linear_attention"], {"type": "dense"}, 3])
def test_a_layer_list_entry_that_is_not_a_string_is_refused_naming_the_field(field, entry):
    """A list or object in a layer-type list raised ``TypeError: unhashable type`` from the lookup (no field,
    no file); a number fell through to the same "unknown entries" message the fix gives every kind."""
    raw = copy.deepcopy(KIMI_LINEAR_LAYER_TYPES)
    n = raw["num_hidden_layers"]
    raw[field] = [entry] * n
    with pytest.raises(ConfigError, match=f"field '{field}' has unknown entries"):
        ModelConfig.from_hf_dict(raw)


@pytest.mark.parametrize("name", ["kda_layers", "full_attn_layers"])
def test_json_true_is_not_read_as_layer_one(name):
    """``true`` in a 1-based layer list was Python's 1: ``kda_layers: [true, 2, 3, 5]`` parsed as layer 1
    being KDA (the JSON was almost certainly written wrong)."""
    raw = copy.deepcopy(KIMI_LINEAR_RELEASE)
    lac = raw["linear_attn_config"]
    layers = list(lac[name])
    assert 1 in lac["kda_layers"] + lac["full_attn_layers"]
    lac["kda_layers"] = [x for x in lac["kda_layers"] if x != 1]
    lac["full_attn_layers"] = [x for x in lac["full_attn_layers"] if x != 1]
    lac[name] = [True] + [x for x in layers if x != 1]
    with pytest.raises(ConfigError, match=rf"linear_attn_config\.{name}: layer True outside"):
        ModelConfig.from_hf_dict(raw)


@pytest.mark.parametrize("width", [-3, 0])
def test_a_non_positive_latent_expert_width_is_refused_for_every_family(width):
    """``routed_expert_hidden_size`` was checked for the Kimi families only: on a DeepSeek-V3 config -3
    failed later inside torch ("negative dimension") and 0 silently meant no latent projection."""
    raw = dict(copy.deepcopy(DEEPSEEK), routed_expert_hidden_size=width)
    with pytest.raises(ConfigError, match="'routed_expert_hidden_size' must be positive"):
        ModelConfig.from_hf_dict(raw)
    assert ModelConfig.from_hf_dict(dict(raw, routed_expert_hidden_size=8)).moe.latent_size == 8


def test_a_negative_pad_id_means_no_pad_token_as_in_transformers():
    """Early Llama conversions write ``pad_token_id: -1`` for "no pad token"; transformers loads them, and
    nonstop refused the whole checkpoint over a field it never pads with. A -1 is read as no pad id; a pad
    id of the wrong type is still refused."""
    raw = dict(copy.deepcopy(LLAMA), pad_token_id=-1)
    assert transformers.LlamaConfig(**raw).pad_token_id == -1  # the oracle takes it
    assert ModelConfig.from_hf_dict(raw).pad_token_id is None
    assert ModelConfig.from_hf_dict(dict(raw, pad_token_id=3)).pad_token_id == 3
    with pytest.raises(ConfigError, match="'pad_token_id' must be an integer"):
        ModelConfig.from_hf_dict(dict(raw, pad_token_id="0"))


def test_mla_softmax_scale_takes_mscale_all_dim_under_any_scaled_rope_as_transformers():
    """DeepSeek's reference and transformers (``yarn_apply_mscale``) fold ``mscale_all_dim`` into the MLA
    softmax scale under any rope scaling, not only YaRN: with linear rope, factor 4, mscale_all_dim 1 the scale
    is head_dim^-0.5 · (0.1·ln 4 + 1)^2 (nonstop gave head_dim^-0.5)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    raw = copy.deepcopy(DEEPSEEK)
    raw["rope_scaling"] = {"rope_type": "linear", "factor": 4.0, "mscale_all_dim": 1.0}
    head_dim = raw["qk_nope_head_dim"] + raw["qk_rope_head_dim"]
    expected = head_dim**-0.5 * (0.1 * math.log(4.0) + 1.0) ** 2
    assert ModelConfig.from_hf_dict(raw).mla.softmax_scale == pytest.approx(expected, rel=1e-12)
    oracle = DeepseekV3Attention(transformers.DeepseekV3Config(**raw), layer_idx=0)
    assert oracle.scaling == pytest.approx(expected, rel=1e-12)


def test_rope_scaling_and_rope_parameters_that_disagree_are_refused():
    """A config carrying both spellings with different values was read from ``rope_parameters`` while
    transformers' Llama reads ``rope_scaling``: the two engines built different rotary tables from one
    file. Disagreeing keys are refused; the same values in both (as transformers writes them) load."""
    raw = copy.deepcopy(LLAMA)
    assert raw["rope_scaling"]["rope_type"] == "llama3"
    with pytest.raises(ConfigError, match=r"'rope_scaling' and 'rope_parameters' differ in \['factor', 'rope_type'\]"):
        ModelConfig.from_hf_dict(dict(raw, rope_parameters={"rope_type": "linear", "factor": 2.0}))
    both = ModelConfig.from_hf_dict(dict(raw, rope_parameters=dict(raw["rope_scaling"], rope_theta=raw["rope_theta"])))
    assert both.rope == ModelConfig.from_hf_dict(raw).rope
