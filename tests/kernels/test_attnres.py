"""K3's attention-residual mix + norm (``nonstop/kernels/attnres.py``) against its twin inside real steps of the
tiny K3 (7 layers, blocks of 3: all 15 mixes - 0 to 3 completed blocks, with and without a block store), with
the output poisoned and the kernel's scratch (per-chunk sums) filled with NaN before every launch: rows split
into 2 column chunks (the interpreter's default) or 3 ragged ones of 16 columns. The harness compares ``blocks``
too (the twin's store), its stored block poisoned first."""

from __future__ import annotations

import pytest
import torch

from nonstop.kernels import attnres, launch
from tests.kernels.harness import check_kernel
from tests.tiny_configs import TINY_CONFIGS

F32, F16 = torch.float32, torch.float16


def _stale_scratch_then_kernel(op, env):
    for name in ("attnres.dots", "attnres.sq"):
        for (key, _, _), t in launch._WORKSPACES.items():
            if key == name:
                t.fill_(float("nan"))
    attnres.attnres_mix_norm(op, env)


@pytest.mark.parametrize("block_c", [None, 16], ids=["2-chunks", "3-chunks"])
@pytest.mark.parametrize("dtype,B,T", [(F32, 1, 1), (F16, 3, 1), (F32, 2, 3), (F16, 3, 3)])
def test_attnres_mix_norm(dtype, B, T, block_c, monkeypatch):
    if block_c is not None:
        blocks = attnres.attnres_blocks
        monkeypatch.setattr(
            attnres, "attnres_blocks", lambda D, S: {**blocks(D, S), "BLOCK_C": block_c, "BLOCK_NCH": 4}
        )
    assert attnres.attnres_blocks(44, 4)["BLOCK_C"] == (block_c or 32)  # the tiny K3's 44 columns: 2 or 3 chunks
    checked = check_kernel("attnres_mix_norm", TINY_CONFIGS["kimi_k3"], _stale_scratch_then_kernel, dtype, B=B, T=T)
    assert checked == 15
    assert not launch.phase_counters("attnres", "cpu").any(), "the counters must be back at zero after the launch"


def test_a_kernel_that_skips_the_block_store_fails_the_check():
    """``blocks`` is not among the op's writes, yet the harness checks the store into it: a kernel that leaves
    the stored block as it found it (the poisoned values) is caught."""

    def without_store(op, env):
        blocks = env.buf["blocks"].clone()
        attnres.attnres_mix_norm(op, env)
        env.buf["blocks"].copy_(blocks)

    with pytest.raises(AssertionError, match="-> blocks"):
        check_kernel("attnres_mix_norm", TINY_CONFIGS["kimi_k3"], without_store, F32, B=2, T=1)


def test_scratch_first_made_in_inference_mode_stays_writable_outside_it(monkeypatch):
    """Workspaces are process-wide: one first made under ``torch.inference_mode`` (a generate call, or an earlier
    test in the same worker) is a normal tensor, so a caller outside inference mode may write it in place (the
    NaN poisoning above)."""
    monkeypatch.setattr(launch, "_WORKSPACES", {})
    with torch.inference_mode():
        scratch = launch.workspace("attnres.dots", 1 << 12, torch.float32, "cpu")
    assert not scratch.is_inference()
    assert check_kernel("attnres_mix_norm", TINY_CONFIGS["kimi_k3"], _stale_scratch_then_kernel, F32, B=2, T=1) == 15
