"""The parts of a model description that ``ModelConfig`` is made of: sub-configs of each layer kind and
the error every config problem raises. No parsing here (``config_parse.py``) and no loading
(``config.py``), so the three modules import in one direction: types < parse < config.
"""

from __future__ import annotations

from dataclasses import dataclass

# SiTU activation (K3): defaults of ``activation_situ_beta`` / ``activation_situ_linear_beta``.
SITU_BETA = 4.0
SITU_LINEAR_BETA = 25.0


class ConfigError(ValueError):
    """A config.json that cannot describe a model: the message names the offending field."""


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding. ``kind`` is ``default | linear | llama3 | yarn``; ``interleaved`` selects the
    GPT-J pairing (2i, 2i+1) instead of NeoX halves; ``dim`` is the number of rotated channels."""

    dim: int
    theta: float = 10000.0
    kind: str = "default"
    interleaved: bool = False
    factor: float = 1.0
    original_max_position: int | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class GQAConfig:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    bias: bool = False
    out_bias: bool = False


@dataclass(frozen=True)
class MLAConfig:
    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    use_rope: bool  # False: NoPE (Kimi) - the rope slice exists but is never rotated
    output_gate: bool  # K3 gated MLA: o_proj(sigmoid(g_proj x) * attn)
    softmax_scale: float
    lora_norm_eps: float = 1e-6

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_dim(self) -> int:
        """Values cached per token: normalised latent + shared rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class KDAConfig:
    num_heads: int
    head_dim: int
    conv_size: int
    gate_lower_bound: float | None  # None: Kimi Linear softplus gate; float: K3 bounded sigmoid gate
    full_rank_output_gate: bool  # K3: g_proj [H*dv, d]; Kimi Linear: g_a_proj/g_b_proj low rank

    @property
    def proj_dim(self) -> int:
        return self.num_heads * self.head_dim


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int
    intermediate_size: int
    num_shared_experts: int
    scoring: str  # "sigmoid" | "softmax"
    num_groups: int
    topk_groups: int
    renormalize: bool
    routed_scaling_factor: float
    latent_size: int | None = None  # K3 latent MoE width (routed_expert_hidden_size)
    latent_norm: bool = False
    expert_format: str = "dense"  # "dense" | "mxfp4" | "int4" (int4: priced by nonstop plan, not run by the engine)

    @property
    def shared_intermediate_size(self) -> int:
        return self.intermediate_size * self.num_shared_experts

    @property
    def expert_in_dim(self) -> int | None:
        return self.latent_size
