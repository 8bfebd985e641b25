"""ModelConfig: one description of every supported family, parsed from a Hugging Face config.json.

Families (``ModelConfig.family``):

* ``llama``        dense GQA + RoPE + SwiGLU (Llama 2/3).
* ``deepseek_v3``  MLA with decoupled RoPE (GPT-J interleaved, YaRN) + sigmoid-routed MoE (covers Kimi K2).
* ``kimi_linear``  KDA linear attention + NoPE MLA + MoE (Kimi Linear 48B-A3B).
* ``kimi_k3``      Kimi Linear topology + K3 gates, gated MLA, latent MoE, SiTU and block attention residuals.

Per-layer structure is data, not code: ``attn_types[i]`` is ``"gqa" | "mla" | "kda"`` and
``mlp_types[i]`` is ``"dense" | "moe"``. Sub-configs (``gqa``, ``mla``, ``kda``, ``moe``) are ``None``
when the model has no such layer. Missing required fields and contradictions raise ``ConfigError``
naming the field.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nonstop.jsonfile import read_json_object

FAMILIES = ("llama", "deepseek_v3", "kimi_linear", "kimi_k3")
PRESET_DIR = Path(__file__).parent / "presets"


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
    expert_format: str = "dense"  # "dense" | "mxfp4"

    @property
    def shared_intermediate_size(self) -> int:
        return self.intermediate_size * self.num_shared_experts

    @property
    def expert_in_dim(self) -> int | None:
        return self.latent_size


@dataclass(frozen=True)
class ModelConfig:
    family: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    attn_types: tuple[str, ...]
    mlp_types: tuple[str, ...]
    intermediate_size: int
    rms_norm_eps: float
    hidden_act: str = "silu"
    situ_beta: float = 4.0
    situ_linear_beta: float = 25.0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    attn_res_block_size: int | None = None
    mlp_bias: bool = False
    rope: RopeConfig | None = None
    gqa: GQAConfig | None = None
    mla: MLAConfig | None = None
    kda: KDAConfig | None = None
    moe: MoEConfig | None = None
    weight_prefix: str = "model."
    lm_head_name: str = "lm_head.weight"
    hf: dict = field(default_factory=dict, compare=False, repr=False)

    # ------------------------------------------------------------------ derived facts
    @property
    def num_kda_layers(self) -> int:
        return self.attn_types.count("kda")

    @property
    def num_mla_layers(self) -> int:
        return self.attn_types.count("mla")

    @property
    def uses_attn_res(self) -> bool:
        return self.attn_res_block_size is not None

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def with_num_layers(self, n: int) -> "ModelConfig":
        """The same model cut to its first ``n`` layers (benchmark slices, quick tests)."""
        if not 1 <= n <= self.num_hidden_layers:
            raise ConfigError(f"num_hidden_layers: cannot slice {self.num_hidden_layers} layers to {n}")
        hf = dict(self.hf)
        return self.replace(num_hidden_layers=n, attn_types=self.attn_types[:n], mlp_types=self.mlp_types[:n], hf=hf)

    # ------------------------------------------------------------------ loading
    @staticmethod
    def from_hf_dict(raw: dict) -> "ModelConfig":
        from nonstop.config_parse import parse_hf_config

        return parse_hf_config(raw)

    @staticmethod
    def from_file(path: str | Path) -> "ModelConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise ConfigError(f"config.json not found: {path}")
        raw = read_json_object(path, ConfigError)
        try:
            return ModelConfig.from_hf_dict(raw)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None

    @staticmethod
    def preset(name: str) -> "ModelConfig":
        return ModelConfig.from_hf_dict(preset_hf_dict(name))

    def to_hf_dict(self) -> dict:
        """The config.json to write beside a checkpoint of this model (the family's own format)."""
        from nonstop.config_parse import to_hf_config

        return to_hf_config(self)


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def preset_hf_dict(name: str) -> dict:
    path = PRESET_DIR / f"{name}.json"
    if not path.exists():
        raise ConfigError(f"unknown preset {name!r}; known presets: {', '.join(preset_names())}")
    return json.loads(path.read_text())


def as_dict(obj: Any) -> Any:
    """Plain-data view of a config (for printing and JSON)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: as_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name != "hf"}
    if isinstance(obj, tuple):
        return [as_dict(x) for x in obj]
    return obj
