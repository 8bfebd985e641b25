"""linear_residual written from scratch: target (+)= W a (+ b), fp32 accumulation, one program per BLOCK_N
output columns looping over the rows. Rounds as the twin: y = (W a + b) in the model dtype, then the
residual add in fp32 rounded once."""

import triton
import triton.language as tl


@triton.jit
def _gemv_rows(
    a_ptr,
    stride_a,
    w_ptr,
    stride_w,
    b_ptr,
    out_ptr,
    stride_out,
    R,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    for r in range(R):
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            kmask = ks < K
            a = tl.load(a_ptr + r * stride_a + ks, mask=kmask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols[:, None] * stride_w + ks[None, :], mask=cmask[:, None] & kmask[None, :], other=0.0)
            acc += tl.sum(w.to(tl.float32) * a[None, :], axis=1)
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        y = acc.to(w_ptr.dtype.element_ty).to(tl.float32)
        if ACCUMULATE:
            y += tl.load(out_ptr + r * stride_out + cols, mask=cmask, other=0.0).to(tl.float32)
        tl.store(out_ptr + r * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=cmask)


def launch(op, env):
    a, out, w = env.buf[op.reads[0]], env.buf[op.writes[0]], op.weights["w"]
    b = op.weights.get("b")
    R, K = a.shape
    N = w.shape[0]
    BLOCK_N = 16
    _gemv_rows[(triton.cdiv(N, BLOCK_N),)](
        a,
        a.stride(0),
        w,
        w.stride(0),
        b if b is not None else w,
        out,
        out.stride(0),
        R,
        N,
        K,
        HAS_BIAS=b is not None,
        ACCUMULATE=False,
        BLOCK_N=BLOCK_N,
        BLOCK_K=32,
    )
