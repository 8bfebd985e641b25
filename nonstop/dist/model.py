"""A rank's model: ``CausalLM`` of the rank's config (``shard.local_config``) holding its parts of the
weights. Routed experts hold only the rank's physical experts (stacked in local order); the MoE
module keeps the full ``MoEConfig`` (its router scores every expert).

The model is a container of weights to lower into the rank's Program (``dist/program.py``): its own
``forward`` would miss the collectives and is never called under a multi-rank layout.
"""

from __future__ import annotations

import torch
from torch import nn

from nonstop.config import ModelConfig
from nonstop.dist.layout import Layout
from nonstop.dist.shard import local_config, rank_shards
from nonstop.model.stack import CausalLM


def _assign(model: nn.Module, path: str, tensor: torch.Tensor) -> None:
    owner, _, leaf = path.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    if leaf in module._parameters:
        module._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)
    elif leaf in module._buffers:
        module._buffers[leaf] = tensor
    else:
        raise KeyError(f"{path}: no such parameter in the rank's model")


def build_rank_model(cfg: ModelConfig, layout: Layout, rank: int, state: dict[str, torch.Tensor]) -> CausalLM:
    """The rank's model holding ``state`` ({internal param: the rank's part}, as ``load_rank_state``)."""
    return model_holding(local_config(cfg, layout, rank), rank, state)


def model_holding(local: ModelConfig, rank: int, state: dict[str, torch.Tensor]) -> CausalLM:
    """A ``CausalLM`` of the rank's config ``local`` (``shard.local_config``) holding ``state``."""
    with torch.device("meta"):
        model = CausalLM(local)
    for path, tensor in state.items():
        _assign(model, path, tensor)
    real = any(not t.is_meta for t in state.values())
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if real and left:
        raise RuntimeError(f"rank {rank}: parameter(s) {left[:4]} were not loaded")
    return model.eval().requires_grad_(False)


def meta_rank_state(cfg: ModelConfig, layout: Layout, rank: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Shape-only (meta) tensors of the rank's parts, for costs without weights."""
    return {
        s.spec.param: torch.empty(s.shape, dtype=s.spec.torch_dtype(dtype), device="meta")
        for s in rank_shards(cfg, layout, rank)
    }


def rank_weight_bytes(cfg: ModelConfig, layout: Layout, dtype: torch.dtype = torch.bfloat16) -> list[int]:
    """Bytes of the weights each rank holds (float weights in ``dtype``; fp32 and uint8 as stored)."""
    from nonstop.weights.layout import checkpoint_layout

    specs = checkpoint_layout(cfg)
    return [
        sum(s.numel * s.spec.torch_dtype(dtype).itemsize for s in rank_shards(cfg, layout, r, specs))
        for r in range(layout.world)
    ]
