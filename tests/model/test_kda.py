"""KDA: our recurrent and chunked forms against each other and against fla's naive references,
for both gate variants (Kimi Linear softplus, K3 lower bound), plus the short conv and the layer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nonstop.model.kda import kda_chunked, kda_gate_lower_bound, kda_gate_softplus, kda_recurrent, short_conv
from nonstop.model.norms import l2_norm

fla_naive = pytest.importorskip("fla.ops.kda.naive")
fla_gate = pytest.importorskip("fla.ops.kda.gate")


def _inputs(B, T, H, D, Dv, gate: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = l2_norm(torch.randn(B, T, H, D, generator=g)) * D**-0.5
    k = l2_norm(torch.randn(B, T, H, D, generator=g))
    v = torch.randn(B, T, H, Dv, generator=g)
    f = torch.randn(B, T, H, D, generator=g)
    A_log = torch.rand(H, generator=g) * 2
    dt_bias = torch.randn(H * D, generator=g) * 0.5
    if gate == "softplus":
        gv = kda_gate_softplus(f, A_log, dt_bias)
        ref = fla_gate.naive_kda_gate(f, A_log, dt_bias)
    else:
        gv = kda_gate_lower_bound(f, A_log, dt_bias, -5.0)
        ref = fla_gate.naive_kda_lowerbound_gate(f, A_log, dt_bias, lower_bound=-5.0)
    beta = torch.sigmoid(torch.randn(B, T, H, generator=g))
    state = torch.randn(B, H, D, Dv, generator=g) * 0.3
    return q, k, v, gv, ref, beta, state


@pytest.mark.parametrize("gate", ["softplus", "lower_bound"])
@pytest.mark.parametrize("T", [1, 5, 37, 70])
def test_recurrent_and_chunked_equal_fla_naive(gate, T):
    q, k, v, g, g_ref, beta, state = _inputs(2, T, 3, 6, 5, gate, seed=T)
    torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-6)
    # fla scales q itself: give it the unscaled q and scale=D^-1/2
    o_ref, s_ref = fla_naive.naive_recurrent_kda(
        q * 6**0.5, k, v, g_ref, beta, scale=6**-0.5, initial_state=state, output_final_state=True
    )
    o_rec, s_rec = kda_recurrent(q, k, v, g, beta, state)
    o_chk, s_chk = kda_chunked(q, k, v, g, beta, state, chunk_size=16)
    for o, s in ((o_rec, s_rec), (o_chk, s_chk)):
        torch.testing.assert_close(o, o_ref, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(s, s_ref, rtol=1e-4, atol=1e-5)


def test_chunked_matches_fla_naive_chunk():
    q, k, v, g, _, beta, state = _inputs(1, 64, 2, 8, 8, "lower_bound", seed=9)
    o_ref, s_ref = fla_naive.naive_chunk_kda(
        q * 8**0.5, k, v, g, beta, scale=8**-0.5, initial_state=state, output_final_state=True, chunk_size=16
    )
    o, s = kda_chunked(q, k, v, g, beta, state, chunk_size=32)
    torch.testing.assert_close(o, o_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(s, s_ref, rtol=1e-4, atol=1e-5)


def test_recurrent_returns_every_intermediate_state():
    q, k, v, g, _, beta, state = _inputs(1, 6, 2, 4, 4, "softplus", seed=3)
    _, final, states = kda_recurrent(q, k, v, g, beta, state, return_states=True)
    for t in range(6):
        _, s_t = kda_recurrent(q[:, : t + 1], k[:, : t + 1], v[:, : t + 1], g[:, : t + 1], beta[:, : t + 1], state)
        torch.testing.assert_close(states[:, t], s_t)
    torch.testing.assert_close(states[:, -1], final)


def test_chunked_is_stable_with_strong_decay():
    """A long chunk of near-lower-bound decays: e^{G} underflows but nothing may overflow to inf/nan."""
    q, k, v, _, _, beta, state = _inputs(1, 64, 2, 4, 4, "softplus", seed=5)
    g = torch.full((1, 64, 2, 4), -4.99)
    o, s = kda_chunked(q, k, v, g, beta, state, chunk_size=64)
    o_rec, s_rec = kda_recurrent(q, k, v, g, beta, state)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    torch.testing.assert_close(o, o_rec, rtol=1e-4, atol=1e-5)


def test_short_conv_equals_padded_conv1d_and_streams():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 9, 5, generator=gen)
    w = torch.randn(5, 4, generator=gen)
    y, window = short_conv(x, w, None)
    expected = F.silu(F.conv1d(x.transpose(1, 2), w[:, None], padding=3, groups=5)[..., :9]).transpose(1, 2)
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(window, x[:, -3:].transpose(1, 2))
    # token by token through the window gives the same outputs
    win = None
    for t in range(9):
        y_t, win = short_conv(x[:, t : t + 1], w, win)
        torch.testing.assert_close(y_t[:, 0], expected[:, t])
