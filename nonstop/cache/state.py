"""Slot-based decode caches.

A ``ModelCache`` holds ``num_slots`` sequences. A forward step processes a batch of rows, row b
belonging to slot ``slots[b]`` and holding ``T`` new tokens at absolute positions
``start[b] .. start[b]+T-1`` where ``start[b]`` is that slot's current length. Attention caches
store tokens in pages of a shared pool (``nonstop.cache.pages``); KDA state has a fixed size per slot.

Layout per layer (S = slots, R = pool rows = pages · page_size; see ``PageTable.rows``):
  GQA  : k, v        [R, Hkv, D]             model dtype
  MLA  : latent      [R, kv_lora + rope]     model dtype (normalised c_kv | k_pe)
  KDA  : recurrent   [S, H, dk, dv]          fp32
         conv        [S, 3, H·dk, K-1]       model dtype (last K-1 raw q/k/v projections)

Speculative verification (``StepBatch.keep_states``): a step of T rows [last token, d1..dk] also
writes each KDA layer's state after *every* token into per-slot histories (allocated on demand:
recurrent [S, T, H, dk, dv] fp32, conv [S, T, 3, H·dk, K-1]); ``ModelCache.commit(batch, counts)``
then makes ``history[slot, counts-1]`` current and sets the lengths to start + counts. Attention
caches need no rollback: positions past a slot's length are masked and overwritten by later steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nonstop.cache.pages import PAGE_SIZE, PageTable
from nonstop.config import ModelConfig

INITIAL_SLOT_TOKENS = 64  # attention-cache tokens reserved per slot up front (the pool grows on demand)


@dataclass
class StepBatch:
    """Which slots a forward step touches and where its tokens sit.

    slots: [B] long; start: [B] long (tokens already cached per row); T: new tokens per row.
    keep_states: speculative verification — compute in the decode form (recurrent KDA, absorbed MLA)
    and keep every token's KDA state for ``ModelCache.commit``.
    """

    slots: torch.Tensor
    start: torch.Tensor
    T: int
    keep_states: bool = False

    @property
    def decode_form(self) -> bool:
        """One-token decode, or verification rows that must compute as one-token decode steps."""
        return self.T == 1 or self.keep_states

    @property
    def positions(self) -> torch.Tensor:
        """[B, T] absolute positions of the new tokens."""
        return self.start[:, None] + torch.arange(self.T, device=self.start.device)[None, :]

    @property
    def end(self) -> torch.Tensor:
        return self.start + self.T

    def attention_mask(self, key_len: int) -> torch.Tensor:
        """[B, T, key_len] bool: query at position p sees keys 0..p (causal over cache + new tokens)."""
        keys = torch.arange(key_len, device=self.start.device)
        return keys[None, None, :] <= self.positions[:, :, None]


class _TokenCache:
    """Base for caches indexed by (slot, token position), stored in pages of a shared pool.

    Each named tensor is a pool ``[num_pages * page_size, *shape]``; a ``PageTable`` (shared by all
    layers of a ``ModelCache``) maps (slot, position) to a pool row. Pages are reserved on write and
    returned when the slot is reset; the pool grows on demand.
    """

    def __init__(
        self,
        shapes: dict[str, tuple[int, ...]],
        num_slots: int,
        capacity: int,
        dtype,
        device,
        pages: PageTable | None = None,
    ):
        self.shapes = shapes
        self.dtype = dtype
        self.device = device
        if pages is None:
            pages = PageTable(num_slots, PAGE_SIZE, num_slots * -(-capacity // PAGE_SIZE), device)
        self.pages = pages
        rows = pages.num_pages * pages.page_size
        self.tensors = {k: torch.zeros(rows, *s, dtype=dtype, device=device) for k, s in shapes.items()}

    @property
    def capacity(self) -> int:
        """Token rows in the pool (all slots together)."""
        return next(iter(self.tensors.values())).shape[0]

    def fit_pool(self) -> None:
        """Grow the pool tensors to the page table's page count (existing rows keep their place)."""
        rows = self.pages.num_pages * self.pages.page_size
        for k, t in self.tensors.items():
            if t.shape[0] < rows:
                # the same kind of tensor as before (an inference tensor or not, whatever mode the growth runs
                # in): a compiled step guards on it and would otherwise compile again after the first growth
                with torch.inference_mode(t.is_inference()):
                    grown = torch.zeros(rows, *t.shape[1:], dtype=t.dtype, device=t.device)
                grown[: t.shape[0]] = t
                self.tensors[k] = grown

    def write(self, batch: StepBatch, **values: torch.Tensor) -> None:
        """Store values[name] [B, T, ...] at positions start..start+T-1 of each row's slot."""
        self.pages.reserve_rows(batch.slots, batch.end)
        self.fit_pool()
        rows = self.pages.rows(batch.slots, batch.positions)
        for k, v in values.items():
            self.tensors[k][rows] = v.to(self.dtype)

    def read(self, batch: StepBatch, name: str) -> torch.Tensor:
        """[B, L, ...] with L = max end over the batch (rows past their own end hold stale data: mask them)."""
        length = int(batch.end.max())
        positions = torch.arange(length, device=batch.slots.device)[None, :].expand(batch.slots.shape[0], length)
        return self.tensors[name][self.pages.rows(batch.slots, positions)]


class KVCache(_TokenCache):
    def __init__(self, num_slots, capacity, num_kv_heads, head_dim, dtype, device, pages: PageTable | None = None):
        super().__init__(
            {"k": (num_kv_heads, head_dim), "v": (num_kv_heads, head_dim)}, num_slots, capacity, dtype, device, pages
        )


class LatentCache(_TokenCache):
    def __init__(self, num_slots, capacity, cache_dim, dtype, device, pages: PageTable | None = None):
        super().__init__({"latent": (cache_dim,)}, num_slots, capacity, dtype, device, pages)


class KDAState:
    """Recurrent state (fp32) and short-conv window per slot, and the per-token histories of the last
    ``keep_states`` step (allocated on the first such step, grown to its T)."""

    def __init__(self, num_slots, num_heads, head_dim, conv_size, dtype, device):
        channels = num_heads * head_dim
        self.recurrent = torch.zeros(num_slots, num_heads, head_dim, head_dim, dtype=torch.float32, device=device)
        self.conv = torch.zeros(num_slots, 3, channels, conv_size - 1, dtype=dtype, device=device)
        self.history_recurrent: torch.Tensor | None = None  # [S, T, H, dk, dv] fp32
        self.history_conv: torch.Tensor | None = None  # [S, T, 3, C, K-1]
        # tokens of history written by the last keep_states step, per slot and kind (commit checks them)
        self.history_rows = torch.zeros(2, num_slots, dtype=torch.long, device=device)

    def _history(self, current: torch.Tensor, held: torch.Tensor | None, T: int) -> torch.Tensor:
        """A history with room for T tokens: ``held``, or a larger one holding ``held``'s tokens (another
        slot's history not yet committed is kept)."""
        if held is None or held.shape[1] < T:
            grown = torch.zeros(current.shape[0], T, *current.shape[1:], dtype=current.dtype, device=current.device)
            if held is not None:
                grown[:, : held.shape[1]] = held
            return grown
        return held

    def keep_recurrent(self, slots: torch.Tensor, states: torch.Tensor) -> None:
        """states [B, T, H, dk, dv]: the recurrent state after each of the T tokens of each row."""
        T = states.shape[1]
        self.history_recurrent = self._history(self.recurrent, self.history_recurrent, T)
        self.history_recurrent[slots, :T] = states.float()
        self.history_rows[0, slots] = T

    def keep_conv(self, slots: torch.Tensor, windows: torch.Tensor) -> None:
        """windows [B, T, 3, C, K-1]: the conv window after each of the T tokens of each row."""
        T = windows.shape[1]
        self.history_conv = self._history(self.conv, self.history_conv, T)
        self.history_conv[slots, :T] = windows.to(self.conv.dtype)
        self.history_rows[1, slots] = T

    def history_for(self, kind: str, slots: torch.Tensor, T: int) -> torch.Tensor:
        """The ``kind`` (recurrent | conv) history with room for T tokens, for a kernel that writes
        tokens 0..T-1 of ``slots`` in this step (marked written, as keep_recurrent / keep_conv do)."""
        if kind == "recurrent":
            self.history_recurrent = self._history(self.recurrent, self.history_recurrent, T)
            self.history_rows[0, slots] = T
            return self.history_recurrent
        self.history_conv = self._history(self.conv, self.history_conv, T)
        self.history_rows[1, slots] = T
        return self.history_conv

    def select(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Make the state after token ``rows[b]`` of the last keep_states step current for ``slots[b]``."""
        written = self.history_rows[:, slots]
        if bool((written <= rows[None]).any()):
            raise RuntimeError(
                "KDA state history was not written for this step: the executor ignored StepBatch.keep_states"
            )
        self.recurrent[slots] = self.history_recurrent[slots, rows]
        self.conv[slots] = self.history_conv[slots, rows]
        self.history_rows[:, slots] = 0


class ModelCache:
    """All layers' state for ``num_slots`` sequences, plus each slot's length.

    The attention layers share one ``PageTable`` (``page_size`` tokens per page, ``capacity`` tokens
    per slot reserved up front in the pool; it grows on demand). ``batch`` reserves the pages a step
    will write; ``reset`` returns a slot's pages.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        num_slots: int,
        capacity: int = INITIAL_SLOT_TOKENS,
        dtype=torch.float32,
        device="cpu",
        page_size: int = PAGE_SIZE,
    ):
        self.cfg = cfg
        self.num_slots = num_slots
        self.lengths = torch.zeros(num_slots, dtype=torch.long, device=device)
        # per slot, on the host: steps made (``batch``) and resets; an executor that continues a slot from its own
        # device state (the megakernel's ``decode_next``) checks that no other step or reset touched it since
        self.touches = [0] * num_slots
        self.pages = PageTable(num_slots, page_size, num_slots * -(-capacity // page_size), device)
        self.layers: list = []
        for kind in cfg.attn_types:
            if kind == "gqa":
                g = cfg.gqa
                self.layers.append(KVCache(num_slots, capacity, g.num_kv_heads, g.head_dim, dtype, device, self.pages))
            elif kind == "mla":
                self.layers.append(LatentCache(num_slots, capacity, cfg.mla.cache_dim, dtype, device, self.pages))
            else:
                k = cfg.kda
                self.layers.append(KDAState(num_slots, k.num_heads, k.head_dim, k.conv_size, dtype, device))

    def batch(self, slots, T: int, keep_states: bool = False) -> StepBatch:
        """The step of T tokens for each of ``slots`` (distinct slot ids in 0..num_slots-1): reserves the pages
        those tokens will write. A negative or repeated slot is refused: it would index another sequence's
        length and pages, or let two rows write the same positions of one sequence."""
        slots = torch.as_tensor(slots, dtype=torch.long, device=self.lengths.device)
        ids = slots.tolist()
        if slots.dim() != 1 or any(not 0 <= s < self.num_slots for s in ids) or len(set(ids)) != len(ids):
            raise ValueError(f"a step needs distinct cache slots in 0..{self.num_slots - 1}, got {ids}")
        batch = StepBatch(slots=slots, start=self.lengths[slots].clone(), T=T, keep_states=keep_states)
        self.pages.reserve_rows(batch.slots, batch.end)
        for s in ids:
            self.touches[s] += 1
        return batch

    def advance(self, batch: StepBatch, counts=None) -> None:
        """Record that rows' tokens are now part of their sequences (all T unless ``counts`` [B], a tensor or a
        sequence of ints, says fewer)."""
        if counts is not None:
            counts = torch.as_tensor(counts, dtype=torch.long, device=self.lengths.device)
            if counts.shape != batch.slots.shape or bool((counts < 0).any()) or bool((counts > batch.T).any()):
                raise ValueError(
                    f"advance needs one count in 0..{batch.T} per row ({batch.slots.shape[0]}), got {counts.tolist()}"
                )
        self.lengths[batch.slots] = batch.start + (batch.T if counts is None else counts)

    def commit(self, batch: StepBatch, counts) -> None:
        """After a ``keep_states`` step: row b keeps its first counts[b] tokens (1 <= counts <= T).

        Each KDA layer's state after token counts[b]-1 becomes current (no replay); lengths become
        start + counts, which truncates the attention caches (later steps overwrite the rest).
        """
        counts = torch.as_tensor(counts, dtype=torch.long, device=self.lengths.device)
        if not batch.keep_states:
            raise ValueError("commit needs a batch made with keep_states=True")
        if counts.shape != batch.slots.shape:
            raise ValueError(f"commit needs one count per row ({batch.slots.shape[0]}), got {counts.tolist()}")
        if bool((counts < 1).any()) or bool((counts > batch.T).any()):
            raise ValueError(f"commit counts must be in 1..{batch.T}, got {counts.tolist()}")
        for layer in self.layers:
            if isinstance(layer, KDAState):
                layer.select(batch.slots, counts - 1)
        self.advance(batch, counts)

    def reset(self, slot: int) -> None:
        """Free a slot: its length returns to 0, its pages to the pool and its recurrent state to zeros."""
        self.touches[slot] += 1
        self.lengths[slot] = 0
        self.pages.release(slot)
        for layer in self.layers:
            if isinstance(layer, KDAState):
                layer.recurrent[slot].zero_()
                layer.conv[slot].zero_()
                layer.history_rows[:, slot] = 0

    def bytes_per_token(self) -> int:
        """Attention-cache bytes added per token (all layers); KDA state is per sequence
        (``program/cost.state_bytes_per_sequence``)."""
        total = 0
        for layer in self.layers:
            if isinstance(layer, _TokenCache):
                for t in layer.tensors.values():
                    total += t[0].numel() * t.element_size()
        return total
