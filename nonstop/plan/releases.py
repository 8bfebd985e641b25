"""Which model a released name means to the planner, and the serving formats that release stores.

Users name models as they are published: ``moonshotai/Kimi-K2.5``, ``deepseek-ai/DeepSeek-R1-0528``,
``nvidia/Kimi-K3-NVFP4``. The planner prices a model from a config (a preset, or one of the public configs
bundled under ``plan/models/``) plus the formats its weights are stored in, so a release is

    name  ->  (config the planner reads, formats that differ from that config's own)

Names compare case-insensitively, with or without the publisher (``Kimi-K2.5`` = ``moonshotai/kimi-k2.5``);
another publisher's name for it (``nvidia/Kimi-K2.5``) is no release.
Explicit ``--weights`` / ``--experts`` / ``--attention-weights`` / ``--kv-cache`` flags override a release's
formats. A checkpoint directory is read as it is (its own ``quantization_config``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

MODELS = Path(__file__).with_name("models")


@dataclass(frozen=True)
class Release:
    model: str  # a preset or a config bundled under plan/models/
    formats: dict = field(default_factory=dict)  # Precision fields: dense / experts / attention / cache
    note: str = ""  # where the formats come from


_K2 = Release("kimi-k2", note="Kimi K2's shapes; released in fp8 with 128x128 block scales")
_K2_INT4 = Release(
    "kimi-k2-thinking", note="K2's text model with int4 experts (compressed-tensors, groups of 32), the rest bf16"
)
_DSV3 = Release("deepseek-v3", note="DeepSeek-V3 shapes; released in fp8 with 128x128 block scales")
# nvidia's NVFP4 exports of DeepSeek-R1-0528 keep self_attn in bf16 and store every MLP (dense, shared,
# routed) in NVFP4 (the checkpoint's tensor list: self_attn.* BF16, mlp.*.weight U8 with F8_E4M3 scales)
_DSR1_NVFP4 = Release(
    "deepseek-v3",
    {"dense": "nvfp4", "experts": "nvfp4", "attention": "bf16"},
    "every MLP in NVFP4, attention in bf16 (nvidia's export)",
)
_K3_NVFP4 = Release("kimi-k3", {"experts": "nvfp4"}, "routed experts re-quantised to NVFP4 (nvidia's modelopt export)")
_K25_NVFP4 = Release(
    "kimi-k2-thinking", {"experts": "nvfp4"}, "K2.5 with its routed experts in NVFP4, the rest bf16 (nvidia's export)"
)
_K25_MXFP4 = Release(
    "kimi-k2-thinking", {"experts": "mxfp4"}, "routed experts in MXFP4, the rest bf16 (AMD's Quark export)"
)

# keys: the released name in lower case, with its publisher; looked up with and without it
RELEASES = {
    "moonshotai/kimi-k3": Release("kimi-k3"),
    "nvidia/kimi-k3-nvfp4": _K3_NVFP4,
    "moonshotai/kimi-k2-instruct": _K2,
    "moonshotai/kimi-k2-instruct-0905": _K2,
    "moonshotai/kimi-k2-0905": _K2,  # the API name of Kimi-K2-Instruct-0905 (OpenRouter, Moonshot's platform)
    "moonshotai/kimi-k2-base": _K2,
    "moonshotai/kimi-k2-thinking": _K2_INT4,
    "moonshotai/kimi-k2.5": _K2_INT4,
    "moonshotai/kimi-k2.6": _K2_INT4,
    # 1T parameters, 32B active, int4 MoE weights and BF16 everything else as K2.6, 605 GB at full precision
    # (unsloth.ai/docs, its Kimi K2.7 Code page)
    "moonshotai/kimi-k2.7-code": _K2_INT4,
    "nvidia/kimi-k2.5-nvfp4": _K25_NVFP4,
    "nvidia/kimi-k2.6-nvfp4": _K25_NVFP4,
    "nvidia/kimi-k2-thinking-nvfp4": _K25_NVFP4,
    "amd/kimi-k2.5-mxfp4": _K25_MXFP4,
    "amd/kimi-k2-thinking-mxfp4": _K25_MXFP4,
    "amd/kimi-k2-thinking-mxfp4-attnfp8": Release(
        "kimi-k2-thinking", {"experts": "mxfp4", "attention": "fp8"}, "as amd/Kimi-K2-Thinking-MXFP4, attention in fp8"
    ),
    "deepseek-ai/deepseek-v3": _DSV3,
    "deepseek-ai/deepseek-v3-0324": _DSV3,
    "deepseek-ai/deepseek-v3-base": _DSV3,
    "deepseek-ai/deepseek-r1": _DSV3,
    "deepseek-ai/deepseek-r1-0528": _DSV3,
    "deepseek-ai/deepseek-r1-zero": _DSV3,
    # V3.1 continues training from the V3 base (671B, 37B active) and ships fp8 with UE8M0 block scales:
    # the same shapes and bytes (V3.2's sparse attention indexer is another model and is not mapped here)
    "deepseek-ai/deepseek-v3.1": _DSV3,
    "deepseek-ai/deepseek-v3.1-base": _DSV3,
    "deepseek-ai/deepseek-v3.1-terminus": _DSV3,
    # the first exports (R1, February 2025, renamed DeepSeek-R1-NVFP4; R1-0528) quantise the MLPs only: the
    # R1 v2 card says v2 "additionally quantizes the wo module in attention layers" over nvidia/DeepSeek-R1-FP4
    "nvidia/deepseek-r1-fp4": _DSR1_NVFP4,
    "nvidia/deepseek-r1-nvfp4": _DSR1_NVFP4,
    "nvidia/deepseek-r1-0528-fp4": _DSR1_NVFP4,
    "nvidia/deepseek-r1-0528-fp4-v2": _DSR1_NVFP4,
    "nvidia/deepseek-r1-0528-nvfp4-v2": _DSR1_NVFP4,
    "moonshotai/kimi-linear-48b-a3b-instruct": Release("kimi-linear-48b-a3b"),
    "moonshotai/kimi-linear-48b-a3b-base": Release("kimi-linear-48b-a3b"),
    "meta-llama/llama-3.2-1b": Release("llama-3.2-1b"),
    "meta-llama/llama-3.2-1b-instruct": Release("llama-3.2-1b"),
}
_BY_NAME = {key.split("/", 1)[1]: rel for key, rel in RELEASES.items()}


def find_release(name: str) -> Release | None:
    """The release ``name`` means (``RELEASES``, with its own publisher or none, any case), else None: a
    publisher that did not publish the name (``nvidia/Kimi-K2.5``) means no release (``other_publishers``)."""
    key = str(name).strip().lower()
    return RELEASES.get(key) if "/" in key else _BY_NAME.get(key)


def other_publishers(name: str) -> list[str]:
    """The releases of ``name``'s model under other publishers than the one it gives ([] without a publisher
    or for a known release): ``nvidia/kimi-k2.5`` -> ``moonshotai/kimi-k2.5``."""
    key = str(name).strip().lower()
    if key.count("/") != 1 or key in RELEASES:
        return []
    bare = key.split("/", 1)[1]
    return sorted(k for k in RELEASES if k.split("/", 1)[1] == bare)


def model_ref(name: str) -> str:
    """What ``resolve_model`` should read for ``name``: a checkpoint directory as given; a released name's
    planner model; a config bundled under ``plan/models/`` by its path; else the name itself."""
    if Path(name).exists():
        return str(name)
    release = find_release(name)
    model = release.model if release else str(name)
    bundled = MODELS / model
    return str(bundled) if (bundled / "config.json").exists() else model


def release_formats(name: str) -> dict:
    """The serving formats the release ``name`` stores beyond its config's own ({} for a directory or an
    unknown name)."""
    if Path(name).exists():
        return {}
    release = find_release(name)
    return dict(release.formats) if release else {}


def planner_names() -> list[str]:
    """Model names the planner knows beyond presets and bundled models: its own configs and the releases."""
    return sorted({p.parent.name for p in MODELS.glob("*/config.json")} | set(_BY_NAME))
