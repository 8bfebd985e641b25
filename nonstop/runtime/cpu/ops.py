"""The super-op tables of the CPU executor: the Program's plain-torch twins, with the one twin that
cannot be traced into a compiled step replaced by an equivalent gathered form (``CPU_OPS``), and, where the
C++ kernels are built, one-token GQA attention in the ``decode_attention`` kernel (``CPU_KERNEL_OPS``).

``program/reference.moe_experts`` loops over the distinct experts chosen (a host sync and a
data-dependent loop). ``moe_experts_gathered`` computes every row's k chosen experts from weights
gathered by id - no host sync, the same math (``model.moe.select_experts``, ``model.activations.glu``)
and the same fp32 accumulation order (ascending expert id, as the reference's ``index_add_``).
"""

from __future__ import annotations

import torch

from nonstop.model.activations import glu
from nonstop.model.moe import select_experts
from nonstop.program.reference import REFERENCE


def _batched_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [N, k, in], w [N, k, out, in] -> [N, k, out]."""
    return torch.matmul(w, x[..., None])[..., 0]


def _gathered(w, ids: torch.Tensor) -> torch.Tensor:
    """Expert weights [E, out, in] (fp32 / bf16, or an int8 pair (Q, scales [E, out, 1])) gathered by
    ids [N, k] -> [N, k, out, in], in fp32 unless the stack is fp32-compatible already."""
    if isinstance(w, tuple):
        q, s = w
        return q[ids].float() * s[ids]
    return w[ids] if w.dtype == torch.float32 else w[ids].float()


def moe_experts_gathered(op, env):
    """moe_out += Σ_j p_j E_{id_j}(moe_in), the k experts of each row in ascending id order.

    E(x) = W2 glu(W1 x, W3 x); the stacked expert weights (``op.attrs["dense_experts"]``: w1/w3 [E, I, K],
    w2 [E, K, I]; MXFP4 checkpoints dequantised; int8 as (Q, scales)) are gathered per row: [N, k, ...]."""
    a = op.attrs
    weights, ids = select_experts(env.buf["moe_logits"], op.weights["bias"], a["moe"])
    ids, order = ids.sort(dim=-1)
    weights = weights.gather(1, order)
    x = env.buf["moe_in"]
    w1, w3, w2 = (_gathered(a["dense_experts"][n], ids) for n in ("w1", "w3", "w2"))
    xk = x[:, None, :].expand(-1, ids.shape[1], -1).to(w1.dtype)
    h = glu(_batched_linear(xk, w1), _batched_linear(xk, w3), a["act"], a["beta"], a["linear_beta"])
    y = _batched_linear(h, w2).float() * weights[..., None]
    acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for j in range(ids.shape[1]):
        acc = acc + y[:, j]
    env.buf[op.writes[0]].add_(acc.to(x.dtype))


def gqa_attn_decode(op, env):
    """``gqa_attn`` of a one-token step on an fp32 cache in the C++ kernel (``attention.cpp``): keys and values
    read in place from the pool rows of ``env.cache`` (a ``cache_view.TokenCacheView``) instead of gathered
    into a copy for two batched GEMMs. q [B, H·D] -> o [B, H·D]; other steps and dtypes: the twin."""
    a = op.attrs
    cache = env.cache.layers[a["cache_layer"]]
    q, k, v = env.buf[op.reads[0]], cache.tensors["k"], cache.tensors["v"]
    if env.T != 1 or any(t.dtype != torch.float32 for t in (q, k, v)):
        return REFERENCE["gqa_attn"](op, env)
    H, D = a["heads"], a["head_dim"]
    visible = env.batch.start + 1  # the query at position start sees keys 0..start
    o = torch.ops.nonstop_cpu.decode_attention(q.view(env.B, H, D), k, v, cache.read_rows, visible, D**-0.5)
    env.buf[op.writes[0]].copy_(o.reshape(-1, H * v.shape[-1]))


CPU_OPS = {**REFERENCE, "moe_experts": moe_experts_gathered}
CPU_KERNEL_OPS = {**CPU_OPS, "gqa_attn": gqa_attn_decode}
