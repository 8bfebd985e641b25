"""LM-head sampling on the device: the ``sample`` super-op (fp32 logits [R, V] -> next token ids [R]).

For the CUDA-graph / megakernel paths, where the step should end with token ids instead of logits. The
engine samples on the host today; this op is not in the lowered program. Its twin is
``REFERENCE["sample"]`` (``program/reference.py``), which picks the same tokens.

Per row r (all parameters are per-row buffers, so one launch serves a batch of different requests):
    temperature[r] == 0:  argmax_i logits[r, i]                           (first maximal index)
    otherwise:            argmax_{i in K} (x_i + g_i),  x = logits[r] / temperature[r]   (Gumbel-max)
where K = the finite entries of ``engine/sampling.filter_logits(logits[r], temperature, top_k, top_p)``
(top-k then top-p on the renormalised top-k distribution) and g the Gumbel noise of Philox4x32-10 with
key seed[r] and counter (i // 4, offset[r]) (``model/philox.gumbel_noise``). Gumbel-max over K draws
exactly from softmax(x) restricted to K; a caller advances ``offset`` every step (e.g. the request's
generated-token count + t for row t of a T-row verification step) and keeps ``seed`` per request.

How the kernel finds argmax over K without sorting the vocabulary. K is an upper set of the order
"larger x first, then smaller index" (a stable descending sort), so for any token j outside K, all of K
lies above j. The kernel takes j = argmax over all tokens, and while j is not in K replaces it by the
argmax over the tokens above j (same noise); the first j inside K is the answer. Membership of j:
    top-k:  #{x > x_j} < k                                   (ties at the k-th value are all kept)
    top-p:  mass above j  <  top_p · Z_k                     (masses e^{x - max}; Z_k = mass of the top-k set)
One pass over the row per candidate (the pass that tests j also finds the next candidate); usually
1-3 passes. Z_k (only when top-k and top-p are both on and two cheap bounds do not decide) comes from
a bisection for the k-th largest value on the monotone int32 image of fp32 (<= ~32 passes, once).

Tie order: the kernel breaks ties by index (stable sort). ``filter_logits`` uses ``torch.sort``, which
is not stable on CPU, so among tokens tied exactly at the top-p boundary its choice is arbitrary.

Tile function (one row per program):
``sample_tile(row, logits_ptr, stride_logits, temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, offset_ptr, out_ptr,
              V, BLOCK_Q)``
    logits [R, V] fp32; temperature, top_p [R] fp32; top_k, seed, offset, out [R] int64. A block holds
    BLOCK_Q Philox counters = 4·BLOCK_Q vocabulary entries (one Philox call yields 4 words).

Using it: ``op, specs = sample_op(vocab_size)`` gives the SuperOp and the buffers it needs; allocate them
next to the program's (``program.buffers.update(specs)`` before ``program.allocate``), fill
``sample_temperature / sample_top_k / sample_top_p / sample_seed / sample_offset`` per row, and run
``KERNELS["sample"](op, env)`` after the ``lm_head`` op; ``env.buf["next_ids"]`` then holds the tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nonstop.kernels.launch import launcher, pdl_launch_args
from nonstop.program.ir import BufferSpec, SuperOp

SAMPLE_READS = ("logits", "sample_temperature", "sample_top_k", "sample_top_p", "sample_seed", "sample_offset")
SAMPLE_WRITES = ("next_ids",)


def sample_op(vocab_size: int) -> tuple[SuperOp, dict[str, BufferSpec]]:
    """The ``sample`` SuperOp and the specs of its per-row buffers (``logits`` is the LM head's)."""
    specs = {
        "logits": BufferSpec("logits", (vocab_size,), "float32"),
        "sample_temperature": BufferSpec("sample_temperature", (), "float32"),
        "sample_top_k": BufferSpec("sample_top_k", (), "int64"),
        "sample_top_p": BufferSpec("sample_top_p", (), "float32"),
        "sample_seed": BufferSpec("sample_seed", (), "int64"),
        "sample_offset": BufferSpec("sample_offset", (), "int64"),
        "next_ids": BufferSpec("next_ids", (), "int64"),
    }
    return SuperOp("sample", "sample", None, SAMPLE_READS, SAMPLE_WRITES, {}, {"vocab_size": vocab_size}), specs


# ----------------------------------------------------------------------------- noise, keys, passes


@triton.jit
def gumbel_block(seed, off_lo, off_hi, quads, words):
    """[BLOCK_Q, 4] Gumbel noise of entries 4·quads + words: g = -log(-log u), u = (2·(w >> 9) + 1) / 2^24."""
    zero = quads.to(tl.uint32) * 0
    r0, r1, r2, r3 = tl.philox(seed, quads.to(tl.uint32), zero + off_lo, zero + off_hi, zero)
    w = words[None, :]
    bits = tl.where(w == 0, r0[:, None], tl.where(w == 1, r1[:, None], tl.where(w == 2, r2[:, None], r3[:, None])))
    u = ((bits >> 9) * 2 + 1).to(tl.float32) * (1.0 / 16777216.0)
    return -tl.log(-tl.log(u))


@triton.jit
def order_key(x):
    """Monotone int32 image of fp32 x (x < y  <=>  key(x) < key(y); -0.0 and 0.0 share key 0)."""
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return tl.where(x == 0, 0, key)


@triton.jit
def _load_tempered(row_ptr, q0, V, temperature, BLOCK_Q: tl.constexpr):
    """(x [BLOCK_Q, 4] = logits / T with -inf outside the row and at NaN, entry index, quads, words)."""
    quads = q0 + tl.arange(0, BLOCK_Q)
    words = tl.arange(0, 4)
    idx = quads[:, None] * 4 + words[None, :]
    logit = tl.load(row_ptr + idx, mask=idx < V, other=float("-inf"))
    x = tl.div_rn(logit, temperature)
    x = tl.where(x == x, x, float("-inf"))
    return x, idx, quads, words


@triton.jit
def _block_argmax(s, idx, best, best_idx):
    """Fold a block's scores s into the running (best score, first index attaining it)."""
    b = tl.max(tl.max(s, axis=1), axis=0)
    i = tl.min(tl.min(tl.where(s == b, idx, 2147483647), axis=1), axis=0)
    better = b > best
    return tl.where(better, b, best), tl.where(better, i, best_idx)


@triton.jit
def _greedy_pass(row_ptr, V, BLOCK_Q: tl.constexpr):
    best = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], 0, tl.int32)
    for q0 in range(0, tl.cdiv(V, 4), BLOCK_Q):
        x, idx, _, _ = _load_tempered(row_ptr, q0, V, 1.0, BLOCK_Q)
        best, best_idx = _block_argmax(x, idx, best, best_idx)
    return best_idx


@triton.jit
def _first_pass(row_ptr, V, temperature, seed, off_lo, off_hi, BLOCK_Q: tl.constexpr):
    """(max x, Z = Σ e^{x - max}, min x, argmax_i (x_i + g_i)) over the whole row."""
    m = tl.full([], float("-inf"), tl.float32)
    z = tl.full([], 0.0, tl.float32)
    lo = tl.full([], float("inf"), tl.float32)
    best = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], 0, tl.int32)
    for q0 in range(0, tl.cdiv(V, 4), BLOCK_Q):
        x, idx, quads, words = _load_tempered(row_ptr, q0, V, temperature, BLOCK_Q)
        m_new = tl.maximum(m, tl.max(tl.max(x, axis=1), axis=0))
        if m_new > float("-inf"):
            z = z * tl.exp(m - m_new) + tl.sum(tl.sum(tl.exp(x - m_new), axis=1), axis=0)
            m = m_new
        lo = tl.minimum(lo, tl.min(tl.min(tl.where(idx < V, x, float("inf")), axis=1), axis=0))
        s = x + gumbel_block(seed, off_lo, off_hi, quads, words)
        best, best_idx = _block_argmax(s, idx, best, best_idx)
    return m, z, lo, best_idx


@triton.jit
def _scan(row_ptr, V, temperature, seed, off_lo, off_hi, m, x_j, j, BLOCK_Q: tl.constexpr):
    """For the candidate j (value x_j): (#{x > x_j}, mass above j, mass of x >= x_j, the next candidate =
    argmax (x + g) over the tokens above j, or -1). "Above j": x > x_j, or x == x_j at a smaller index."""
    count = tl.full([], 0, tl.int32)
    above_mass = tl.full([], 0.0, tl.float32)
    ge_mass = tl.full([], 0.0, tl.float32)
    best = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], -1, tl.int32)
    for q0 in range(0, tl.cdiv(V, 4), BLOCK_Q):
        x, idx, quads, words = _load_tempered(row_ptr, q0, V, temperature, BLOCK_Q)
        greater = x > x_j
        above = greater | ((x == x_j) & (idx < j))
        e = tl.exp(x - m)
        count += tl.sum(tl.sum(greater.to(tl.int32), axis=1), axis=0)
        above_mass += tl.sum(tl.sum(tl.where(above, e, 0.0), axis=1), axis=0)
        ge_mass += tl.sum(tl.sum(tl.where(x >= x_j, e, 0.0), axis=1), axis=0)
        if tl.sum(tl.sum(above.to(tl.int32), axis=1), axis=0) > 0:  # no noise for blocks wholly below j
            s = tl.where(above, x + gumbel_block(seed, off_lo, off_hi, quads, words), float("-inf"))
            best, best_idx = _block_argmax(s, idx, best, best_idx)
    return count, above_mass, ge_mass, best_idx


@triton.jit
def _top_k_mass(row_ptr, V, temperature, m, k, lo_x, hi_x, BLOCK_Q: tl.constexpr):
    """Z_k = Σ_{x >= v_k} e^{x - m}, v_k the k-th largest x, known to lie in [lo_x, hi_x]: bisection on
    order keys, each bound snapped to a value present in the row."""
    lo = order_key(lo_x)
    hi = order_key(hi_x)
    while lo < hi:
        mid = (lo.to(tl.int64) + (hi.to(tl.int64) - lo.to(tl.int64) + 1) // 2).to(tl.int32)
        count = tl.full([], 0, tl.int32)
        up = tl.full([], 2147483647, tl.int32)
        down = tl.full([], -2147483647 - 1, tl.int32)
        for q0 in range(0, tl.cdiv(V, 4), BLOCK_Q):
            x, idx, _, _ = _load_tempered(row_ptr, q0, V, temperature, BLOCK_Q)
            key = order_key(x)
            valid = idx < V
            ge = valid & (key >= mid)
            count += tl.sum(tl.sum(ge.to(tl.int32), axis=1), axis=0)
            up = tl.minimum(up, tl.min(tl.min(tl.where(ge, key, 2147483647), axis=1), axis=0))
            down = tl.maximum(down, tl.max(tl.max(tl.where(valid & (key < mid), key, -2147483647 - 1), axis=1), axis=0))
        if count >= k:
            lo = up
        else:
            hi = down
    z = tl.full([], 0.0, tl.float32)
    for q0 in range(0, tl.cdiv(V, 4), BLOCK_Q):
        x, idx, _, _ = _load_tempered(row_ptr, q0, V, temperature, BLOCK_Q)
        z += tl.sum(tl.sum(tl.where(order_key(x) >= lo, tl.exp(x - m), 0.0), axis=1), axis=0)
    return z


# ----------------------------------------------------------------------------- the tile


@triton.jit
def sample_tile(
    row,
    logits_ptr,
    stride_logits,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    seed_ptr,
    offset_ptr,
    out_ptr,
    V,
    BLOCK_Q: tl.constexpr,
):
    """next token of one row; see the module docstring."""
    row_ptr = logits_ptr + row.to(tl.int64) * stride_logits
    temperature = tl.load(temperature_ptr + row)
    if temperature > 0:
        k = tl.load(top_k_ptr + row)
        p = tl.load(top_p_ptr + row)
        seed = tl.load(seed_ptr + row)
        offset = tl.load(offset_ptr + row)
        off_lo = (offset & 0xFFFFFFFF).to(tl.uint32)
        off_hi = ((offset >> 32) & 0xFFFFFFFF).to(tl.uint32)
        use_k = (k > 0) & (k < V)
        use_p = p < 1.0
        m, z, lo_x, j = _first_pass(row_ptr, V, temperature, seed, off_lo, off_hi, BLOCK_Q)
        z_k = tl.where(use_k, -1.0, z)  # -1: not known yet
        searching = use_k | use_p
        while searching:
            x_j = tl.div_rn(tl.load(row_ptr + j), temperature)
            count, above_mass, ge_mass, next_j = _scan(
                row_ptr, V, temperature, seed, off_lo, off_hi, m, x_j, j, BLOCK_Q
            )
            keep = (count < k) | (use_k == 0)
            if keep & use_p:
                if z_k < 0:
                    # bounds: mass(x >= x_j) <= Z_k <= Z; bisect for Z_k only when they do not decide
                    if (above_mass >= p * ge_mass) & (above_mass < p * z):
                        z_k = _top_k_mass(row_ptr, V, temperature, m, k, lo_x, x_j, BLOCK_Q)
                        keep = above_mass < p * z_k
                    else:
                        keep = above_mass < p * ge_mass
                else:
                    keep = above_mass < p * z_k
            searching = (keep == 0) & (next_j >= 0)
            if searching:
                j = next_j
    else:
        j = _greedy_pass(row_ptr, V, BLOCK_Q)
    tl.store(out_ptr + row, j.to(tl.int64))


sample_kernel = launcher(sample_tile)


def sample(op, env, BLOCK_Q: int | None = None):
    """next_ids [R] (int64) from logits [R, V] and the per-row sampling buffers (``SAMPLE_READS``)."""
    logits, temperature, top_k, top_p, seed, offset = (env.buf[n] for n in op.reads)
    out = env.buf[op.writes[0]]
    R, V = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1
    if BLOCK_Q is None:
        BLOCK_Q = min(1024, max(16, triton.next_power_of_2(triton.cdiv(V, 4))))
    sample_kernel[(R,)](
        logits,
        logits.stride(0),
        temperature,
        top_k,
        top_p,
        seed,
        offset,
        out,
        V,
        BLOCK_Q=BLOCK_Q,
        num_warps=8,
        **pdl_launch_args(env),
    )


KERNELS = {"sample": sample}
