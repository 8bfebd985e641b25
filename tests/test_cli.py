"""The CLI: each command's help, the happy paths, and one clear line (exit 2) for user errors."""

from __future__ import annotations

import argparse
import json
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
