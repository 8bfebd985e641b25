"""``bench/op_check.py``, ``bench/decode.py`` and ``bench/spec_decode.py`` as a user runs them: a --dry-run that
turns Triton's interpreter on itself, an exit status that says when a check failed, the device asked for being
the one used, and counts and help that say what the script does."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from tests.bench_script import BENCH_DIR, load_bench
from tests.runtime.helpers import tiny_model

OP_CHECK = ["--dry-run", "--shapes", "llama-3.2-1b", "--llama-layers", "1"]


def _script(script: str, argv: list[str], cwd, env_drop=("TRITON_INTERPRET",)) -> subprocess.CompletedProcess:
    """``bench/<script> argv`` in a process of its own, as from a shell without ``env_drop`` set."""
    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    return subprocess.run(
        [sys.executable, str(BENCH_DIR / script), *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def test_op_check_dry_run_turns_the_interpreter_on_itself(tmp_path):
    """Without TRITON_INTERPRET in the environment every kernel once failed ("Cannot call @triton.jit'd outside
    of the scope of a kernel": the variable was set after the kernels were defined) and the run exited 0."""
    run = _script("op_check.py", [*OP_CHECK, "--megakernel-step", "--out-dir", str(tmp_path / "out")], tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "op_check_cpu_llama-3.2-1b.json").read_text())
    assert len(report["ops"]) == 6 and all(r["ok"] and "error" not in r for r in report["ops"]), report["ops"]
    assert {name for name, s in report["step"].items() if s["ok"] and s["rel_err"] < 1e-5} == {
        "twins",
        "superop",
        "megakernel",
    }, report["step"]
    env = report["environment"]  # the versions a result depends on, recorded beside it
    assert env["torch"] == torch.__version__ and env["triton"] and "python" in env


def _failing_kernel(op, env):
    raise RuntimeError("this kernel faulted")


def test_op_check_exits_1_and_names_an_erroring_op_an_error(tmp_path, monkeypatch, capsys):
    """An op whose kernel raised was counted "over tolerance" (its line never printed) and the run exited 0."""
    from nonstop.kernels import KERNELS

    monkeypatch.setitem(KERNELS, "mlp", _failing_kernel)
    monkeypatch.setattr(sys, "argv", ["op_check.py", *OP_CHECK, "--out-dir", str(tmp_path)])
    with pytest.raises(SystemExit) as e:
        load_bench("op_check.py").cli()
    out, err = capsys.readouterr()
    assert e.value.code == 1 and "failure(s)" in err
    mlp = next(line for line in out.splitlines() if "L0.mlp" in line)
    assert "error: RuntimeError: this kernel faulted" in mlp and "over tolerance" not in mlp
    assert "0 over tolerance, 1 erred; first L0.mlp" in out
    report = json.loads((tmp_path / "op_check_cpu_llama-3.2-1b.json").read_text())
    assert report["ops"][-1]["op"] == "L0.mlp" and "this kernel faulted" in report["ops"][-1]["error"]
    assert not report["step"]["superop"]["ok"] and "error" in report["step"]["superop"]


def test_op_check_fails_a_step_over_its_tolerance():
    """The ops' checks pass and only a whole step is off (``--no-ops``): still a failure."""
    bench = load_bench("op_check.py")
    failed = bench.main([*OP_CHECK, "--no-ops", "--step-tol", "0"])  # 0: any difference is over it
    assert failed == 1  # the superop step (fp32 kernels differ from torch by rounding); the twins match exactly
    assert bench.main([*OP_CHECK, "--no-ops"]) == 0  # the default fp32 tolerance of a --dry-run, 1e-3


def test_op_check_step_rule():
    bench = load_bench("op_check.py")
    assert bench.step_ok({"rel_err": 0.5, "finite": True}, None)  # no tolerance: bf16 steps are not judged
    assert not bench.step_ok({"rel_err": 0.5, "finite": True}, 0.1)
    assert not bench.step_ok({"rel_err": 0.0, "finite": False}, None)
    assert not bench.step_ok({"error": "InterpreterError"}, None)


@pytest.mark.parametrize("device", ["bogus", "meta"])
def test_decode_a_device_torch_does_not_know_is_one_error_line(device, tmp_path):
    run = _script("decode.py", ["--device", device, "--no-gpucheck"], tmp_path, env_drop=())
    errors = [line for line in run.stderr.splitlines() if "error:" in line]
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert len(errors) == 1 and "argument --device" in errors[0] and device in errors[0], run.stderr
    assert not list(tmp_path.iterdir())


def test_decode_makes_an_indexed_gpu_the_current_one(monkeypatch):
    """--device cuda:1 built the model there, but CUDA events and synchronize (the timings) acted on cuda:0."""
    bench = load_bench("decode.py")
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    assert bench.use_device("cuda:1") == torch.device("cuda:1") and current == [torch.device("cuda:1")]
    assert bench.use_device("cpu") == torch.device("cpu") and len(current) == 1
    with pytest.raises(ValueError, match="only 2 CUDA device"):
        bench.use_device("cuda:2")


def test_decode_counts_each_compiled_row_alone():
    """Dynamo's counters are process-wide: a later compiled row reported the graphs of every earlier one."""
    from torch._dynamo.utils import counters

    bench = load_bench("decode.py")
    model = tiny_model("llama")
    with torch.inference_mode():
        cache, _ = bench.prefilled(model, 5, "cpu", capacity=8)
        ids, batch = torch.tensor([[1]]), cache.batch([0], 1)
    counters["stats"]["unique_graphs"] += 3  # an earlier row's graphs and breaks
    counters["graph_break"]["an earlier break"] += 2
    bench.compiled_step(model, cache, ids, batch)  # compiles lazily: nothing of this row counted yet
    assert bench.dynamo_counters() == {"unique_graphs": 0, "graph_breaks": 0}


def test_decode_help_states_no_bound_the_parser_does_not_enforce(capsys):
    """--steps said ">= 200" while 5 was accepted (a --dry-run uses 5): a bound in a help string is checked."""
    bench = load_bench("decode.py")
    parser = bench.build_parser()
    bounds = [(a, int(m)) for a in parser._actions if a.help for m in re.findall(r">= (\d+)", a.help)]
    for action, low in bounds:
        with pytest.raises(SystemExit):
            bench.parse_args(["--dry-run", action.option_strings[0], str(low - 1)])
    capsys.readouterr()
    assert bench.parse_args(["--dry-run", "--steps", "5"]).steps == 5
    steps = next(a for a in parser._actions if a.dest == "steps")
    assert "default 300" in steps.help and "5" in steps.help  # the --dry-run's own count, said


def test_spec_decode_runs_where_told(tmp_path, monkeypatch):
    """It had no --device: the superop and megakernel backends it offers failed on the CPU it always used, and its
    floor was the CPU's copy bandwidth. The device reaches the floor and the report."""
    bench = load_bench("spec_decode.py")
    measured_on = []

    def copy_bandwidth(device="cpu"):
        measured_on.append(torch.device(device))
        return {"copy_GBps": 10.0}

    monkeypatch.setattr(bench, "copy_bandwidth", copy_bandwidth)
    out = tmp_path / "spec.json"
    argv = ["--device", "cpu", "--prompts", "1", "--max-tokens", "3", "--repeats", "1", "--num-tokens", "2"]
    monkeypatch.setattr(sys, "argv", ["spec_decode.py", *argv, "--methods", "ngram", "--out", str(out)])
    bench.main()
    report = json.loads(out.read_text())
    assert measured_on == [torch.device("cpu")] and report["bandwidth_floor"]["copy_GBps"] == 10.0
    assert report["device"] == "cpu" and report["machine"]["gpu"] is None


def test_spec_decode_a_device_this_machine_lacks_is_one_error_line(tmp_path):
    run = _script("spec_decode.py", ["--device", "bogus"], tmp_path, env_drop=())
    errors = [line for line in run.stderr.splitlines() if "error:" in line]
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert len(errors) == 1 and "'bogus'" in errors[0], run.stderr
