"""``nonstop plan``'s memory fit against a hand count of what a rank holds.

Defect pinned here: with ``--input-len I --output-len O`` the fit sized the attention cache at the *mean*
context of a request's decode steps (I + O/2, the right figure for timing), but a serving benchmark's wave of
``--concurrency`` requests starts together and ends together, so at its last step every sequence holds I + O
cached tokens; the plan said "fits" for deployments whose cache overflows before the requests finish.
(The position check beside it already uses I + O.)

DeepSeek-V3's MLA cache by hand (model-architecture.md 3.2): 61 layers x (kv_lora_rank 512 + rope 64) values
x 2 bytes (bf16) = 70,272 bytes a token, held whole by every tensor-parallel rank (one latent shared by all
heads); nothing else grows with the context.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import nonstop
from nonstop.cli import main
from nonstop.config import ModelConfig
from nonstop.plan.chips import get_chip
from nonstop.plan.layout import Layout
from nonstop.plan.predict import Requests, predict
from nonstop.plan.workload import build_workload

DSV3_DIR = Path(nonstop.__file__).parent / "plan" / "models" / "deepseek-v3"
MLA_TOKEN_BYTES = 61 * (512 + 64) * 2  # 70,272


@pytest.fixture(scope="module")
def dsv3():
    return build_workload(ModelConfig.from_file(DSV3_DIR), "deepseek-v3")


@pytest.mark.parametrize("input_len, output_len", [(1_000, 100_000), (8_192, 1_024)])
def test_the_fit_holds_the_cache_of_finished_requests(dsv3, input_len, output_len):
    """Defect: the resident cache with --input-len I --output-len O is batch x (I + O) tokens (every request
    of the wave reaches I + O cached tokens at its last step), not batch x (I + O/2)."""
    p = predict(
        dsv3,
        get_chip("h200"),
        Layout(8),
        batch=8,
        requests=Requests(input_len, output_len),
    )
    assert p.resident["cache"] == 8 * (input_len + output_len) * MLA_TOKEN_BYTES


def test_plan_does_not_say_fits_when_the_finished_requests_overflow(capsys):
    """Defect, from the command: DeepSeek-V3 fp8 on 8 x H200 at TP8 holds ~85 GB of weights a rank; 8 requests
    of 1,000 + 100,000 tokens end holding 8 x 101,000 x 70,272 B = 56.8 GB of cache a rank, 142 GB in all,
    over the 138.7 GB the planner allows (92% of 150.8 GB). At the mean context (51,000) it looked like
    113.8 GB, and the plan said fits."""
    rc = main(
        ["plan", "-m", str(DSV3_DIR), "--chip", "h200", "--chips", "8", "--tp", "8", "--batch", "8",
         "--input-len", "1000", "--output-len", "100000", "--json"]
    )  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    weights, cache = (
        out["bytes_per_chip_detail"]["weights"],
        out["bytes_per_chip_detail"]["cache"],
    )
    assert cache == 8 * 101_000 * MLA_TOKEN_BYTES
    assert weights + cache > out["capacity_per_chip"]
    assert out["fits"] is False
