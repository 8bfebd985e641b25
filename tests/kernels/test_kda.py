"""KDA super-op kernels (``nonstop/kernels/kda.py``) against their twins, inside real decode steps.

Configs: kimi_linear (softplus gate, low-rank output gate, conv width 4), kimi_linear_layer_types
(2 heads of 10, conv width 3), kimi_k3 (lower-bound gate, full-rank output gate, input already
normalised). Rows: B sequences × T tokens, the last sequence fresh (zero state and window); T = 3
exercises the in-order recurrence and the conv taps that read this step's own earlier tokens.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from nonstop.kernels import kda  # noqa: E402
from nonstop.kernels.kda_tiles import _softplus  # noqa: E402
from tests.kernels.harness import check_kernel  # noqa: E402
from tests.tiny_configs import TINY_CONFIGS  # noqa: E402

CONFIGS = ["kimi_linear", "kimi_linear_layer_types", "kimi_k3"]
DTYPES = [torch.float32, torch.float16]
KINDS = ["kda_in_proj", "kda_core"]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The twins' tiny ops run fastest on one thread (a second one mostly spins on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _check(kind, config, dtype, B, T, seed=0, prompt_lens=(5, 3, 7)):
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", RuntimeWarning
        )  # the interpreter's exp overflows to inf inside sigmoid (harmless)
        return check_kernel(
            kind, TINY_CONFIGS[config], kda.KERNELS[kind], dtype, B=B, T=T, seed=seed, prompt_lens=prompt_lens
        )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize("B,T", [(2, 1), (3, 3)])
def test_kda_kernel_matches_twin(kind, config, dtype, B, T):
    """The 2 kinds × 3 configs × fp32/fp16 × (2 sequences of 1 token, 3 sequences of 3 tokens)."""
    assert _check(kind, config, dtype, B, T) > 0


@pytest.mark.parametrize(
    "B,T,config,dtype",
    [
        (1, 1, "kimi_k3", torch.float32),
        (1, 1, "kimi_linear", torch.float16),
        (2, 3, "kimi_linear_layer_types", torch.float16),
        (3, 1, "kimi_k3", torch.float32),
    ],
)
@pytest.mark.parametrize("kind", KINDS)
def test_kda_kernel_rows(kind, B, T, config, dtype):
    """One row, and the other pairings of B and T."""
    assert _check(kind, config, dtype, B, T, seed=B + T) > 0


@pytest.mark.parametrize("kind", KINDS)
def test_fresh_sequence_ignores_what_the_slot_held(kind):
    """A fresh sequence (start == 0) starts from a zero state and window whatever its slot held: the
    kernel's copy of the fresh slot is filled with NaN first (the twin's copy holds zeros)."""

    def dirty_then_kernel(op, env):
        layer = env.cache.layers[op.attrs["cache_layer"]]
        fresh = env.batch.slots[env.batch.start == 0]
        held = layer.conv if kind == "kda_in_proj" else layer.recurrent  # the state this kind rewrites
        held[fresh] = float("nan")
        kda.KERNELS[kind](op, env)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert check_kernel(kind, TINY_CONFIGS["kimi_linear"], dirty_then_kernel, torch.float32, B=2, T=1) > 0


@pytest.mark.parametrize(
    "config,dtype,keep",
    [("kimi_linear", torch.float32, False), ("kimi_k3", torch.float16, True)],
    ids=["kimi_linear", "kimi_k3-keep"],
)
def test_kda_core_streams_a_wide_state(config, dtype, keep, monkeypatch):
    """A head whose [D, D] state exceeds ``kda.STATE_ELEMS`` streams it through memory in blocks of key rows
    (two passes a token): shrunk here to 2 blocks of the tiny heads, against the twin - 3 sequences of 3 tokens
    (one fresh: its slot holds junk), and a speculative-verification step keeping the state after every token."""
    monkeypatch.setattr(kda, "STATE_ELEMS", 128)
    assert kda.state_block_rows(16) == 8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert check_kernel("kda_core", TINY_CONFIGS[config], kda.kda_core, dtype, B=3, T=3, seed=7, keep_states=keep)


# ----------------------------------------------------------------------------- tile helpers


@triton.jit
def _softplus_kernel(z_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(out_ptr + i, _softplus(tl.load(z_ptr + i, mask=i < n)), mask=i < n)


def test_softplus_matches_torch():
    z = torch.tensor([-90.0, -30.0, -12.0, -4.6, -4.5, -1.0, 0.0, 0.5, 3.0, 19.9, 20.0, 20.1, 60.0])
    out = torch.empty_like(z)
    _softplus_kernel[(1,)](z, out, z.numel(), BLOCK=16)
    torch.testing.assert_close(out, F.softplus(z), rtol=1e-6, atol=0)


def test_kda_in_proj_conv_windows_of_more_sequences_than_one_block():
    """6 sequences (5 with history, 1 fresh) of one token at conv width 4 keep 6 x 3 = 18 window rows, more
    than one 16-row block: window entry 1 of the sixth sequence (row 16) shifts to entry 0; a window block
    sized for one sequence's 3 rows (16) never moved it, leaving that sequence's window stale."""
    assert _check("kda_in_proj", "kimi_linear", torch.float32, 6, 1, seed=4, prompt_lens=(5, 3, 7, 2, 6)) > 0


def test_kda_in_proj_refuses_a_step_without_a_convolution_window():
    """Conv size 1 keeps no previous token (the kernel's window of K - 1 rows would be empty): refused with a
    reason naming the size; 2 (one previous token) is the smallest it runs."""
    assert "short_conv_kernel_size 1" in kda.kda_in_proj_refusal({"conv_size": 1})
    assert kda.kda_in_proj_refusal({"conv_size": 2}) is None
