"""Loading a DSpark drafter goes through the checked readers: a broken dspark/config.json or
dspark/model.safetensors is a ConfigError / CheckpointError naming the file and the field or tensor, and
the command line ends with one line, exit status 2."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from nonstop.cli import main
from nonstop.config import ConfigError, ModelConfig
from nonstop.engine.speculative.dspark import DSparkConfig, DSparkModel, load_drafter, save_drafter
from nonstop.weights.errors import CheckpointError
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import LLAMA

TARGET = ModelConfig.from_hf_dict(LLAMA)


def _drafter(path, **changes):
    torch.manual_seed(0)
    cfg = DSparkConfig(
        TARGET.vocab_size, TARGET.hidden_size, taps=(1, 3), num_heads=2, head_dim=8, intermediate_size=16, **changes
    )
    save_drafter(DSparkModel(cfg), path, dtype=torch.float32)
    return path


def _edit(path, change) -> None:
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))


def _rewrite(path, change) -> None:
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


def test_a_saved_drafter_loads_back(tmp_path):
    d = _drafter(tmp_path / "dspark")
    model = load_drafter(d)
    want = load_file(str(d / "model.safetensors"))
    assert all(torch.equal(v, want[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c.pop("hidden_size"), "config.json: missing required field 'hidden_size'"),
        (lambda c: c.update(num_heads="2"), "config.json: field 'num_heads' must be an integer, got '2'"),
        (lambda c: c.update(block_size=0), "config.json: field 'block_size' must be positive"),
        (lambda c: c.update(taps=[]), "config.json: field 'taps' must be a non-empty list"),
        (lambda c: c.update(taps=[1, -2]), "config.json: field 'taps' must be a non-empty list"),
        (lambda c: c.update(rope_theta=float("inf")), "config.json: field 'rope_theta' must be a finite number"),
        (lambda c: c.update(head_dim=7), "config.json: block_size must be >= 1 and head_dim even"),
        (lambda c: c.update(model_type="llama"), "config.json: field 'model_type' is 'llama'"),
    ],
)
def test_config_errors_name_the_file_and_field(tmp_path, change, message):
    d = _drafter(tmp_path / "dspark")
    _edit(d / "config.json", change)
    with pytest.raises(ConfigError, match=message):
        load_drafter(d)


def test_config_not_json(tmp_path):
    d = _drafter(tmp_path / "dspark")
    (d / "config.json").write_text('{"vocab_size": 131,\n')
    with pytest.raises(ConfigError, match=r"dspark/config.json: not valid JSON"):
        DSparkConfig.load(d / "config.json")


def _poison(t):
    t["context_norm.weight"] = t["context_norm.weight"].clone()
    t["context_norm.weight"][0] = float("nan")


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.pop("context_norm.weight"), r"dspark/model.safetensors: missing tensor 'context_norm.weight'"),
        (lambda t: t.update(extra=torch.zeros(2)), r"dspark/model.safetensors: unexpected tensor 'extra'"),
        (
            lambda t: t.update(mask_embedding=torch.zeros(3)),
            r"'mask_embedding' is \[3\] torch.float32, expected \[40\]",
        ),
        (
            lambda t: t.update(mask_embedding=torch.zeros(40, dtype=torch.int32)),
            r"'mask_embedding' is \[40\] torch.int",
        ),
        (_poison, r"'context_norm.weight' in .*dspark/model.safetensors holds 1 NaN"),
    ],
)
def test_weight_errors_name_the_file_and_tensor(tmp_path, change, message):
    d = _drafter(tmp_path / "dspark")
    _rewrite(d / "model.safetensors", change)
    with pytest.raises(CheckpointError, match=message):
        load_drafter(d)


def test_truncated_weights_and_fp16_overflow(tmp_path):
    d = _drafter(tmp_path / "dspark")
    _rewrite(d / "model.safetensors", lambda t: t.update(mask_embedding=torch.full((40,), 1e6)))
    with pytest.raises(
        CheckpointError, match=r"'mask_embedding' in .*dspark/model.safetensors holds values beyond float16"
    ):
        load_drafter(d, dtype=torch.float16)
    path = d / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"dspark/model.safetensors: truncated file: tensor"):
        load_drafter(d)


def test_the_command_line_says_one_line(tmp_path, capsys):
    model = write_checkpoint(TARGET, tmp_path / "m", seed=1, dtype=torch.float32)
    d = _drafter(model / "dspark")
    _rewrite(d / "model.safetensors", lambda t: t.pop("markov_w2.weight"))
    with pytest.raises(SystemExit) as e:
        main(["generate", "-m", str(model), "--speculative", "dspark", "--prompt-ids", "1,2", "-n", "2"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("nonstop: error:")]
    assert e.value.code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "dspark/model.safetensors: missing tensor 'markov_w2.weight'" in errors[0], errors


def test_more_drafts_than_the_block_size_are_refused_before_the_weights_load(tmp_path, capsys):
    """--num-draft-tokens 5 with a drafter of block size 4 was cut to 4 drafts without a word, each step
    still reserving 6 verify rows."""
    model = write_checkpoint(TARGET, tmp_path / "m", seed=1, dtype=torch.float32)
    _drafter(model / "dspark", block_size=4)
    argv = ["generate", "-m", str(model), "--speculative", "dspark", "--prompt-ids", "1,2", "-n", "2"]
    with pytest.raises(SystemExit) as e:
        main([*argv, "--num-draft-tokens", "5"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err and "loading" not in err, err
    assert [line for line in err.splitlines() if line.startswith("nonstop: error:")] == [
        "nonstop: error: speculative num_tokens 5 (--num-draft-tokens) exceeds the DSpark drafter's block size 4, "
        "the most it drafts per step: give at most 4"
    ], err
    assert main([*argv, "--num-draft-tokens", "4"]) == 0  # the block size itself drafts


def test_a_drafter_built_for_fewer_drafts_is_refused_at_load(tmp_path):
    from nonstop.engine.speculative.dspark_drafter import DSparkDrafter
    from nonstop.model.build import random_model

    d, target = _drafter(tmp_path / "dspark", block_size=3), random_model(TARGET, torch.float32)
    with pytest.raises(ValueError, match=r"num_tokens 4 \(--num-draft-tokens\) exceeds the DSpark drafter's block"):
        DSparkDrafter.load(d, target, num_tokens=4)
    assert DSparkDrafter.load(d, target, num_tokens=3).taps == (1, 3)
