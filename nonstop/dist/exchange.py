"""The MoE token exchange's static mode, and the choice between it and the dynamic mode.

dynamic (``moe.py``): the split sizes [chunk, local expert] are exchanged first and read on the host, then
    ``all_to_all_single`` moves exactly the (token, expert) pairs, with uneven splits that change every step.
static: the way low-latency expert-parallel kernels (DeepEP's) make the exchange capturable. Per chunk every
    rank sends every rank of its expert group a fixed-capacity buffer: ``static_capacity`` rows, the most
    pairs it can send there (``program/cost.py``: from the rows it routes this step, top-k and the experts
    the peer holds). Every rank derives every capacity from the step's rows per attention group (in every
    rank's step message) and the placement: the split sizes are Python integers fixed for a step shape, no
    size is exchanged, nothing is read back from the device. A buffer row is [int32 local expert slot (-1:
    empty) | z row] as bytes; on arrival the filled rows are moved first (a stable sort: the order the
    dynamic mode receives them in), the local experts run, and each output goes back in the row it came in.
    Per pair, the same expert runs on the same input as in the dynamic mode: the outputs are bit-identical.

``choose_exchange`` (the engine's ``auto``): static where it is required (CUDA-graph capture) or cheaper
under the link model of the expert group (gloo: measured; NCCL: public link figures and estimates, pending
a GPU measurement); every rank of an expert group decides the same from the same facts (the step's rows
per attention group, layout, placement, device type).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nonstop.program.cost import SLOT_ID_BYTES, routed_rows, static_capacity, static_splits

REQUESTS = ("auto", "static", "dynamic")


@dataclass(frozen=True)
class LinkModel:
    """Time of one ``all_to_all_single`` over E ranks in which a rank sends b bytes:
    collective_s + per_peer_s·(E - 1) + b / bytes_per_s; ``host_sync_s``: what reading the dynamic
    mode's split sizes on the host costs besides (a device drains its launch queue meanwhile)."""

    collective_s: float
    per_peer_s: float
    bytes_per_s: float
    host_sync_s: float
    source: str

    def seconds(self, ranks: int, nbytes: float) -> float:
        return self.collective_s + self.per_peer_s * (ranks - 1) + nbytes / self.bytes_per_s


# gloo on this project's 2-core CPU machines (it sends to the peers in turn): bench/dist_link.py fits 300 us
# per call and 0.86 GB/s at world 2, 660 us per peer and 1.05 GB/s at world 4 (4 processes on 2 busy cores)
GLOO_CPU = LinkModel(0.0, 300e-6, 0.85e9, 0.0, "gloo measured by bench/dist_link.py")
# NCCL: no GPU was lent, so nothing here is measured (pending). Bandwidth per GPU and direction from the
# planner's public H100 figures (nonstop/plan/chips.json: NVLink 450 GB/s inside an 8-GPU node, InfiniBand
# NDR 50 GB/s across nodes); estimate: ~10 us for a small NCCL all-to-all and ~20 us for a device-to-host
# read of the sizes and the idle device while the next kernels are launched.
NCCL_NODE = LinkModel(10e-6, 0.0, 450e9, 20e-6, "NCCL estimate inside a node (pending a GPU measurement)")
NCCL_NODES = LinkModel(10e-6, 0.0, 50e9, 20e-6, "NCCL estimate across nodes (pending a GPU measurement)")
NODE_GPUS = 8


def link_for(device_type: str, ranks: int) -> LinkModel:
    """The link model of an expert group of ``ranks`` ranks on ``device_type``."""
    if device_type != "cuda":
        return GLOO_CPU
    return NCCL_NODE if ranks <= NODE_GPUS else NCCL_NODES


# ----------------------------------------------------------------------------- the choice


def _group_bytes(op, group_rows: tuple[int, ...], width_bytes: int) -> tuple[float, float]:
    """(dynamic, static) payload bytes the ranks of ``op``'s expert group send in one step of this op, in
    all: dynamic the expected remote pairs (uniform routing) each way, static the buffers. The dynamic mode's
    split sizes travel in an all-to-all of their own, which ``choose_exchange`` costs on its own side."""
    a = op.attrs
    E, k, C, placement = a["ep_ranks"], a["top_k"], a["chunks"], a["placement"]
    routed = routed_rows(group_rows, a["tp_ranks"], E, a["rank"])
    held = [len(set(s)) for s in placement.slots]
    dynamic = sum(n * k * (1 - placement.local_fraction(s)) for s, n in enumerate(routed)) * 2 * width_bytes
    static = 0
    for s, n in enumerate(routed):
        other = [static_capacity(n, k, C, held[d]) for d in range(E) if d != s]
        static += C * sum(other) * (2 * width_bytes + SLOT_ID_BYTES)
    return dynamic, static


def choose_exchange(
    requested: str, ops, group_rows: tuple[int, ...], max_rows: int, device_type: str, required: bool, width_bytes: int
) -> tuple[str, str]:
    """(mode, reason) for a step whose attention groups have ``group_rows`` rows: ``requested`` unless
    auto; auto is dynamic for steps of more than ``max_rows`` rows in a group (prefill: the buffers would
    grow with the prompt), static when ``required`` (the step is captured in a CUDA graph), else static
    when the padding costs less time on the expert group's link (``link_for``) than what the dynamic mode
    spends per MoE layer on its split-size exchange and the host read of the sizes."""
    if requested != "auto":
        return requested, "asked for"
    if max(group_rows, default=0) > max_rows:
        return "dynamic", f"more than {max_rows} rows in an attention group (prefill)"
    if required:
        return "static", "the step is captured in a CUDA graph: no split size may be read on the host"
    moe = [op for op in ops if op.kind == "moe_ep" and op.attrs["ep_ranks"] > 1]
    if not moe:
        return "dynamic", "no token exchange between ranks"
    padding = saved = 0.0
    for op in moe:
        E = op.attrs["ep_ranks"]
        link = link_for(device_type, E)
        dynamic, static = _group_bytes(op, group_rows, width_bytes)
        padding += (static - dynamic) / E / link.bytes_per_s
        saved += link.seconds(E, (E - 1) * op.attrs["chunks"] * max(1, op.attrs["max_local"]) * 4) + link.host_sync_s
    verdict = "<" if padding < saved else ">="
    reason = (
        f"static padding {padding * 1e6:.0f} us {verdict} dynamic split-size exchanges and host reads "
        f"{saved * 1e6:.0f} us per step; {link.source}"
    )
    return ("static" if padding < saved else "dynamic"), reason


# ----------------------------------------------------------------------------- the static exchange


@dataclass
class StaticPlan:
    """A step shape's fixed split sizes (rows per chunk): send[d] to ep rank d, recv[s] from s;
    ``offsets`` [E] (device) where each destination's rows start in a chunk's send buffer."""

    send: list[int]
    recv: list[int]
    offsets: torch.Tensor

    @property
    def send_rows(self) -> int:
        return sum(self.send)

    @property
    def recv_rows(self) -> int:
        return sum(self.recv)


def static_plan(op, group_rows: tuple[int, ...], device) -> StaticPlan:
    """The plan of ``op`` for a step of ``group_rows`` rows per attention group (made once per step shape,
    kept in ``op.attrs["static_plans"]``)."""
    plans = op.attrs.setdefault("static_plans", {})
    key = (tuple(group_rows), str(device))
    if key not in plans:
        send, recv = static_splits(op, tuple(group_rows))
        offsets = torch.zeros(len(send), dtype=torch.long, device=device)
        for d in range(1, len(send)):  # filled in place (no upload of host data: capturable too)
            offsets[d] = sum(send[:d])
        plans[key] = StaticPlan(send, recv, offsets)
    return plans[key]


def buffer_rows(
    dest: torch.Tensor, slot: torch.Tensor, chunk: torch.Tensor, ep: int, local: int, chunks: int, plan: StaticPlan
) -> tuple[torch.Tensor, torch.Tensor]:
    """(order [P], row [P]): the pairs sorted by (chunk, destination, local slot) (stable: the dynamic
    mode's order), and the row of each sorted pair in the send buffer [chunks · send_rows]: its chunk's
    block, its destination's part, then its place among that part's pairs."""
    bucket = chunk * ep + dest
    order = torch.argsort(bucket * local + slot, stable=True)
    b = bucket[order]
    counts = torch.zeros(chunks * ep, dtype=torch.long, device=dest.device).index_add_(0, b, torch.ones_like(b))
    place = torch.arange(b.shape[0], device=dest.device) - (counts.cumsum(0) - counts)[b]
    return order, chunk[order] * plan.send_rows + plan.offsets[dest[order]] + place


def pack(z: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor, total: int) -> torch.Tensor:
    """The send buffer [total, 4 + K·bytes] (uint8): row rows[i] = [slots[i] as int32 | z[i]], the other
    rows [-1 | zeros]."""
    ids = torch.full((total, 1), -1, dtype=torch.int32, device=z.device)
    ids[rows, 0] = slots.to(torch.int32)
    body = torch.zeros(total, z.shape[1], dtype=z.dtype, device=z.device)
    body[rows] = z
    return torch.cat([ids.view(torch.uint8), body.view(torch.uint8)], dim=1)


def unpack(buf: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots [N] long (-1: empty), z [N, K]) of received buffer rows [N, 4 + K·bytes]."""
    slots = buf[:, :SLOT_ID_BYTES].contiguous().view(torch.int32).view(-1).long()
    return slots, buf[:, SLOT_ID_BYTES:].contiguous().view(dtype)


def filled_first(slots: torch.Tensor) -> torch.Tensor:
    """Permutation putting the filled rows (slot >= 0) first, each part in arrival order."""
    return torch.argsort((slots < 0).to(torch.int32), stable=True)
