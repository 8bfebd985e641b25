"""The C++ weight-only GEMV kernels (``gemv.cpp``): built once per machine into the compile cache
and registered as torch operators ``torch.ops.nonstop_cpu.linear_f32`` / ``linear_bf16`` / ``linear_int8`` (with
shape-only "fake" versions, so a compiled step calls them directly). Their last argument, ``stream``, reads
the weights with non-temporal prefetches (``pack.streams_weights``).

``load_kernels()`` returns None when they are ready, else the reason they are not (no compiler, a
build error); callers then compute with the weights dequantised by torch ops instead (correct, slower).
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import torch

from nonstop.runtime.cpu.compile_cache import announced, cache_root

SOURCE = Path(__file__).with_name("gemv.cpp")
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


def load_kernels(progress: bool = True) -> str | None:
    """Build (first time) and load the kernels; None on success, else why they are unavailable."""
    with _lock:
        if "error" in _state:
            return _state["error"]
        from torch.utils.cpp_extension import load

        source = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]  # one build per source version
        build = cache_root() / "ext" / f"torch-{torch.__version__}-{source}"
        build.mkdir(parents=True, exist_ok=True)
        fresh = not any(build.glob("*.so"))
        try:
            with announced(
                f"building the C++ GEMV kernels into {build} (once per machine)", enabled=progress and fresh
            ):
                load(
                    name="nonstop_cpu_gemv",
                    sources=[str(SOURCE)],
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
