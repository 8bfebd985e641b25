"""The ``moe_ep`` super-op: routed experts over an expert group, with uneven all-to-all exchanges.

On each rank, for its share of the step's rows (rows [lo, hi) of its attention group, contiguous parts):
1. route: weights, ids [n, k] = select_experts(logits, bias) (``model/moe.py``, the one routing rule);
2. place: every (row, j) pair -> a replica of expert ids[row, j] (``ExpertPlacement.route``): destination
   rank and local expert slot there;
3. cut the pairs, in (row, j) order, into ``chunks`` contiguous pieces; sort each piece by
   (destination, local slot); exchange split sizes [dest, chunk, slot] once (int32 ``all_to_all_single``),
   so every rank knows how many rows of which local expert it will get from whom;
4. per chunk: dispatch the expert inputs (K3: the latent z, not x), run the local experts on what
   arrived, send the outputs back (combine). With ``overlap`` chunk c+1's dispatch is in flight while
   chunk c's experts run, and chunk c's combine while chunk c+1's experts run (async handles: gloo
   work on CPU, NCCL's stream on GPU); without it the chunks run one after another. The same chunks
   compute the same values either way, so the outputs are identical;
5. combine in the reference order: u[row] = Σ_j p_j E_j(z) summed in fp32 in increasing expert id
   (as ``routed_experts`` does), rounded to the model dtype, added to moe_out.

Rows outside this rank's share keep moe_out = 0 (their owner computes them; the residual all-reduce
after ``moe_tail`` adds them up). ``op.attrs["load"]`` counts the pairs routed to each logical expert
(the input of ``ExpertPlacement.rebalanced``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nonstop.dist.layout import split_range
from nonstop.model.moe import select_experts

LocalExperts = Callable[[object, torch.Tensor, torch.Tensor], torch.Tensor]  # (op, z [N, K], slot [N]) -> [N, K]


def _plan(op, logits: torch.Tensor):
    """Routing of this rank's rows: (weights [n, k], ids [n, k], dest [n·k], slot [n·k], chunk [n·k])."""
    a = op.attrs
    weights, ids = select_experts(logits, op.weights["bias"], a["moe"])
    pairs = ids.reshape(-1)
    load = a.setdefault("load", torch.zeros(a["moe"].num_experts, dtype=torch.long))
    load += torch.bincount(pairs.cpu(), minlength=load.shape[0])
    dest, slot = a["placement"].route(pairs, a["ep_rank"])
    n, C = pairs.shape[0], a["chunks"]
    chunk = torch.arange(n) * C // max(n, 1)
    return weights, ids, dest, slot, chunk


def moe_ep(op, env, local_experts: LocalExperts) -> None:
    a = op.attrs
    comm = env.comm
    x, logits, out = env.buf["moe_in"], env.buf["moe_logits"], env.buf[op.writes[0]]
    lo, hi = split_range(x.shape[0], a["tp_ranks"], a["tp_rank"])
    weights, ids, dest, slot, chunk = _plan(op, logits[lo:hi])
    E, L, C = a["ep_ranks"], max(1, a["max_local"]), a["chunks"]
    key = (chunk * E + dest) * L + slot
    order = torch.argsort(key, stable=True)
    sends = torch.bincount(key, minlength=C * E * L).view(C, E, L)  # pairs to (chunk, dest, slot)
    k = ids.shape[1]
    device = x.device
    z = x[lo:hi][order.to(device) // k] if order.numel() else x[:0]
    if E > 1:
        recvs = torch.empty(E, C, L, dtype=torch.int32)
        comm.all_to_all(recvs, sends.permute(1, 0, 2).contiguous().to(torch.int32), [1] * E, [1] * E, what="MoE split-size exchange")
    else:
        recvs = sends.permute(1, 0, 2).to(torch.int32)
    send_rows = sends.sum(-1)  # [C, E]
    recv_rows = recvs.sum(-1).transpose(0, 1)  # [C, E(src)]
    starts = torch.cat([torch.zeros(1, dtype=torch.long), send_rows.sum(-1).cumsum(0)]).tolist()
    back = torch.empty_like(z)
    inbox: dict[int, torch.Tensor] = {}
    pending: list = []

    def dispatch(c: int):
        payload = z[starts[c] : starts[c + 1]]
        inbox[c] = torch.empty(int(recv_rows[c].sum()), z.shape[1], dtype=z.dtype, device=device)
        if E == 1:
            inbox[c].copy_(payload)
            return None
        return comm.all_to_all(inbox[c], payload, recv_rows[c].tolist(), send_rows[c].tolist(), async_op=True, what="MoE dispatch")

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
        return comm.all_to_all(target, y.contiguous(), send_rows[c].tolist(), recv_rows[c].tolist(), async_op=True, what="MoE combine")

    overlap = a["overlap"] and E > 1
    inflight = {0: dispatch(0)} if overlap else {}
    for c in range(C):
        if not overlap:
            inflight[c] = dispatch(c)
        elif c + 1 < C:
            inflight[c + 1] = dispatch(c + 1)
        if inflight[c] is not None:
            inflight[c].wait()
        work = combine(c, compute(c))
        if work is not None:
            if overlap:
                pending.append(work)
            else:
                work.wait()
    for work in pending:
        work.wait()
    if hi == lo:
        return
    y = torch.empty_like(back)
    y[order.to(device)] = back
    y = y.view(hi - lo, k, -1)
    by_id = ids.argsort(dim=1).to(device)  # each row's experts in increasing id: the reference's summation order
    acc = torch.zeros(hi - lo, y.shape[-1], dtype=torch.float32, device=device)
    rows = torch.arange(hi - lo, device=device)
    w = weights.to(device)
    for j in range(k):
        col = by_id[:, j]
        acc += y[rows, col].float() * w[rows, col, None]
    out[lo:hi] += acc.to(x.dtype)
