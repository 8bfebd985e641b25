"""What the bench scripts check before they measure: the output path (``script_args.check_out``), the model they
are given (cpu_peers' own checkpoint, cpu_attention_ab's GQA layers, routing_sensitivity's MoE), the peers
cpu_peers runs, and what they record (readme_numbers' versions, cpu_gemv's cache warning)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.bench_script import BENCH_DIR, load_bench


def _script(script: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH_DIR / script), *argv], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def _one_error(run: subprocess.CompletedProcess, message: str) -> None:
    errors = [line for line in run.stderr.splitlines() if "error:" in line]
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert len(errors) == 1 and message in errors[0], run.stderr[-3000:]


# ----------------------------------------------------------------------------- the output path


def test_check_out_makes_the_folder_and_leaves_nothing_else(tmp_path):
    check_out = load_bench("script_args.py").check_out
    out = tmp_path / "new" / "deeper" / "r.json"
    assert check_out(str(out)) == out
    assert out.parent.is_dir() and not list(out.parent.iterdir())  # the probe file is gone


@pytest.mark.parametrize(
    ("where", "message"),
    [
        (lambda tmp: tmp / "a-file" / "r.json", "cannot create its folder"),
        (lambda tmp: tmp / "a-file" / "sub" / "r.json", "a file is in the way"),
        (lambda tmp: tmp, "is a directory"),
        (lambda tmp: "", "is empty"),
    ],
)
def test_check_out_refuses_a_path_it_cannot_write(where, message, tmp_path):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ValueError, match=message) as e:
        load_bench("script_args.py").check_out(where(tmp_path))
    assert str(e.value).startswith("--out")


def test_an_unwritable_out_stops_a_script_before_it_measures(tmp_path):
    """cpu_gemv measured for a minute, then failed to write --out /proc/nope/x.json with a traceback."""
    (tmp_path / "a-file").write_text("x")
    run = _script("cpu_gemv.py", "--out", str(tmp_path / "a-file" / "x.json"), cwd=tmp_path)
    _one_error(run, "argument --out")
    assert "GB/s" not in run.stdout  # nothing was timed


def test_readme_numbers_checks_out_before_computing(tmp_path, monkeypatch, capsys):
    bench = load_bench("readme_numbers.py")
    monkeypatch.setattr(bench, "compute", lambda: pytest.fail("computed before --out was checked"))
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(SystemExit) as e:
        bench.main(["--out", str(tmp_path / "a-file" / "n.json")])
    assert e.value.code == 2 and "argument --out" in capsys.readouterr().err


def test_readme_numbers_records_the_versions_it_counted_with(monkeypatch):
    import nonstop

    bench = load_bench("readme_numbers.py")
    monkeypatch.setattr(bench, "op_counts", lambda model: {})
    monkeypatch.setattr(bench, "floor", lambda name: {})
    monkeypatch.setattr(bench, "peer_rows", lambda: [])
    versions = bench.compute()["versions"]
    assert versions["torch"] == torch.__version__ and versions["nonstop"] == nonstop.__version__


# ----------------------------------------------------------------------------- routing_sensitivity


def test_a_routing_dry_run_writes_nothing_to_bench_results(tmp_path, monkeypatch):
    """Its default --out was bench/results even for a dry run: a test run overwrote the recorded result."""
    bench = load_bench("routing_sensitivity.py")
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    assert bench.parse_args(["--dry-run"]).out.parent == tmp_path / "out"
    monkeypatch.delenv("OUT")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    assert bench.parse_args(["--dry-run"]).out.parent == tmp_path / "tmp"
    assert bench.parse_args(["--dry-run", "--out", str(tmp_path / "r.json")]).out == tmp_path / "r.json"
    assert bench.parse_args([]).out.parent == BENCH_DIR / "results"  # a real run records there


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--expert-intermediate", "0"], "argument --expert-intermediate"),
        (["--layers", "-1"], "argument --layers"),
        (["--model", "nope"], "neither a directory holding config.json nor a preset"),
        (["--model", "llama-3.2-1b"], "has no routed experts"),
        (["--eps", "nan"], "--eps takes comma-separated numbers"),
    ],
)
def test_routing_refuses_bad_values_in_its_parser(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        load_bench("routing_sensitivity.py").parse_args([*argv, "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and "error:" in err[-1] and message in err[-1]


# ----------------------------------------------------------------------------- cpu_attention_ab


def test_attention_ab_refuses_one_token_and_a_model_without_gqa(tmp_path):
    _one_error(_script("cpu_attention_ab.py", "--tokens", "1", cwd=tmp_path), "--tokens: expected at least 2")
    run = _script("cpu_attention_ab.py", "--checkpoint", "k3-nano", cwd=tmp_path)
    _one_error(run, "GQA")
    assert run.stderr.splitlines()[-1].startswith("nonstop: error: k3-nano has kda and mla attention layers")
    assert not list(tmp_path.iterdir())


def test_attention_ab_lists_the_kv_bytes_at_the_context():
    """It listed them at context + tokens / 2 under the name "at context"."""
    from nonstop.config import ModelConfig

    bench = load_bench("cpu_attention_ab.py")
    llama = {"model_type": "llama", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256}
    llama |= {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5}
    # 2 layers x (K and V) x 2 kv heads x head_dim 32 x 4 bytes (fp32) = 1024 bytes a position
    assert bench.kv_bytes_at(ModelConfig.from_hf_dict(llama), 40) == 40 * 1024


# ----------------------------------------------------------------------------- cpu_gemv


def test_gemv_warns_of_a_working_set_the_cache_holds():
    warning = load_bench("cpu_gemv.py").cache_warning
    assert "under twice the last-level cache" in warning(4, 32 << 20)
    assert warning(2 * 32 * 1.048576 + 0.001, 32 << 20) is None  # just over twice 32 MiB
    assert warning(4, 0) is None  # the cache size unknown: nothing to say


# ----------------------------------------------------------------------------- cpu_peers


def _shape(hidden: int, layers: int, **flags) -> argparse.Namespace:
    shape = {"hidden": hidden, "layers": layers, "intermediate": 256, "heads": 4, "kv_heads": 2, "vocab": 512}
    return argparse.Namespace(**{**shape, **flags})


def _parameters(checkpoint: Path) -> int:
    """The parameters stored in ``checkpoint``'s safetensors, counted from the file."""
    import math

    from safetensors import safe_open

    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())


def test_peers_records_the_checkpoint_it_times(tmp_path):
    """--checkpoint DIR recorded the default 245M shape of the shape flags, not the checkpoint it timed."""
    from nonstop.program.footprint import model_footprint

    peers = load_bench("cpu_peers.py")
    ckpt = tmp_path / "llama"
    peers.make_llama_checkpoint(_shape(128, 2), ckpt)  # a small Llama, as a user's own checkpoint
    args = _shape(None, None, intermediate=None, heads=None, kv_heads=None, vocab=None, checkpoint=str(ckpt))
    peers.resolve_shape(args)
    assert (args.hidden, args.layers, args.vocab) == (128, 2, 512)
    cfg, hf = peers.make_llama_checkpoint(_shape(1024, 16), ckpt)  # another shape asked for: the one there counts
    assert hf["hidden_size"] == 128 and hf["num_hidden_layers"] == 2
    assert model_footprint(cfg, torch.float32).total_params == _parameters(ckpt)


def test_peers_refuses_shape_flags_that_disagree_with_the_checkpoint(tmp_path):
    peers = load_bench("cpu_peers.py")
    peers.make_llama_checkpoint(_shape(128, 2), tmp_path / "llama")
    args = _shape(
        1024, None, intermediate=None, heads=None, kv_heads=None, vocab=None, checkpoint=str(tmp_path / "llama")
    )
    with pytest.raises(ValueError, match=r"--hidden 1024 \(it has 128\)"):
        peers.resolve_shape(args)
    args = _shape(None, None, checkpoint=str(BENCH_DIR.parent / "nonstop" / "assets" / "k3-nano"))
    with pytest.raises(ValueError, match="compares systems on a Llama"):
        peers.resolve_shape(args)


def test_peers_says_when_a_default_peer_is_absent(tmp_path, capsys):
    peer_python = load_bench("cpu_peers.py").peer_python
    assert peer_python(None, tmp_path / "python", "--llama-python", "llama.cpp") is None
    assert "no llama.cpp rows" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--llama-python /nonexistent/python does not exist"):
        peer_python("/nonexistent/python", tmp_path / "python", "--llama-python", "llama.cpp")
    assert peer_python(sys.executable, tmp_path / "python", "--llama-python", "llama.cpp") == sys.executable


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--skip", "llamacpp"], "argument --skip: unknown 'llamacpp'"),
        (["--llama-python", "/nonexistent/python"], "--llama-python /nonexistent/python does not exist"),
        (["--vllm-python", "/nonexistent/python"], "--vllm-python /nonexistent/python does not exist"),
        (["--skip", "transformers,llama.cpp,vllm"], "no peer left to measure beside nonstop"),
        (["--chart", "{tmp}/a-file/c.png"], "argument --chart"),
    ],
)
def test_peers_refuses_a_run_it_cannot_do_before_it_starts(argv, message, tmp_path):
    (tmp_path / "a-file").write_text("x")
    argv = [a.format(tmp=tmp_path) for a in argv]
    _one_error(_script("cpu_peers.py", *argv, "--out", str(tmp_path / "p.json"), cwd=tmp_path), message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
