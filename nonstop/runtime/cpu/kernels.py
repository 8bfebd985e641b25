"""The C++ CPU kernels: the weight-only GEMVs (``gemv.cpp``) and one-token paged attention
(``attention.cpp``), built once per machine into the compile cache and registered as torch operators
``torch.ops.nonstop_cpu.linear_f32`` / ``linear_bf16`` / ``linear_int8`` / ``decode_attention`` (with
shape-only "fake" versions, so a compiled step calls them directly). The GEMVs' last argument, ``stream``,
reads the weights with non-temporal prefetches (``pack.streams_weights``).

``load_kernels()`` returns None when they are ready, else the reason they are not (no compiler, a
build error); callers then compute with the weights dequantised by torch ops instead (correct, slower).
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import torch

from nonstop.runtime.cpu.compile_cache import announced, cache_root

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


def load_kernels(progress: bool = True) -> str | None:
    """Build (first time) and load the kernels; None on success, else why they are unavailable."""
    with _lock:
        if "error" in _state:
            return _state["error"]
        from torch.utils.cpp_extension import load

        digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES + HEADERS))
        source = digest.hexdigest()[:12]  # one build per version of the sources
        build = cache_root() / "ext" / f"torch-{torch.__version__}-{source}"
        build.mkdir(parents=True, exist_ok=True)
        fresh = not any(build.glob("*.so"))
        try:
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
            _register_fakes()
            _state["error"] = None
        except (OSError, RuntimeError, ImportError) as exc:  # no compiler or headers, a build error: report it
            _state["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}"
        return _state["error"]
