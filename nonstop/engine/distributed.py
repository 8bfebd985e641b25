"""The multi-rank engine: rank 0 owns the scheduler, tokenizer and HTTP; every other rank follows step
by step.

Rank 0's ``EngineCore`` sees one executor (``ClusterExecutor``) and one cache (``ClusterCache``: the
slots' lengths only). Slot s belongs to attention group s mod DP (local slot s div DP); every rank keeps
the real caches of its group's slots (its KDA heads, its KV heads, the MLA latent) in a ``ModelCache``.
Each step rank 0 broadcasts a ``StepMessage`` (gloo side channel): the cache operations since the last
step (reset / advance / commit / new / drop, replayed by every rank on its own caches) and each group's
rows (token ids, slots, positions). Every rank then runs its Program (``RankExecutor``); the first rank
of every other group returns its logits (and the drafter's hidden taps) to rank 0.

Failures: every collective has a timeout and raises ``RankFailure``; an idle rank 0 sends a keep-alive
message every timeout / 4 so followers can tell a quiet server from a dead one. ``on_failure`` (the CLI:
print and exit) runs when rank 0 learns of a failure; a follower that fails exits with the message.
"""

from __future__ import annotations

import itertools
import operator
import threading
import time
import weakref
from dataclasses import dataclass, field

import torch

from nonstop.cache.pages import PAGE_SIZE
from nonstop.cache.state import INITIAL_SLOT_TOKENS, ModelCache, StepBatch
from nonstop.config import ModelConfig
from nonstop.dist.comm import Comm, RankFailure
from nonstop.dist.layout import Layout
from nonstop.model.rows import is_row_exact, row_exact
from nonstop.runtime.distributed import RankExecutor
from nonstop.runtime.interface import Executor


@dataclass
class StepMessage:
    """What rank 0 tells every rank. kind: step | noop | stop | rebalance (T = redundant experts).
    groups[g]: (local slots, starts, ids [B][T]) of attention group g, or None when it has no rows."""

    kind: str
    ops: list = field(default_factory=list)
    cache_id: int = -1
    groups: list | None = None
    T: int = 1
    keep_states: bool = False
    row_exact: bool = False
    last_only: bool = False
    taps: tuple[int, ...] = ()


class ClusterCache:
    """The engine's cache under a layout: the lengths of every slot of every attention group; the
    operations that change a slot are logged for the ranks (``StepMessage.ops``). Same interface as
    ``ModelCache`` for ``EngineCore`` and speculative decoding (batch, advance, commit, reset)."""

    def __init__(self, owner: ClusterExecutor, cache_id: int, num_slots: int, page_size: int):
        self.cache_id = cache_id
        self.num_slots = num_slots
        self.lengths = torch.zeros(num_slots, dtype=torch.long)
        self._log = owner.log
        self._log(("new", cache_id, num_slots, page_size))

    def batch(self, slots, T: int, keep_states: bool = False) -> StepBatch:
        slots = torch.as_tensor(slots, dtype=torch.long)
        return StepBatch(slots=slots, start=self.lengths[slots].clone(), T=T, keep_states=keep_states)

    def advance(self, batch: StepBatch, counts=None) -> None:
        counts_list = None if counts is None else torch.as_tensor(counts).tolist()
        self._log(("advance", self.cache_id, batch.slots.tolist(), batch.start.tolist(), batch.T, counts_list))
        self.lengths[batch.slots] = batch.start + (
            batch.T if counts is None else torch.as_tensor(counts, dtype=torch.long)
        )

    def commit(self, batch: StepBatch, counts) -> None:
        counts = torch.as_tensor(counts, dtype=torch.long)
        if not batch.keep_states:
            raise ValueError("commit needs a batch made with keep_states=True")
        if bool((counts < 1).any()) or bool((counts > batch.T).any()):
            raise ValueError(f"commit counts must be in 1..{batch.T}, got {counts.tolist()}")
        self._log(("commit", self.cache_id, batch.slots.tolist(), batch.start.tolist(), batch.T, counts.tolist()))
        self.lengths[batch.slots] = batch.start + counts

    def reset(self, slot: int) -> None:
        self._log(("reset", self.cache_id, int(slot)))
        self.lengths[slot] = 0


# ----------------------------------------------------------------------------- every rank


class RankWorker:
    """A rank's caches and executor; ``handle`` applies one ``StepMessage``."""

    def __init__(self, comm: Comm, executor: RankExecutor, dtype: torch.dtype, source=None):
        self.comm = comm
        self.executor = executor
        self.dtype = dtype
        self.source = source  # source(layout, only) -> this rank's weights under ``layout`` (see build_worker)
        self.caches: dict[int, ModelCache] = {}

    @property
    def dp(self) -> int:
        return self.comm.layout.dp

    def _local(self, slots: list[int]) -> list[tuple[int, int]]:
        """(batch index, local slot) of the slots in this rank's attention group."""
        g = self.comm.dp_index
        return [(i, s // self.dp) for i, s in enumerate(slots) if s % self.dp == g]

    def replay(self, ops: list) -> None:
        for op in ops:
            kind, cid = op[0], op[1]
            if kind == "new":
                num_slots, page_size = op[2], op[3]
                mine = len(range(self.comm.dp_index, num_slots, self.dp))
                self.caches[cid] = ModelCache(
                    self.executor.local_cfg,
                    max(1, mine),
                    capacity=INITIAL_SLOT_TOKENS,
                    dtype=self.dtype,
                    device=self.comm.device,
                    page_size=page_size,
                )
            elif kind == "drop":
                self.caches.pop(cid, None)
            elif kind == "reset":
                if op[2] % self.dp == self.comm.dp_index:
                    self.caches[cid].reset(op[2] // self.dp)
            else:  # advance / commit
                slots, starts, T, counts = op[2], op[3], op[4], op[5]
                rows = self._local(slots)
                if not rows:
                    continue
                local = self.caches[cid]
                dev = local.lengths.device
                batch = StepBatch(
                    torch.tensor([s for _, s in rows], device=dev),
                    torch.tensor([starts[i] for i, _ in rows], device=dev),
                    T,
                    keep_states=kind == "commit",
                )
                sub = None if counts is None else [counts[i] for i, _ in rows]
                if kind == "commit":
                    local.commit(batch, sub)
                else:
                    local.advance(batch, sub)

    def rebalance(self, redundant: int) -> dict:
        """Place every MoE layer's experts for the load recorded on all ranks so far (summed over the
        ranks), with ``redundant`` extra replicas of hot experts; read this rank's new experts. Every
        rank computes the same placements. Returns {layer: ExpertPlacement}."""
        from nonstop.dist.load import is_expert
        from nonstop.dist.placement import ExpertPlacement

        loads = self.executor.expert_load()
        layers = sorted(loads)
        if not layers:
            return {}
        total = torch.stack([loads[i] for i in layers]).float()
        self.comm.all_reduce_control(total)
        placements = {
            i: ExpertPlacement.rebalanced(total[j], self.comm.layout.ep, redundant) for j, i in enumerate(layers)
        }
        layout = self.comm.layout.with_placement(placements)
        self.executor.set_placement(layout, self.source(layout, only=is_expert))
        return placements

    @torch.inference_mode()
    def handle(self, msg: StepMessage):
        """Apply ``msg``; for a step, returns this group's (logits [B, T', V] | None, hidden) and sends
        them to rank 0 when this rank leads another group."""
        self.replay(msg.ops)
        if msg.kind == "rebalance":
            return self.rebalance(msg.T), {}
        if msg.kind != "step":
            return None, {}
        part = msg.groups[self.comm.dp_index]
        group_rows = tuple(len(g[0]) * msg.T if g is not None else 0 for g in msg.groups)
        with row_exact(msg.row_exact):
            if part is None:
                self.executor.idle(group_rows)
                return None, {}
            slots, starts, ids = part
            dev = self.comm.device
            cache = self.caches[msg.cache_id]
            batch = StepBatch(
                torch.tensor(slots, device=dev), torch.tensor(starts, device=dev), msg.T, keep_states=msg.keep_states
            )
            cache.pages.reserve_rows(batch.slots, batch.end)
            ids = torch.tensor(ids, dtype=torch.long, device=dev)
            logits, hidden = self.executor.run(ids, cache, batch, msg.taps, group_rows)
        if logits is not None and msg.last_only:
            logits = logits[:, -1:]
        if self.comm.leader and self.comm.rank != 0:
            self.comm.send(logits, 0)
            if msg.taps:
                self.comm.send(torch.stack([hidden[t] for t in msg.taps]), 0)
        return logits, hidden


def follow(worker: RankWorker) -> None:
    """A follower's loop: apply rank 0's messages until it says stop."""
    while True:
        msg = worker.comm.broadcast_object()
        if msg.kind == "stop":
            return
        worker.handle(msg)


# ----------------------------------------------------------------------------- rank 0


class ClusterExecutor(Executor):
    """The executor ``EngineCore`` drives on rank 0: ``forward`` / ``forward_hidden`` of a step of the
    whole layout, and ``new_cache`` for the cluster's slots (kept on the ranks)."""

    def __init__(self, worker: RankWorker, cfg: ModelConfig, on_failure=None):
        self.worker = worker
        self.comm = worker.comm
        self.cfg = cfg
        self.name = worker.executor.backend
        self.on_failure = on_failure
        self._pending: list = []
        self._pending_lock = threading.Lock()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._last_sent = time.monotonic()
        self.failed: str | None = None
        self.closed = False
        self.stats = {"steps": 0}
        self._stop_keepalive = threading.Event()
        self._keepalive = threading.Thread(target=self._keep_alive, name="nonstop-dist-keepalive", daemon=True)
        self._keepalive.start()

    @property
    def layout(self) -> Layout:
        return self.comm.layout

    # ------------------------------------------------------------------ caches
    def new_cache(
        self, cfg=None, num_slots: int = 1, dtype=None, device=None, page_size: int = PAGE_SIZE
    ) -> ClusterCache:
        """A cache of ``num_slots`` slots spread over the attention groups (their state lives on the ranks;
        ``cfg``, ``dtype`` and ``device`` are the layout's own)."""
        cache = ClusterCache(self, next(self._ids), num_slots, page_size)
        weakref.finalize(cache, self.log, ("drop", cache.cache_id))
        return cache

    def log(self, op: tuple) -> None:
        """Queue a cache operation for the ranks (sent with the next step)."""
        with self._pending_lock:
            self._pending.append(op)

    def _take_log(self) -> list:
        with self._pending_lock:
            ops, self._pending = self._pending, []
        return ops

    # ------------------------------------------------------------------ sending
    def _send(self, msg: StepMessage) -> None:
        if self.failed:
            raise RankFailure(self.failed)
        if self.closed and msg.kind != "stop":  # the other ranks have stopped: no rank failed
            raise RuntimeError("this engine is closed: close() told the other ranks to stop (make a new one)")
        self.comm.broadcast_object(msg)
        self._last_sent = time.monotonic()

    def _fail(self, exc: RankFailure):
        self.failed = str(exc)
        if self.on_failure is not None:
            self.on_failure(self.failed)
        raise exc

    def _keep_alive(self) -> None:
        interval = max(0.5, min(self.comm.timeout, threading.TIMEOUT_MAX) / 4)
        while not self._stop_keepalive.wait(interval / 4):
            if self.closed or self.failed or time.monotonic() - self._last_sent < interval:
                continue
            if self._lock.acquire(blocking=False):
                try:
                    if not self.closed:
                        self._send(StepMessage("noop"))
                except RankFailure as exc:
                    self.failed = str(exc)
                    if self.on_failure is not None:
                        self.on_failure(self.failed)
                finally:
                    self._lock.release()

    def close(self) -> None:
        """Tell every rank to stop (idempotent; best effort when a rank has failed), then end the keep-alive
        thread: a daemon thread still alive when the interpreter finalises is ended inside whatever it runs,
        and ending it inside torch's C++ aborted rank 0 now and then ("terminate called without an active
        exception" after the last token, 1 run in 6 under load)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._stop_keepalive.set()
            if not self.failed:
                try:
                    self._send(StepMessage("stop"))
                except RankFailure:
                    pass
        if threading.current_thread() is not self._keepalive:
            self._keepalive.join(timeout=min(self.comm.timeout, threading.TIMEOUT_MAX))

    # ------------------------------------------------------------------ steps
    def _step(
        self, input_ids: torch.Tensor, cache: ClusterCache, batch: StepBatch, last_only: bool, taps: tuple[int, ...]
    ):
        dp = self.layout.dp
        ids = input_ids.tolist()
        slots, starts = batch.slots.tolist(), batch.start.tolist()
        rows_of = [[i for i, s in enumerate(slots) if s % dp == g] for g in range(dp)]
        groups = [
            ([slots[i] // dp for i in rows], [starts[i] for i in rows], [ids[i] for i in rows]) if rows else None
            for rows in rows_of
        ]
        B, T = input_ids.shape
        with self._lock:
            msg = StepMessage(
                "step",
                self._take_log(),
                cache.cache_id,
                groups,
                T,
                batch.keep_states,
                is_row_exact(),
                last_only,
                tuple(taps),
            )
            try:
                self._send(msg)
                own_logits, own_hidden = self.worker.handle(msg)
                Tout = 1 if last_only else T
                logits = torch.empty(B, Tout, self.cfg.vocab_size, dtype=torch.float32)
                hidden = {t: torch.empty(B, T, self.cfg.hidden_size, dtype=self.worker.dtype) for t in taps}
                for g, rows in enumerate(rows_of):
                    if not rows:
                        continue
                    if g == 0:
                        got, got_hidden = own_logits.cpu(), {t: own_hidden[t].cpu() for t in taps}
                    else:
                        leader = self.layout.leader(g)
                        got = self.comm.recv((len(rows), Tout, self.cfg.vocab_size), torch.float32, leader)
                        stacked = (
                            self.comm.recv((len(taps), len(rows), T, self.cfg.hidden_size), self.worker.dtype, leader)
                            if taps
                            else None
                        )
                        got_hidden = {t: stacked[j] for j, t in enumerate(taps)}
                    index = torch.tensor(rows)
                    logits[index] = got
                    for t in taps:
                        hidden[t][index] = got_hidden[t]
            except RankFailure as exc:
                self._fail(exc)
        self.stats["steps"] += 1
        device = input_ids.device
        logits = logits.to(device)
        return (logits[:, 0] if last_only else logits), {t: h.to(device) for t, h in hidden.items()}

    def rebalance(self, redundant: int = 0) -> dict:
        """Re-place the experts of every MoE layer for the load recorded so far (``RankWorker.rebalance``)."""
        if self.cfg.moe is None:
            raise ValueError(f"{self.cfg.family} model without routed experts: nothing to rebalance")
        most = self.cfg.moe.num_experts * (self.layout.ep - 1)
        if isinstance(redundant, bool) or not hasattr(type(redundant), "__index__"):  # every rank would fail on it
            raise TypeError(f"redundant experts must be an integer, got {type(redundant).__name__} {redundant!r}")
        redundant = operator.index(redundant)
        if not 0 <= redundant <= most:
            raise ValueError(
                f"redundant experts must be in 0..{most} (at most one replica of an expert per rank of the "
                f"{self.layout.ep}-rank expert group)"
            )
        with self._lock:
            msg = StepMessage("rebalance", self._take_log(), T=redundant)
            try:
                self._send(msg)
                placements, _ = self.worker.handle(msg)
            except RankFailure as exc:
                self._fail(exc)
        return placements

    def forward(self, input_ids: torch.Tensor, cache, batch: StepBatch | None, last_only: bool = False) -> torch.Tensor:
        if cache is None:  # cache-free scoring: a temporary cache of B slots from position 0
            cache = self.new_cache(num_slots=input_ids.shape[0])
            batch = cache.batch(list(range(input_ids.shape[0])), input_ids.shape[1])
        return self._step(input_ids, cache, batch, last_only, ())[0]

    def forward_hidden(self, input_ids: torch.Tensor, cache, batch: StepBatch, taps: tuple[int, ...]):
        return self._step(input_ids, cache, batch, False, tuple(taps))


# ----------------------------------------------------------------------------- building a rank


def check_rank_options(chunks, overlap, graphs) -> tuple[int | None, bool | None]:
    """(chunks, overlap) checked, before any weight loads: ``chunks`` an int >= 1 or None (the device's default),
    ``overlap`` a bool or None, ``graphs`` True, False, "auto" or "emulate" (a ValueError or TypeError
    otherwise: -1 chunks failed at the first MoE step, and a truthy "no" switched overlap or capture on)."""
    from nonstop.engine.inputs import check_flag, check_optional_count
    from nonstop.runtime.cuda_graph import check_graphs

    check_graphs(graphs)
    chunks = check_optional_count(chunks, "chunks", "the device's default")
    return chunks, None if overlap is None else check_flag(overlap, "overlap")


def build_worker(
    comm: Comm,
    cfg: ModelConfig,
    model_dir,
    dtype: torch.dtype,
    backend: str = "reference",
    seed: int = 0,
    chunks: int | None = None,
    overlap: bool | None = None,
    progress: bool = False,
    exchange: str = "auto",
    graphs="auto",
) -> RankWorker:
    """Load this rank's part of the model (sharded reads; random weights for a preset, drawn with rank 0's
    ``seed``: every rank calls this, and a rank's own seed is not used) and its executor (``exchange``: the MoE
    exchange mode, auto | static | dynamic; ``graphs``: CUDA-graph capture)."""
    from nonstop.dist.load import load_rank_state, random_rank_state
    from nonstop.dist.model import build_rank_model
    from nonstop.runtime.distributed import check_backend, check_exchange

    layout, rank, device = comm.layout, comm.rank, comm.device
    check_backend(backend, device, layout.world)
    check_exchange(exchange)
    chunks, overlap = check_rank_options(chunks, overlap, graphs)
    if model_dir is None and layout.world > 1:  # a follower given another seed drew other weights, silently
        seed = comm.broadcast_object(seed, "agreeing on the random weights' seed" + (" with rank 0" if rank else ""))

    def source(layout: Layout, only=None, progress=None) -> dict[str, torch.Tensor]:
        if model_dir is None:
            return random_rank_state(cfg, layout, rank, dtype, device, seed, only)
        return load_rank_state(cfg, layout, rank, model_dir, dtype, device, progress=progress, only=only)

    report = None
    if progress and rank == 0 and model_dir is not None:
        from nonstop.engine.llm import _progress_printer

        report = _progress_printer(f"loading rank 0's part of {model_dir} ({layout.describe(cfg.moe is not None)})")
    model = build_rank_model(cfg, layout, rank, source(layout, progress=report))
    gpu = device.type == "cuda"
    chunks = chunks or (2 if gpu else 1)
    overlap = gpu if overlap is None else overlap
    return RankWorker(comm, RankExecutor(comm, cfg, model, backend, chunks, overlap, exchange, graphs), dtype, source)


def print_failure_and_exit(message: str) -> None:
    """The CLI's ``on_failure``: its one line (on stderr, or left to the launcher of a launch:
    ``leave_failure``), then exit at once with status 3 (a broken group cannot be left cleanly)."""
    import os

    from nonstop.dist.launch import report_failure

    report_failure(f"nonstop: error: {message}")
    os._exit(3)
