"""What tilings build with: the buffer registry of one step's schedule and region / weight helpers.

Buffers of a schedule for a step of B sequences x T tokens (R = B*T rows):
  Program buffers        ``[R, row_numel]`` by their Program name.
  attention caches       ``L{i}.k``, ``L{i}.v`` (GQA), ``L{i}.latent`` (MLA): ``[R, per-token values]``,
                         the step's new tokens; append-only (older tokens: ``READ_PAST``).
  KDA state              ``L{i}.recurrent`` ``[B, H*D*D]`` and ``L{i}.conv`` ``[B, 3*C*(K-1)]``: row b is
                         sequence b's slot (slots of a step are distinct).
  workspaces             the kernels' scratch between the phases of a multi-phase op, shared by every op of
                         the kind as the workspace is (``nonstop.kernels.launch.workspace``), in the layout
                         the kernels and the checks' twins agree on.
  ``start``              the step's start positions ``[B, 1]`` (read by the attention and KDA tiles,
                         advanced by ``advance``).
"""

from __future__ import annotations

from dataclasses import replace

from nonstop.program.ir import Program, SuperOp
from nonstop.runtime.megakernel.tasks import Access, BufferInfo, Region, WeightSlice


class TileContext:
    def __init__(self, program: Program, B: int, T: int):
        self.program = program
        self.cfg = program.cfg
        self.B, self.T, self.R = B, T, B * T
        self.buffers: list[BufferInfo] = []
        self._index: dict[str, int] = {}

    # ------------------------------------------------------------------ buffers
    def _add(self, info: BufferInfo) -> int:
        if info.name not in self._index:
            self._index[info.name] = len(self.buffers)
            self.buffers.append(info)
        return self._index[info.name]

    def buf(self, name: str) -> int:
        """A Program activation buffer."""
        return self._add(BufferInfo(name, self.R, max(1, self.program.buffers[name].row_numel)))

    def cache(self, layer: int, tensor: str, cols: int) -> int:
        return self._add(BufferInfo(f"L{layer}.{tensor}", self.R, cols, "cache", True, layer, tensor))

    def state(self, layer: int, tensor: str, cols: int) -> int:
        return self._add(BufferInfo(f"L{layer}.{tensor}", self.B, cols, "state", False, layer, tensor))

    def scratch(self, name: str, rows: int, cols: int) -> int:
        """A workspace seen as [rows, cols]; a later, larger use of the same workspace grows it."""
        b = self._add(BufferInfo(name, rows, cols, "scratch"))
        info = self.buffers[b]
        if rows * cols > info.size:
            self.buffers[b] = replace(info, rows=max(rows, info.rows), cols=max(cols, info.cols))
        return b

    def start(self) -> int:
        """The step's start positions, one row per sequence."""
        return self._add(BufferInfo("start", self.B, 1, "step"))

    def cols(self, b: int) -> int:
        return self.buffers[b].cols

    # ------------------------------------------------------------------ regions
    def box(
        self, b: int, access: Access, rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None
    ) -> Region:
        """Region of buffer index b: rows/cols default to all."""
        r0, r1 = rows if rows is not None else (0, self.buffers[b].rows)
        c0, c1 = cols if cols is not None else (0, self.buffers[b].cols)
        return Region(b, r0, r1, c0, c1, access)

    def seq_rows(self, b: int) -> tuple[int, int]:
        """Rows of sequence b."""
        return b * self.T, (b + 1) * self.T

    # ------------------------------------------------------------------ weights
    def weight(
        self, op: SuperOp, role: str, dim: int = -1, start: int = 0, stop: int | None = None, dynamic: bool = False
    ) -> WeightSlice | None:
        """Slice [start, stop) along ``dim`` of ``op.weights[role]`` (dim -1: whole); ``dynamic``: one
        expert (dim 0) chosen at run time. None if the op has no such weight."""
        t = op.weights.get(role)
        if t is None:
            return None
        if dynamic:
            t = t[0]
            dim -= 1
        if dim < 0:
            return WeightSlice(role, -1, 0, t.shape[0] if t.dim() else 1, t.numel() * t.element_size(), dynamic)
        stop = t.shape[dim] if stop is None else min(stop, t.shape[dim])
        part = t.narrow(dim, start, stop - start)
        return WeightSlice(role, dim + (1 if dynamic else 0), start, stop, part.numel() * part.element_size(), dynamic)

    def weights(self, *slices) -> tuple[WeightSlice, ...]:
        return tuple(w for w in slices if w is not None)


def chunks(n: int, block: int) -> list[tuple[int, int]]:
    """[0, n) in consecutive pieces of ``block``."""
    return [(a, min(a + block, n)) for a in range(0, n, block)]


def packed_parts(sizes: list[int], lo: int, hi: int) -> list[tuple[int, int, int]]:
    """(part, local start, local stop) of the packed outputs [lo, hi) of parts of ``sizes``."""
    out, base = [], 0
    for p, n in enumerate(sizes):
        a, b = max(lo, base), min(hi, base + n)
        if a < b:
            out.append((p, a - base, b - base))
        base += n
    return out
