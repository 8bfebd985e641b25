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

from nonstop.config_parse import hf_config_fields, to_hf_config
from nonstop.config_types import (
    SITU_BETA,
    SITU_LINEAR_BETA,
    ConfigError,
    GQAConfig,
    KDAConfig,
    MLAConfig,
    MoEConfig,
    RopeConfig,
)
from nonstop.jsonfile import read_json_object

__all__ = [
    "FAMILIES",
    "ConfigError",
    "GQAConfig",
    "KDAConfig",
    "MLAConfig",
    "ModelConfig",
    "MoEConfig",
    "RopeConfig",
    "as_dict",
    "preset_hf_dict",
    "preset_names",
]

FAMILIES = ("llama", "deepseek_v3", "kimi_linear", "kimi_k3")
PRESET_DIR = Path(__file__).parent / "presets"


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
    situ_beta: float = SITU_BETA
    situ_linear_beta: float = SITU_LINEAR_BETA
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

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def with_num_layers(self, n: int) -> ModelConfig:
        """The same model cut to its first ``n`` layers (benchmark slices, quick tests)."""
        if not 1 <= n <= self.num_hidden_layers:
            raise ConfigError(f"num_hidden_layers: cannot slice {self.num_hidden_layers} layers to {n}")
        hf = dict(self.hf)
        return self.replace(num_hidden_layers=n, attn_types=self.attn_types[:n], mlp_types=self.mlp_types[:n], hf=hf)

    # ------------------------------------------------------------------ loading
    @staticmethod
    def from_hf_dict(raw: dict) -> ModelConfig:
        return ModelConfig(**hf_config_fields(raw))

    @staticmethod
    def from_file(path: str | Path) -> ModelConfig:
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
    def preset(name: str) -> ModelConfig:
        return ModelConfig.from_hf_dict(preset_hf_dict(name))

    def to_hf_dict(self) -> dict:
        """The config.json to write beside a checkpoint of this model (the family's own format)."""
        return to_hf_config(self.hf, self.attn_types)


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
