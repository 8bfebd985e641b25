"""``write_side_files`` names the written dtype at every level of config.json that names one (a mutation audit
found the ``text_config`` level and the "only the keys it already has" rule unpinned). transformers 5 reads
``dtype`` before ``torch_dtype``, and a multimodal config (Kimi K3's) keeps them in ``text_config`` as well:
a stale "float32" left there would make transformers load bf16 weights as fp32."""

from __future__ import annotations

import copy
import json

import torch

from nonstop.config import ModelConfig
from nonstop.weights.write import write_side_files
from tests.engine.tiny_models import TINY_MODELS


def _written(tmp_path, hf: dict, dtype=torch.bfloat16) -> dict:
    cfg = ModelConfig.from_hf_dict(hf)
    write_side_files(tmp_path, cfg, dtype, {}, None)
    return json.loads((tmp_path / "config.json").read_text())


def _tiny_k3() -> dict:
    return json.loads(TINY_MODELS["k3"].read_text())


def test_both_dtype_keys_of_text_config_name_the_written_dtype(tmp_path):
    hf = _tiny_k3()
    hf["dtype"] = "float32"
    hf["text_config"].update(dtype="float32", torch_dtype="float32")
    out = _written(tmp_path, copy.deepcopy(hf))
    assert out["torch_dtype"] == out["dtype"] == "bfloat16"
    assert out["text_config"]["dtype"] == "bfloat16"
    assert out["text_config"]["torch_dtype"] == "bfloat16"


def test_a_text_config_with_only_torch_dtype_gets_no_new_dtype_key(tmp_path):
    hf = _tiny_k3()
    hf.pop("dtype", None)
    hf["text_config"].pop("dtype", None)
    hf["text_config"]["torch_dtype"] = "float32"
    out = _written(tmp_path, hf, torch.float16)
    assert out["torch_dtype"] == "float16"
    assert out["text_config"]["torch_dtype"] == "float16"
    assert "dtype" not in out["text_config"] and "dtype" not in out  # only the spellings the config uses
