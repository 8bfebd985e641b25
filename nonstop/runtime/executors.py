"""The registry of backends (``make_executor``) and the ``reference`` executor.

Every backend implements ``runtime.interface.Executor`` (forward, forward_hidden, name, stats,
batch_invariant, max_rows) and must give the reference's tokens.
"""

from __future__ import annotations

import torch

from nonstop.cache.state import ModelCache, StepBatch
from nonstop.model.stack import CausalLM
from nonstop.runtime.interface import Executor


class ReferenceExecutor(Executor):
    """Every layer as plain torch ops — readable, the oracle for the others."""

    name = "reference"

    def __init__(self, model: CausalLM):
        self.model = model
        self.stats: dict = {}

    def forward(
        self, input_ids: torch.Tensor, cache: ModelCache | None, batch: StepBatch | None, last_only: bool = False
    ) -> torch.Tensor:
        return self.model(input_ids, cache, batch, last_only=last_only)

    def forward_hidden(self, input_ids: torch.Tensor, cache: ModelCache, batch: StepBatch, taps: tuple[int, ...]):
        """(logits [B, T, V], {tap: residual stream entering layer tap [B, T, d]}) — for drafters."""
        return self.model.forward_hidden(input_ids, cache, batch, taps)


def _superop(model):
    from nonstop.runtime.superop import SuperOpExecutor

    return SuperOpExecutor(model)


def _megakernel(model):
    from nonstop.runtime.megakernel import MegakernelExecutor

    return MegakernelExecutor(model)


def _cpu(weights: str):
    def make(model):
        from nonstop.runtime.cpu import CPUExecutor

        return CPUExecutor(model, weights=weights)

    return make


CPU_WEIGHTS = {"cpu": "auto", "cpu-bf16": "bfloat16", "cpu-int8": "int8"}  # backend: the format it packs weights in
BACKENDS = {
    "reference": ReferenceExecutor,
    "superop": _superop,
    "megakernel": _megakernel,
    **{name: _cpu(weights) for name, weights in CPU_WEIGHTS.items()},
}


KERNEL_BACKENDS = ("superop", "megakernel")


def triton_interpreter() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``, set before import)."""
    from nonstop.kernels.platform import interpreting

    return interpreting()


def resolve_backend(backend: str, device) -> str:
    """``auto``: ``cpu`` (the compiled CPU path) on a CPU, ``reference`` elsewhere; others unchanged."""
    if backend != "auto":
        return backend
    return "cpu" if torch.device(device).type == "cpu" else "reference"


def streamed_weight_bytes(cfg, dtype: torch.dtype, backend: str, device) -> tuple[int, str]:
    """(bytes of weights one decode token reads, in the format ``backend`` keeps them, what that format is): the
    weights of ``dtype`` (``program.footprint``), except on a ``cpu`` backend, which packs them (fp32, bf16 or
    int8 with its scales; router, norms and embedding as loaded; MXFP4 experts widened to fp32): what its packed
    Program streams (``runtime/cpu/pack.streamed_bytes_per_token``). The numerator of a bandwidth floor."""
    backend = resolve_backend(backend, device)
    if backend in CPU_WEIGHTS:
        from nonstop.runtime.cpu.executor import resolve_weights
        from nonstop.runtime.cpu.pack import streamed_bytes_per_token

        fmt = resolve_weights(CPU_WEIGHTS[backend], dtype)
        return streamed_bytes_per_token(cfg, dtype, fmt), f"{fmt} (backend {backend})"
    from nonstop.program.footprint import model_footprint

    return model_footprint(cfg, dtype).bytes_per_token, f"{str(dtype).removeprefix('torch.')} (backend {backend})"


def make_executor(backend: str, model: CausalLM) -> Executor:
    backend = resolve_backend(backend, model.embed_tokens.weight.device)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    device = model.embed_tokens.weight.device
    if backend in KERNEL_BACKENDS and device.type != "cuda" and not triton_interpreter():
        raise ValueError(
            f"backend {backend!r} runs Triton kernels: it needs a CUDA device (--device cuda), or "
            f"TRITON_INTERPRET=1 in the environment to run them in Triton's CPU interpreter "
            f"(hundreds of times slower; for testing); on a CPU use backend 'cpu' (the default there) "
            f"or 'reference' (the plain-torch oracle)"
        )
    try:
        return BACKENDS[backend](model)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("nonstop.runtime"):
            raise ValueError(f"backend {backend!r} is not available in this build") from None
        if exc.name == "triton":
            raise ValueError(
                f"backend {backend!r} needs Triton: pip install 'triton>=3.6' (or use backend='reference')"
            ) from None
        raise
