"""The C++ CPU kernels: the weight-only GEMVs (``gemv.cpp``) and one-token paged attention
(``attention.cpp``), built once per machine into the compile cache and registered as torch operators
``torch.ops.nonstop_cpu.linear_f32`` / ``linear_bf16`` / ``linear_int8`` / ``decode_attention`` (with
shape-only "fake" versions, so a compiled step calls them directly). The GEMVs' last argument, ``stream``,
reads the weights with non-temporal prefetches (``pack.streams_weights``).

``load_kernels()`` returns None when they are ready, else the reason they are not (no compiler, a
build error); callers then compute with the weights dequantised by torch ops instead (correct, slower).
Processes building or loading at once take turns on a ``flock`` (``file_lock.exclusive``): torch's own
lock is a file whose existence is the lock, left behind by a process killed while it held it, after
which every later load waited for ever; under the flock such a file is stale by construction and removed.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import torch

from nonstop.cache_dirs import private_dir
from nonstop.file_lock import exclusive
from nonstop.runtime.cpu.compile_cache import announced

SOURCES = [Path(__file__).with_name(n) for n in ("gemv.cpp", "attention.cpp")]
HEADERS = [Path(__file__).with_name("isa.h")]
_lock = threading.Lock()
_state: dict = {}


def _register_fakes() -> None:
    @torch.library.register_fake("nonstop_cpu::linear_f32")
    def _(x, w, n, stream=False):
        return x.new_empty(x.shape[0], n)

    @torch.library.register_fake("nonstop_cpu::linear_bf16")
    def _(x, w, n, stream=False):
        return x.new_empty(x.shape[0], n)

    @torch.library.register_fake("nonstop_cpu::linear_int8")
    def _(x, q, s, n, stream=False):
        return x.new_empty(x.shape[0], n)

    @torch.library.register_fake("nonstop_cpu::decode_attention")
    def _(q, k, v, rows, visible, scale):
        return q.new_empty(q.shape[0], q.shape[1], v.shape[2])


def build_directory() -> Path:
    """Where the kernels are built: one directory per torch version and version of the sources."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES + HEADERS))
    return private_dir("ext") / f"torch-{torch.__version__}-{digest.hexdigest()[:12]}"


def load_kernels(progress: bool = True) -> str | None:
    """Build (first time) and load the kernels; None on success, else why they are unavailable."""
    with _lock:
        if "error" in _state:
            return _state["error"]
        try:  # a cache folder that cannot be made or is not private to this user: report it, as a build error
            build = build_directory()
            build.mkdir(parents=True, exist_ok=True)
            with exclusive(build / "nonstop.lock", f"nonstop cpu: waiting for another process to build {build}"):
                _load(build, progress)
            _register_fakes()
            _state["error"] = None
        except (OSError, RuntimeError, ImportError) as exc:  # no compiler or headers, a build error: report it
            _state["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}"
        return _state["error"]


def _load(build: Path, progress: bool) -> None:
    """torch's build (only what changed) and load, under the flock: a ``lock`` file there is stale."""
    from torch.utils.cpp_extension import load

    (build / "lock").unlink(missing_ok=True)
    fresh = not any(build.glob("*.so"))
    with announced(f"building the C++ CPU kernels into {build} (once per machine)", enabled=progress and fresh):
        load(
            name="nonstop_cpu_gemv",
            sources=[str(p) for p in SOURCES],
            extra_cflags=["-O3", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            build_directory=str(build),
            verbose=False,
        )
