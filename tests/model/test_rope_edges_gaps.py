"""RoPE scaling edge cases the existing transformers comparisons miss: a YaRN ramp of zero width
(both correction dims clamped to 0) and Llama 3 wavelengths lying exactly on a band edge."""

from __future__ import annotations

import math

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.model.rope import rope_inv_freq
from tests.tiny_configs import LLAMA

ORIGINAL = 8192
# rotary channel pair 0 has wavelength 2π; this low_freq_factor puts original / low_freq_factor at 2π too
EDGE_FACTOR = ORIGINAL / (2 * math.pi)

EDGE_VARIANTS = {
    # both correction dims clamp to 0 (low: floor(-1.56) -> 0, high: ceil(-0.36) = 0): a ramp of zero width,
    # which transformers widens by 0.001 instead of dividing 0 by 0
    "yarn-zero-width-ramp": (
        10000.0,
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 256,
            "beta_fast": 100.0,
            "beta_slow": 50.0,
        },
    ),
    # pair 0 sits exactly on the low-frequency wavelength: it is smoothed (factor 1/factor), not divided twice
    "llama3-on-low-wavelength": (
        500000.0,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": EDGE_FACTOR,
            "high_freq_factor": EDGE_FACTOR * 2,
            "original_max_position_embeddings": ORIGINAL,
        },
    ),
}


def _transformers_inv_freq(raw: dict) -> torch.Tensor:
    import transformers
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hf_cfg = transformers.AutoConfig.for_model("llama", **{k: v for k, v in raw.items() if k != "model_type"})
    return LlamaRotaryEmbedding(hf_cfg).inv_freq.float()


@pytest.mark.parametrize("variant", list(EDGE_VARIANTS))
def test_rope_edge_inv_freq_matches_transformers(variant):
    """A dropped zero-width guard (NaN frequencies) or an off-by-one band comparison in llama3 scaling
    (pair 0 divided by factor twice, or left unscaled) differs from transformers' inverse frequencies."""
    theta, scaling = EDGE_VARIANTS[variant]
    raw = {
        **LLAMA,
        "head_dim": 32,
        "max_position_embeddings": 16384,
        "rope_theta": theta,
        "rope_scaling": scaling,
    }
    ours, _ = rope_inv_freq(ModelConfig.from_hf_dict(raw).rope)
    assert not ours.isnan().any()
    torch.testing.assert_close(ours, _transformers_inv_freq(raw), rtol=1e-6, atol=0)


def test_llama3_pair_on_low_wavelength_is_divided_by_factor_once():
    """Hand check of the same edge: wavelength 2π == original / low_freq_factor gives smooth = 0, so pair 0's
    frequency 1 becomes 1 / factor (not 1 / factor², not 1)."""
    _, scaling = EDGE_VARIANTS["llama3-on-low-wavelength"]
    raw = {
        **LLAMA,
        "head_dim": 32,
        "max_position_embeddings": 16384,
        "rope_theta": 500000.0,
        "rope_scaling": scaling,
    }
    ours, magnitude = rope_inv_freq(ModelConfig.from_hf_dict(raw).rope)
    assert ours[0].item() == pytest.approx(1 / 8.0, rel=1e-6)
    assert magnitude == 1.0
