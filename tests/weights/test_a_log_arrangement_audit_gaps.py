"""Gap found by a mutation audit of ``loader._zero_padded``: an ``A_log`` of exactly the config's head
count stored in the other arrangement (K3's [1, 1, H, 1] given flat, Kimi Linear's [H] given as [1, 1, H, 1],
no padding at all). The loader's docstring accepts both for either; the expected values are the checkpoint's
own A_log, loaded before the rewrite."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from nonstop.config import ModelConfig
from nonstop.weights.loader import load_state_dict
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import KIMI_K3, KIMI_LINEAR_RELEASE


@pytest.mark.parametrize("raw", [KIMI_K3, KIMI_LINEAR_RELEASE], ids=["k3", "kimi-linear"])
@pytest.mark.parametrize("arrangement", ["flat", "4d"])
def test_an_a_log_of_exactly_h_entries_in_either_arrangement_loads(raw, arrangement, tmp_path):
    """Catches the length test made strict (``long < numel`` -> ``<=``): an unpadded vector in the other
    arrangement would be refused as a wrong shape."""
    cfg = ModelConfig.from_hf_dict(raw)
    model_dir = write_checkpoint(cfg, tmp_path / "m", seed=1, dtype=torch.float32)
    want = load_state_dict(cfg, model_dir, torch.float32)
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    names = [k for k in tensors if k.endswith("A_log")]
    h = cfg.kda.num_heads
    for k in names:
        assert tensors[k].numel() == h
        tensors[k] = tensors[k].reshape(h) if arrangement == "flat" else tensors[k].reshape(1, 1, h, 1)
    save_file(tensors, str(path))
    got = load_state_dict(cfg, model_dir, torch.float32)
    a_logs = [k for k in want if k.endswith("A_log")]
    assert names and a_logs and all(got[k].shape == (h,) for k in a_logs)
    assert all(torch.equal(got[k], want[k]) for k in want)
