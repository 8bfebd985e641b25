"""Kimi Delta Attention (KDA): gated delta-rule linear attention with per-channel decay.

Per token x [d] (after the layer's input norm), H heads of dk = dv = D channels, conv width K:
  q̂, k̂, v̂ = W_q x, W_k x, W_v x                                     [H·D] each
  q, k, v  = SiLU(ShortConv(q̂)), ...        depthwise causal conv; tap K-1 multiplies the current token
  q ← L2(q)·D^-½,  k ← L2(k)                  per head, fp32, eps 1e-6 inside the root
  f = W_fb W_fa x + dt_bias                   [H, D] decay logits
    Kimi Linear:  g = -exp(A_log[h]) · softplus(f)
    K3 (bounded): g = lower_bound · σ(exp(A_log[h]) · f)   ∈ (lower_bound, 0)
  β = σ(W_b x)                                [H]
  S ← Diag(exp g) S;  S ← S + k (β (v - Sᵀk))ᵀ;  o = Sᵀ q          state S [H, D, D] fp32 (key × value)
  y = W_o [ o_norm(o) ⊙ σ(W_g x) ]            W_g full rank (K3) or W_gb W_ga (Kimi Linear)

Prefill uses the chunked (WY) form, decode the recurrence; both give the same outputs and state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nonstop.cache.state import KDAState, StepBatch
from nonstop.config import KDAConfig
from nonstop.model.linear import Linear
from nonstop.model.norms import GatedRMSNorm, l2_norm
from nonstop.model.rows import rowwise

# ----------------------------------------------------------------------------- gates


def kda_gate_softplus(f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """Kimi Linear decay: g = -exp(A_log[h]) · softplus(f + dt_bias). f: [..., H, D]; A_log [H]; dt_bias [H·D]."""
    H, D = f.shape[-2:]
    z = f.float() + dt_bias.float().view(H, D)
    return -torch.exp(A_log.float()).view(H, 1) * F.softplus(z)


def kda_gate_lower_bound(
    f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float
) -> torch.Tensor:
    """K3 decay: g = lower_bound · σ(exp(A_log[h]) · (f + dt_bias)) ∈ (lower_bound, 0). Shapes as above."""
    H, D = f.shape[-2:]
    z = f.float() + dt_bias.float().view(H, D)
    return lower_bound * torch.sigmoid(torch.exp(A_log.float()).view(H, 1) * z)


# ----------------------------------------------------------------------------- short conv


def short_conv(x: torch.Tensor, weight: torch.Tensor, window: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv + SiLU over time.

    x: [B, T, C] raw projections; weight: [C, K] (tap K-1 = current token); window: [B, C, K-1] the
    previous K-1 inputs (zeros at sequence start, None = zeros). Returns (SiLU(conv) [B, T, C],
    new window [B, C, K-1] = the last K-1 inputs).
    """
    B, T, C = x.shape
    K = weight.shape[-1]
    if window is None:
        window = x.new_zeros(B, C, K - 1)
    seq = torch.cat([window.to(x.dtype), x.transpose(1, 2)], dim=-1)  # [B, C, K-1+T]
    # the K taps as one elementwise product and sum (a depthwise F.conv1d costs a oneDNN call of
    # milliseconds for one decode token on CPU; this form also compiles into one fused loop)
    out = (seq.unfold(-1, K, 1) * weight.to(x.dtype)[:, None, :]).sum(-1)  # [B, C, T]
    return F.silu(out.transpose(1, 2).contiguous()), seq[:, :, seq.shape[-1] - (K - 1) :]


def conv_windows(x: torch.Tensor, window: torch.Tensor | None, K: int) -> torch.Tensor:
    """The short-conv window after every token: x [B, T, C] raw projections, window [B, C, K-1] before
    them (None = zeros) -> [B, T, C, K-1], entry t = the K-1 inputs ending at token t (what
    ``short_conv`` returns as the new window after a step ending at t)."""
    B, T, C = x.shape
    if window is None:
        window = x.new_zeros(B, C, K - 1)
    seq = torch.cat([window.to(x.dtype), x.transpose(1, 2)], dim=-1)  # [B, C, K-1+T]
    return seq.unfold(-1, K - 1, 1)[:, :, 1:].transpose(1, 2)


# ----------------------------------------------------------------------------- the recurrence


def kda_recurrent(q, k, v, g, beta, state: torch.Tensor | None = None, return_states: bool = False):
    """Token-by-token KDA. q, k: [B,T,H,D] (normalised, q scaled); v: [B,T,H,Dv]; g: [B,T,H,D] log-decay;
    beta: [B,T,H]; state: [B,H,D,Dv] fp32 or None (zeros).

    Returns o [B,T,H,Dv] fp32, final state [B,H,D,Dv] fp32 and, if ``return_states``, the state after
    every token [B,T,H,D,Dv] (speculative verification keeps the accepted one).
    """
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    B, T, H, D = q.shape
    S = q.new_zeros(B, H, D, v.shape[-1]) if state is None else state.float().clone()
    outs, states = [], []
    for t in range(T):
        S = S * torch.exp(g[:, t])[..., None]
        pred = torch.einsum("bhk,bhkv->bhv", k[:, t], S)
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], beta[:, t, :, None] * (v[:, t] - pred))
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
        if return_states:
            states.append(S)
    o = torch.stack(outs, dim=1)
    if return_states:
        return o, S, torch.stack(states, dim=1)
    return o, S


def kda_chunked(q, k, v, g, beta, state: torch.Tensor | None = None, chunk_size: int = 32):
    """Chunked (WY) KDA: the same outputs and final state as ``kda_recurrent`` with matrix products.

    Inside a chunk with entering state S0 and cumulative log-decay G_t = Σ_{s≤t} g_s:
      S_t = Diag(e^{G_t}) S0 + Σ_{s≤t} Diag(e^{G_t-G_s}) k_s u_sᵀ,
      (I + Diag(β) A) U = Diag(β) (V - (K ⊙ e^G) S0),   A_ts = Σ_i k_t,i k_s,i e^{G_t,i-G_s,i} (s < t),
      o_t = S0ᵀ(q_t ⊙ e^{G_t}) + Σ_{s≤t} (Σ_i q_t,i k_s,i e^{G_t,i-G_s,i}) u_s.
    Pairwise decays are formed as e^{G_t-G_s} (never e^{G_t}·e^{-G_s}), so nothing overflows.
    Shapes as ``kda_recurrent``; differentiable (used for training).
    """
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    B, T, H, D = q.shape
    Dv = v.shape[-1]
    C = chunk_size
    pad = (-T) % C
    if pad:  # padded steps: k = v = β = g = 0 leave the state untouched
        q, k, v, g = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v, g))
        beta = F.pad(beta, (0, 0, 0, pad))
    n = (T + pad) // C
    # [B, H, n, C, ...]
    q, k, v, g = (t.view(B, n, C, H, -1).permute(0, 3, 1, 2, 4) for t in (q, k, v, g))
    beta = beta.view(B, n, C, H).permute(0, 3, 1, 2)
    G = g.cumsum(dim=-2)
    idx = torch.arange(C, device=q.device)
    incl = idx[:, None] >= idx[None, :]  # s <= t
    strict = idx[:, None] > idx[None, :]  # s < t
    eye = torch.eye(C, device=q.device)
    S = q.new_zeros(B, H, D, Dv) if state is None else state.float()
    outs = []
    for c in range(n):
        qc, kc, vc, Gc, bc = q[:, :, c], k[:, :, c], v[:, :, c], G[:, :, c], beta[:, :, c]
        diff = Gc[:, :, :, None, :] - Gc[:, :, None, :, :]  # [B,H,C(t),C(s),D]
        decay = torch.exp(diff.masked_fill(~incl[:, :, None], float("-inf")))
        A = torch.einsum("bhtk,bhsk,bhtsk->bhts", kc, kc, decay) * strict
        Aqk = torch.einsum("bhtk,bhsk,bhtsk->bhts", qc, kc, decay)
        eG = torch.exp(Gc)
        rhs = bc[..., None] * (vc - torch.einsum("bhtk,bhkv->bhtv", kc * eG, S))
        U = torch.linalg.solve_triangular(eye + bc[..., None] * A, rhs, upper=False, unitriangular=True)
        outs.append(torch.einsum("bhtk,bhkv->bhtv", qc * eG, S) + Aqk @ U)
        G_last = Gc[:, :, -1]  # [B,H,D]
        S = torch.exp(G_last)[..., None] * S + torch.einsum(
            "bhsk,bhsv->bhkv", kc * torch.exp(G_last[:, :, None] - Gc), U
        )
    o = torch.stack(outs, dim=2).permute(0, 2, 3, 1, 4).reshape(B, n * C, H, Dv)[:, :T]
    return o, S


# ----------------------------------------------------------------------------- the layer


class KDAAttention(nn.Module):
    """One KDA layer with the checkpoint's tensor names (q/k/v_proj, q/k/v_conv1d, f_a/f_b_proj, b_proj,
    A_log, dt_bias, g_proj or g_a/g_b_proj, o_norm, o_proj)."""

    def __init__(self, cfg: KDAConfig, hidden: int, eps: float):
        super().__init__()
        self.cfg = cfg
        C, D, H, K = cfg.proj_dim, cfg.head_dim, cfg.num_heads, cfg.conv_size
        self.q_proj = Linear(hidden, C)
        self.k_proj = Linear(hidden, C)
        self.v_proj = Linear(hidden, C)
        self.q_conv1d = nn.Parameter(torch.empty(C, 1, K))
        self.k_conv1d = nn.Parameter(torch.empty(C, 1, K))
        self.v_conv1d = nn.Parameter(torch.empty(C, 1, K))
        self.f_a_proj = Linear(hidden, D)
        self.f_b_proj = Linear(D, C)
        self.b_proj = Linear(hidden, H)
        self.A_log = nn.Parameter(torch.empty(H))
        self.dt_bias = nn.Parameter(torch.empty(C))
        if cfg.full_rank_output_gate:
            self.g_proj = Linear(hidden, C)
        else:
            self.g_a_proj = Linear(hidden, D)
            self.g_b_proj = Linear(D, C)
        self.o_norm = GatedRMSNorm(D, eps)
        self.o_proj = Linear(C, hidden)
        self.chunked: bool | None = None  # None: chunked for prefill (T > 1), recurrent for decode
        self.chunk_size = 32  # chunked form's block length: same result; cost and memory per token grow with it

    def conv_weights(self) -> list[torch.Tensor]:
        return [w.squeeze(1) for w in (self.q_conv1d, self.k_conv1d, self.v_conv1d)]

    def gate(self, x: torch.Tensor) -> torch.Tensor:
        """x [B,T,d] -> log-decay g [B,T,H,D] fp32."""
        c = self.cfg
        f = self.f_b_proj(self.f_a_proj(x)).view(*x.shape[:2], c.num_heads, c.head_dim)
        if c.gate_lower_bound is None:
            return kda_gate_softplus(f, self.A_log, self.dt_bias)
        return kda_gate_lower_bound(f, self.A_log, self.dt_bias, c.gate_lower_bound)

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        return self.g_proj(x) if self.cfg.full_rank_output_gate else self.g_b_proj(self.g_a_proj(x))

    def qkv(self, x: torch.Tensor, windows: torch.Tensor | None, every_token: bool = False):
        """Projections + conv + SiLU + L2 norms. windows [B,3,C,K-1] or None.
        Returns q, k [B,T,H,D] fp32 (q scaled by D^-½), v [B,T,H,D] fp32 and the new windows
        [B,3,C,K-1] — or with ``every_token`` the windows after every token [B,T,3,C,K-1]."""
        c = self.cfg
        B, T, _ = x.shape
        outs, new_windows = [], []
        for i, (proj, w) in enumerate(zip((self.q_proj, self.k_proj, self.v_proj), self.conv_weights())):
            raw = proj(x)
            window = None if windows is None else windows[:, i]
            y, win = short_conv(raw, w, window)
            outs.append(y.float().view(B, T, c.num_heads, c.head_dim))
            new_windows.append(conv_windows(raw, window, c.conv_size) if every_token else win)
        q, k, v = outs
        q = l2_norm(q) * c.head_dim**-0.5
        k = l2_norm(k)
        return q, k, v, torch.stack(new_windows, dim=2 if every_token else 1)

    def forward(self, x: torch.Tensor, batch: StepBatch, state: KDAState | None) -> torch.Tensor:
        B, T, _ = x.shape
        windows = recurrent = None
        if state is not None:
            windows = state.conv[batch.slots]
            recurrent = state.recurrent[batch.slots]
            fresh = batch.start == 0  # a new sequence starts from zero state whatever the slot held
            if bool(fresh.any()):
                windows = torch.where(fresh[:, None, None, None], torch.zeros_like(windows), windows)
                recurrent = torch.where(fresh[:, None, None, None], torch.zeros_like(recurrent), recurrent)
        keep = batch.keep_states and state is not None
        q, k, v, new_windows = self.qkv(x, windows, every_token=keep)
        g = self.gate(x)
        beta = rowwise(torch.sigmoid, self.b_proj(x).float())
        chunked = self.chunked if self.chunked is not None else not batch.decode_form
        if keep:
            o, final, states = kda_recurrent(q, k, v, g, beta, recurrent, return_states=True)
            state.keep_conv(batch.slots, new_windows)
            state.keep_recurrent(batch.slots, states)
            new_windows = new_windows[:, -1]
        elif chunked:
            o, final = kda_chunked(q, k, v, g, beta, recurrent, self.chunk_size)
        else:
            o, final = kda_recurrent(q, k, v, g, beta, recurrent)
        if state is not None:
            state.conv[batch.slots] = new_windows.to(state.conv.dtype)
            state.recurrent[batch.slots] = final
        H = self.cfg.num_heads
        y = self.o_norm(o.view(B, T, H, -1), self.output_gate(x).view(B, T, H, -1))
        return self.o_proj(y.reshape(B, T, -1).to(x.dtype))
