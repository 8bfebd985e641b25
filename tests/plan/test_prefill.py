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


def test_a_wave_of_requests_queues_behind_its_prefills(capsys):
    """c requests started together: each attention group (D of them) prefills its n = c / D one after
    another; the k-th gets its first token after k prefills and waits for the n - k after it."""
    for layout, dp in ((["--tp", "8"], 1), (["--tp", "2", "--dp", "4", "--ep", "8"], 4)):
        out = _plan(capsys, "-m", "kimi-k3", "--chip", "b300", "--chips", "8", *layout,
                    "--concurrency", "13", "--input-len", "3001", "--output-len", "517")  # fmt: skip
        assert out["requests"] == {"input_len": 3001, "output_len": 517}
        assert out["context"] == 3001 + 517 // 2
        n, p = 13 / dp, out["prefill_ms"]
        if dp == 1:  # the 13 first tokens in turn, each request then waiting for the prefills after its own
            assert out["ttft_ms"] == pytest.approx(sum(k * p for k in range(1, 14)) / 13)
            later = sum((13 - k) * p for k in range(1, 14)) / 13
            assert out["prefill_stall_ms_per_token"] == pytest.approx(later / 516)
        assert out["ttft_ms"] == pytest.approx((n + 1) / 2 * p)
        assert out["prefill_stall_ms_per_token"] == pytest.approx((n - 1) / 2 * p / 516)
        assert out["ms_per_token"] == pytest.approx(out["step_ms"])  # the stall is reported apart
    alone = _plan(capsys, "-m", "kimi-k3", "--chip", "b300", "--chips", "8", "--tp", "8",
                  "--input-len", "3001", "--output-len", "517")  # fmt: skip
    assert alone["prefill_stall_ms_per_token"] == 0.0
    one_token = _plan(capsys, "-m", "kimi-k3", "--chip", "b300", "--chips", "8", "--tp", "8", "--batch", "4",
                      "--input-len", "100", "--output-len", "1")  # fmt: skip
    assert one_token["prefill_stall_ms_per_token"] == 0.0 and one_token["ttft_ms"] > one_token["prefill_ms"]
    assert alone["ttft_ms"] == pytest.approx(alone["prefill_ms"])
    plain = _plan(capsys, "-m", "kimi-k3", "--chip", "b300", "--chips", "8", "--tp", "8", "--context", "3259")
    assert plain["requests"] is None and plain["prefill_ms"] is None and plain["ttft_ms"] is None


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
    assert "prefill, one prompt" in out and "8192 tokens" in out and "over 16 requests started together" in out
    assert main([*argv, "--context", "8704"]) == 0
    assert "prefill" not in capsys.readouterr().out


def test_the_stalls_what_if_adds_the_wave_to_serving_points_only():
    from nonstop.plan.points import load_points
    from nonstop.plan.validation import evaluate

    points = {p["id"]: p for p in load_points()}
    serving, offline = points["sglang-b300-tp8-c16"], points["inferact-tpu7x-b2"]
    assert serving.get("stalls") and not offline.get("stalls")
    plain = evaluate([serving, offline])
    stalled = evaluate([serving, offline], with_stalls=True)
    stall = plain[0].prediction.prefill_stall_ms_per_token
    assert stall == pytest.approx(7.5 * plain[0].prediction.prefill_ms / 1023)  # a wave of 16, 1,024 tokens
    assert stalled[0].predicted == pytest.approx(plain[0].predicted + stall)
    assert stalled[1].predicted == plain[1].predicted


def test_the_layout_search_carries_the_requests_to_its_best_layout(capsys):
    searched = _plan(capsys, "-m", "kimi-k3", "--chip", "b300", "--chips", "8", "--batch", "4",
                     "--input-len", "2000", "--output-len", "300")  # fmt: skip
    lay = searched["layout"]
    explicit = _plan(capsys, "-m", "kimi-k3", "--chip", "b300", "--chips", "8", "--tp", str(lay["tp"]),
                     "--dp", str(lay["dp"]), "--ep", str(lay["ep"]), "--pp", str(lay["pp"]), "--batch", "4",
                     "--input-len", "2000", "--output-len", "300")  # fmt: skip
    assert searched["prefill_ms"] == pytest.approx(explicit["prefill_ms"])
    assert searched["ttft_ms"] == pytest.approx(explicit["ttft_ms"])
