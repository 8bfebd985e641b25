"""The decode Program: a model's step as an ordered list of super-operator instances.

A step processes R rows (B sequences × T new tokens each; row r = (b = r // T, t = r % T)). Every
activation buffer holds one value per row: ``[R, *row_shape]``. A ``SuperOp`` names the buffers it
reads and writes, the weights it streams, static attributes, and its cost. Three executors run the
same program: the plain-torch twins in ``program/reference.py`` (the spec of every kernel), one
Triton launch per op (``superop``), or all ops' tiles inside one persistent kernel (``megakernel``).

Residual stream: plain-residual models carry ``h``; K3's block attention residuals carry ``partial``
and ``blocks`` ([R, n_blocks, d]). Sublayer inputs are normalised inside the consuming op
(``attrs["norm"]`` names the RMSNorm weight in ``weights["norm"]``) or, for K3, by the mix op.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from nonstop.config import ModelConfig

MAX_STEP_ROWS = 16  # rows (B·T) a decode step runs through the Program: decode batches, verification blocks


@dataclass(frozen=True)
class BufferSpec:
    """An activation buffer: ``[R, *row_shape]`` of ``dtype`` ("model" = the model's float dtype)."""

    name: str
    row_shape: tuple[int, ...]
    dtype: str = "model"  # "model" | "float32" | "int64"

    def torch_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        return {"model": model_dtype, "float32": torch.float32, "int64": torch.int64}[self.dtype]

    @property
    def row_numel(self) -> int:
        n = 1
        for s in self.row_shape:
            n *= s
        return n


@dataclass(frozen=True)
class Cost:
    """Traffic and work of one op for one step."""

    weight_bytes: int
    bytes_read: int  # weights + activations + cache/state reads
    bytes_written: int
    flops: int

    def __add__(self, other: Cost) -> Cost:
        return Cost(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple())))

    def as_tuple(self):
        return (self.weight_bytes, self.bytes_read, self.bytes_written, self.flops)


@dataclass
class SuperOp:
    """One super-operator instance.

    name:    unique, e.g. ``L3.kda_core``
    kind:    op kind - selects the reference twin (``program/reference.py``) and the kernel
    layer:   decoder layer index (None for embed / head)
    reads / writes: activation buffer names (``cache`` and ``state`` side effects are in ``attrs``)
    weights: the tensors it streams, by role (views of the model's parameters)
    attrs:   static facts (dims, eps, flags, the layer's cache index ...)
    cost:    ``cost(rows, context=0, sequences=None) -> Cost`` for a step of ``rows`` rows of ``sequences``
             sequences (default: one row each) at ``context`` cached tokens (``program/cost.py``)
    tiles:   ``tiles(rows, context=0, sequences=None) -> int``: the tiles its work splits into
    """

    name: str
    kind: str
    layer: int | None
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    weights: dict[str, torch.Tensor]
    attrs: dict = field(default_factory=dict)
    cost: Callable[..., Cost] | None = None
    tiles: Callable[..., int] | None = None

    def weight_bytes(self) -> int:
        return sum(w.numel() * w.element_size() for w in self.weights.values())


@dataclass
class Program:
    cfg: ModelConfig
    ops: list[SuperOp]
    buffers: dict[str, BufferSpec]
    dtype: torch.dtype
    max_rows: int = MAX_STEP_ROWS

    def total_cost(self, rows: int = 1, context: int = 0, sequences: int | None = None) -> Cost:
        total = Cost(0, 0, 0, 0)
        for op in self.ops:
            total = total + op.cost(rows, context, sequences)
        return total

    def allocate(self, rows: int, device) -> dict[str, torch.Tensor]:
        """Fresh activation buffers for ``rows`` rows."""
        return {
            b.name: torch.empty(rows, *b.row_shape, dtype=b.torch_dtype(self.dtype), device=device)
            for b in self.buffers.values()
        }
