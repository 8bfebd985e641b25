"""Buffer regions and access kinds: what a megakernel task touches.

Every buffer a task touches is seen as a 2-D array ``[rows, cols]`` (``cols`` = elements per row):
an activation buffer ``[R, *row_shape]`` has R rows; a per-sequence state (KDA recurrent / conv
windows) has B rows, one per sequence of the step; an attention cache has R rows, the step's new
tokens (older tokens are read with ``READ_PAST``). A ``Region`` is a box of that array:
rows ``[r0, r1)`` x columns ``[c0, c1)``. Its elements, in row-major order, form one flat interval
per row, or a single interval when the box spans whole rows.

Access kinds and the orderings they need (a "modification" is a write or an accumulate):
  READ        after every earlier modification of the element.
  WRITE       after every earlier access of the element.
  ACCUMULATE  after every earlier write and read; accumulates commute with each other (split-K
              atomic adds into a zeroed target), so two of them need no order.
  READ_PAST   reads what *previous steps* appended to an append-only buffer (an attention cache):
              after the previous step's writes of the element; never conflicts within a step.
A read-modify-write (``h += y`` on a tile's own columns) is a READ and a WRITE of the same box.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Access(IntEnum):
    READ = 0
    WRITE = 1
    ACCUMULATE = 2
    READ_PAST = 3


VERB = {Access.READ: "reads", Access.WRITE: "writes", Access.ACCUMULATE: "accumulates into", Access.READ_PAST: "reads earlier steps' rows of"}


@dataclass(frozen=True)
class Region:
    """Box ``[r0, r1) x [c0, c1)`` of buffer ``buffer`` (an index into ``Schedule.buffers``)."""

    buffer: int
    r0: int
    r1: int
    c0: int
    c1: int
    access: Access

    def intervals(self, cols: int) -> list[tuple[int, int]]:
        """Flat element ranges ``[lo, hi)`` of the box in a buffer of ``cols`` columns."""
        if self.c0 == 0 and self.c1 == cols:
            return [(self.r0 * cols, self.r1 * cols)]
        return [(r * cols + self.c0, r * cols + self.c1) for r in range(self.r0, self.r1)]

    def overlaps(self, other: "Region") -> bool:
        return self.buffer == other.buffer and self.r0 < other.r1 and other.r0 < self.r1 and self.c0 < other.c1 and other.c0 < self.c1

    def describe(self, name: str) -> str:
        return f"{name}[rows {self.r0}:{self.r1}, cols {self.c0}:{self.c1}]"


def describe_elements(name: str, cols: int, lo: int, hi: int) -> str:
    """Human form of the flat element range [lo, hi) of a buffer with ``cols`` columns."""
    r0, c0 = divmod(lo, cols)
    r1, c1 = divmod(hi - 1, cols)
    if r0 == r1:
        return f"{name}[row {r0}, cols {c0}:{c1 + 1}]"
    return f"{name}[elements {lo}:{hi} = row {r0} col {c0} .. row {r1} col {c1}]"
