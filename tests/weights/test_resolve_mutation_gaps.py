"""Gaps in the tests of nonstop.weights.resolve and ModelConfig.from_file: dtype aliases, devices this
machine cannot use, and errors that name the config.json they come from."""

from __future__ import annotations

import json

import pytest
import torch

from nonstop.config import ConfigError, ModelConfig
from nonstop.weights.resolve import check_device, parse_dtype
from tests.tiny_configs import LLAMA


@pytest.mark.parametrize(
    "name, dtype",
    [("fp16", torch.float16), ("float16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32)],
)
def test_dtype_aliases(name, dtype):
    assert parse_dtype(name, "cpu") is dtype


def test_devices_other_than_cpu_and_cuda_are_refused():
    with pytest.raises(ValueError, match="device 'meta' is not supported: use cpu or cuda"):
        check_device("meta")


def test_a_cuda_index_past_the_visible_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"only 1 CUDA device\(s\) are visible"):
        check_device("cuda:1")
    assert check_device("cuda:0") == torch.device("cuda:0")


def test_from_file_errors_name_the_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(LLAMA, num_hidden_layers=0)))
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_file(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'config.json'}: ") and "'num_hidden_layers'" in str(err.value)
