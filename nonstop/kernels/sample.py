"""LM-head sampling on the device: the ``sample`` super-op (fp32 logits [R, V] -> next token ids [R]).

For the CUDA-graph / megakernel paths, where the step ends with token ids instead of logits. Its twin is
``REFERENCE["sample"]`` (``program/reference.py``), which picks the same tokens.

Per row r (all parameters are per-row buffers, so one launch serves a batch of different requests):
    temperature[r] == 0:  argmax_i logits[r, i]                           (first maximal index)
    otherwise:            argmax_{i in K} (x_i + g_i),  x = logits[r] / temperature[r]   (Gumbel-max)
where K = the finite entries of ``model/sampling.filter_logits(logits[r], temperature, top_k, top_p)``
(top-k, then top-p on the renormalised top-k distribution) and g the Gumbel noise of Philox4x32-10 with
key seed[r] and counter (i // 4, offset[r]) (``model/philox.gumbel_noise``). Gumbel-max over K draws
exactly from softmax(x) restricted to K; a caller advances ``offset`` every step and keeps ``seed`` per
request. K is an upper set of the order "larger x first, then smaller index" (a stable descending
sort): ties break by index.

Three phases spread the vocabulary over many programs (``launch.py``'s protocol):
  1 ``scan`` - tile (r, c): chunk c (CHUNK entries) of row r: its max m_c of x, Z_c = Σ e^{x - m_c}, the
    best score (x, or x + g when sampling) with its first index, and - when the row filters (top-k / top-p)
    - its KC largest entries and its SC best scorers (largest x + g), both as stable-order keys
    (``stable_key``: value, then index).
  2 ``verify`` - tile (r, c), filtered rows: the row's SC best scorers j (merged from its chunks' lists) and,
    over chunk c, #{x > x_j}, #{x >= x_j}, the mass above j in the stable order and the mass of x >= x_j
    (masses e^{x - m}, m the row's max).
  3 ``pick`` - tile r: greedy and unfiltered rows take the best score over the chunks (first index on
    ties). Filtered rows merge the chunks' lists (one sort), decide top-k (x >= the k-th value) and top-p
    (mass above < top_p · Z_k, Z_k the mass of the top-k set, or of the row from the chunks' Z_c) on the
    merged list, and take Gumbel-max over the kept entries. That is exact when no token outside the lists
    could belong: every chunk whose list is full ends below the kept set and, with top-k, below the k-th
    value (path 1). Otherwise (more than KC kept tokens in one chunk: a flat row under top-p, a chunk holding
    most of the top-k) the draw is the best scorer in the kept set (``scorer_pick``, path 2): the global
    best scorers are among the chunks' lists, and their membership follows exactly from the verified sums
    (top-k: fewer than k larger values; top-p: mass above under top_p · Z_k, Z_k bounded by the scorers'
    masses). Only when none of them is known to be kept first (a kept set of small mass - top-k on a flat
    chunk cluster - or top-k and top-p together with Z_k left open) the tile runs the one-program search
    over the row (``sample_row_search``, path 3): start from argmax (x + g), and while the candidate is not
    in K move to the best candidate above it; top-k membership is #{x > x_j} < k, top-p mass above j <
    top_p · Z_k (Z_k by bisection on the monotone int32 image of fp32 when needed). The path of each row is
    kept (``sample_paths``).

Tile function: ``sample_tile(tile, ..., PHASE)``; workspaces: stats fp32 [R, NC, 3], best index int32
[R, NC], candidate keys int64 [R, NC, KC], scorer keys int64 [R, NC, SC], verify fp32 [R, NC, SC, 4], path
int32 [R] (NC = cdiv(V, CHUNK)).

Using it: ``op, specs = sample_op(vocab_size)`` gives the SuperOp and the buffers it needs; allocate them
next to the program's (``program.buffers.update(specs)`` before ``program.allocate``), fill
``sample_temperature / sample_top_k / sample_top_p / sample_seed / sample_offset`` per row, and run
``KERNELS["sample"](op, env)`` after the ``lm_head`` op; ``env.buf["next_ids"]`` then holds the tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nonstop.kernels.launch import launcher, pdl_launch_args, phase_counters, phase_done, phase_ticket, workspace
from nonstop.kernels.platform import interpreting, pow2
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


@triton.jit(noinline=True)  # the rare fallback: its registers apart from the pick's
def sample_row_search(
    row,
    logits_ptr,
    stride_logits,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    seed_ptr,
    offset_ptr,
    V,
    BLOCK_Q: tl.constexpr,
):
    """The next token of one row by the one-program search (module docstring): the fallback of ``pick``."""
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
    return j


MIN_KEY: tl.constexpr = tl.constexpr(-(2**63))
VERIFY_BLOCK: tl.constexpr = tl.constexpr(256)  # chunk entries a verify step compares with every scorer
BIG: tl.constexpr = tl.constexpr(2147483647)


@triton.jit
def gumbel_at(seed, off_lo, off_hi, idx):
    """Gumbel noise of entries ``idx`` (int32, any shape): word idx % 4 of Philox counter (idx // 4, offset)."""
    quads = (idx // 4).to(tl.uint32)
    zero = quads * 0
    r0, r1, r2, r3 = tl.philox(seed, quads, zero + off_lo, zero + off_hi, zero)
    w = idx % 4
    bits = tl.where(w == 0, r0, tl.where(w == 1, r1, tl.where(w == 2, r2, r3)))
    u = ((bits >> 9) * 2 + 1).to(tl.float32) * (1.0 / 16777216.0)
    return -tl.log(-tl.log(u))


@triton.jit
def stable_key(x, idx):
    """int64 keys whose descending order is the stable order: larger x first, then smaller index."""
    return (order_key(x).to(tl.int64) << 32) | (2147483647 - idx).to(tl.int64)


@triton.jit
def key_value(key):
    """The fp32 x of a ``stable_key``."""
    k = (key >> 32).to(tl.int32)
    return tl.where(k < 0, k ^ 0x7FFFFFFF, k).to(tl.float32, bitcast=True)


@triton.jit
def sample_scan_tile(
    t,
    logits_ptr,
    stride_logits,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    seed_ptr,
    offset_ptr,
    stats_ptr,
    best_idx_ptr,
    cand_ptr,
    scored_ptr,
    V,
    NC,
    CHUNK: tl.constexpr,
    KC: tl.constexpr,
    SC: tl.constexpr,
):
    """Phase 1, tile t = (row, chunk) = divmod(t, NC): the chunk's statistics (module docstring)."""
    row = t // NC
    c = t % NC
    slot = row.to(tl.int64) * NC + c
    idx = c * CHUNK + tl.arange(0, CHUNK)
    valid = idx < V
    logit = tl.load(logits_ptr + row.to(tl.int64) * stride_logits + idx, mask=valid, other=float("-inf"))
    temperature = tl.load(temperature_ptr + row)
    if temperature > 0:
        x = tl.div_rn(logit, temperature)
        x = tl.where(x == x, x, float("-inf"))
        m = tl.max(x, axis=0)
        z = tl.sum(tl.where(valid & (x > float("-inf")), tl.exp(x - m), 0.0), axis=0)
        offset = tl.load(offset_ptr + row)
        g = gumbel_at(
            tl.load(seed_ptr + row),
            (offset & 0xFFFFFFFF).to(tl.uint32),
            ((offset >> 32) & 0xFFFFFFFF).to(tl.uint32),
            idx,
        )
        score = tl.where(valid, x + g, float("-inf"))
        k = tl.load(top_k_ptr + row)
        if ((k > 0) & (k < V)) | (tl.load(top_p_ptr + row) < 1.0):
            top = tl.topk(tl.where(valid, stable_key(x, idx), MIN_KEY), KC)
            tl.store(cand_ptr + slot * KC + tl.arange(0, KC), top)
            best_scores = tl.topk(tl.where(valid, stable_key(score, idx), MIN_KEY), SC)
            tl.store(scored_ptr + slot * SC + tl.arange(0, SC), best_scores)
    else:
        score = tl.where(logit == logit, logit, float("-inf"))
        m = tl.max(score, axis=0)
        z = m * 0.0
    best = tl.max(score, axis=0)
    tl.store(stats_ptr + slot * 3, m)
    tl.store(stats_ptr + slot * 3 + 1, z)
    tl.store(stats_ptr + slot * 3 + 2, best)
    tl.store(best_idx_ptr + slot, tl.min(tl.where(score == best, idx, BIG), axis=0))


@triton.jit
def row_top_scorers(scored_ptr, row, NC, SC: tl.constexpr, BLOCK_SCORED: tl.constexpr):
    """The row's SC best (x + g, then smaller index) entries from its chunks' lists, best first: (stable keys of
    their scores [SC] (MIN_KEY past the listed ones), entry indices [SC])."""
    pos = tl.arange(0, BLOCK_SCORED)
    listed = tl.load(scored_ptr + row.to(tl.int64) * NC * SC + pos, mask=pos < NC * SC, other=MIN_KEY)
    top = tl.topk(listed, SC)
    return top, 2147483647 - (top & 0xFFFFFFFF).to(tl.int32)


@triton.jit
def sample_verify_tile(
    t,
    logits_ptr,
    stride_logits,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    stats_ptr,
    scored_ptr,
    verify_ptr,
    V,
    NC,
    CHUNK: tl.constexpr,
    SC: tl.constexpr,
    BLOCK_NC: tl.constexpr,
    BLOCK_SCORED: tl.constexpr,
):
    """Phase 2, tile t = (row, chunk): for each of the row's SC best scorers j (``row_top_scorers``), over the
    chunk: #{x > x_j}, #{x >= x_j}, the mass (e^{x - m}, m the row's max) of the entries above j in the stable
    order, and of x >= x_j -> verify [R, NC, SC, 4] fp32. Filtered rows only."""
    row = t // NC
    c = t % NC
    temperature = tl.load(temperature_ptr + row)
    k = tl.load(top_k_ptr + row)
    if (temperature > 0) & (((k > 0) & (k < V)) | (tl.load(top_p_ptr + row) < 1.0)):
        ch = tl.arange(0, BLOCK_NC)
        m = tl.max(tl.load(stats_ptr + (row.to(tl.int64) * NC + ch) * 3, mask=ch < NC, other=float("-inf")), axis=0)
        _, j = row_top_scorers(scored_ptr, row, NC, SC, BLOCK_SCORED)
        row_ptr = logits_ptr + row.to(tl.int64) * stride_logits
        x_j = tl.div_rn(tl.load(row_ptr + j, mask=(j >= 0) & (j < V), other=float("-inf")), temperature)
        x_j = tl.where(x_j == x_j, x_j, float("-inf"))
        gt = tl.zeros([SC], dtype=tl.float32)
        ge = tl.zeros([SC], dtype=tl.float32)
        mass_above = tl.zeros([SC], dtype=tl.float32)
        mass_ge = tl.zeros([SC], dtype=tl.float32)
        for b0 in range(0, CHUNK, VERIFY_BLOCK):  # [SC, VERIFY_BLOCK] comparisons at a time
            within = b0 + tl.arange(0, VERIFY_BLOCK)
            idx = c * CHUNK + within
            x = tl.div_rn(tl.load(row_ptr + idx, mask=(within < CHUNK) & (idx < V), other=float("-inf")), temperature)
            x = tl.where(x == x, x, float("-inf"))
            e = tl.where(x > float("-inf"), tl.exp(x - m), 0.0)[None, :]
            greater = x[None, :] > x_j[:, None]
            at_least = x[None, :] >= x_j[:, None]
            above = greater | ((x[None, :] == x_j[:, None]) & (idx[None, :] < j[:, None]))
            gt += tl.sum(greater.to(tl.float32), axis=1)
            ge += tl.sum(at_least.to(tl.float32), axis=1)
            mass_above += tl.sum(tl.where(above, e, 0.0), axis=1)
            mass_ge += tl.sum(tl.where(at_least, e, 0.0), axis=1)
        cell = verify_ptr + (row.to(tl.int64) * NC + c) * (SC * 4) + tl.arange(0, SC) * 4
        tl.store(cell, gt)
        tl.store(cell + 1, ge)
        tl.store(cell + 2, mass_above)
        tl.store(cell + 3, mass_ge)


@triton.jit
def scorer_pick(
    row,
    scored_ptr,
    verify_ptr,
    NC,
    k,
    p,
    use_k,
    use_p,
    z,
    SC: tl.constexpr,
    BLOCK_NC: tl.constexpr,
    BLOCK_SCORED: tl.constexpr,
):
    """The draw from the row's best scorers (module docstring): the first of them (best score first) in the kept
    set, provided every better one is known to be out. Membership from the chunks' ``verify`` sums, exactly:
    top-k keeps j iff fewer than k values exceed x_j; top-p keeps j iff the mass above it (stable order) is
    under top_p · Z_k, Z_k = the mass of x >= v_k (Z without top-k) bounded by the scorers: at least the mass
    of x >= x_j of a scorer inside the top-k set, at most that of one with >= k values >= x_j (equal when a
    scorer holds v_k). -1 when the bounds leave the first undecided scorer open, or no scorer is kept."""
    top, j = row_top_scorers(scored_ptr, row, NC, SC, BLOCK_SCORED)
    ch = tl.arange(0, BLOCK_NC)
    cells = verify_ptr + (row.to(tl.int64) * NC + ch[:, None]) * (SC * 4) + tl.arange(0, SC)[None, :] * 4
    cm = (ch < NC)[:, None]
    gt = tl.sum(tl.load(cells, mask=cm, other=0.0), axis=0)  # [SC], chunks in order: exact counts
    ge = tl.sum(tl.load(cells + 1, mask=cm, other=0.0), axis=0)
    above = tl.sum(tl.load(cells + 2, mask=cm, other=0.0), axis=0)
    mass_ge = tl.sum(tl.load(cells + 3, mask=cm, other=0.0), axis=0)
    finite = (top != MIN_KEY) & (key_value(top) > float("-inf"))  # a listed score of -inf: x = -inf, never kept
    in_k = finite & ((use_k == 0) | (gt < k.to(tl.float32)))
    z_lo = tl.where(use_k, tl.max(tl.where(in_k, mass_ge, 0.0), axis=0), z)
    z_hi = tl.where(use_k, tl.min(tl.where(finite & (ge >= k.to(tl.float32)), mass_ge, z), axis=0), z)
    kept = in_k & ((use_p == 0) | (above < p * z_lo))
    out = (finite == 0) | (in_k == 0) | ((use_p != 0) & (above >= p * z_hi))
    first = tl.min(tl.where(out, SC, tl.arange(0, SC)), axis=0)  # the best scorer not known to be out
    decided = first < SC
    is_kept = tl.sum(tl.where(tl.arange(0, SC) == first, kept.to(tl.int32), 0), axis=0) > 0
    return tl.where(decided & is_kept, tl.sum(tl.where(tl.arange(0, SC) == first, j, 0), axis=0), -1)


@triton.jit
def sample_pick_tile(
    row,
    logits_ptr,
    stride_logits,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    seed_ptr,
    offset_ptr,
    out_ptr,
    stats_ptr,
    best_idx_ptr,
    cand_ptr,
    scored_ptr,
    verify_ptr,
    path_ptr,
    V,
    NC,
    KC: tl.constexpr,
    SC: tl.constexpr,
    BLOCK_NC: tl.constexpr,
    BLOCK_CAND: tl.constexpr,
    BLOCK_SCORED: tl.constexpr,
    BLOCK_Q: tl.constexpr,
):
    """Phase 3, tile = row: combine the row's chunks (module docstring); next_ids[row], and the way it was
    decided in path[row] (``PATHS``)."""
    path = tl.full([], 0, tl.int32)
    c = tl.arange(0, BLOCK_NC)
    cm = c < NC
    base = row.to(tl.int64) * NC
    best_c = tl.load(stats_ptr + (base + c) * 3 + 2, mask=cm, other=float("-inf"))
    best = tl.max(best_c, axis=0)
    j = tl.min(tl.where(cm & (best_c == best), tl.load(best_idx_ptr + base + c, mask=cm, other=BIG), BIG), axis=0)
    temperature = tl.load(temperature_ptr + row)
    if temperature > 0:
        k = tl.load(top_k_ptr + row)
        p = tl.load(top_p_ptr + row)
        use_k = (k > 0) & (k < V)
        use_p = p < 1.0
        if use_k | use_p:
            m_c = tl.load(stats_ptr + (base + c) * 3, mask=cm, other=float("-inf"))
            m = tl.max(m_c, axis=0)
            z = tl.sum(
                tl.where(
                    cm & (m_c > float("-inf")),
                    tl.load(stats_ptr + (base + c) * 3 + 1, mask=cm, other=0.0) * tl.exp(m_c - m),
                    0.0,
                ),
                axis=0,
            )
            pos = tl.arange(0, BLOCK_CAND)
            keys = tl.sort(tl.load(cand_ptr + base * KC + pos, mask=pos < NC * KC, other=MIN_KEY), descending=True)
            listed = keys != MIN_KEY
            x = key_value(keys)
            idx = 2147483647 - (keys & 0xFFFFFFFF).to(tl.int32)
            e = tl.where(listed, tl.exp(x - m), 0.0)
            v_k = tl.sum(tl.where(pos == k - 1, x, 0.0), axis=0)
            keep = listed
            if use_k:
                keep = keep & (x >= v_k)
            z_k = tl.where(use_k, tl.sum(tl.where(keep, e, 0.0), axis=0), z)
            if use_p:
                keep = keep & (tl.cumsum(e, axis=0) - e < p * z_k)
            last = tl.max(
                tl.load(cand_ptr + (base + c) * KC + KC - 1, mask=cm, other=MIN_KEY), axis=0
            )  # lowest listed of the fullest
            threshold = tl.min(tl.where(keep, keys, 9223372036854775807), axis=0)
            complete = (last == MIN_KEY) | (
                (last < threshold)
                & ((use_k == 0) | ((key_value(last) < v_k) & (k <= tl.sum(listed.to(tl.int32), axis=0))))
            )
            if complete == 0:
                j = scorer_pick(row, scored_ptr, verify_ptr, NC, k, p, use_k, use_p, z, SC, BLOCK_NC, BLOCK_SCORED)
                path = tl.where(j >= 0, 2, 3).to(tl.int32)
            if complete:
                path = tl.full([], 1, tl.int32)
                offset = tl.load(offset_ptr + row)
                g = gumbel_at(
                    tl.load(seed_ptr + row),
                    (offset & 0xFFFFFFFF).to(tl.uint32),
                    ((offset >> 32) & 0xFFFFFFFF).to(tl.uint32),
                    idx,
                )
                score = tl.where(keep, x + g, float("-inf"))
                top = tl.max(score, axis=0)
                j = tl.min(tl.where(keep & (score == top), idx, BIG), axis=0)
            elif j < 0:
                j = sample_row_search(
                    row,
                    logits_ptr,
                    stride_logits,
                    temperature_ptr,
                    top_k_ptr,
                    top_p_ptr,
                    seed_ptr,
                    offset_ptr,
                    V,
                    BLOCK_Q,
                )
    tl.store(out_ptr + row, j.to(tl.int64))
    tl.store(path_ptr + row, path)


@triton.jit
def sample_tile(
    tile,
    logits_ptr,
    stride_logits,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    seed_ptr,
    offset_ptr,
    out_ptr,
    stats_ptr,
    best_idx_ptr,
    cand_ptr,
    scored_ptr,
    verify_ptr,
    path_ptr,
    counters_ptr,
    V,
    NC,
    n_scan,
    n_pick,
    CHUNK: tl.constexpr,
    KC: tl.constexpr,
    SC: tl.constexpr,
    BLOCK_NC: tl.constexpr,
    BLOCK_CAND: tl.constexpr,
    BLOCK_SCORED: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    PHASE: tl.constexpr,
):
    """Sampling in three phases (module docstring): 1 ``scan`` and 2 ``verify`` (n_scan = R·NC tiles each),
    3 ``pick`` (n_pick = R); 0 the in-launch protocol (counters int32 [4])."""
    phase = PHASE
    if PHASE == 0:
        phase, tile = phase_ticket(counters_ptr, n_scan, n_scan)
    if phase == 1:
        sample_scan_tile(
            tile,
            logits_ptr,
            stride_logits,
            temperature_ptr,
            top_k_ptr,
            top_p_ptr,
            seed_ptr,
            offset_ptr,
            stats_ptr,
            best_idx_ptr,
            cand_ptr,
            scored_ptr,
            V,
            NC,
            CHUNK,
            KC,
            SC,
        )
    elif phase == 2:
        sample_verify_tile(
            tile,
            logits_ptr,
            stride_logits,
            temperature_ptr,
            top_k_ptr,
            top_p_ptr,
            stats_ptr,
            scored_ptr,
            verify_ptr,
            V,
            NC,
            CHUNK,
            SC,
            BLOCK_NC,
            BLOCK_SCORED,
        )
    else:
        sample_pick_tile(
            tile,
            logits_ptr,
            stride_logits,
            temperature_ptr,
            top_k_ptr,
            top_p_ptr,
            seed_ptr,
            offset_ptr,
            out_ptr,
            stats_ptr,
            best_idx_ptr,
            cand_ptr,
            scored_ptr,
            verify_ptr,
            path_ptr,
            V,
            NC,
            KC,
            SC,
            BLOCK_NC,
            BLOCK_CAND,
            BLOCK_SCORED,
            BLOCK_Q,
        )
    if PHASE == 0:
        phase_done(counters_ptr, phase, n_pick, 3)


sample_kernel = launcher(sample_tile, phases=("scan", "verify", "pick"), first=("n_scan", "n_scan"))

CHUNK = 2048  # vocabulary entries per scan tile on a GPU: 80 tiles per row of a 163840-token vocabulary
CANDIDATES = 16  # largest entries each chunk lists for a filtered row (the merged list: NC · 16)
SCORERS = 8  # best scorers (x + g) each chunk lists for a filtered row; the row's best 8 are verified
SEARCH_QUADS = 1024  # quads (4 entries) per step of the one-program search: 40 steps over 163840 entries
PATHS = {0: "greedy or unfiltered", 1: "merged lists", 2: "verified scorers", 3: "one-program search"}


def sample(
    op,
    env,
    chunk: int | None = None,
    candidates: int | None = None,
    scorers: int | None = None,
    search_quads: int | None = None,
):
    """next_ids [R] (int64) from logits [R, V] and the per-row sampling buffers (``SAMPLE_READS``).
    ``chunk`` / ``candidates`` / ``scorers``: scan tile width and list lengths (tests; defaults ``CHUNK`` /
    ``CANDIDATES`` / ``SCORERS``, a quarter-vocabulary chunk in the interpreter). ``search_quads``: quads per
    step of the one-program search (tests; default ``SEARCH_QUADS``; a power of two >= 16, at most the row's
    quads rounded up). How each row was decided: ``sample_paths(device)`` after the launch."""
    logits, temperature, top_k, top_p, seed, offset = (env.buf[n] for n in op.reads)
    out = env.buf[op.writes[0]]
    R, V = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1
    chunk = pow2(chunk or (min(CHUNK, pow2(V) // 4) if interpreting() else CHUNK), 16)
    kc = min(pow2(candidates or CANDIDATES), chunk)
    sc = min(pow2(scorers or SCORERS), chunk)
    nc = triton.cdiv(V, chunk)
    dev = logits.device
    stats = workspace("sample.stats", R * nc * 3, torch.float32, dev)
    best_idx = workspace("sample.best_idx", R * nc, torch.int32, dev)
    cand = workspace("sample.cand", R * nc * kc, torch.int64, dev)
    scored = workspace("sample.scored", R * nc * sc, torch.int64, dev)
    verify = workspace("sample.verify", R * nc * sc * 4, torch.float32, dev)
    sample_kernel[(2 * R * nc + R,)](
        logits,
        logits.stride(0),
        temperature,
        top_k,
        top_p,
        seed,
        offset,
        out,
        stats,
        best_idx,
        cand,
        scored,
        verify,
        sample_paths(dev, R),
        phase_counters("sample", dev),
        V,
        nc,
        R * nc,
        R,
        CHUNK=chunk,
        KC=kc,
        SC=sc,
        BLOCK_NC=pow2(nc),
        BLOCK_CAND=pow2(nc * kc),
        BLOCK_SCORED=pow2(nc * sc),
        BLOCK_Q=min(pow2(search_quads or SEARCH_QUADS, 16), pow2(triton.cdiv(V, 4), 16)),
        num_warps=4,
        **pdl_launch_args(env),
    )


def sample_paths(device, rows: int = 16) -> torch.Tensor:
    """int32 [>= rows]: how the last ``sample`` launch on ``device`` decided each row (``PATHS``)."""
    return workspace("sample.path", rows, torch.int32, device)


KERNELS = {"sample": sample}
