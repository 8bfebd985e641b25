"""YaRN cos/sin magnitude when only one of ``mscale`` / ``mscale_all_dim`` is given: transformers (and
DeepSeek's reference) then fall back to the plain 0.1·ln(factor) + 1, ignoring the lone value."""

from __future__ import annotations

import math

import pytest

from nonstop.config import ModelConfig
from nonstop.model.rope import rope_inv_freq
from tests.tiny_configs import LLAMA

FACTOR = 4.0


def _raw(**extra) -> dict:
    scaling = {"rope_type": "yarn", "factor": FACTOR, "original_max_position_embeddings": 64, **extra}
    return {**LLAMA, "head_dim": 32, "max_position_embeddings": 256, "rope_scaling": scaling}


def _transformers_magnitude(raw: dict) -> float:
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_cfg = transformers.AutoConfig.for_model("llama", **{k: v for k, v in raw.items() if k != "model_type"})
    _, magnitude = ROPE_INIT_FUNCTIONS["yarn"](hf_cfg, "cpu")
    return float(magnitude)


@pytest.mark.parametrize(
    "extra",
    [{"mscale": 0.707}, {"mscale_all_dim": 0.707}, {"mscale": 2.0, "mscale_all_dim": 0.0}],
    ids=["mscale-only", "mscale_all_dim-only", "mscale_all_dim-zero"],
)
def test_lone_mscale_falls_back_to_the_plain_yarn_magnitude(extra):
    """A guard reduced to ``elif rope.mscale:`` divides by yarn_mscale(factor, None) (a TypeError) or by 1
    (magnitude 0.1·mscale·ln 4 + 1 instead of 0.1·ln 4 + 1); transformers uses the plain value."""
    raw = _raw(**extra)
    _, magnitude = rope_inv_freq(ModelConfig.from_hf_dict(raw).rope)
    expected = 0.1 * math.log(FACTOR) + 1.0
    assert magnitude == pytest.approx(expected, rel=1e-9)
    assert magnitude == pytest.approx(_transformers_magnitude(raw), rel=1e-6)


def test_both_mscales_give_their_ratio():
    """With both set the magnitude is the ratio (0.1·a·ln f + 1) / (0.1·b·ln f + 1), as transformers."""
    raw = _raw(mscale=2.0, mscale_all_dim=0.5)
    _, magnitude = rope_inv_freq(ModelConfig.from_hf_dict(raw).rope)
    ln = math.log(FACTOR)
    assert magnitude == pytest.approx((0.2 * ln + 1) / (0.05 * ln + 1), rel=1e-9)
    assert magnitude == pytest.approx(_transformers_magnitude(raw), rel=1e-6)
