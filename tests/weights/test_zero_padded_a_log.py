"""KDA ``A_log`` stored longer than the config's head count, zeros past the live heads (K3's release pads
96 heads to 128: reference/kimi-k3.md), flat or as [1, 1, N, 1]: loaded as the live heads, by the whole
loader and by a tensor-parallel rank's slice reader alike; padding that is not zero, a tensor shorter than
the heads or one with two long dimensions is refused, naming the tensor."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from nonstop.config import ModelConfig
from nonstop.dist.layout import Layout
from nonstop.dist.load import load_rank_state
from nonstop.weights.errors import CheckpointError
from nonstop.weights.loader import load_state_dict
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import KIMI_K3, KIMI_LINEAR_RELEASE


def _checkpoint(raw: dict, tmp_path):
    cfg = ModelConfig.from_hf_dict(raw)
    return cfg, write_checkpoint(cfg, tmp_path / "m", seed=1, dtype=torch.float32)


def _restore_a_log(model_dir, change) -> list[str]:
    """Rewrite every A_log of the checkpoint with ``change(tensor)``; returns their names."""
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    names = [k for k in tensors if k.endswith("A_log")]
    for k in names:
        tensors[k] = change(tensors[k])
    save_file(tensors, str(path))
    return names


def _pad(extra: int, shape=None):
    def change(t):
        flat = torch.cat([t.reshape(-1), torch.zeros(extra, dtype=t.dtype)])
        return flat.reshape(shape(flat.numel())) if shape else flat

    return change


@pytest.mark.parametrize(
    ("raw", "change"),
    [
        (KIMI_K3, _pad(1)),  # [H + 1], as the release's 96 -> 128
        (KIMI_K3, _pad(5, lambda n: (1, 1, n, 1))),
        (KIMI_LINEAR_RELEASE, _pad(2, lambda n: (1, 1, n, 1))),
        (KIMI_LINEAR_RELEASE, _pad(3)),
    ],
    ids=["k3-flat", "k3-4d", "kimi-linear-4d", "kimi-linear-flat"],
)
def test_a_zero_padded_a_log_loads_as_its_live_heads(raw, change, tmp_path):
    cfg, model_dir = _checkpoint(raw, tmp_path)
    want = load_state_dict(cfg, model_dir, torch.float32)
    tp = Layout.make(3, 1, 3)  # a head a rank
    want_ranks = [load_rank_state(cfg, tp, r, model_dir, torch.float32) for r in range(3)]
    assert _restore_a_log(model_dir, change)
    got = load_state_dict(cfg, model_dir, torch.float32)
    a_logs = [k for k in want if k.endswith("A_log")]
    assert a_logs and all(got[k].shape == (cfg.kda.num_heads,) for k in a_logs)
    assert all(torch.equal(got[k], want[k]) for k in want)
    for r in range(3):  # each rank's head of the padded vector
        part = load_rank_state(cfg, tp, r, model_dir, torch.float32)
        assert all(torch.equal(part[k], want_ranks[r][k]) for k in want_ranks[r])


def test_padding_that_is_not_zero_is_refused(tmp_path):
    cfg, model_dir = _checkpoint(KIMI_K3, tmp_path)

    def change(t):
        return torch.cat([t, torch.tensor([0.0, 0.5])])

    name = _restore_a_log(model_dir, change)[0]
    with pytest.raises(CheckpointError, match=rf"{name}.* has {cfg.kda.num_heads + 2} entries .* 1 of the 2 past"):
        load_state_dict(cfg, model_dir, torch.float32)
    with pytest.raises(CheckpointError, match="not padding"):
        load_rank_state(cfg, Layout.make(3, 1, 3), 0, model_dir, torch.float32)


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t[:-1],  # fewer entries than heads
        lambda t: torch.cat([t, torch.zeros_like(t)]).reshape(2, -1),  # two long dimensions
    ],
    ids=["short", "two-long-dims"],
)
def test_other_shapes_are_still_refused(change, tmp_path):
    cfg, model_dir = _checkpoint(KIMI_K3, tmp_path)
    name = _restore_a_log(model_dir, change)[0]
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' in model.safetensors has shape"):
        load_state_dict(cfg, model_dir, torch.float32)
