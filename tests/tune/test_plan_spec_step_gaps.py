"""Gap the k8 mutation audit found in ``tune/verify.plan``: a tuned step of exactly 2 tokens (the smallest
speculative step: one draft token) must also be verified as a speculative step (``keep_states``)."""

from __future__ import annotations

import random

import torch

from nonstop.config import ModelConfig
from nonstop.tune.target import make_target
from nonstop.tune.verify import plan
from tests.tiny_configs import TINY_CONFIGS


def test_a_tuned_step_of_two_tokens_is_also_verified_as_a_speculative_step():
    cfg = ModelConfig.from_hf_dict(TINY_CONFIGS["kimi_linear"])
    for tokens in (1, 2):
        target = make_target("kda_core", "tiny-kimi-linear", cfg, torch.float32, "cpu", [1], tokens=tokens)
        tuned = sorted((s.B, s.T, s.keep_states) for s in plan(target, random.Random(0)) if s.label == "tuned")
        want = [(1, 1, False)] if tokens == 1 else [(1, 2, False), (1, 2, True)]  # one token: no speculative step
        assert tuned == want
