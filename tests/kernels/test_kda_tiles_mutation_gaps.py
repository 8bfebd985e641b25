"""Gaps the mutation audit of ``nonstop/kernels/kda_tiles.py`` found (the KDA tile helpers), closed against
the plain-torch twins (``kda_in_proj``, ``kda_core`` in program/reference.py) inside real decode steps of
the tiny odd-shaped models, via ``tests.kernels.harness.check_kernel``: the kernel's outputs and the
per-token histories are poisoned (NaN) before the launch, and the fresh sequence's slot holds junk.

- ``kda_in_proj`` never ran a speculative-verification step (``keep_states``) in any test: the conv
  history it writes per token (``KEEP``) was unchecked - every entry could be wrong or missing.
- ``kda_core`` with its state in registers (``BLOCK_KD == BLOCK_D``) never ran ``keep_states`` either
  (only the streamed path did): its per-token history could go to the wrong token.
- The kimi_linear tiny models' q/k/v channels (3C = 54, 60) fit in the first ``IN_PROJ_BLOCK_N = 64`` tile:
  only the kimi_k3 tiny model had tiles starting inside the conv channels (a real K3 layer has hundreds);
  here the tile is shrunk so the conv-width-3 model's channels (and a v | og boundary) span several tiles.
"""

from __future__ import annotations

import warnings

import pytest
import torch

triton = pytest.importorskip("triton")

from nonstop.kernels import kda  # noqa: E402
from tests.kernels.harness import check_kernel  # noqa: E402
from tests.tiny_configs import TINY_CONFIGS  # noqa: E402


@pytest.fixture(autouse=True)
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _check(kind, config, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's exp overflow inside sigmoid
        return check_kernel(kind, TINY_CONFIGS[config], kda.KERNELS[kind], torch.float32, **kw)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("config", ["kimi_linear", "kimi_linear_layer_types"])
def test_in_proj_conv_history_in_a_verification_step(config):
    """Conv widths 4 and 3 (3 and 2 window entries), 3 sequences of 3 tokens (the last fresh, its slot
    junk) with keep_states: every window entry after every token is compared with the twin's at fp32
    tolerance. Kills a history whose current-token entry (K-2) or older entries (K-2-s) are shifted, or
    whose oldest entry is never written (left NaN)."""
    assert _check("kda_in_proj", config, B=3, T=3, seed=2, keep_states=True) > 0


@pytest.mark.timeout(120)
def test_in_proj_history_with_fewer_tokens_than_the_window():
    """T = 2 < K - 1 = 3 (kimi_linear): the window after token 0 still holds two entries of the old window,
    and the fresh sequence (first row here: slots [3, 0, 1]) must see zeros there, not its slot's junk."""
    assert _check("kda_in_proj", "kimi_linear", B=3, T=2, seed=5, keep_states=True, slots=[3, 0, 1]) > 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("config", ["kimi_linear", "kimi_k3"])
def test_core_history_with_the_state_in_registers(config):
    """kda_core with the whole [D, D] state in registers (the default for the tiny heads) in a verification
    step, fp32: the state after every token of every sequence is compared with the twin's (token order,
    slot). 3 sequences of 3 tokens, the last fresh."""
    assert kda.state_block_rows(16) == 16  # the register path, not the streamed one
    assert _check("kda_core", config, B=3, T=3, seed=3, keep_states=True) > 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block_n", [16, 32])
def test_in_proj_conv_channels_split_over_tiles(block_n, monkeypatch):
    """W_in tiles of 16 / 32 rows (kimi_linear_layer_types: C = 20, so q/k/v = 60 channels span 4 / 2
    tiles, and a tile straddles the v | og boundary): tiles starting inside the conv channels must
    convolve them (and keep their own windows), 2 sequences of 3 tokens, the last fresh."""
    monkeypatch.setattr(kda, "IN_PROJ_BLOCK_N", block_n)
    assert _check("kda_in_proj", "kimi_linear_layer_types", B=2, T=3, seed=6, keep_states=True) > 0
