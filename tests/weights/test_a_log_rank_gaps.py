"""KDA ``A_log`` stored unpadded in the *other* family's rank: K3 as [1, 1, H, 1] (Kimi Linear's rank), Kimi
Linear flat [H]. reference/kimi-k3.md: the K3 release's exact A_log rank is not verified and vLLM accepts 1-D
or [1, 1, H, 1] and narrows. nonstop already accepts both ranks when the vector is zero-padded (longer than
H), but refuses the same ranks holding exactly H values, so a checkpoint that carries A_log unpadded in the
other rank does not load at all while a padded one does."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from nonstop.config import ModelConfig
from nonstop.dist.layout import Layout
from nonstop.dist.load import load_rank_state
from nonstop.weights.loader import load_state_dict
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import KIMI_K3, KIMI_LINEAR_RELEASE


@pytest.mark.parametrize(
    ("raw", "shape"),
    [(KIMI_K3, lambda h: (1, 1, h, 1)), (KIMI_LINEAR_RELEASE, lambda h: (h,))],
    ids=["k3-as-1x1xHx1", "kimi-linear-flat"],
)
def test_an_unpadded_a_log_in_the_other_rank_loads_as_its_heads(raw, shape, tmp_path):
    """Catches the loader refusing an A_log of exactly H values in a rank other than the family's own
    (``_zero_padded`` only accepts another shape when it is longer than H)."""
    cfg = ModelConfig.from_hf_dict(raw)
    d = write_checkpoint(cfg, tmp_path / "m", seed=1, dtype=torch.float32)
    path = d / "model.safetensors"
    tensors = load_file(str(path))
    heads = cfg.kda.num_heads
    names = [k for k in tensors if k.endswith("A_log")]
    want = {k: tensors[k].reshape(-1).clone() for k in names}
    for k in names:
        tensors[k] = tensors[k].reshape(shape(heads)).contiguous()
    save_file(tensors, str(path))
    got = load_state_dict(cfg, d, torch.float32)
    for k in names:
        param = k.removeprefix(cfg.weight_prefix)
        assert torch.equal(got[param], want[k])
    state = load_rank_state(cfg, Layout.make(tp=3), 1, d, torch.float32)
    for k in names:
        assert torch.equal(state[k.removeprefix(cfg.weight_prefix)], want[k][1:2])
