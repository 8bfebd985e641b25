"""Which model a name means, and the dtype / device it runs in.

``resolve_model(name)`` turns a checkpoint directory, a bundled model (``nonstop/assets/<name>``) or a
preset (``nonstop/presets/<name>.json``, random weights) into its ``ModelConfig`` and directory.
Commands, benchmarks and ``LLM`` all resolve models here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from nonstop.config import ConfigError, ModelConfig, preset_names
from nonstop.weights.safetensors_file import unreadable

ASSETS = Path(__file__).resolve().parent.parent / "assets"
DEFAULT_MODEL = "k3-nano"
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")  # owner/name, as the Hub spells repositories
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}  # as config.json says


def parse_dtype(dtype, device: str) -> torch.dtype:
    """``auto`` (or None): bf16 on CUDA, fp32 elsewhere; else one of ``DTYPES`` by name or as a torch dtype.
    Any other dtype is refused: the engine's layers, kernels and caches are built for these three only
    (float64 too: no executor, kernel or cache format is made for it)."""
    if dtype is None or (isinstance(dtype, str) and dtype == "auto"):
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    what = repr(dtype) if isinstance(dtype, (str, torch.dtype)) else f"{dtype!r} (a {type(dtype).__name__})"
    raise ValueError(
        f"unsupported dtype {what}; choose one of: {', '.join(DTYPES)}, auto "
        "(or torch.float32 / torch.bfloat16 / torch.float16)"
    )


def bundled_models() -> list[str]:
    return sorted(p.parent.name for p in ASSETS.glob("*/config.json"))


def resolve_model(model: str | Path) -> tuple[ModelConfig, Path | None]:
    """(config, checkpoint dir) for a directory, a bundled model name, or a preset (dir None: random weights).
    ConfigError for anything else, saying why: an unreadable config.json or directory, a broken link or
    symlink loop, a file, or an unknown name (an ``owner/name`` is told that nothing is downloaded)."""
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(
            "model must be a checkpoint directory, a bundled model name or a preset name (a str or path), "
            f"got {type(model).__name__} {model!r}"
        )
    if isinstance(model, str) and not model.strip():
        raise ConfigError(
            f"model is empty ({model!r}): give a checkpoint directory, a bundled model name or a preset name "
            "(for the current directory, give '.')"
        )
    path = Path(model)
    try:
        if path.is_dir():
            why = unreadable(path / "config.json")
            if why:
                raise ConfigError(f"{path / 'config.json'}: cannot read ({why})")
            return ModelConfig.from_file(path), path
        exists, link = path.exists(), path.is_symlink()
    except OSError as exc:  # a directory on the way that this user may not search
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    if (ASSETS / str(model) / "config.json").exists():
        return ModelConfig.from_file(ASSETS / str(model)), ASSETS / str(model)
    if str(model) in preset_names():
        return ModelConfig.preset(str(model)), None
    if link and not exists:
        raise ConfigError(f"{path}: cannot read ({unreadable(path) or 'a broken symbolic link'})")
    if exists:
        raise ConfigError(f"{path} is not a directory: give the checkpoint directory (holding config.json)")
    hub = (
        " (downloads from the Hugging Face Hub are not supported: download it, e.g. `hf download "
        f"{model} --local-dir DIR`, and give that directory)"
        if HUB_NAME.fullmatch(str(model))
        else ""
    )
    raise ConfigError(
        f"model {str(model)!r} is neither a checkpoint directory nor a known name{hub}; bundled: "
        f"{', '.join(bundled_models()) or 'none'}; presets (random weights): {', '.join(preset_names())}"
    )


def check_device(device: str | torch.device) -> torch.device:
    """``device`` as a torch.device, or a ValueError saying why this machine cannot use it."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {device!r} is not a device torch knows: {exc}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {device!r} asked for, but this torch ({torch.__version__}) sees no CUDA GPU; use --device cpu"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r} asked for, but only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
    elif dev.type != "cpu":
        raise ValueError(f"device {device!r} is not supported: use cpu or cuda[:N]")
    return dev
