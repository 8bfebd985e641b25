"""The caches of one step as plain tensors: what a compiled step reads and writes.

A compiled step cannot run the page table's host-side bookkeeping (Python lists, pool growth), so the
executor does it eagerly before the step (``ModelCache.batch`` reserves pages, ``fit_pool`` grows the
pools) and hands the step the pool tensors, the page table and the span of positions to read
(``step_pages``); the step computes its rows from them (``cache.pages.pool_rows``, fused into the step):
  write_rows [B·T]  pool row of each new token (row r = token r % T of sequence r // T),
  read_rows  [B, L] pool rows of positions 0..L-1 of each sequence (L = max end; rows past a
                    sequence's own end hold stale data and are masked by the step).
The views offer the ``write`` / ``read`` methods of ``cache.state._TokenCache`` and the ``recurrent`` /
``conv`` tensors of ``KDAState``, so the Program's super-op twins run on them unchanged.
"""

from __future__ import annotations

import torch

from nonstop.cache.pages import pool_rows
from nonstop.cache.state import KDAState, ModelCache, StepBatch, _TokenCache


class TokenCacheView:
    """A paged attention cache (``tensors``: name -> pool [rows, ...]) seen through this step's rows."""

    def __init__(self, tensors: dict[str, torch.Tensor], write_rows: torch.Tensor, read_rows: torch.Tensor):
        self.tensors, self.write_rows, self.read_rows = tensors, write_rows, read_rows

    def write(self, batch: StepBatch, **values: torch.Tensor) -> None:
        for name, v in values.items():
            pool = self.tensors[name]
            pool.index_put_((self.write_rows,), v.reshape(-1, *pool.shape[1:]).to(pool.dtype))

    def read(self, batch: StepBatch, name: str) -> torch.Tensor:
        return self.tensors[name][self.read_rows]


class KDAStateView:
    """A KDA layer's per-slot recurrent state [S, H, dk, dv] (fp32) and conv windows [S, 3, C, K-1]."""

    def __init__(self, recurrent: torch.Tensor, conv: torch.Tensor):
        self.recurrent, self.conv = recurrent, conv


class CacheView:
    """``layers``: one view per decoder layer, as ``ModelCache.layers``."""

    def __init__(self, layers: list):
        self.layers = layers


def cache_tensors(cache: ModelCache) -> list:
    """Per layer: the attention cache's {name: pool} or the KDA (recurrent, conv) pair (after growing pools)."""
    out = []
    for layer in cache.layers:
        if isinstance(layer, _TokenCache):
            layer.fit_pool()
            out.append(dict(layer.tensors))
        elif isinstance(layer, KDAState):
            out.append((layer.recurrent, layer.conv))
        else:
            raise TypeError(f"unknown cache layer {type(layer).__name__}")
    return out


def step_pages(cache: ModelCache, batch: StepBatch) -> tuple[torch.Tensor, int, torch.Tensor]:
    """(page table [S, W], page size, span [L] = 0..L-1 with L = max end) of a step whose pages
    ``cache.batch`` has reserved."""
    pages = cache.pages
    return pages.table, pages.page_size, torch.arange(int(batch.end.max()), device=batch.slots.device)


def step_rows(table: torch.Tensor, page_size: int, batch: StepBatch, span: torch.Tensor):
    """(write_rows [B·T], read_rows [B, L]) from ``step_pages``' tensors: traceable, no host sync."""
    B = batch.slots.shape[0]
    write = pool_rows(table, page_size, batch.slots, batch.positions).reshape(-1)
    return write, pool_rows(table, page_size, batch.slots, span[None, :].expand(B, span.shape[0]))


def make_view(tensors: list, write_rows: torch.Tensor, read_rows: torch.Tensor) -> CacheView:
    layers = []
    for t in tensors:
        layers.append(TokenCacheView(t, write_rows, read_rows) if isinstance(t, dict) else KDAStateView(*t))
    return CacheView(layers)
