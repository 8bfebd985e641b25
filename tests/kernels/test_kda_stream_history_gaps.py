"""Gaps the mutation audit found in ``kda_core``'s streamed-state path (heads whose [D, D] state exceeds
``kda.STATE_ELEMS``, held in blocks of key rows) in a speculative-verification step (``keep_states``).

The only existing check of that path with a history runs in fp16, whose tolerance (atol 2e-2) is larger
than every value of the tiny model's per-token states: a history written into the wrong slot (or not at
all) still passed. Here the same step runs in fp32 (rtol 2e-4, atol 2e-5), with ``STATE_ELEMS`` shrunk so
the tiny heads (D = 8, 6, 10) stream in blocks.
"""

from __future__ import annotations

import warnings

import pytest
import torch

triton = pytest.importorskip("triton")

from nonstop.kernels import kda  # noqa: E402
from tests.kernels.harness import check_kernel  # noqa: E402
from tests.tiny_configs import TINY_CONFIGS  # noqa: E402


class _Recorder:
    """Wraps ``kda.kda_core_kernel``: records the BLOCK_KD of every launch."""

    def __init__(self, kernel):
        self.kernel, self.block_kd = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.block_kd.append(kwargs["BLOCK_KD"])
            return self.kernel[grid](*args, **kwargs)

        return launch


@pytest.mark.parametrize("config", ["kimi_k3", "kimi_linear_layer_types"])
def test_streamed_state_history_in_fp32(config, monkeypatch):
    """Catches a streamed kda_core that stores a token's state into the history of sequence index b rather
    than of its slot ``slots[b]`` (slots are [0, 1, 3] here), or of the wrong token: each kept state is
    compared with the twin's at fp32 tolerance. 3 sequences of 3 tokens, the last fresh in a junk slot.
    Also catches a launcher that never streams (BLOCK_KD = BLOCK_D whatever the state's size: a wide head's
    state then cannot stay in a GPU's registers)."""
    monkeypatch.setattr(kda, "STATE_ELEMS", 128)
    rec = _Recorder(kda.kda_core_kernel)
    monkeypatch.setattr(kda, "kda_core_kernel", rec)
    assert kda.state_block_rows(16) < 16  # the streamed path
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert check_kernel("kda_core", TINY_CONFIGS[config], kda.kda_core, torch.float32, B=3, T=3, keep_states=True)
    assert rec.block_kd and set(rec.block_kd) == {8}  # blocks of 8 key rows of the 16-wide padded head
