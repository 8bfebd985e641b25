"""Tile functions of the KDA super-ops (twins: ``kda_in_proj``, ``kda_core`` in program/reference.py).

Row layout of a step: R = B·T rows, row r = token t = r % T of sequence b = r // T, whose slot is
``slots[b]`` and which starts a fresh sequence when ``start[b] == 0`` (zero conv window and state).

kda_in_proj_tile(tile): outputs n0 = tile·BLOCK_N .. n0+BLOCK_N-1 of the packed
  W_in = [q | k | v | g or g_a | b | f_a]  ([N, d], N = 3C + G + H + RANK), for all R rows:
    p = RMSNorm(x) W_inᵀ (model dtype)                                         [R, BLOCK_N]
    q/k/v channels n < 3C:  y_t = SiLU(Σ_j conv[n, j] · s_{t+j}),  s = [window_0..window_{K-2}, p_0..p_{T-1}]
                            (per sequence; tap K-1 multiplies the current token), new window = last K-1 of s
  A tile owns its channels' conv windows in every slot, so tiles never touch the same state.
  KEEP (speculative verification): also the window after every token, into the layer's conv
  history [S, T_cap, 3C, K-1]: entry i after token t = s_{t+1+i} (the token K-2-i steps before t).

kda_core_tile(tile): sequence b = tile // H, head h = tile % H, the whole state S [D, D] fp32 in registers
  (BLOCK_KD = BLOCK_D), or streamed through memory in blocks of BLOCK_KD key rows, two passes a token (wide
  heads: ``kda.state_block_rows``):
    f = fa W_fb[h]ᵀ,  g = -e^{A_log[h]} softplus(f + dt_bias)  or  lower_bound · σ(e^{A_log[h]} (f + dt_bias))
    per token in order: q ← L2(q)·D^-½, k ← L2(k), β = σ(b);
        S ← Diag(e^g) S;  S ← S + k (β (v - Sᵀk))ᵀ;  o = Sᵀq
        y = o_norm ⊙ o / sqrt(mean(o²) + eps) ⊙ σ(gate),  gate = og (full rank) or og W_gb[h]ᵀ (low rank)
    KEEP (speculative verification): also S after every token, into the layer's recurrent history
    [S_slots, T_cap, H, D, D] fp32 (``KDAState.history_recurrent``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from nonstop.kernels.gemv import gemv_rows, row_inv_rms, vec_inv_rms

# ----------------------------------------------------------------------------- small helpers


@triton.jit
def _round(x, dtype: tl.constexpr):
    """x (fp32) rounded through ``dtype`` (what a model-dtype torch op stores), back in fp32."""
    return x.to(dtype).to(tl.float32)


@triton.jit
def _softplus(z):
    """torch's softplus (beta 1, threshold 20). log1p(e), e = e^z, without libdevice: with u = 1 + e
    rounded, log(u) · e / (u - 1) is accurate to a few ulp (and e itself where u rounds to 1)."""
    e = tl.exp(tl.minimum(z, 20.0))
    u = 1.0 + e
    exact = u == 1.0
    log1p = tl.where(exact, e, tl.log(u) * (e / tl.where(exact, 1.0, u - 1.0)))
    return tl.where(z > 20.0, z, log1p)


@triton.jit
def _shift_rows(x, s, t, dtype: tl.constexpr, BLOCK_R: tl.constexpr, UPCAST: tl.constexpr):
    """[BLOCK_R, N] -> row r gets x[r - s] where the row's token index t[r] >= s (same sequence), else 0.
    A one-hot [BLOCK_R, BLOCK_R] product: exact, since each output sums one value representable in
    ``dtype`` (the model dtype: the tensor-core operand type on a GPU; fp32 models multiply in "ieee")."""
    rows = tl.arange(0, BLOCK_R)
    pick = ((rows[None, :] == rows[:, None] - s) & (t[:, None] >= s)).to(tl.float32)
    if UPCAST or dtype == tl.float32:
        return tl.dot(pick, x, input_precision="ieee")
    return tl.dot(pick.to(dtype), x.to(dtype))


@triton.jit
def _store_section(out_ptr, val, rows, rmask, ns, lo, width):
    """Store the columns lo <= n < lo + width of the tile into a [R, width] buffer."""
    cols = ns - lo
    mask = rmask[:, None] & ((cols >= 0) & (cols < width))[None, :]
    tl.store(out_ptr + rows[:, None] * width + cols[None, :], val.to(out_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------- kda_in_proj


@triton.jit
def _short_conv_silu(
    raw,
    rows,
    rmask,
    ns,
    conv_w_ptr,
    win_ptr,
    stride_win_slot,
    slots_ptr,
    start_ptr,
    R,
    T,
    C,
    K,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_W: tl.constexpr,
    UPCAST: tl.constexpr,
    hist_ptr=None,
    stride_hist_slot=0,
    stride_hist_t=0,
    KEEP: tl.constexpr = False,
):
    """SiLU(causal depthwise conv) of the tile's q/k/v channels over each sequence's window + T tokens;
    writes the new windows. raw: [BLOCK_R, BLOCK_N] projections (model-dtype values, fp32).
    Window layout per slot: [3C, K-1] contiguous (channel n = part·C + c), slot stride ``stride_win_slot``."""
    dtype = win_ptr.dtype.element_ty
    km1 = K - 1
    cmask = ns < 3 * C
    t = rows % T
    b = rows // T
    slot = tl.load(slots_ptr + b, mask=rmask, other=0)
    live = tl.load(start_ptr + b, mask=rmask, other=0) != 0  # fresh sequences read a zero window
    win_rows = win_ptr + slot.to(tl.int64) * stride_win_slot
    win_cols = ns * km1
    y = tl.load(conv_w_ptr + ns * K + km1, mask=cmask, other=0.0).to(tl.float32)[None, :] * raw
    if KEEP:  # the window after token t ends with token t itself; the taps below give the older entries
        hist_rows = hist_ptr + slot.to(tl.int64) * stride_hist_slot + t * stride_hist_t
        hmask = rmask[:, None] & cmask[None, :]
        tl.store(hist_rows[:, None] + win_cols[None, :] + (km1 - 1), raw.to(dtype), mask=hmask)
    for s in range(1, K):  # token t - s: the window entry t + K-1 - s while t < s, else row r - s
        tap = tl.load(conv_w_ptr + ns * K + (km1 - s), mask=cmask, other=0.0).to(tl.float32)
        from_win = rmask & live & (t < s)
        prev = tl.load(
            win_rows[:, None] + win_cols[None, :] + (t + km1 - s)[:, None],
            mask=from_win[:, None] & cmask[None, :],
            other=0.0,
        ).to(tl.float32)
        if BLOCK_R > 1:
            if s < T:  # some row of this step is s tokens after another row of its sequence
                prev += _shift_rows(raw, s, t, dtype, BLOCK_R, UPCAST)
        y += tap[None, :] * prev
        if KEEP:
            if s < km1:  # token t - s is entry K-2-s of the window after token t
                tl.store(hist_rows[:, None] + win_cols[None, :] + (km1 - 1 - s), prev.to(dtype), mask=hmask)
    y = _round(y, dtype)
    y = _round(y * tl.sigmoid(y), dtype)

    # new window [b, i] = s_{T+i}: the old entry T+i while T+i < K-1, else token T+i-(K-1)
    w = tl.arange(0, BLOCK_W)
    wb = w // km1
    wi = w % km1
    moved = (wb < R // T) & (wi + T < km1)
    wslot = tl.load(slots_ptr + wb, mask=moved, other=0)
    wlive = tl.load(start_ptr + wb, mask=moved, other=0) != 0
    w_rows = win_ptr + wslot.to(tl.int64) * stride_win_slot
    kept = tl.load(
        w_rows[:, None] + win_cols[None, :] + (wi + T)[:, None],
        mask=(moved & wlive)[:, None] & cmask[None, :],
        other=0.0,
    )
    tl.debug_barrier()  # every read of the old windows (taps above, kept entries) precedes the writes
    tl.store(w_rows[:, None] + win_cols[None, :] + wi[:, None], kept, mask=moved[:, None] & cmask[None, :])
    ni = t - T + km1
    tl.store(
        win_rows[:, None] + win_cols[None, :] + ni[:, None],
        raw.to(dtype),
        mask=(rmask & (ni >= 0))[:, None] & cmask[None, :],
    )
    return y


@triton.jit
def kda_in_proj_tile(
    tile,
    x_ptr,
    stride_x,
    norm_ptr,
    eps,
    w_ptr,
    stride_w,
    conv_w_ptr,
    win_ptr,
    stride_win_slot,
    slots_ptr,
    start_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    og_ptr,
    beta_ptr,
    fa_ptr,
    R,
    T,
    d,
    C,
    G,
    H,
    RANK,
    K,
    HAS_NORM: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_W: tl.constexpr,
    USE_DOT: tl.constexpr,
    UPCAST: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    hist_ptr=None,
    stride_hist_slot=0,
    stride_hist_t=0,
    KEEP: tl.constexpr = False,
):
    """One BLOCK_N slice of kda_in_proj for all R rows (see the module docstring).

    x [R, d] (row stride stride_x); norm [d] (used when HAS_NORM); w [N, d]; conv_w [3C, K];
    win: the layer's conv state [S, 3, C, K-1] (slot stride stride_win_slot); slots, start [B] int64;
    outputs contiguous: q, k, v [R, C], og [R, G], beta [R, H], fa [R, RANK].
    BLOCK_R, USE_DOT = platform.row_block(R); BLOCK_W >= 16, a power of two >= B·(K-1).
    KEEP: hist = the conv history [S, T_cap, 3C, K-1] (slot / token strides given), written per token.
    """
    DT: tl.constexpr = w_ptr.dtype.element_ty
    N = 3 * C + G + H + RANK
    n0 = tile * BLOCK_N
    rows = tl.arange(0, BLOCK_R)
    rmask = rows < R
    ns = n0 + tl.arange(0, BLOCK_N)
    if HAS_NORM:
        inv_rms = row_inv_rms(x_ptr, stride_x, R, d, eps, DT, BLOCK_R, BLOCK_K)
    else:
        inv_rms = tl.full([BLOCK_R], 1.0, tl.float32)
    acc, _ = gemv_rows(
        x_ptr,
        stride_x,
        R,
        0,
        d,
        norm_ptr,
        inv_rms,
        w_ptr,
        w_ptr,
        stride_w,
        w_ptr,
        w_ptr,
        0,
        0,
        ns,
        ns,
        ns < N,
        HAS_NORM,
        False,
        False,
        DT,
        BLOCK_R,
        BLOCK_K,
        USE_DOT,
        UPCAST,
        NUM_STAGES,
    )
    raw = _round(acc, q_ptr.dtype.element_ty)
    val = raw
    if n0 < 3 * C:
        y = _short_conv_silu(
            raw,
            rows,
            rmask,
            ns,
            conv_w_ptr,
            win_ptr,
            stride_win_slot,
            slots_ptr,
            start_ptr,
            R,
            T,
            C,
            K,
            BLOCK_R,
            BLOCK_N,
            BLOCK_W,
            UPCAST,
            hist_ptr,
            stride_hist_slot,
            stride_hist_t,
            KEEP,
        )
        val = tl.where((ns < 3 * C)[None, :], y, raw)
    _store_section(q_ptr, val, rows, rmask, ns, 0, C)
    _store_section(k_ptr, val, rows, rmask, ns, C, C)
    _store_section(v_ptr, val, rows, rmask, ns, 2 * C, C)
    _store_section(og_ptr, val, rows, rmask, ns, 3 * C, G)
    _store_section(beta_ptr, val, rows, rmask, ns, 3 * C + G, H)
    _store_section(fa_ptr, val, rows, rmask, ns, 3 * C + G + H, RANK)


# ----------------------------------------------------------------------------- kda_core


@triton.jit
def kda_core_tile(
    tile,
    q_ptr,
    k_ptr,
    v_ptr,
    og_ptr,
    beta_ptr,
    fa_ptr,
    fb_ptr,
    gb_ptr,
    A_log_ptr,
    dt_bias_ptr,
    o_norm_ptr,
    out_ptr,
    state_ptr,
    stride_state_slot,
    slots_ptr,
    start_ptr,
    T,
    H,
    D,
    RANK,
    G,
    lower_bound,
    q_scale,
    eps,
    BOUNDED: tl.constexpr,
    LOW_RANK_GATE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_RANK: tl.constexpr,
    BLOCK_G: tl.constexpr,
    USE_DOT: tl.constexpr,
    UPCAST: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    BLOCK_KD: tl.constexpr,
    hist_ptr=None,
    stride_hist_slot=0,
    stride_hist_t=0,
    KEEP: tl.constexpr = False,
):
    """Sequence b = tile // H, head h = tile % H of kda_core (see the module docstring).

    q, k, v [R, H·D], og [R, G], beta [R, H], fa [R, RANK] (contiguous, model dtype);
    f_b [H·D, RANK]; g_b [H·D, G] (LOW_RANK_GATE; else og is the full-rank gate, G = H·D);
    A_log [H]; dt_bias [H·D]; o_norm [D]; out [R, H·D];
    state: the layer's recurrent state [S, H, D, D] fp32 (slot stride stride_state_slot, key-major).
    BLOCK_T, USE_DOT = platform.row_block(T); BLOCK_D, BLOCK_RANK, BLOCK_G powers of two >= 16; BLOCK_KD key
    rows of the state at a time (a power of two <= BLOCK_D; BLOCK_D: the state stays in registers).
    KEEP: hist = the recurrent history [S, T_cap, H, D, D] fp32 (slot / token strides given).
    """
    dtype = q_ptr.dtype.element_ty
    b = tile // H
    h = tile % H
    C = H * D
    row0 = b * T
    cols = tl.arange(0, BLOCK_D)
    dmask = cols < D
    slot = tl.load(slots_ptr + b)
    held = tl.where(tl.load(start_ptr + b) != 0, D, 0)  # key rows to read: none for a fresh sequence
    s_base = state_ptr + slot.to(tl.int64) * stride_state_slot + h * D * D
    smask = dmask[:, None] & dmask[None, :]
    if BLOCK_KD == BLOCK_D:
        # the state S[key, value] (zeros for a fresh sequence), loaded first: the largest transfer
        S = tl.load(s_base + cols[:, None] * D + cols[None, :], mask=(cols < held)[:, None] & dmask[None, :], other=0.0)
    trow = tl.arange(0, BLOCK_T)
    ones = tl.full([BLOCK_T], 1.0, tl.float32)
    a = tl.exp(tl.load(A_log_ptr + h).to(tl.float32))
    if BLOCK_KD == BLOCK_D:  # decay gate of the sequence's T rows: [BLOCK_T, BLOCK_D] fp32
        g = _decay(
            fa_ptr,
            fb_ptr,
            dt_bias_ptr,
            row0,
            T,
            RANK,
            h * D + cols,
            dmask,
            a,
            lower_bound,
            BOUNDED,
            dtype,
            BLOCK_T,
            BLOCK_RANK,
            USE_DOT,
            UPCAST,
            NUM_STAGES,
        )
    if LOW_RANK_GATE:
        gate, _ = gemv_rows(
            og_ptr + row0 * G,
            G,
            T,
            0,
            G,
            og_ptr,
            ones,
            gb_ptr,
            gb_ptr,
            G,
            gb_ptr,
            gb_ptr,
            0,
            0,
            h * D + cols,
            h * D + cols,
            dmask,
            False,
            False,
            False,
            dtype,
            BLOCK_T,
            BLOCK_G,
            USE_DOT,
            UPCAST,
            NUM_STAGES,
        )
        gate = _round(gate, dtype)
    else:
        gate = tl.load(
            og_ptr + (row0 + trow)[:, None] * G + h * D + cols[None, :],
            mask=(trow < T)[:, None] & dmask[None, :],
            other=0.0,
        ).to(tl.float32)
    w_norm = tl.load(o_norm_ptr + cols, mask=dmask, other=0.0).to(tl.float32)
    kb = tl.arange(0, BLOCK_KD)

    for t in range(0, T):
        r = row0 + t
        here = (trow == t)[:, None]
        gate_t = tl.sum(tl.where(here, gate, 0.0), axis=0)
        head0 = r * C + h * D
        q_t = tl.load(q_ptr + head0 + cols, mask=dmask, other=0.0).to(tl.float32)
        k_t = tl.load(k_ptr + head0 + cols, mask=dmask, other=0.0).to(tl.float32)
        v_t = tl.load(v_ptr + head0 + cols, mask=dmask, other=0.0).to(tl.float32)
        beta_t = tl.sigmoid(tl.load(beta_ptr + r * H + h).to(tl.float32))
        q_den = tl.sqrt(tl.sum(q_t * q_t) + 1e-6)
        k_den = tl.sqrt(tl.sum(k_t * k_t) + 1e-6)
        q_t = q_t / q_den * q_scale
        k_t = k_t / k_den
        if BLOCK_KD == BLOCK_D:
            g_t = tl.sum(tl.where(here, g, 0.0), axis=0)
            S = S * tl.exp(g_t)[:, None]
            u = beta_t * (v_t - tl.sum(k_t[:, None] * S, axis=0))
            S = S + k_t[:, None] * u[None, :]
            if KEEP:
                h_base = hist_ptr + slot.to(tl.int64) * stride_hist_slot + t * stride_hist_t + h * D * D
                tl.store(h_base + cols[:, None] * D + cols[None, :], S, mask=smask)
            o = tl.sum(q_t[:, None] * S, axis=0)
        else:
            # the state streamed in blocks of BLOCK_KD key rows (a [BLOCK_D, BLOCK_D] state would not fit in
            # registers): pass 1 reads Diag(e^g) S for its products with k and q, pass 2 writes Diag(e^g) S + k uᵀ
            # back; o = Sᵀq of the updated state = (Diag(e^g) S)ᵀq + (q·k) u
            ks = tl.zeros([BLOCK_D], dtype=tl.float32)
            qs = tl.zeros([BLOCK_D], dtype=tl.float32)
            u = ks
            for rewrite in tl.static_range(2):
                if rewrite:
                    u = beta_t * (v_t - ks)
                    tl.debug_barrier()  # every block read before one is rewritten
                for k0 in range(0, D, BLOCK_KD):
                    rows = k0 + kb
                    S_b = tl.load(
                        s_base + rows[:, None] * D + cols[None, :],
                        mask=(rows < held)[:, None] & dmask[None, :],  # a fresh sequence: zeros before its first token
                        other=0.0,
                    )
                    g_b = _decay(
                        fa_ptr,
                        fb_ptr,
                        dt_bias_ptr,
                        row0,
                        T,
                        RANK,
                        h * D + rows,
                        rows < D,
                        a,
                        lower_bound,
                        BOUNDED,
                        dtype,
                        BLOCK_T,
                        BLOCK_RANK,
                        USE_DOT,
                        UPCAST,
                        NUM_STAGES,
                    )
                    S_b = S_b * tl.exp(tl.sum(tl.where(here, g_b, 0.0), axis=0))[:, None]  # Diag(e^g_t) S[rows, :]
                    k_b = tl.load(k_ptr + head0 + rows, mask=rows < D, other=0.0).to(tl.float32) / k_den
                    if rewrite:
                        S_b = S_b + k_b[:, None] * u[None, :]
                        bmask = (rows < D)[:, None] & dmask[None, :]
                        tl.store(s_base + rows[:, None] * D + cols[None, :], S_b, mask=bmask)
                        if KEEP:
                            h_base = hist_ptr + slot.to(tl.int64) * stride_hist_slot + t * stride_hist_t + h * D * D
                            tl.store(h_base + rows[:, None] * D + cols[None, :], S_b, mask=bmask)
                    else:
                        q_b = tl.load(q_ptr + head0 + rows, mask=rows < D, other=0.0).to(tl.float32) / q_den * q_scale
                        ks += tl.sum(k_b[:, None] * S_b, axis=0)
                        qs += tl.sum(q_b[:, None] * S_b, axis=0)
            tl.debug_barrier()  # the new state in memory before the next token reads it
            held = D
            o = qs + tl.sum(q_t * k_t) * u
        o = o * vec_inv_rms(o, D, eps)
        y = w_norm * o * tl.sigmoid(gate_t)
        tl.store(out_ptr + head0 + cols, y.to(out_ptr.dtype.element_ty), mask=dmask)
    if BLOCK_KD == BLOCK_D:
        tl.store(s_base + cols[:, None] * D + cols[None, :], S, mask=smask)


@triton.jit
def _decay(
    fa_ptr,
    fb_ptr,
    dt_bias_ptr,
    row0,
    T,
    RANK,
    channels,
    cmask,
    a,
    lower_bound,
    BOUNDED: tl.constexpr,
    dtype: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_RANK: tl.constexpr,
    USE_DOT: tl.constexpr,
    UPCAST: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """The decay gate g [BLOCK_T, len(channels)] fp32 of the sequence's T rows (rows row0..) at key channels
    ``channels`` of the layer: f = fa W_fb[channels]ᵀ rounded to the model dtype, z = f + dt_bias,
    g = lower_bound · σ(a z) (BOUNDED) or -a · softplus(z)."""
    f, _ = gemv_rows(
        fa_ptr + row0 * RANK,
        RANK,
        T,
        0,
        RANK,
        fa_ptr,
        tl.full([BLOCK_T], 1.0, tl.float32),
        fb_ptr,
        fb_ptr,
        RANK,
        fb_ptr,
        fb_ptr,
        0,
        0,
        channels,
        channels,
        cmask,
        False,
        False,
        False,
        dtype,
        BLOCK_T,
        BLOCK_RANK,
        USE_DOT,
        UPCAST,
        NUM_STAGES,
    )
    z = _round(f, dtype) + tl.load(dt_bias_ptr + channels, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if BOUNDED:
        g = lower_bound * tl.sigmoid(a * z)
    else:
        g = -a * _softplus(z)
    return g
