"""Checkpoints crossing between nonstop and transformers in both directions, checked with transformers as the
oracle: what ``nonstop synth`` writes (bf16 / fp16, sharded) loads in ``from_pretrained`` with no load report
and the same fp32 logits; what ``save_pretrained`` writes (bf16 / fp16, sharded with an index, tied and untied
heads) loads in nonstop with transformers' logits; ``nonstop info``'s parameter total is transformers'
``num_parameters()`` plus the correction-bias buffers; and the config.json dtype transformers reads is the
dtype of the tensors written, even when the source config (a transformers 5 save) already names one."""

from __future__ import annotations

import copy
import io
import logging

import pytest
import torch
import transformers

from nonstop.cli import main
from nonstop.config import ModelConfig
from nonstop.model.build import load_model
from nonstop.program.footprint import model_footprint
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import TINY_CONFIGS, hf_model_from_dict

FAMILIES = ["llama", "deepseek_v3", "kimi_linear", "kimi_linear_layer_types"]
IDS = torch.tensor([[5, 17, 33, 8, 80, 11, 9, 3, 100, 7, 2, 66, 4]])
SHARD_BYTES = 20_000  # a dozen shards and an index for these models


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _hf_load(path, **kw):
    """transformers' model of ``path`` and everything its loader logged (a LOAD REPORT names missing,
    unexpected or mismatched weights)."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, experts_implementation="eager", **kw)
    finally:
        logger.removeHandler(handler)
    return model.eval(), buf.getvalue()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_sharded_half_precision_synth_checkpoint_loads_cleanly_in_transformers(family, dtype, tmp_path):
    """Catches synth writing a name, shape or dtype transformers does not expect (it would print a LOAD
    REPORT of missing / unexpected / mismatched weights and initialise them at random), a wrong torch_dtype
    in config.json, or shards and an index transformers reads differently: both read the same file and
    must give the same fp32 logits."""
    cfg = ModelConfig.from_hf_dict(TINY_CONFIGS[family])
    out = write_checkpoint(cfg, tmp_path / "ck", seed=5, dtype=dtype, max_shard_bytes=SHARD_BYTES)
    assert (out / "model.safetensors.index.json").is_file()
    auto, log = _hf_load(out)  # dtype from config.json, as a user's from_pretrained(path) gets it
    assert "LOAD REPORT" not in log, log
    assert auto.dtype == dtype
    ref, _ = _hf_load(out, dtype=torch.float32)
    ours = load_model(cfg, out, torch.float32)
    with torch.no_grad():
        assert _rel_err(ours(IDS), ref(IDS).logits.float()) < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_info_counts_transformers_parameters_plus_the_correction_bias(family, tmp_path):
    """Catches ``nonstop info`` / the footprint counting a tensor twice or missing one (the tied head, a
    shared expert, the KDA conv): its total is transformers' num_parameters() plus the router correction
    bias, which transformers keeps as a buffer and the checkpoint stores as a tensor."""
    cfg = ModelConfig.from_hf_dict(TINY_CONFIGS[family])
    out = write_checkpoint(cfg, tmp_path / "ck", seed=1, dtype=torch.float32)
    ref, _ = _hf_load(out, dtype=torch.float32)
    buffers = sum(b.numel() for n, b in ref.named_buffers() if n.endswith("e_score_correction_bias"))
    assert model_footprint(cfg).total_params == ref.num_parameters() + buffers


@pytest.fixture(scope="module")
def hf_models():
    out = {}
    for family, tied in [("llama", True), ("llama", False), ("deepseek_v3", True), ("kimi_linear", None)]:
        raw = copy.deepcopy(TINY_CONFIGS[family])
        if tied is not None:
            raw["tie_word_embeddings"] = tied
        torch.manual_seed(11)
        out[(family, tied)] = hf_model_from_dict(raw)
    return out


@pytest.mark.parametrize("shard", [None, "20KB"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("key", [("llama", True), ("llama", False), ("deepseek_v3", True), ("kimi_linear", None)])
def test_save_pretrained_checkpoints_load_with_transformers_logits(hf_models, key, dtype, shard, tmp_path):
    """Catches a loader that reads a sharded index, a half-precision file or a tied / untied head of
    transformers' own save_pretrained differently from transformers: fp32 logits of both on the file."""
    model = copy.deepcopy(hf_models[key]).to(dtype)
    model.save_pretrained(tmp_path, **({} if shard is None else {"max_shard_size": shard}))
    assert (tmp_path / "model.safetensors.index.json").is_file() == (shard is not None)
    ref, log = _hf_load(tmp_path, dtype=torch.float32)
    assert "LOAD REPORT" not in log, log
    ours = load_model(ModelConfig.from_file(tmp_path), tmp_path, torch.float32)
    with torch.no_grad():
        assert _rel_err(ours(IDS), ref(IDS).logits.float()) < 1e-5


@pytest.mark.parametrize(("saved", "written"), [(torch.bfloat16, "fp32"), (torch.float32, "bf16")])
def test_synth_over_a_transformers_config_names_the_dtype_it_wrote(hf_models, saved, written, tmp_path):
    """DEFECT (fails on the code as audited): transformers 5 saves its config with a ``dtype`` key, which
    it prefers to ``torch_dtype``; synth keeps the source's ``dtype`` and adds ``torch_dtype`` beside it, so
    ``from_pretrained(out)`` builds the model in the source's dtype, not the written one (fp32 weights
    silently rounded to bf16, or bf16 weights widened). The written config must name the written dtype."""
    copy.deepcopy(hf_models[("llama", False)]).to(saved).save_pretrained(tmp_path / "src")
    assert main(["synth", "--config", str(tmp_path / "src"), "--dtype", written, "--out", str(tmp_path / "o")]) == 0
    want = {"fp32": torch.float32, "bf16": torch.bfloat16}[written]
    assert transformers.AutoConfig.from_pretrained(tmp_path / "o").dtype == want
    auto, _ = _hf_load(tmp_path / "o")
    assert auto.dtype == want
