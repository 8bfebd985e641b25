"""The collective super-ops of a rank's Program (``dist/program.py``): plain torch + torch.distributed.

``DistEnv`` is the ``StepEnv`` of a rank (buffers, cache, batch) plus its ``Comm``. ``TWINS`` run every
collective kind with the experts as plain torch (``routed_experts``: the reference executor);
``KERNEL_OPS`` run the local experts of ``moe_ep`` through the ``moe_experts`` Triton super-op (the
superop executor): each received row is routed to its one local expert with weight 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nonstop.dist.comm import Comm
from nonstop.dist.moe import moe_ep
from nonstop.model.moe import routed_experts
from nonstop.program.ir import SuperOp
from nonstop.program.reference import StepEnv

ONE_HOT_LOGIT = 30.0  # sigmoid/softmax of ±30 in fp32: the chosen expert's weight renormalises to exactly 1


@dataclass
class DistEnv(StepEnv):
    """A step's environment on a rank: its communicator; ``group_rows`` the rows of every attention group
    this step (every rank knows them from the step message: the static exchange's capacities);
    ``exchange`` the step's MoE exchange mode (dynamic | static)."""

    comm: Comm | None = None
    group_rows: tuple[int, ...] = ()
    exchange: str = "dynamic"
    pdl: bool = False

    @property
    def launch_kwargs(self) -> dict:
        return {}


def embed_shard(op, env):
    """target = rows of this rank's vocabulary part (ids outside it give zeros; the all-reduce after
    adds the parts)."""
    w = op.weights["embed"]
    local = env.buf["ids"] - op.attrs["vocab_start"]
    inside = (local >= 0) & (local < w.shape[0])
    rows = F.embedding(local.clamp(0, w.shape[0] - 1), w)
    env.buf[op.writes[0]].copy_(torch.where(inside[:, None], rows, torch.zeros_like(rows)))


def tp_all_reduce(op, env):
    env.comm.all_reduce(env.buf[op.writes[0]])


def vocab_gather(op, env):
    """logits [R, V] on the attention group's first rank = its ranks' vocabulary parts side by side."""
    parts = env.comm.gather_to_leader(env.buf[op.reads[0]].contiguous())
    if parts is not None:
        env.buf[op.writes[0]].copy_(torch.cat(parts, dim=-1)[:, : op.attrs["vocab"]])


def experts_twin(op, z: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """E_slot(z) per row [N, K] in z's dtype, as plain torch (``routed_experts`` with weight 1); rows of
    slot -1 (empty rows of the static exchange) are left out of the computation and give zeros."""
    filled = slots >= 0
    if not bool(filled.all()):  # reads the mask on the host: the twins are not captured
        out = torch.zeros_like(z)
        out[filled] = experts_twin(op, z[filled], slots[filled])
        return out
    a = op.attrs
    ones = torch.ones(z.shape[0], 1, dtype=torch.float32, device=z.device)
    return routed_experts(z, ones, slots[:, None], a["experts"], a["act"], a["beta"], a["linear_beta"])


def experts_kernel(op, z: torch.Tensor, slots: torch.Tensor, max_rows: int = 16) -> torch.Tensor:
    """E_slot(z) per row through the ``moe_experts`` Triton super-op over the local experts: logits are
    one-hot (+30 on the row's slot, -30 elsewhere) with top-1 routing, so the kernel weights each row's
    one expert by exactly 1. Launched on batches of exactly ``max_rows`` rows, the last one padded: a
    padding row, like an empty row (slot -1) of the static exchange, is routed to the expert of its
    batch's first row, so it selects no expert the batch does not already use and the real rows'
    results do not depend on how many such rows there are (their outputs are ignored). The batches and
    their launches are fixed by the row count alone: nothing is read back from the device."""
    from dataclasses import replace
    from types import SimpleNamespace

    from nonstop.kernels.moe import launch_moe_experts

    a = op.attrs
    n_local = a["local_experts"]
    local_cfg = replace(
        a["moe"],
        num_experts=n_local,
        top_k=1,
        num_groups=1,
        topk_groups=1,
        scoring="softmax",
        renormalize=True,
        routed_scaling_factor=1.0,
    )
    weights = {n: w for n, w in op.weights.items() if n != "bias"}
    local_op = SuperOp(
        op.name + ".local",
        "moe_experts",
        op.layer,
        ("moe_logits", "moe_in"),
        ("moe_out",),
        weights,
        {**a, "moe": local_cfg},
    )
    N = z.shape[0]
    padded = -(-N // max_rows) * max_rows
    if padded > N:
        z = torch.cat([z, z.new_zeros(padded - N, z.shape[1])])
        slots = torch.cat([slots, slots.new_full((padded - N,), -1)])
    batch_first = slots.view(-1, max_rows)[:, :1].clamp(min=0).expand(-1, max_rows).reshape(-1)
    slots = torch.where(slots >= 0, slots, batch_first)
    out = torch.empty_like(z)
    experts = torch.arange(n_local, device=z.device)
    for start in range(0, padded, max_rows):
        part, ids = z[start : start + max_rows].contiguous(), slots[start : start + max_rows]
        logits = torch.where(experts[None, :] == ids[:, None], ONE_HOT_LOGIT, -ONE_HOT_LOGIT).float()
        acc = torch.zeros(part.shape, dtype=torch.float32, device=z.device)
        launch_moe_experts(local_op, SimpleNamespace(buf={"moe_logits": logits, "moe_in": part, "moe_out": acc}))
        out[start : start + max_rows] = acc.to(z.dtype)
    return out[:N]


TWINS = {
    "embed_shard": embed_shard,
    "tp_all_reduce": tp_all_reduce,
    "vocab_gather": vocab_gather,
    "moe_ep": lambda op, env: moe_ep(op, env, experts_twin),
}
KERNEL_OPS = {**TWINS, "moe_ep": lambda op, env: moe_ep(op, env, experts_kernel)}
