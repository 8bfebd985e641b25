"""``model/build.py``: a built model is an inference model (eval mode, no gradients), holds exactly the given
tensors (a missing or extra one is an error, not a silent meta or ignored tensor), takes the seed and dtype it
is asked for, and ``meta_model`` gives each tensor the dtype its checkpoint layout names (router, A_log,
dt_bias fp32; packed experts uint8)."""

from __future__ import annotations

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.model.build import assemble_model, load_model, meta_model, random_model
from nonstop.weights.synth import random_state_dict, write_checkpoint
from tests.tiny_configs import TINY_CONFIGS


def _cfg(name: str = "llama") -> ModelConfig:
    return ModelConfig.from_hf_dict(TINY_CONFIGS[name])


def test_a_built_model_is_in_eval_mode_without_gradients():
    """A model left in training mode or with requires_grad parameters would record autograd graphs (and keep
    activations) in every forward the engine runs."""
    model = random_model(_cfg())
    assert model.training is False and not any(m.training for m in model.modules())
    assert not any(p.requires_grad for p in model.parameters())
    out = model(torch.tensor([[3, 4]]))
    assert not out.requires_grad


def test_assembly_refuses_a_state_with_a_missing_or_an_extra_tensor():
    """strict loading: a checkpoint missing a tensor must not leave that parameter on the meta device (the
    first forward would fail far from the cause), nor may an unknown tensor be dropped unnoticed."""
    cfg = _cfg()
    state = random_state_dict(cfg, torch.float32, "cpu", 0)
    assert assemble_model(cfg, dict(state)) is not None
    missing = dict(state)
    missing.pop(next(iter(missing)))
    with pytest.raises(RuntimeError, match="Missing key"):
        assemble_model(cfg, missing)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        assemble_model(cfg, {**state, "nonsense.weight": torch.zeros(1)})


def test_the_tensors_are_assigned_not_copied_and_the_seed_is_used():
    """The model holds the state's own tensors (no second copy in memory), ``seed`` picks the weights, fp32 is
    the default dtype."""
    cfg = _cfg()
    state = random_state_dict(cfg, torch.float32, "cpu", 3)
    model = assemble_model(cfg, dict(state))
    assert model.embed_tokens.weight.data_ptr() == state["embed_tokens.weight"].data_ptr()
    a, b = random_model(cfg, seed=3), random_model(cfg, seed=4)
    assert torch.equal(a.embed_tokens.weight, state["embed_tokens.weight"])
    assert not torch.equal(a.embed_tokens.weight, b.embed_tokens.weight)
    assert random_model(cfg).embed_tokens.weight.dtype == torch.float32  # the documented default


def test_load_model_takes_the_asked_dtype(tmp_path):
    """A checkpoint written in fp32 and loaded as bf16 gives bf16 parameters (and fp32 by default)."""
    cfg = _cfg()
    path = write_checkpoint(cfg, tmp_path / "ckpt", seed=1, dtype=torch.float32)
    assert load_model(cfg, path, torch.bfloat16).embed_tokens.weight.dtype == torch.bfloat16
    assert load_model(cfg, path).embed_tokens.weight.dtype == torch.float32


def test_meta_model_keeps_the_fp32_tensors_of_a_16_bit_model():
    """kimi_linear in bf16: the router's weight and KDA's A_log / dt_bias stay fp32 as a loaded model has them
    (the footprint's bytes count them at 4 bytes), the rest is bf16, all on the meta device."""
    cfg = _cfg("kimi_linear")
    model = meta_model(cfg, torch.bfloat16)
    loaded = random_model(cfg, torch.bfloat16)
    got = {n: (t.dtype, t.device.type) for n, t in model.state_dict().items()}
    want = {n: (t.dtype, "meta") for n, t in loaded.state_dict().items()}
    assert got == want
    assert {d for d, _ in got.values()} == {torch.bfloat16, torch.float32}
