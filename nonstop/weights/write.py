"""Writing a checkpoint directory safely: checked before the work, staged, then put in place at once.

``check_output_dir(path)`` refuses, before any work is done, an output path a checkpoint cannot be written to
(empty, an existing file, under a file, not writable, a directory that cannot be created).
``staged_checkpoint(out_dir)`` yields a fresh staging directory inside ``out_dir``; when the block ends
normally the files of a checkpoint already there that the new one replaces (its weights, ``old_weight_files``:
``model.safetensors``, ``model-NNNNN-of-NNNNN.safetensors`` shards, the index and the files it names; and the
other files its writer owns, ``replaces``) are removed and every staged file takes its place, readable as the
user's umask allows (safetensors writes 0600). When the block fails, the staging directory is removed and
``out_dir`` is as it was: never a new config.json beside old weights, never an index naming shards that are
gone. SIGTERM (timeout, Slurm, docker stop) ends the write as a failure does, raising ``Terminated``
(``nonstop.stops``), where it would otherwise kill the process. The staging directory is named after its
process (``.nonstop-partial-PID-HOST-XXXXXXXX``): one whose process is gone (killed outright: SIGKILL, a
crash) is removed by the next write to the same directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import torch

from nonstop.config import ModelConfig
from nonstop.config_parse import without_quantization
from nonstop.stops import Terminated
from nonstop.weights.resolve import DTYPE_NAMES

STAGING_PREFIX = ".nonstop-partial-"
STAGING_OWNER = re.compile(r"\.nonstop-partial-(\d+)-(.+)-[a-z0-9_]+")  # PID, host, mkdtemp's random part
INDEX_FILE = "model.safetensors.index.json"
SHARD_FILE = re.compile(r"model-\d{5,}-of-\d{5,}\.safetensors")  # model-00001-of-00004.safetensors


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
    _check_creatable(out, flag)
    return out


def _check_creatable(out: Path, flag: str) -> None:
    """Make ``out`` and its missing parents, then remove what was made: a directory that cannot be created
    (``/proc/x``, a read-only file system) is refused now, naming ``flag``, not after the work (nor blamed on
    free disk space, which such a path's nearest existing parent may report as 0 B)."""
    missing = [d for d in (out, *out.parents) if not d.exists()]  # deepest first
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{flag} {out}: cannot create the directory ({exc.strerror or exc})") from None
    for d in missing:
        with contextlib.suppress(OSError):  # something else wrote there meanwhile: leave it
            d.rmdir()


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
    """config.json (``torch_dtype``, and ``dtype`` where the config spells it so, naming ``dtype``),
    generation_config.json (the config's bos / pad / eos ids, then
    ``generation``) and the ``TOKENIZER_FILES`` that ``tokenizer_dir`` has, into ``stage``. The weights
    written beside it are ``dtype`` floats (fp8 ones dequantised) and, for MXFP4 experts, packed MXFP4: the
    ``quantization_config`` is kept only for the latter (an fp8 one would announce scales that are not there)."""
    hf = cfg.to_hf_dict()
    if not (cfg.moe and cfg.moe.expert_format == "mxfp4"):
        hf = without_quantization(hf)
    name = DTYPE_NAMES.get(dtype, str(dtype))
    hf["torch_dtype"] = name
    for level in (hf, hf.get("text_config")):  # transformers 5 reads "dtype" before "torch_dtype": the same name
        if isinstance(level, dict):
            level.update({k: name for k in ("dtype", "torch_dtype") if k in level})
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


def old_weight_files(out_dir: Path) -> list[Path]:
    """The weight files of the checkpoint in ``out_dir``, which a new checkpoint's weights replace:
    ``model.safetensors``, the index, shards named as a sharded checkpoint names them
    (``model-00001-of-00004.safetensors``) and any other file of ``out_dir`` the index names. Other
    ``.safetensors`` files (``model_backup.safetensors``) are the user's."""
    names = {"model.safetensors", INDEX_FILE, *(p.name for p in out_dir.iterdir() if SHARD_FILE.fullmatch(p.name))}
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):  # an unreadable index names none
        names |= {n for n in json.loads((out_dir / INDEX_FILE).read_text())["weight_map"].values() if "/" not in n}
    return sorted(p for p in (out_dir / n for n in names) if p.is_file())


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def remove_stale_stages(out_dir: Path) -> None:
    """Remove the staging directories in ``out_dir`` left by a process of this host that is gone (killed
    before its cleanup ran), saying so on stderr. One whose writer may still run elsewhere (another host's,
    or one named without its process, as before nonstop named them) is named on stderr and left alone."""
    host = socket.gethostname()
    for stage in sorted(p for p in out_dir.glob(f"{STAGING_PREFIX}*") if p.is_dir()):
        owner = STAGING_OWNER.fullmatch(stage.name)
        if owner is None or owner[2] != host:
            print(
                f"nonstop: note: {stage} is left from an unfinished write: remove it unless another write to "
                f"{out_dir} is running",
                file=sys.stderr,
            )
        elif not _process_alive(int(owner[1])):
            shutil.rmtree(stage, ignore_errors=True)
            print(f"nonstop: removed {stage}, left by an unfinished write (process {owner[1]})", file=sys.stderr)


def _raise_terminated(signum, frame) -> None:
    raise Terminated


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While the block runs, SIGTERM raises ``Terminated`` where it would kill the process (in the main
    thread, the default action in force), so that the block's cleanup runs; the default is then put back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:  # a handler of the caller's: left in charge
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def _sigterm_held() -> Iterator[None]:
    """A SIGTERM that would raise (``_sigterm_raises``) is held while the block runs and raised once it
    has ended: the block is never cut halfway."""
    if signal.getsignal(signal.SIGTERM) is not _raise_terminated:
        yield
        return
    came: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, _raise_terminated)
    if came:
        raise Terminated


@contextlib.contextmanager
def staged_checkpoint(
    out_dir: str | Path, replaces: tuple[str, ...] = (), removed: list[str] | None = None
) -> Iterator[Path]:
    """Yield a staging directory to write a whole checkpoint into; on success its files replace
    ``out_dir``'s checkpoint (see the module docstring), on failure or SIGTERM ``out_dir`` is left as it
    was (stale staging directories aside: ``remove_stale_stages``). ``replaces``: names of files besides
    the weights (``old_weight_files``) that the writer owns: an old one is removed even where the new
    checkpoint has none (a stale tokenizer must not outlive its model); the name of every old file removed
    that the new checkpoint has none of, weights too, is appended to ``removed``. Files neither weights nor
    in ``replaces`` are the user's and left alone."""
    out_dir = Path(out_dir)
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_stages(out_dir)
    from safetensors import SafetensorError

    with _sigterm_raises():
        stage = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-{socket.gethostname()}-", dir=out_dir))
        try:
            yield stage
        except BaseException as exc:
            with _sigterm_held():  # a second SIGTERM does not cut the cleanup short
                shutil.rmtree(stage, ignore_errors=True)
                if created:
                    with contextlib.suppress(OSError):
                        out_dir.rmdir()  # only if empty: the directory this call made, nothing else in it
            if isinstance(exc, (OSError, SafetensorError)):  # a full disk, a file size limit, a read-only mount
                raise CheckpointWriteError(
                    f"could not write the checkpoint to {out_dir}: {exc}; it was left as it was"
                ) from exc
            raise
        with _sigterm_held():
            try:
                _put_in_place(stage, out_dir, replaces, removed if removed is not None else [])
            except BaseException as exc:  # its refusal of a folder in the way, a failing disk, a vanished directory
                shutil.rmtree(stage, ignore_errors=True)
                if isinstance(exc, OSError):
                    raise CheckpointWriteError(
                        f"could not move the checkpoint into {out_dir}: {exc}; its files there may be incomplete"
                    ) from exc
                raise


def _put_in_place(stage: Path, out_dir: Path, replaces: tuple[str, ...], removed: list[str]) -> None:
    """Remove ``out_dir``'s old weights and its ``replaces`` files, noting in ``removed`` those ``stage``
    has none of, then move every staged file there (as the umask allows) and remove ``stage``. A folder
    where a staged file goes (which no file can replace) is refused first, with ``out_dir`` untouched (the
    caller removes ``stage``)."""
    for f in sorted(stage.iterdir()):
        target = out_dir / f.name
        if target.is_dir() and not target.is_symlink():
            raise CheckpointWriteError(
                f"could not write the checkpoint to {out_dir}: {target} is a folder where the checkpoint's file "
                f"{f.name} goes; move it away and write again ({out_dir} was left as it was)"
            )
    old = old_weight_files(out_dir) + [out_dir / name for name in replaces if (out_dir / name).is_file()]
    for path in old:
        path.unlink()
        if not (stage / path.name).exists():
            removed.append(path.name)
    mode = file_mode()
    for f in sorted(stage.iterdir()):
        f.chmod(mode)
        f.replace(out_dir / f.name)
    stage.rmdir()
