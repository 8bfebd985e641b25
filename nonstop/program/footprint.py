"""What a model costs per decode token: a view over its Program's cost model (``program/cost.py``).

``model_footprint(cfg, dtype)`` lowers a weightless (meta-device) model, so it works at any scale
without reading or allocating weights; ``footprint(model, program)`` reads an already lowered model.

  total_params             parameters of the model (packed MXFP4 bytes count two, block scales none)
  embedding_params         the embedding table's (a decode token reads one row of it)
  active_params            parameters a decode token multiplies with: all but the embedding table and the
                           unselected routed experts (top_k of E run); a tied LM head counts, being a matmul
  weight_bytes             the parameters' bytes (what the checkpoint holds, in this dtype)
  bytes_per_token          weight bytes one batch-1 decode step streams: ``Program.total_cost(rows=1)``
  cache_bytes_per_token    attention-cache bytes each token adds, all layers
  state_bytes_per_sequence KDA recurrent states (fp32) + conv windows, all layers
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nonstop.config import ModelConfig
from nonstop.model.build import meta_model
from nonstop.model.stack import CausalLM
from nonstop.program.cost import cache_bytes_per_token, state_bytes_per_sequence, weight_elements
from nonstop.program.ir import Program
from nonstop.program.lower import lower


@dataclass(frozen=True)
class Footprint:
    total_params: int
    active_params: int
    embedding_params: int
    weight_bytes: int
    bytes_per_token: int
    cache_bytes_per_token: int
    state_bytes_per_sequence: int


def footprint(model: CausalLM, program: Program) -> Footprint:
    """The footprint of ``model`` (any device, meta included) and its ``program = lower(model)``."""
    cfg = model.cfg
    total = inactive = weight_bytes = 0
    seen: set[int] = set()
    for name, p in model.state_dict(keep_vars=True).items():  # parameters and packed-expert buffers
        if id(p) in seen:  # a tied LM head is the embedding's tensor
            continue
        seen.add(id(p))
        n = weight_elements(name, p)
        total += n
        weight_bytes += p.numel() * p.element_size()
        if ".experts." in name:  # E - top_k of the E routed experts sit out each token
            inactive += n - n * cfg.moe.top_k // cfg.moe.num_experts
    embedding = model.embed_tokens.weight.numel()
    tied_head = embedding if cfg.tie_word_embeddings else 0
    elt = program.dtype.itemsize
    return Footprint(
        total_params=total,
        active_params=total - embedding - inactive + tied_head,
        embedding_params=embedding,
        weight_bytes=weight_bytes,
        bytes_per_token=program.total_cost(rows=1).weight_bytes,
        cache_bytes_per_token=cache_bytes_per_token(cfg, elt),
        state_bytes_per_sequence=state_bytes_per_sequence(cfg, elt),
    )


def model_footprint(cfg: ModelConfig, dtype: torch.dtype = torch.bfloat16) -> Footprint:
    """The footprint of ``cfg`` with weights in ``dtype``, without weights (a meta-device model)."""
    model = meta_model(cfg, dtype)
    return footprint(model, lower(model))
