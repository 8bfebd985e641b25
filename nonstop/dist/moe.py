"""The ``moe_ep`` super-op: routed experts over an expert group, tokens exchanged by ``all_to_all_single``.

On each rank, for its share of the step's rows (rows [lo, hi) of its attention group, contiguous parts):
1. route: weights, ids [n, k] = select_experts(logits, bias) (``model/moe.py``, the one routing rule);
2. place: every (row, j) pair -> a replica of expert ids[row, j] (``ExpertPlacement.route``): destination
   rank and local expert slot there;
3. cut the pairs, in (row, j) order, into ``chunks`` contiguous pieces; sort each piece by
   (destination, local slot);
4. per chunk: dispatch the expert inputs (K3: the latent z, not x), run the local experts on what
   arrived, send the outputs back (combine). With ``overlap`` chunk c+1's dispatch is in flight while
   chunk c's experts run, and chunk c's combine while chunk c+1's experts run (async handles: gloo
   work on CPU, NCCL's stream on GPU); without it the chunks run one after another. The same chunks
   compute the same values either way, so the outputs are identical;
5. combine in the reference order: u[row] = Σ_j p_j E_j(z) summed in fp32 in increasing expert id
   (as ``routed_experts`` does), rounded to the model dtype, added to moe_out.

Step 4 runs in the step's exchange mode (``env.exchange``, chosen by ``dist/exchange.py``):
* dynamic: the split sizes [dest, chunk, slot] are exchanged once (int32 ``all_to_all_single``) and read
  on the host, then every chunk moves exactly its pairs (uneven splits);
* static: every chunk moves fixed-capacity buffers whose rows carry their local expert slot
  (``exchange.py``): the same split sizes every step of a shape, no host synchronisation, capturable.
A pair meets the same expert with the same input in both modes: the outputs are bit-identical.

Rows outside this rank's share keep moe_out = 0 (their owner computes them; the residual all-reduce
after ``moe_tail`` adds them up). ``op.attrs["load"]`` counts the pairs routed to each logical expert
(the input of ``ExpertPlacement.rebalanced``; on the data device).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nonstop.dist.exchange import buffer_rows, filled_first, pack, static_plan, unpack
from nonstop.dist.layout import split_range
from nonstop.model.moe import select_experts

# (op, z [N, K], local expert slot [N]; -1: an empty row of the static exchange, its output ignored) -> [N, K]
LocalExperts = Callable[[object, torch.Tensor, torch.Tensor], torch.Tensor]


def _route(op, logits: torch.Tensor):
    """Routing of this rank's rows: (weights [n, k], ids [n, k], dest [n·k], slot [n·k], chunk [n·k]),
    all on the data device."""
    a = op.attrs
    weights, ids = select_experts(logits, op.weights["bias"], a["moe"])
    pairs = ids.reshape(-1)
    load = a.get("load")
    if load is None:
        load = a["load"] = torch.zeros(a["moe"].num_experts, dtype=torch.long, device=pairs.device)
    load.index_add_(0, pairs, torch.ones_like(pairs))
    dest, slot = a["placement"].route(pairs, a["ep_rank"])
    n = pairs.shape[0]
    chunk = torch.arange(n, device=pairs.device) * a["chunks"] // max(n, 1)
    return weights, ids, dest, slot, chunk


def moe_ep(op, env, local_experts: LocalExperts) -> None:
    a = op.attrs
    x, logits, out = env.buf["moe_in"], env.buf["moe_logits"], env.buf[op.writes[0]]
    lo, hi = split_range(x.shape[0], a["tp_ranks"], a["tp_rank"])
    weights, ids, dest, slot, chunk = _route(op, logits[lo:hi])
    exchange = static_exchange if getattr(env, "exchange", "dynamic") == "static" else dynamic_exchange
    y = exchange(op, env, x[lo:hi], ids.shape[1], dest, slot, chunk, local_experts)  # [n·k, K], (row, j) order
    if hi > lo:
        out[lo:hi] += weighted_sum(y.view(hi - lo, ids.shape[1], -1), weights, ids).to(x.dtype)


def weighted_sum(y: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Σ_j p_j y[:, j] [n, K] in fp32, j in increasing expert id (the reference's order): y [n, k, K]."""
    n = y.shape[0]
    by_id = ids.argsort(dim=1)
    acc = torch.zeros(n, y.shape[-1], dtype=torch.float32, device=y.device)
    rows = torch.arange(n, device=y.device)
    for j in range(ids.shape[1]):
        col = by_id[:, j]
        acc += y[rows, col].float() * weights[rows, col, None]
    return acc


def run_chunks(chunks: int, overlap: bool, dispatch, compute, combine) -> None:
    """The chunk pipeline: dispatch(c) and combine(c, y) return a work handle (or None when done); with
    ``overlap`` chunk c+1's dispatch and chunk c's combine stay in flight while the next experts run."""
    pending: list = []
    inflight = {0: dispatch(0)} if overlap else {}
    for c in range(chunks):
        if not overlap:
            inflight[c] = dispatch(c)
        elif c + 1 < chunks:
            inflight[c + 1] = dispatch(c + 1)
        work = inflight.pop(c)
        if work is not None:
            work.wait()
        work = combine(c, compute(c))
        if work is not None:
            if overlap:
                pending.append(work)
            else:
                work.wait()
    for work in pending:
        work.wait()


def dynamic_exchange(op, env, xs, k: int, dest, slot, chunk, local_experts: LocalExperts) -> torch.Tensor:
    """Split sizes exchanged and read on the host, then the pairs with uneven splits; returns each pair's
    expert output [n·k, K] in (row, j) order."""
    a, comm, device = op.attrs, env.comm, xs.device
    E, L, C = a["ep_ranks"], max(1, a["max_local"]), a["chunks"]
    key = (chunk * E + dest) * L + slot
    order = torch.argsort(key, stable=True)
    sends = torch.zeros(C * E * L, dtype=torch.long, device=device).index_add_(0, key, torch.ones_like(key))
    sends = sends.view(C, E, L)
    z = xs[order // k]
    if E > 1:  # on the data device (NCCL exchanges CUDA tensors), read back to the host for the split sizes
        recvs = torch.empty(E, C, L, dtype=torch.int32, device=device)
        sizes = sends.permute(1, 0, 2).to(torch.int32).contiguous()
        comm.all_to_all(recvs, sizes, [1] * E, [1] * E, what="MoE split-size exchange", kind="a2a_sizes")
        recvs = recvs.cpu()
    else:
        recvs = sends.permute(1, 0, 2).to(torch.int32)
    sends = sends.cpu()
    send_rows = sends.sum(-1)  # [C, E]
    recv_rows = recvs.sum(-1).transpose(0, 1)  # [C, E(src)]
    starts = torch.cat([torch.zeros(1, dtype=torch.long), send_rows.sum(-1).cumsum(0)]).tolist()
    back = torch.empty_like(z)
    inbox: dict[int, torch.Tensor] = {}

    def dispatch(c: int):
        payload = z[starts[c] : starts[c + 1]]
        inbox[c] = torch.empty(int(recv_rows[c].sum()), z.shape[1], dtype=z.dtype, device=device)
        if E == 1:
            inbox[c].copy_(payload)
            return None
        return comm.all_to_all(
            inbox[c],
            payload,
            recv_rows[c].tolist(),
            send_rows[c].tolist(),
            async_op=True,
            what="MoE dispatch",
            kind="a2a_dispatch",
        )

    def compute(c: int) -> torch.Tensor:
        got = inbox.pop(c)
        if got.shape[0] == 0:
            return got
        slots = torch.cat([torch.repeat_interleave(torch.arange(L), recvs[s, c].long()) for s in range(E)]).to(device)
        return local_experts(op, got, slots)

    def combine(c: int, y: torch.Tensor):
        target = back[starts[c] : starts[c + 1]]
        if E == 1:
            target.copy_(y)
            return None
        return comm.all_to_all(
            target,
            y.contiguous(),
            send_rows[c].tolist(),
            recv_rows[c].tolist(),
            async_op=True,
            what="MoE combine",
            kind="a2a_combine",
        )

    run_chunks(C, a["overlap"] and E > 1, dispatch, compute, combine)
    y = torch.empty_like(back)
    y[order] = back
    return y


def static_exchange(op, env, xs, k: int, dest, slot, chunk, local_experts: LocalExperts) -> torch.Tensor:
    """Fixed-capacity buffers per chunk and peer, rows tagged with their local expert slot (``exchange.py``);
    no host synchronisation. Returns each pair's expert output [n·k, K] in (row, j) order."""
    a, comm, device = op.attrs, env.comm, xs.device
    E, L, C = a["ep_ranks"], max(1, a["max_local"]), a["chunks"]
    plan = static_plan(op, env.group_rows, device)
    S, R = plan.send_rows, plan.recv_rows
    order, rows = buffer_rows(dest, slot, chunk, E, L, C, plan)
    payload = pack(xs[order // k], slot[order], rows, C * S)
    inbox = torch.empty(C * R, payload.shape[1], dtype=payload.dtype, device=device)
    back = torch.empty(C * S, xs.shape[1], dtype=xs.dtype, device=device)

    def dispatch(c: int):
        part, target = payload[c * S : (c + 1) * S], inbox[c * R : (c + 1) * R]
        if E == 1:
            target.copy_(part)
            return None
        return comm.all_to_all(
            target, part, plan.recv, plan.send, async_op=True, what="MoE dispatch", kind="a2a_dispatch"
        )

    def compute(c: int) -> torch.Tensor:
        slots, z = unpack(inbox[c * R : (c + 1) * R], xs.dtype)
        if R == 0:
            return z
        first = filled_first(slots)
        y = torch.empty_like(z)
        y[first] = local_experts(op, z[first], slots[first])
        return y

    def combine(c: int, y: torch.Tensor):
        target = back[c * S : (c + 1) * S]
        if E == 1:
            target.copy_(y)
            return None
        return comm.all_to_all(target, y, plan.send, plan.recv, async_op=True, what="MoE combine", kind="a2a_combine")

    run_chunks(C, a["overlap"] and E > 1, dispatch, compute, combine)
    y = torch.empty(order.shape[0], xs.shape[1], dtype=xs.dtype, device=device)
    y[order] = back[rows]
    return y
