"""Process groups of a layout and the collectives the Program uses, each guarded by a timeout.

``init(layout)`` joins the process group (env:// as torchrun and ``nonstop.dist.spawn`` set it: RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), gloo on CPU and NCCL on CUDA, then builds one group per
attention group (tp) and per expert group (ep) and a gloo ``control`` group over all ranks (step
messages and logits, CPU tensors even under NCCL). The ranks get at least ``RENDEZVOUS_S`` seconds to
meet (the store connection and every group's setup: ranks start seconds apart), whatever the collective
timeout; a rendezvous that fails is a ``RankFailure`` saying so. Every group's collectives then get the
collective timeout.

Every collective runs inside ``guard``: a failure (a rank died, a peer closed its connection, the
timeout passed) becomes a ``RankFailure`` naming this rank and the collective, so every rank stops
with a clear error in bounded time instead of hanging. Tokens move only through
``all_to_all_single`` (the list form fails on gloo for uneven sizes).

``stats`` counts the launches and the bytes this rank sends, per kind (all_reduce, gather, send, and the
MoE all-to-alls a2a_sizes / a2a_dispatch / a2a_combine: exactly the rows sent to other ranks;
all-reduce: the ring figure of ``program/cost.py``).
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import pickle
import re
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from nonstop.dist.layout import Layout
from nonstop.program.cost import all_reduce_wire_bytes

RENDEZVOUS_S = 60.0  # the least time the ranks get to join the process group and set up its groups


class RankFailure(RuntimeError):
    """Another rank died, hung or failed: this rank cannot continue (every rank exits)."""

    fatal = True


@dataclass
class Comm:
    layout: Layout
    rank: int
    device: torch.device
    timeout: float
    tp: object | None = None  # ProcessGroup of this rank's attention group (None: one rank)
    ep: object | None = None  # ProcessGroup of this rank's expert group (None: one rank)
    control: object | None = None  # gloo group over all ranks
    stats: dict = field(default_factory=lambda: defaultdict(lambda: [0, 0]))  # kind -> [launches, bytes sent]

    # ------------------------------------------------------------------ facts
    @property
    def tp_rank(self) -> int:
        return self.layout.tp_rank(self.rank)

    @property
    def ep_rank(self) -> int:
        return self.layout.ep_rank(self.rank)

    @property
    def dp_index(self) -> int:
        return self.layout.dp_index(self.rank)

    @property
    def leader(self) -> bool:
        """First rank of its attention group: it holds the gathered logits and returns them to rank 0."""
        return self.tp_rank == 0

    def count(self, kind: str, nbytes: float) -> None:
        s = self.stats[kind]
        s[0] += 1
        s[1] += nbytes

    @contextlib.contextmanager
    def guard(self, what: str):
        try:
            yield
        except RankFailure:
            raise
        except (RuntimeError, ConnectionError, OSError) as exc:
            raise RankFailure(
                f"rank {self.rank}: {what} failed ({_reason(exc)}); another rank has died, hung past the "
                f"{self.timeout:g} s collective timeout, or failed"
            ) from None

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, t: torch.Tensor) -> None:
        """Sum ``t`` in place over the attention group."""
        if self.tp is None:
            return
        with self.guard("all-reduce over the attention group"):
            dist.all_reduce(t, group=self.tp)
        self.count("all_reduce", all_reduce_wire_bytes(t.numel() * t.element_size(), self.layout.tp))

    def gather_to_leader(self, t: torch.Tensor) -> list[torch.Tensor] | None:
        """The attention group's ``t`` (same shape on every rank) on its first rank, in tp-rank order."""
        if self.tp is None:
            return [t]
        parts = [torch.empty_like(t) for _ in range(self.layout.tp)] if self.leader else None
        with self.guard("gather over the attention group"):
            dist.gather(t, parts, dst=self.layout.leader(self.dp_index), group=self.tp)
        self.count("gather", 0 if self.leader else t.numel() * t.element_size())
        return parts

    def all_to_all(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        async_op: bool = False,
        what: str = "all-to-all",
        kind: str = "all_to_all",
    ):
        """``all_to_all_single`` over the expert group (rows of ``inp`` split by ``in_splits`` to the
        group's ranks in order), counted under ``kind``; returns a handle whose ``wait()`` is guarded
        when ``async_op``."""
        row = math.prod(inp.shape[1:]) * inp.element_size()
        self.count(kind, (sum(in_splits) - in_splits[self.ep_rank]) * row)
        with self.guard(what):
            work = dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.ep, async_op=async_op)
        return _Guarded(work, self, what) if async_op else None

    # ------------------------------------------------------------------ the control channel (gloo, CPU)
    def broadcast_object(self, obj=None, what: str | None = None):
        """``obj`` from rank 0 to every rank (pickled); ``what`` names it in a failure (default: a step)."""
        box = [obj]
        what = what or ("receiving the next step from rank 0" if self.rank else "sending the step to the other ranks")
        with self.guard(what):
            dist.broadcast_object_list(box, src=0, group=self.control)
        if self.rank == 0 and getattr(obj, "kind", None) == "step":
            self.count("broadcast", (self.layout.world - 1) * len(pickle.dumps(obj)))
        return box[0]

    def all_reduce_control(self, t: torch.Tensor) -> None:
        """Sum a CPU tensor over all ranks on the control channel (bookkeeping such as expert load)."""
        with self.guard("summing over all ranks"):
            dist.all_reduce(t, group=self.control)

    def send(self, t: torch.Tensor, dst: int) -> None:
        with self.guard(f"sending results to rank {dst}"):
            dist.send(t.contiguous().cpu(), dst, group=self.control)
        self.count("send", t.numel() * t.element_size())

    def recv(self, shape, dtype, src: int) -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype)
        with self.guard(f"receiving results from rank {src}"):
            dist.recv(t, src, group=self.control)
        return t


def _reason(exc: BaseException) -> str:
    """The backend's error in one short line (gloo's source location and advice dropped)."""
    text = (str(exc).splitlines() or [type(exc).__name__])[0]
    text = re.sub(r"^\[[^\]]*\] ", "", text)
    return text.split(". This is typically")[0]


class _Guarded:
    """An async work handle whose ``wait`` turns failures into ``RankFailure``."""

    def __init__(self, work, comm: Comm, what: str):
        self.work, self.comm, self.what = work, comm, what

    def wait(self) -> None:
        with self.comm.guard(self.what):
            self.work.wait()


def _backend(device: torch.device, backend: str) -> str:
    if backend != "auto":
        return backend
    return "nccl" if device.type == "cuda" else "gloo"


def env_int(name: str, default: int) -> int:
    """The whole number in environment variable ``name`` (as torchrun and ``nonstop.dist.spawn`` set RANK,
    WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), ``default`` when unset; a ValueError naming it otherwise."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"the environment variable {name}={raw!r} is not a whole number") from None


def init(
    layout: Layout, device="cpu", timeout: float = 120.0, backend: str = "auto", rendezvous: float | None = None
) -> Comm:
    """Join the process group described by the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
    and build the layout's groups. ``device`` cpu or cuda (a CUDA rank uses cuda:LOCAL_RANK).
    ``timeout``: seconds a collective may wait for another rank; ``rendezvous``: seconds the ranks get to
    meet (default max(timeout, ``RENDEZVOUS_S``)); ``RankFailure`` naming the rendezvous when they do not."""
    rank, world = env_int("RANK", 0), env_int("WORLD_SIZE", 1)
    if world != layout.world:
        raise ValueError(f"the layout needs {layout.world} ranks ({layout.describe()}) but WORLD_SIZE is {world}")
    if not 0 <= rank < world:  # such a rank could only wait out the rendezvous
        raise ValueError(f"RANK {rank} is outside the {world} ranks of WORLD_SIZE (0 .. {world - 1})")
    meet = max(timeout, RENDEZVOUS_S) if rendezvous is None else rendezvous
    for name, seconds in (("timeout", timeout), ("rendezvous", meet)):
        if not 0 < seconds <= threading.TIMEOUT_MAX:  # also False for nan
            raise ValueError(f"{name} must be a number of seconds in (0, {threading.TIMEOUT_MAX:g}], got {seconds!r}")
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", env_int("LOCAL_RANK", rank))
        torch.cuda.set_device(dev)
    comm = Comm(layout, rank, dev, timeout)
    started = time.monotonic()
    try:
        _join(comm, world, _backend(dev, backend), datetime.timedelta(seconds=meet))
    except (RuntimeError, ConnectionError, OSError) as exc:  # c10d's DistNetworkError / DistStoreError among them
        where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
        took = time.monotonic() - started
        when = f"within {meet:g} s" if took >= 0.9 * meet else f"after {took:.1f} s (of the {meet:g} s allowed)"
        raise RankFailure(
            f"rank {rank}: the rendezvous with the other ranks at {where} failed {when} ({_reason(exc)})"
        ) from None
    for group in {dist.group.WORLD, comm.control, comm.tp, comm.ep} - {None}:
        dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=timeout), group)
    return comm


def _join(comm: Comm, world: int, data_backend: str, meet: datetime.timedelta) -> None:
    """Join the process group and build ``comm``'s groups, each given ``meet`` to form."""
    if not dist.is_initialized():
        dist.init_process_group(data_backend, init_method="env://", rank=comm.rank, world_size=world, timeout=meet)
    comm.control = (
        dist.new_group(list(range(world)), timeout=meet, backend="gloo") if data_backend != "gloo" else dist.group.WORLD
    )
    for ranks in comm.layout.tp_groups():
        g = dist.new_group(list(ranks), timeout=meet) if len(ranks) > 1 else None
        if comm.rank in ranks:
            comm.tp = g
    for ranks in comm.layout.ep_groups():
        g = dist.new_group(list(ranks), timeout=meet) if len(ranks) > 1 else None
        if comm.rank in ranks:
            comm.ep = g


def shutdown() -> None:
    """Leave the process group (if joined)."""
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
