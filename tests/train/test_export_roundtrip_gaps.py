"""``save_checkpoint`` -> ``load_model`` gives back the trained model, for every tiny family (a second
mutation audit found only K3 in fp32 pinned): exactly in fp32, and in the default bf16 as the model whose
weights are rounded to bf16 except the fp32 kinds (router weight and bias, A_log, dt_bias)."""

from __future__ import annotations

import json

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.model.build import load_model
from nonstop.train.export import save_checkpoint
from nonstop.train.trainer import init_model
from tests.tiny_configs import DEEPSEEK, KIMI_K3, KIMI_LINEAR_RELEASE, LLAMA

FAMILIES = {"llama": LLAMA, "deepseek_v3": DEEPSEEK, "kimi_linear": KIMI_LINEAR_RELEASE, "kimi_k3": KIMI_K3}
FP32_SUFFIXES = ("gate.weight", "e_score_correction_bias", "A_log", "dt_bias")


def _trained_looking(cfg: ModelConfig) -> torch.nn.Module:
    """A model whose every parameter (correction biases included) is moved off its initial value."""
    torch.manual_seed(3)
    model = init_model(cfg, seed=2)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_an_fp32_export_loads_back_bit_identical(family, tmp_path):
    """Catches an export that drops, reorders (stacked experts split in the wrong order, a flipped axis) or
    rounds a tensor: the fp32 checkpoint must reproduce the logits exactly."""
    cfg = ModelConfig.from_hf_dict(FAMILIES[family])
    model = _trained_looking(cfg)
    save_checkpoint(model, tmp_path, dtype=torch.float32)
    loaded = load_model(cfg, tmp_path, torch.float32)
    ids = torch.randint(0, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids), loaded(ids))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_bf16_export_is_the_model_rounded_to_bf16_except_the_fp32_kinds(family, tmp_path):
    """Catches fp32-kind tensors (router, correction bias, A_log, dt_bias) written in bf16, or float weights
    not written in the requested dtype: the default export loads back as the model with every other weight
    rounded to bf16 here, by hand."""
    cfg = ModelConfig.from_hf_dict(FAMILIES[family])
    model = _trained_looking(cfg)
    save_checkpoint(model, tmp_path)
    loaded = load_model(cfg, tmp_path, torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith(FP32_SUFFIXES):
                p.copy_(p.to(torch.bfloat16).float())
    ids = torch.randint(0, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids), loaded(ids))


def test_the_generation_config_asks_for_greedy_decoding(tmp_path):
    """Catches a trained checkpoint whose generation_config.json turns sampling on or loses its length:
    ``save_checkpoint`` writes do_sample false and the max_new_tokens it is given."""
    cfg = ModelConfig.from_hf_dict(LLAMA)
    save_checkpoint(init_model(cfg, seed=0).eval(), tmp_path, max_new_tokens=17)
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert gen["do_sample"] is False and gen["max_new_tokens"] == 17


def test_the_weights_file_says_it_holds_pytorch_tensors(tmp_path):
    """Catches model.safetensors written without the {"format": "pt"} header metadata that ``nonstop synth``
    writes and older transformers releases require to load a checkpoint."""
    from safetensors import safe_open

    save_checkpoint(init_model(ModelConfig.from_hf_dict(LLAMA), seed=0).eval(), tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
