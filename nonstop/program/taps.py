"""Residual-stream taps that a Program step still holds in its buffers when the step ends.

A drafter (``engine/speculative``) reads the target's residual stream entering layer l ("tap l", as
``CausalLM.body``'s ``capture``). After the last op of a step the Program keeps:
  * AttnRes models: ``blocks`` [R, n_blocks, d] — block j's sum is the stream entering layer
    j·block_size, so every tap at a block boundary (0 = the embedding) — and ``partial`` [R, d], the
    stream after the last layer (tap = num_hidden_layers);
  * plain residual models: ``h`` [R, d], the stream after the last layer (tap = num_hidden_layers).
"""

from __future__ import annotations

import torch

from nonstop.config import ModelConfig


def available_taps(cfg: ModelConfig) -> tuple[int, ...]:
    L = cfg.num_hidden_layers
    if cfg.uses_attn_res:
        return tuple(range(0, L, cfg.attn_res_block_size)) + (L,)
    return (L,)


def read_taps(
    cfg: ModelConfig, buf: dict[str, torch.Tensor], taps: tuple[int, ...], B: int, T: int
) -> dict[int, torch.Tensor]:
    """{tap: [B, T, d]} (copies) from a finished step's buffers; ValueError for a tap not kept."""
    L = cfg.num_hidden_layers
    out = {}
    for tap in taps:
        if tap not in available_taps(cfg):
            raise ValueError(
                f"the decode program keeps the residual stream only at layers {available_taps(cfg)}, not {tap}"
            )
        if tap == L:
            src = buf["partial"] if cfg.uses_attn_res else buf["h"]
        else:
            src = buf["blocks"][:, tap // cfg.attn_res_block_size]
        out[tap] = src.reshape(B, T, -1).clone()
    return out
