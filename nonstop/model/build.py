"""Build a ``CausalLM`` from a checkpoint or from random weights."""

from __future__ import annotations

from pathlib import Path

import torch

from nonstop.config import ModelConfig
from nonstop.model.stack import CausalLM
from nonstop.weights.layout import checkpoint_layout
from nonstop.weights.loader import load_state_dict
from nonstop.weights.synth import random_state_dict


def assemble_model(cfg: ModelConfig, state: dict) -> CausalLM:
    """``cfg``'s model holding exactly the tensors of ``state`` (assigned, not copied), in eval mode."""
    with torch.device("meta"):
        model = CausalLM(cfg)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval().requires_grad_(False)


def load_model(
    cfg: ModelConfig, model_dir: str | Path, dtype: torch.dtype = torch.float32, device="cpu", progress=None
) -> CausalLM:
    """``cfg``'s model with the weights of ``model_dir`` (memory-mapped read, no random init)."""
    return assemble_model(cfg, load_state_dict(cfg, model_dir, dtype, device, progress))


def random_model(cfg: ModelConfig, dtype: torch.dtype = torch.float32, device="cpu", seed: int = 0) -> CausalLM:
    """``cfg``'s model with the random weights ``nonstop synth`` would write for ``seed``."""
    return assemble_model(cfg, random_state_dict(cfg, dtype, device, seed))


def meta_model(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> CausalLM:
    """``cfg``'s model on the meta device, every parameter in the dtype a loaded model gives it (router,
    A_log, dt_bias fp32; packed experts uint8): shapes and bytes at any scale, no memory."""
    state = {s.param: torch.empty(s.shape, dtype=s.torch_dtype(dtype), device="meta") for s in checkpoint_layout(cfg)}
    return assemble_model(cfg, state)
