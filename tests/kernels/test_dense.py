"""Dense super-op kernels (embed, linear_residual, lm_head, mlp) against their twins
inside real decode steps, and the GEMV / activation tile helpers against torch."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from nonstop.kernels import activations, dense, gemv, launch
from nonstop.model.activations import glu
from nonstop.model.norms import rms_norm
from tests.kernels.harness import check_kernel
from tests.tiny_configs import TINY_CONFIGS

F32, F16 = torch.float32, torch.float16


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny shapes: torch's thread pool only spin-waits, and on a loaded 2-core machine that costs 30x."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# (dtype, B, T): both dtypes see T = 1 and T = 3 (R = 1, 3, 6, 9 rows, all padded to 16 for the mma)
FULL = [(F32, 1, 1), (F16, 3, 1), (F32, 2, 3), (F16, 3, 3)]
SHORT = [(F32, 1, 1), (F16, 3, 3)]  # for kimi_k3, whose model and prefill cost ~5 s per check


def _cases(configs, cases):
    return [pytest.param(c, d, b, t, id=f"{c}-{str(d)[6:]}-B{b}T{t}") for c in configs for d, b, t in cases]


@pytest.mark.parametrize("config,dtype,B,T", _cases(["llama"], FULL) + _cases(["kimi_k3"], SHORT))
def test_mlp(config, dtype, B, T):
    """llama: SwiGLU with the plain residual h; kimi_k3: SiTU into the attnres partial sum."""
    check_kernel("mlp", TINY_CONFIGS[config], dense.KERNELS["mlp"], dtype, B=B, T=T, seed=B + T)


@pytest.mark.parametrize("config,dtype,B,T", _cases(["llama"], FULL) + _cases(["kimi_k3"], SHORT))
def test_linear_residual(config, dtype, B, T):
    """llama: o_proj with bias, accumulating; kimi_k3: accumulating and block-opening (store) o_projs."""
    check_kernel("linear_residual", TINY_CONFIGS[config], dense.KERNELS["linear_residual"], dtype, B=B, T=T, seed=B)


@pytest.mark.parametrize("config,dtype,B,T", _cases(["llama"], FULL) + _cases(["kimi_k3"], SHORT))
def test_lm_head(config, dtype, B, T):
    """llama: tied head with the final RMSNorm fused; kimi_k3: untied head after the final mix."""
    check_kernel("lm_head", TINY_CONFIGS[config], dense.KERNELS["lm_head"], dtype, B=B, T=T, seed=T)


@pytest.mark.parametrize("config,dtype,B,T", _cases(["llama"], SHORT) + _cases(["kimi_k3"], [(F16, 2, 3)]))
def test_embed(config, dtype, B, T):
    check_kernel("embed", TINY_CONFIGS[config], dense.KERNELS["embed"], dtype, B=B, T=T)


@pytest.mark.parametrize("dtype", [F32, torch.bfloat16])
def test_embed_rows_wider_than_one_block(dtype):
    """D = 4133: three 2048-column blocks (the last ragged), from a table and into an output that are
    column slices of wider tensors; every row must be its token's table row, repeated tokens included."""
    gen = torch.Generator().manual_seed(3)
    D = 2 * 2048 + 37
    table = torch.randn(9, D + 11, generator=gen).to(dtype)[:, :D]
    ids = torch.tensor([4, 0, 8, 4, 2])
    out = torch.full((5, D + 5), float("nan"), dtype=dtype)
    op = SimpleNamespace(reads=["ids"], writes=["x"], weights={"embed": table})
    dense.embed(op, SimpleNamespace(buf={"ids": ids, "x": out[:, :D]}))
    assert torch.equal(out[:, :D], table[ids])
    assert out[:, D:].isnan().all(), "columns past D of a wider output were written"


@pytest.mark.parametrize(
    "D,dtype,warps",
    [
        (256, torch.bfloat16, 1),
        (256, F32, 2),
        (512, torch.bfloat16, 2),
        (40, torch.bfloat16, 1),
        (2048, torch.bfloat16, 4),
        (7168, F16, 4),
    ],
)
def test_embed_launch_gives_each_thread_16_bytes(monkeypatch, D, dtype, warps):
    """The embed launcher's warps fit its row block: every thread reads 16 bytes of a BLOCK_D block (k3-nano's
    256-wide bf16 rows: 1 warp, not 4 warps of 4-byte loads), at most 4 warps for wide rows."""
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((grid, kwargs))

    monkeypatch.setattr(dense, "embed_kernel", Recorder())
    table = torch.empty(8, D, dtype=dtype, device="meta")
    op = SimpleNamespace(reads=["ids"], writes=["x"], weights={"embed": table})
    env = SimpleNamespace(buf={"ids": torch.zeros(3, dtype=torch.int64), "x": torch.empty(3, D, dtype=dtype)})
    dense.embed(op, env)
    [(grid, kwargs)] = launches
    launched = kwargs.get("num_warps", 4)  # Triton's default
    assert grid == (3,) and launched == warps, kwargs
    assert kwargs["BLOCK_D"] * table.element_size() >= 16 * 32 * launched or launched == 1


@pytest.mark.parametrize(
    "config,kind",
    [(c, k) for c in ("deepseek_v3", "kimi_linear") for k in ("mlp", "linear_residual", "lm_head")]
    + [("kimi_linear_layer_types", "mlp")],
)
def test_other_families(config, kind):
    """The same kinds inside the MLA / KDA / MoE families (dense first layer, untied heads, odd widths)."""
    check_kernel(kind, TINY_CONFIGS[config], dense.KERNELS[kind], F16, B=2, T=3)


def test_mlp_many_tasks_and_counter_reset():
    """Five h chunks of 16 and three down tiles of 16 (R = 6: the mma path); the counters end at zero."""
    check_kernel(
        "mlp",
        TINY_CONFIGS["llama"],
        functools.partial(dense.mlp, BLOCK_I=16, BLOCK_K=16, BLOCK_N=16, BLOCK_KD=16),
        F32,
        B=2,
        T=3,
    )
    assert not launch.phase_counters("mlp", "cpu").any()


# ----------------------------------------------------------------------------- tile helpers vs torch


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("R", [1, 5])
def test_gemv_epilogues(dtype, R):
    """STORE (rounded, fp32 out), ADD (residual); fused RMSNorm and bias; several K steps."""
    gen = torch.Generator().manual_seed(R)
    N, K = 37, 45
    x, w, b, g = (torch.randn(*s, generator=gen).to(dtype) for s in ((R, K), (N, K), (N,), (K,)))
    y = F.linear(rms_norm(x, g, 1e-5), w, b)  # model dtype, as the twins compute it
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == F32 else dict(rtol=1e-3, atol=1e-3)
    out = torch.full((R, N), float("nan"))
    gemv.launch_gemv(x, w, out, bias=b, norm=g, eps=1e-5, epilogue=gemv.STORE, round_y=True)
    torch.testing.assert_close(out, y.float(), **tol)
    h = torch.randn(R, N, generator=gen).to(dtype)
    want = h + y
    gemv.launch_gemv(x, w, h, bias=b, norm=g, eps=1e-5, epilogue=gemv.ADD, round_y=True)
    torch.testing.assert_close(h.float(), want.float(), **tol)
    out = torch.full((R, N), float("nan"))
    gemv.launch_gemv(x, w, out, bias=b, norm=g, eps=1e-5, epilogue=gemv.STORE, round_y=True, BLOCK_K=16, BLOCK_N=16)
    torch.testing.assert_close(out, y.float(), **tol)


@pytest.mark.parametrize("act", ["silu", "situ"])
def test_glu_tile(act):
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(g_ptr, u_ptr, out_ptr, ACT: tl.constexpr, N: tl.constexpr):
        i = tl.arange(0, N)
        h = activations.glu_tile(tl.load(g_ptr + i), tl.load(u_ptr + i), ACT, 4.0, 25.0, tl.float32)
        tl.store(out_ptr + i, h)

    z = torch.cat([torch.linspace(-60, 60, 200), torch.linspace(-0.3, 0.3, 56)])
    g, u = z, z.flip(0) * 0.7
    out = torch.empty_like(z)
    kernel[(1,)](g, u, out, ACT=activations.SITU if act == "situ" else activations.SILU, N=z.numel())
    torch.testing.assert_close(out, glu(g, u, act, 4.0, 25.0), rtol=2e-6, atol=1e-6)
