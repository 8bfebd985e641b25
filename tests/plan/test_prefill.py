"""The prefill of one prompt and the stall other requests' prefills add (``predict.Requests``), through
``nonstop plan --json``."""

from __future__ import annotations

import json

import pytest

from nonstop.cli import main

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _plan(capsys, *argv) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_stall_is_the_arrivals_prefills_over_a_requests_later_tokens(capsys):
    """(c - 1) / D arrivals during one request's decode, each one prefill, over its O - 1 later tokens."""
    for layout, dp in ((["--tp", "8"], 1), (["--tp", "2", "--dp", "4", "--ep", "8"], 4)):
        out = _plan(capsys, "-m", "kimi-k3", "--chip", "b300", "--chips", "8", *layout,
                    "--concurrency", "13", "--input-len", "3001", "--output-len", "517")  # fmt: skip
        assert out["requests"] == {"input_len": 3001, "output_len": 517}
        assert out["context"] == 3001 + 517 // 2
        assert out["prefill_stall_ms_per_token"] == pytest.approx(12 / dp * out["prefill_ms"] / 516)
        assert out["ms_per_token"] == pytest.approx(out["step_ms"])  # the stall is reported apart
    alone = _plan(capsys, "-m", "kimi-k3", "--chip", "b300", "--chips", "8", "--tp", "8",
                  "--input-len", "3001", "--output-len", "517")  # fmt: skip
    assert alone["prefill_stall_ms_per_token"] == 0.0
    plain = _plan(capsys, "-m", "kimi-k3", "--chip", "b300", "--chips", "8", "--tp", "8", "--context", "3259")
    assert plain["requests"] is None and plain["prefill_ms"] is None and plain["prefill_stall_ms_per_token"] is None


def test_prefill_is_a_compute_bound_step_that_grows_with_the_prompt(capsys):
    """A long prompt on a GPU is bound by compute (DeepSeek-V3 on 8 H200s: 8K rows of its 37B active
    parameters outweigh reading its 84 GB a rank); it costs more than a decode step of one token, and
    doubling it costs between 2x (linear layers) and 4x (attention alone), launch and host overheads
    being paid once either way."""
    runs = {}
    for n in (8191, 16382):
        runs[n] = _plan(capsys, "-m", "deepseek-v3", "--chip", "h200", "--chips", "8", "--tp", "8",
                        "--input-len", str(n), "--output-len", "64")  # fmt: skip
    short, long = runs[8191], runs[16382]
    assert long["prefill_ms"] > short["prefill_ms"] > short["step_ms"]
    fixed = short["breakdown_ms"]["launch"] + short["breakdown_ms"]["host"]  # per step, not per row
    ratio = (long["prefill_ms"] - fixed) / (short["prefill_ms"] - fixed)
    assert 1.9 < ratio < 4.0


def test_the_report_shows_the_prefill_and_the_stall(capsys):
    argv = ["plan", "-m", "kimi-k3", "--chip", "b300", "--chips", "8", "--tp", "8", "--batch", "16"]
    assert main([*argv, "--input-len", "8192", "--output-len", "1024"]) == 0
    out = capsys.readouterr().out
    assert "prefill, one prompt" in out and "8192 tokens" in out and "concurrency 16" in out
    assert main([*argv, "--context", "8704"]) == 0
    assert "prefill" not in capsys.readouterr().out
