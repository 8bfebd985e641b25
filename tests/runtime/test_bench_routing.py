"""``bench/routing_sensitivity.py`` (op noise through random routers, routing free and forced) on the CPU."""

from __future__ import annotations

import json

import pytest

from tests.bench_script import load_bench


def _bench():
    return load_bench("routing_sensitivity.py")


def test_forcing_the_clean_routing_removes_only_the_flips(tmp_path):
    """Without noise nothing moves; with noise, a run whose top-k sets all match the clean run's is the forced
    run exactly (the same noise, the same experts), and one with flips is not; the report says which."""
    out = tmp_path / "r.json"
    args = ["--dry-run", "--model", "kimi-k3", "--eps", "0,0.003,0.03", "--seeds", "3", "--bf16", "--out", str(out)]
    _bench().main(args)
    report = json.loads(out.read_text())
    *rows, bf16 = report["rows"]
    assert report["experts"] > report["top_k"] and report["router_calls_x_tokens"] > 0 and len(rows) == 9
    assert bf16["noise"].startswith("bf16") and 0 < bf16["rel_err_routing_forced"] < 0.05  # rounding, not noise
    for row in rows:
        if row["eps"] == 0:
            assert row["changed_topk_sets"] == 0 and row["rel_err_free_routing"] == row["rel_err_routing_forced"] == 0
        elif row["changed_topk_sets"] == 0:
            assert row["rel_err_free_routing"] == row["rel_err_routing_forced"] > 0
        else:
            assert row["rel_err_free_routing"] != row["rel_err_routing_forced"]
    assert any(r["changed_topk_sets"] for r in rows if r["eps"] == 0.03)  # large noise flips some choice


def test_the_model_is_restored_after_a_run(tmp_path):
    import torch.nn.functional as F

    from nonstop.model import moe

    linear, select = F.linear, moe.select_experts
    _bench().main(["--dry-run", "--eps", "0.01", "--seeds", "1", "--out", str(tmp_path / "r.json")])
    assert F.linear is linear and moe.select_experts is select


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--eps", "abc"], "--eps takes comma-separated numbers"),
        (["--model", "nope"], "neither a directory holding config.json nor a preset"),
        (["--model", "llama-3.2-1b"], "has no routed experts"),
    ],
)
def test_bad_arguments_are_one_line(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        _bench().main([*argv, "--out", str(tmp_path / "r.json")])
    said = str(e.value.code) if isinstance(e.value.code, str) else capsys.readouterr().err
    assert message in said.strip().splitlines()[-1]  # one line says it (argparse prints its usage above)
    assert not (tmp_path / "r.json").exists()
