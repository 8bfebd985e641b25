"""A narrow twin of a config: the same layers, layer kinds, residual scheme, activation, expert
top-k, routing groups and formats, with tiny widths. A reference decode step dispatches the same
aten ops for both (op counts do not depend on widths), so the twin counts the eager ops of models
too large to instantiate."""

from __future__ import annotations

import dataclasses

from nonstop.config import ModelConfig


def narrow_twin(cfg: ModelConfig) -> ModelConfig:
    changes: dict = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 96 if cfg.intermediate_size else 0}
    if cfg.gqa:
        g = cfg.gqa
        kv = 1 if g.num_kv_heads < g.num_heads else 2
        changes["gqa"] = dataclasses.replace(g, num_heads=2, num_kv_heads=kv, head_dim=16)
    if cfg.rope:
        changes["rope"] = dataclasses.replace(cfg.rope, dim=8 if cfg.mla else 16)
    if cfg.mla:
        m = cfg.mla
        changes["mla"] = dataclasses.replace(
            m,
            num_heads=2,
            q_lora_rank=24 if m.q_lora_rank else None,
            kv_lora_rank=16,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
        )
    if cfg.kda:
        changes["kda"] = dataclasses.replace(cfg.kda, num_heads=2, head_dim=16, conv_size=min(cfg.kda.conv_size, 4))
    if cfg.moe:
        m = cfg.moe
        per_group = max(2, -(-2 * m.top_k // m.num_groups))
        changes["moe"] = dataclasses.replace(
            m,
            num_experts=per_group * m.num_groups,
            intermediate_size=32,
            latent_size=32 if m.latent_size else None,
            num_shared_experts=min(m.num_shared_experts, 1),  # the shared experts are one MLP, of any width
        )
    return dataclasses.replace(cfg, **changes)
