"""Page tables: map (slot, token position) to a row of a shared token pool.

Token storage is split into pages of ``page_size`` tokens drawn from one pool shared by all slots.
Slot s owns the pages listed in ``table[s, :]`` (in order); token position p of slot s lives at pool
row ``table[s, p // page_size] * page_size + p % page_size``. Pages are taken from a free list
when a slot grows (``reserve``) and returned when it is reset (``release``); the pool doubles when
the free list runs out, so page ids stay valid and callers grow their storage to ``num_pages``.

One ``PageTable`` is shared by every attention layer of a model (all layers hold the same positions),
so each layer's pool is ``[num_pages * page_size, ...]`` and the same row index serves them all.
"""

from __future__ import annotations

import torch

PAGE_SIZE = 16  # tokens per page of the attention caches (the default of every cache)


class PageTable:
    """Per-slot lists of page ids into a pool of ``num_pages`` pages of ``page_size`` tokens."""

    def __init__(self, num_slots: int, page_size: int = PAGE_SIZE, num_pages: int = 0, device="cpu"):
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.device = device
        self.num_pages = 0
        self.free_pages: list[int] = []
        self.slot_pages: list[list[int]] = [[] for _ in range(num_slots)]
        # [S, page columns]: room for at least 2 pages per slot from the start, so a width of 1 never reaches
        # a compiled step (torch.compile specialises a size-1 dim and would compile again at 2)
        self.table = torch.zeros(num_slots, 2, dtype=torch.long, device=device)
        self._grow_pool(max(num_pages, 1))

    def _grow_pool(self, num_pages: int) -> None:
        """Add pages so the pool holds ``num_pages`` (new ids go on the free list, lowest first)."""
        self.free_pages = list(range(num_pages - 1, self.num_pages - 1, -1)) + self.free_pages
        self.num_pages = num_pages

    def pages_for(self, length: int) -> int:
        return -(-length // self.page_size)

    def reserve(self, slot: int, length: int) -> None:
        """Make ``slot`` own enough pages to hold tokens 0..length-1."""
        pages = self.slot_pages[slot]
        needed = self.pages_for(length) - len(pages)
        if needed <= 0:
            return
        if needed > len(self.free_pages):
            self._grow_pool(max(2 * self.num_pages, self.num_pages + needed - len(self.free_pages)))
        new = [self.free_pages.pop() for _ in range(needed)]
        pages.extend(new)
        if len(pages) > self.table.shape[1]:
            with torch.inference_mode(self.table.is_inference()):  # the same kind of tensor (see ``fit_pool``)
                wider = torch.zeros(
                    self.table.shape[0], max(len(pages), 2 * self.table.shape[1]), dtype=torch.long, device=self.device
                )
            wider[:, : self.table.shape[1]] = self.table
            self.table = wider
        self.table[slot, len(pages) - needed : len(pages)] = torch.tensor(new, dtype=torch.long)

    def reserve_rows(self, slots: torch.Tensor, ends: torch.Tensor) -> None:
        """``reserve`` for each row: slots [B], ends [B] (tokens each slot must hold)."""
        for slot, end in zip(slots.tolist(), ends.tolist()):
            self.reserve(slot, end)

    def release(self, slot: int) -> None:
        """Return every page of ``slot`` to the free list."""
        self.free_pages.extend(reversed(self.slot_pages[slot]))
        self.slot_pages[slot] = []
        self.table[slot] = 0

    def rows(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Pool rows of tokens: slots [B], positions [B, T] -> [B, T] long (``pool_rows`` on this table)."""
        return pool_rows(self.table, self.page_size, slots, positions)

    @property
    def used_pages(self) -> int:
        return self.num_pages - len(self.free_pages)


def pool_rows(table: torch.Tensor, page_size: int, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Pool rows of tokens: table [S, W] page ids, slots [B], positions [B, T] -> [B, T] long,
    row = table[s, p // page_size] · page_size + p % page_size. Positions past a slot's pages map into
    page 0 (callers mask them). Plain tensor ops: a compiled step computes its rows with it too."""
    page_index = torch.clamp(positions // page_size, max=table.shape[1] - 1)
    return table[slots[:, None], page_index] * page_size + positions % page_size
