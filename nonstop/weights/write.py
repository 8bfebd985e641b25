"""Writing a checkpoint directory safely: checked before the work, staged, then put in place at once.

``check_output_dir(path)`` refuses, before any work is done, an output path a checkpoint cannot be
written to (empty, an existing file, under a file, not writable). ``staged_checkpoint(out_dir)`` yields
a fresh staging directory inside ``out_dir``; when the block ends normally the files of a checkpoint
already there that the new one replaces (its weights: ``model.safetensors``, shards,
``model.safetensors.index.json``; and the other files its writer owns, ``replaces``) are removed and every
staged file takes its place, readable as the user's umask allows (safetensors writes 0600). When the
block fails, the staging directory is removed and ``out_dir`` is as it was: never a new config.json
beside old weights, never an index naming shards that are gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import torch

from nonstop.config import ModelConfig
from nonstop.config_parse import without_quantization
from nonstop.weights.resolve import DTYPE_NAMES

STAGING_PREFIX = ".nonstop-partial-"
WEIGHT_FILES = ("model*.safetensors", "model.safetensors.index.json")  # what a new checkpoint's weights replace


class CheckpointWriteError(ValueError):
    """Writing a checkpoint failed for a reason outside nonstop (disk full, file too large, permissions)."""


def check_output_dir(path: str | Path, flag: str = "--out", what: str = "the checkpoint") -> Path:
    """``path`` as a directory ``what`` can be written to (it may not exist yet); a ValueError naming
    ``flag`` otherwise."""
    if not str(path).strip():
        raise ValueError(f"{flag} is empty: give the directory to write {what} to")
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{flag} {out} is an existing file, not a directory")
    parent = out
    while not parent.exists():  # the nearest existing ancestor must be a writable directory
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {out} lies under {parent}, which is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {out}: cannot write in {parent} (permission denied)")
    return out


def file_mode() -> int:
    """The mode a new file gets under the user's umask (0o666 & ~umask): what a checkpoint's or store's files
    are set to, since safetensors and ``tempfile.mkstemp`` create theirs 0600."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")  # copied with a model
SIDE_FILES = ("config.json", "generation_config.json", *TOKENIZER_FILES)  # what the writers put beside the weights


def write_side_files(
    stage: Path, cfg: ModelConfig, dtype: torch.dtype, generation: dict, tokenizer_dir: Path | None
) -> None:
    """config.json (``torch_dtype`` named), generation_config.json (the config's bos / pad / eos ids, then
    ``generation``) and the ``TOKENIZER_FILES`` that ``tokenizer_dir`` has, into ``stage``. The weights
    written beside it are ``dtype`` floats (fp8 ones dequantised) and, for MXFP4 experts, packed MXFP4: the
    ``quantization_config`` is kept only for the latter (an fp8 one would announce scales that are not there)."""
    hf = cfg.to_hf_dict()
    if not (cfg.moe and cfg.moe.expert_format == "mxfp4"):
        hf = without_quantization(hf)
    hf["torch_dtype"] = DTYPE_NAMES.get(dtype, str(dtype))
    (stage / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    gen = {k: v for k, v in (("bos_token_id", cfg.bos_token_id), ("pad_token_id", cfg.pad_token_id)) if v is not None}
    if cfg.eos_token_ids:
        gen["eos_token_id"] = cfg.eos_token_ids[0] if len(cfg.eos_token_ids) == 1 else list(cfg.eos_token_ids)
    (stage / "generation_config.json").write_text(json.dumps({**gen, **generation}, indent=2) + "\n")
    for name in TOKENIZER_FILES if tokenizer_dir is not None else ():
        if (Path(tokenizer_dir) / name).exists():
            shutil.copy(Path(tokenizer_dir) / name, stage / name)


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``write(f)`` into a temporary file beside ``path`` (binary), then ``os.replace`` it there: a reader
    never sees half a file, and the temporary file is removed whatever goes wrong; readable as the umask
    allows (``file_mode``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, file_mode())  # mkstemp makes it 0600
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def staged_checkpoint(
    out_dir: str | Path, replaces: tuple[str, ...] = (), removed: list[str] | None = None
) -> Iterator[Path]:
    """Yield a staging directory to write a whole checkpoint into; on success its files replace
    ``out_dir``'s checkpoint (see the module docstring), on failure ``out_dir`` is left as it was.
    ``replaces``: names of files besides the weights that the writer owns: an old one is removed even where
    the new checkpoint has none (a stale tokenizer must not outlive its model), and its name is then
    appended to ``removed``; files neither weights nor in ``replaces`` are the user's and left alone."""
    out_dir = Path(out_dir)
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out_dir))
    from safetensors import SafetensorError

    try:
        yield stage
    except BaseException as exc:
        shutil.rmtree(stage, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                out_dir.rmdir()  # only if empty: the directory this call made, nothing else in it
        if isinstance(exc, (OSError, SafetensorError)):  # a full disk, a file size limit, a read-only mount
            raise CheckpointWriteError(
                f"could not write the checkpoint to {out_dir}: {exc}; it was left as it was"
            ) from exc
        raise
    for pattern in WEIGHT_FILES:
        for old in out_dir.glob(pattern):
            old.unlink()
    for name in replaces:
        if (out_dir / name).exists() and not (stage / name).exists():
            (out_dir / name).unlink()
            if removed is not None:
                removed.append(name)
    mode = file_mode()
    for f in sorted(stage.iterdir()):
        f.chmod(mode)
        f.replace(out_dir / f.name)
    stage.rmdir()
