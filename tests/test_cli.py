"""The CLI: each command's help, the happy paths, and one clear line (exit 2) for user errors."""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter

import pytest
import torch

from nonstop import LLM, SamplingParams
from nonstop.cli import main
from nonstop.commands.common import human
from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from tests.program.test_cost_model import streamed_bytes
from tests.tiny_configs import KIMI_K3


def test_every_command_has_help(capsys):
    """Each command says what it does, and its --help lists every option with an explanation."""
    from nonstop.cli import build_parser
    from nonstop.commands import COMMANDS

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {a.dest: a.help for a in sub._choices_actions}
    for name in COMMANDS:
        with pytest.raises(SystemExit) as e:
            main([name, "--help"])
        assert e.value.code == 0
        out = capsys.readouterr().out
        command = sub.choices[name]
        assert summaries[name] and command.description, name
        for action in command._actions:
            assert action.help and action.help != argparse.SUPPRESS, (name, action.dest)
            assert all(flag in out for flag in action.option_strings), (name, action.option_strings)


def test_synth_info_generate(tmp_path, capsys):
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps(KIMI_K3))
    out = tmp_path / "k3"
    assert main(["synth", "--config", str(cfg_path), "--out", str(out), "--dtype", "float32", "--seed", "2"]) == 0
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    capsys.readouterr()
    assert main(["info", "--model", str(out), "--dtype", "bfloat16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    cfg = ModelConfig.from_file(out)
    per_token = streamed_bytes(random_model(cfg, torch.bfloat16), rows=1)  # counted from the model's tensors
    weights = next(ln for ln in lines if ln.startswith("weights"))
    assert weights.endswith(f"read per decode token (batch 1): {human(per_token, 'B')}"), weights
    table = lines[lines.index(next(ln for ln in lines if ln.startswith("attention"))) + 1 :]
    kinds = Counter(zip(cfg.attn_types, cfg.mlp_types))
    assert {(r.split()[0], r.split()[1]): int(r.split()[2]) for r in table if r.strip()} == dict(kinds)
    assert (
        main(["generate", "--model", str(out), "--prompt-ids", "1,2,3", "-n", "4", "--ids", "--temperature", "0"]) == 0
    )
    printed = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("token ids:"))
    greedy = SamplingParams(max_tokens=4, temperature=0)
    want = LLM(out).generate(prompt_token_ids=[[1, 2, 3]], sampling=greedy)[0].token_ids
    assert [int(t) for t in printed.split(":")[1].split()] == want


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--model", "no-such-model"], "neither a checkpoint directory nor a known name"),
        (["info", "--model", "/"], "config.json not found"),
        (["synth", "--preset", "nope", "--out", "x"], "unknown preset"),
        (["generate", "--model", "kimi-k3", "--temperature", "-1"], "temperature"),
        (["generate", "--device", "cuda:7", "-n", "2", "hi"], "cuda:7"),
        (["generate", "--device", "tpu", "-n", "2", "hi"], "tpu"),
    ],
)
def test_user_errors_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("backend", ["superop", "megakernel"])
def test_kernel_backend_on_a_cpu_without_the_interpreter_is_a_clear_error(backend, monkeypatch, capsys):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SystemExit) as e:
        main(["generate", "--backend", backend, "-n", "2", "hello"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "needs a CUDA device" in err and "TRITON_INTERPRET=1" in err and "Traceback" not in err
    assert "use backend 'cpu'" in err  # the fast CPU path, not only the plain-torch oracle


def test_bad_checkpoint_is_a_clear_error(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(KIMI_K3))
    out = tmp_path / "k3"
    main(["synth", "--config", str(cfg), "--out", str(out), "--dtype", "float32"])
    data = (out / "model.safetensors").read_bytes()
    (out / "model.safetensors").write_bytes(data[:-50])
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", str(out), "--prompt-ids", "1"])
    assert e.value.code == 2 and "truncated" in capsys.readouterr().err


def test_version(capsys):
    import nonstop

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"nonstop {nonstop.__version__}"


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "perplexity", "program", "synth", "train", "tune"])
def test_every_command_that_computes_takes_threads(command, monkeypatch):
    """--threads reaches torch through nonstop.threads.set_threads (parsed, then applied by the command)."""
    from nonstop.cli import build_parser

    extra = {"synth": ["--out", "x", "--preset", "k3-nano"], "train": ["--out", "x"], "perplexity": ["f"]}
    args = build_parser().parse_args([command, "--threads", "3", *extra.get(command, [])])
    assert args.threads == 3


def _cheap_run(command: str, tmp_path) -> list[str]:
    """Arguments that make ``command`` compute a little (tune: fail right after applying --threads)."""
    if command == "synth":
        (tmp_path / "config.json").write_text(json.dumps(KIMI_K3))
        return ["synth", "--config", str(tmp_path / "config.json"), "--out", str(tmp_path / "synth")]
    if command == "perplexity":
        (tmp_path / "text.txt").write_text("The quick brown fox jumps over the lazy dog. " * 8)
        return ["perplexity", str(tmp_path / "text.txt"), "--context", "32"]
    return {
        "program": ["program", "--model", "k3-nano", "--summary"],
        "generate": ["generate", "--backend", "reference", "--prompt-ids", "1,2", "-n", "2"],
        "tune": ["tune", "--op", "no_such_kind"],
    }[command]


@pytest.mark.parametrize("command", ["program", "generate", "perplexity", "synth", "tune"])
def test_threads_are_applied(command, tmp_path, capsys, monkeypatch):
    """--threads N takes effect: torch computes with N threads afterwards (N differs from the count before, so
    a command that ignores the flag fails) and N is the choice the cpu backend's default reads."""
    import torch

    import nonstop.threads

    before = torch.get_num_threads()
    want = 1 if before != 1 else 2
    monkeypatch.setattr(nonstop.threads, "_chosen", None)
    try:
        if command == "tune":
            with pytest.raises(SystemExit) as e:
                main([*_cheap_run(command, tmp_path), "--threads", str(want)])
            assert e.value.code == 2 and "no_such_kind" in capsys.readouterr().err
        else:
            assert main([*_cheap_run(command, tmp_path), "--threads", str(want)]) == 0
        assert torch.get_num_threads() == want
        assert nonstop.threads.default_threads() == want
    finally:
        torch.set_num_threads(before)
    capsys.readouterr()


def test_generate_streams_pieces_as_they_come(tmp_path, capsys, monkeypatch):
    """The CLI prints each piece as the engine produces it: more than one write, and in order."""
    import builtins

    writes = []
    real_print = builtins.print

    def spy(*args, **kw):
        if kw.get("end") == "" and kw.get("file") is None:
            writes.append("".join(map(str, args)))
        return real_print(*args, **kw)

    monkeypatch.setattr(builtins, "print", spy)
    assert main(["generate", "-n", "12", "--temperature", "0", "--ignore-eos", "The Python"]) == 0
    out = capsys.readouterr().out
    assert len(writes) > 3 and out.startswith("The Python") and "".join(writes) in out


def _tiny_chat_model(tmp_path):
    from tests.engine.tiny_models import TEST_CHAT_TEMPLATE, synth_checkpoint

    return synth_checkpoint("k3", tmp_path / "chat", chat_template=TEST_CHAT_TEMPLATE)


def test_chat_reads_turns_from_piped_input(tmp_path, capsys, monkeypatch):
    import io

    model = _tiny_chat_model(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n\n/reset\nagain\n/exit\nnever read\n"))
    argv = ["chat", "--model", str(model), "-n", "4", "--temperature", "0", "--ignore-eos", "--system", "Be brief."]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err.count("[4 tokens") == 2 and "conversation cleared" in captured.err
    assert len(captured.out.splitlines()) == 2  # one line per reply


def test_chat_without_a_template_is_a_clear_error(tmp_path, capsys):
    from tests.engine.tiny_models import synth_checkpoint

    model = synth_checkpoint("k3", tmp_path / "plain")
    with pytest.raises(SystemExit) as e:
        main(["chat", "--model", str(model)])
    assert e.value.code == 2 and "--chat-template" in capsys.readouterr().err


def test_a_model_larger_than_memory_is_refused_within_seconds():
    """The issue's reproduction: a trillion-parameter preset on this machine ends at once with the sizes."""
    import re
    import subprocess
    import sys
    import time

    from tests.startup import startup_s, within_seconds_of_starting

    baseline = startup_s()
    t0 = time.monotonic()
    cli = [sys.executable, "-m", "nonstop.cli", "generate", "-m", "kimi-k3"]
    r = subprocess.run([*cli, "hi"], capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert re.search(r"kimi-k3 needs 1\.\d\d TB at float32 .*; this machine has [\d.]+ [GMT]B free", r.stderr), r.stderr
    assert within_seconds_of_starting(elapsed, baseline), (elapsed, baseline)
    r = subprocess.run([*cli, "--dtype", "bfloat16", "hi"], capture_output=True, text=True, timeout=120)
    assert "kimi-k3 needs 1.56 TB at bfloat16" in r.stderr


def test_synth_checks_free_disk(tmp_path, capsys, monkeypatch):
    import nonstop.program.preflight as preflight

    monkeypatch.setattr(preflight, "free_disk", lambda path: 1000)
    with pytest.raises(SystemExit) as e:
        main(["synth", "--preset", "llama-3.2-1b", "--out", str(tmp_path / "big")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and re.search(r"needs 2\.47 GB of disk; .* has 1 KB free", err) and "--no-preflight" in err
    assert not (tmp_path / "big").exists()
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(KIMI_K3))
    assert main(["synth", "--config", str(cfg), "--out", str(tmp_path / "small"), "--no-preflight"]) == 0


def test_memory_preflight_decides_on_weights_plus_cache():
    import torch

    from nonstop.config import ModelConfig
    from nonstop.program.preflight import PreflightError, check_memory, model_bytes

    cfg = ModelConfig.preset("llama-3.2-1b")
    weights, cache = model_bytes(cfg, torch.bfloat16, slots=2)
    assert cache > 0 and model_bytes(cfg, torch.float32, slots=2)[0] > weights
    cpu = torch.device("cpu")
    check_memory("llama-3.2-1b", cfg, torch.bfloat16, cpu, 2, free=weights + cache)
    with pytest.raises(PreflightError):
        check_memory("llama-3.2-1b", cfg, torch.bfloat16, cpu, 2, free=weights + cache - 1)
    message = r"llama-3.2-1b needs [\d.]+ GB at bfloat16 .*; this machine has 1 MB free"
    with pytest.raises(PreflightError, match=message):
        check_memory("llama-3.2-1b", cfg, torch.bfloat16, cpu, 2, free=10**6)
