"""The planner prices a checkpoint directory by its own config.json: ``RELEASED_FP8`` (Kimi K2 / DeepSeek-V3
released in fp8) applies to the presets that stand for those releases, not to a directory's weights."""

from __future__ import annotations

import json

import pytest

from nonstop.config import ModelConfig, preset_hf_dict
from nonstop.plan.workload import Precision
from tests.tiny_configs import DEEPSEEK


def _directory(tmp_path, raw):
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return ModelConfig.from_file(tmp_path)


def test_a_float_deepseek_v3_directory_is_priced_by_its_config(tmp_path):
    p = Precision.released(_directory(tmp_path, {**DEEPSEEK, "torch_dtype": "float32"}))
    assert (p.dense, p.experts) == ("bf16", "bf16")


def test_an_fp8_deepseek_v3_directory_is_priced_in_fp8(tmp_path):
    raw = {**DEEPSEEK, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    p = Precision.released(_directory(tmp_path, raw))
    assert (p.dense, p.experts) == ("fp8", "fp8")


@pytest.mark.parametrize("layers", [None, 2])
def test_the_kimi_k2_preset_is_priced_as_released_in_fp8(layers):
    cfg = ModelConfig.preset("kimi-k2")
    assert "quantization_config" not in preset_hf_dict("kimi-k2")  # the rule, not the config, makes it fp8
    cfg = cfg.with_num_layers(layers) if layers else cfg
    p = Precision.released(cfg)
    assert (p.dense, p.experts) == ("fp8", "fp8")
