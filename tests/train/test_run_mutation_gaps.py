"""`nonstop train` behaviours a mutation audit found unpinned: settings and data refused before training
(--seq-len past the positions, a token id equal to the vocabulary, a budget no step fits in, memory for the
optimiser state or for state and logits together), runtime errors that are not out-of-memory kept as they are,
what the log records (--seed, the last-50-step mean), and the fp32 tensors of the checkpoint."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

import nonstop.train.run as train_run
import nonstop.train.trainer as trainer
from nonstop.cli import main
from nonstop.config import ModelConfig
from nonstop.program.preflight import PreflightError
from nonstop.train.export import save_checkpoint
from nonstop.train.tokens import cached_token_ids
from nonstop.train.trainer import TrainConfig, TrainingOutOfMemory, init_model, train
from tests.test_cli_outputs import _refused
from tests.tiny_configs import KIMI_K3
from tests.train.test_sweep_fixes import POSITIONS, TOKENIZER
from tests.train.test_sweep_fixes import _argv as train_argv

VOCAB = ModelConfig.preset("k3-nano").vocab_size


def _config(tmp_path, **text_config):
    hf = copy.deepcopy(KIMI_K3)
    hf["text_config"].update(vocab_size=VOCAB, max_position_embeddings=POSITIONS)
    hf["text_config"].update(text_config)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf))
    return path


def _argv(corpus, config, tmp_path, *extra) -> list[str]:
    return train_argv(corpus, config, tmp_path, "--no-samples", "--eval-every", "1e9", *extra)


def test_a_seq_len_past_the_models_positions_is_refused(corpus, tmp_path, capsys):
    argv = _argv(corpus, _config(tmp_path), tmp_path)
    argv[argv.index("--seq-len") + 1] = str(POSITIONS + 1)
    err = _refused(argv, capsys)
    assert f"--seq-len {POSITIONS + 1} exceeds the model's {POSITIONS} positions" in err
    assert not (tmp_path / "out").exists()


def test_a_token_id_equal_to_the_vocabulary_size_is_refused(corpus, tmp_path, capsys):
    """Ids run 0 .. vocab_size - 1: a corpus whose largest id is vocab_size does not fit."""
    top = max(
        int(cached_token_ids(corpus / name, TOKENIZER, tmp_path / "tokens").max())
        for name in ("train.txt", "heldout.txt")
    )
    err = _refused(_argv(corpus, _config(tmp_path, vocab_size=top), tmp_path), capsys)
    assert f"tokenizer id {top} does not fit the model's vocabulary of {top}" in err
    assert not (tmp_path / "out").exists()


def test_a_budget_that_no_step_fits_in_writes_nothing(corpus, tmp_path, capsys):
    err = _refused(_argv(corpus, _config(tmp_path), tmp_path, "--minutes", "1e-12"), capsys)
    assert "no training step finished within --minutes" in err and "nothing was written" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("short", "message"),
    [
        ("state", "fp32 weights, gradients and AdamW moments, 16 B a parameter"),
        ("state+logits", "lower --batch-size or --seq-len"),
    ],
)
def test_memory_for_the_optimiser_state_and_a_steps_logits_is_checked(monkeypatch, short, message):
    """16 B a parameter (fp32 weight, gradient, two AdamW moments) plus 3 fp32 copies of a step's logits."""
    cfg = ModelConfig.from_hf_dict(KIMI_K3)
    params = 1_000_000
    tc = TrainConfig(batch_size=4, seq_len=32)
    state, logits = 16 * params, 3 * 4 * 4 * 32 * cfg.vocab_size
    free = state - 1 if short == "state" else state + logits - 1
    monkeypatch.setattr(train_run, "available_memory", lambda device: free)
    with pytest.raises(PreflightError, match=message):
        train_run._check_training_memory(cfg, params, tc)
    monkeypatch.setattr(train_run, "available_memory", lambda device: state + logits)
    train_run._check_training_memory(cfg, params, tc)  # exactly enough: no refusal


def test_a_runtime_error_that_is_not_out_of_memory_is_raised_as_it_is(monkeypatch):
    def broken(*args):
        raise RuntimeError("shape mismatch in a layer")

    monkeypatch.setattr(trainer, "next_token_loss", broken)
    model = init_model(ModelConfig.from_hf_dict(KIMI_K3))
    tc = TrainConfig(threads=1, batch_size=2, seq_len=16, max_steps=1)
    with pytest.raises(RuntimeError, match="shape mismatch") as info:
        train(model, np.arange(200, dtype=np.uint16) % 100, None, tc, log=lambda _: None)
    assert not isinstance(info.value, TrainingOutOfMemory)


def test_the_log_records_the_seed_given_and_the_mean_of_the_last_50_losses(corpus, tmp_path):
    argv = _argv(corpus, _config(tmp_path), tmp_path, "--seed", "5", "--max-steps", "52", "--batch-size", "1")
    argv[argv.index("--seq-len") + 1] = "4"
    assert main(argv) == 0
    log = json.loads((tmp_path / "out" / "training_log.json").read_text())
    assert log["train_config"]["seed"] == 5
    losses = [h["loss"] for h in log["history"]]
    assert len(losses) == 52
    assert log["result"]["final_train_loss_mean_last_50"] == pytest.approx(sum(losses[2:]) / 50, abs=1e-4)


def test_router_weights_biases_a_log_and_dt_bias_stay_fp32_in_a_bf16_checkpoint(tmp_path):
    """What the model card says of k3-nano's checkpoint: float weights in bf16, the router's weight and
    correction bias, A_log and dt_bias in fp32."""
    save_checkpoint(init_model(ModelConfig.from_hf_dict(KIMI_K3)), tmp_path, dtype=torch.bfloat16)
    fp32_suffixes = ("block_sparse_moe.gate.weight", "e_score_correction_bias", "A_log", "dt_bias")
    seen = set()
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        for name in f.keys():
            dtype = f.get_slice(name).get_dtype()
            kind = next((s for s in fp32_suffixes if name.endswith(s)), None)
            assert dtype == ("F32" if kind else "BF16"), (name, dtype)
            seen.add(kind)
    assert seen >= set(fp32_suffixes)
