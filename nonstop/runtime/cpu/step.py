"""One decode step of a Program as a single traceable function (what ``torch.compile`` compiles).

``run_step(program, table, ids [B, T], slots [B], start [B], pages [S, W], page_size, span [L], tensors)``
allocates the activation buffers, computes the step's cache rows from the page table (``cache_view``),
runs every super-op of ``program`` with ``table``'s implementation on a ``CacheView`` of ``tensors``
(``cache_view.cache_tensors``) and returns fp32 logits [B·T, V]. It has no host syncs and no data-dependent
Python control flow, so the whole step traces into one graph; the caches are updated in place.
"""

from __future__ import annotations

from nonstop.cache.state import StepBatch
from nonstop.program.ir import Program
from nonstop.program.reference import StepEnv
from nonstop.runtime.cpu.cache_view import make_view, step_rows


def run_step(
    program: Program, table: dict, ids, slots, start, pages, page_size: int, span, tensors: list, taps: tuple = ()
):
    """Returns logits [B·T, V] fp32 and, for each name in ``taps``, that activation buffer [B·T, ...]."""
    B, T = ids.shape
    batch = StepBatch(slots, start, T)
    write_rows, read_rows = step_rows(pages, page_size, batch, span)
    buf = program.allocate(B * T, ids.device)
    buf["ids"] = ids.reshape(-1)
    env = StepEnv(buf, make_view(tensors, write_rows, read_rows), batch)
    for op in program.ops:
        table[op.kind](op, env)
    return buf["logits"], tuple(buf[name] for name in taps)
