"""``bench/op_check.py`` (every kernel against its twin, op by op, then whole steps against the reference
model) runs end to end on a CPU and names the op whose kernel is wrong."""

from __future__ import annotations

import json

import pytest

from tests.bench_script import load_bench

ARGS = ["--dry-run", "--shapes", "llama-3.2-1b", "--llama-layers", "2", "--megakernel-step"]


def _bench():
    return load_bench("op_check.py")


def test_every_op_matches_its_twin(tmp_path):
    _bench().main([*ARGS, "--out-dir", str(tmp_path)])
    (path,) = tmp_path.glob("op_check_cpu_llama-3.2-1b.json")
    report = json.loads(path.read_text())
    kinds = {r["kind"] for r in report["ops"]}
    assert {"embed", "gqa_qkv_rope", "gqa_attn", "mlp", "lm_head"} <= kinds and len(report["ops"]) == 10
    assert all(r["ok"] and r["nan"] == 0 and r["rel_err"] < 1e-5 for r in report["ops"]), report["ops"]
    for name in ("twins", "superop", "megakernel"):
        assert report["step"][name]["finite"] and report["step"][name]["rel_err"] < 1e-5, report["step"]
    assert report["environment"]["cores"] >= 1


def test_a_wrong_kernel_is_named(tmp_path, monkeypatch):
    from nonstop.kernels import KERNELS

    right = KERNELS["mlp"]

    def off_by_a_bit(op, env):  # the right kernel, then one output element nudged
        right(op, env)
        for name in op.writes:
            env.buf[name].view(-1)[3] += 0.5 * env.buf[name].abs().max()

    monkeypatch.setitem(KERNELS, "mlp", off_by_a_bit)
    _bench().main([*ARGS, "--out-dir", str(tmp_path)])
    report = json.loads(next(tmp_path.glob("op_check_*.json")).read_text())
    bad = [r["op"] for r in report["ops"] if not r["ok"]]
    assert bad == ["L0.mlp", "L1.mlp"]
    assert report["step"]["superop"]["rel_err"] > 1e-3  # the whole step sees it too
    assert report["step"]["twins"]["rel_err"] < 1e-5


def test_help_explains_the_options(capsys):
    with pytest.raises(SystemExit) as e:
        _bench().parse_args(["--help"])
    text = capsys.readouterr().out
    assert e.value.code == 0 and "--megakernel-step" in text and "--tol" in text
