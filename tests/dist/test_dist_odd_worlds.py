"""World 3 (and 6): odd head counts split 3 ways, expert counts that 3 / 6 do not divide, a rank that
holds no expert, data-parallel attention groups fed unevenly, prompts of different lengths in one batch.
Every layout must give the single-process reference's greedy tokens and its token / prompt logprobs
within 1e-5 relative (fp32): all held when written (largest logprob difference 9.5e-7). They guard the
world sizes the other tests do not run (2, 4, 8)."""

from __future__ import annotations

import pickle

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.dist.launch import spawn
from nonstop.weights.synth import write_checkpoint
from tests.dist.test_dist_generate import _close
from tests.dist.workers import run_scenarios
from tests.tiny_configs import DEEPSEEK, KIMI_K3_MXFP4, KIMI_LINEAR_RELEASE, LLAMA

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [30, 12], [77, 100, 41, 9], [3]]  # 4 rows: 3 attention groups get 2, 1, 1
LP = {"logprobs": 8, "prompt_logprobs": 8, "max_tokens": 8, "prompts": PROMPTS, "timeout": 240.0}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("odd_models")
    raws = {
        # 3 MLA heads, 8 experts over 3 ranks (3/3/2), n_group 4 / topk_group 2, a shared expert, a dense layer
        "deepseek": DEEPSEEK,
        # 3 MLA heads, 3 KDA heads, 7 experts
        "kimi_linear": KIMI_LINEAR_RELEASE,
        # 3 heads, MXFP4 experts, 5 of them (not a multiple of 3; under EP 6 one rank holds none)
        "k3_e5": {**KIMI_K3_MXFP4, "text_config": {**KIMI_K3_MXFP4["text_config"], "num_experts": 5}},
        "llama": LLAMA,  # 5 query heads, 1 key/value head
    }
    return {
        name: str(write_checkpoint(ModelConfig.from_hf_dict(raw), root / name, seed=11, dtype=torch.float32))
        for name, raw in raws.items()
    }


def _run_and_check(tmp_path, world: int, scenarios: list[dict]) -> None:
    scenarios = [{**LP, **sc} for sc in scenarios]
    spawn(run_scenarios, world, (str(tmp_path), scenarios), timeout=500)
    for sc in scenarios:
        r = pickle.loads((tmp_path / f"{sc['name']}.pkl").read_bytes())
        assert len(r["got"]) == len(PROMPTS), sc["name"]
        for i, (ref, got) in enumerate(zip(r["ref"], r["got"])):
            assert len(got["token_ids"]) == 8, sc["name"]
            assert got["token_ids"] == ref["token_ids"], f"{sc['name']} prompt {i}"
            _close(ref["logprobs"], got["logprobs"], f"{sc['name']} prompt {i} logprobs")
            _close(ref["prompt_logprobs"], got["prompt_logprobs"], f"{sc['name']} prompt {i} prompt logprobs")


@pytest.mark.timeout(600)
def test_world_3_odd_heads_and_experts(tmp_path, models):
    _run_and_check(
        tmp_path,
        3,
        [
            {"name": "deepseek_tp3_ep3", "model": models["deepseek"], "tp": 3, "ep": 3},
            {
                "name": "kimi_linear_tp3_ep3_static",
                "model": models["kimi_linear"],
                "tp": 3,
                "ep": 3,
                "exchange": "static",
            },
            {"name": "k3_e5_tp3_ep3", "model": models["k3_e5"], "tp": 3, "ep": 3},
            {"name": "llama_dp3", "model": models["llama"], "tp": 1, "ep": 1, "world": 3},
        ],
    )


@pytest.mark.timeout(600)
def test_world_6_more_expert_ranks_than_experts(tmp_path, models):
    _run_and_check(
        tmp_path,
        6,
        [
            {"name": "k3_e5_ep6", "model": models["k3_e5"], "tp": 1, "ep": 6},
            {"name": "deepseek_tp3_ep2_w6", "model": models["deepseek"], "tp": 3, "ep": 2, "world": 6},
        ],
    )
