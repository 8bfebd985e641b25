"""`nonstop train` end to end on a tiny K3 config (seconds, CPU): what it writes and when, and the settings
and files it refuses with one line before it trains."""

from __future__ import annotations

import copy
import json
import sys

import numpy as np
import pytest
import torch

import nonstop.train.run as train_run
from nonstop.cli import main
from nonstop.config import ModelConfig
from nonstop.train.balance import ExpertBalancer
from nonstop.train.tokens import cached_token_ids
from nonstop.train.trainer import TrainConfig, TrainingOutOfMemory, init_model, train
from nonstop.weights.resolve import ASSETS
from tests.test_cli_outputs import _refused
from tests.tiny_configs import KIMI_K3

TOKENIZER = ASSETS / "k3-nano"
POSITIONS = 64


@pytest.fixture
def config(tmp_path):
    """A tiny K3 config with the bundled tokenizer's vocabulary and only 64 positions."""
    hf = copy.deepcopy(KIMI_K3)
    hf["text_config"].update(vocab_size=ModelConfig.preset("k3-nano").vocab_size, max_position_embeddings=POSITIONS)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf))
    return path


def _argv(corpus, config, tmp_path, *extra) -> list[str]:
    return [
        "train",
        "--corpus",
        str(corpus),
        "--tokenizer",
        str(TOKENIZER),
        "--config",
        str(config),
        "--cache-dir",
        str(tmp_path / "tokens"),
        "--out",
        str(tmp_path / "out"),
        "--threads",
        "1",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--max-steps",
        "3",
        *extra,
    ]


def test_final_score_fits_the_models_positions_and_the_end_spread_is_real(corpus, config, tmp_path, monkeypatch):
    """A config of 64 positions was scored in windows of 512 and logged 'context 512'; with an evaluation after
    every step the end-of-run expert spread divided empty counts and recorded 0.0."""
    contexts = []
    score = train_run.score_token_ids

    def spy(model, ids, context, **kw):
        contexts.append(context)
        return score(model, ids, context=context, **kw)

    monkeypatch.setattr(train_run, "score_token_ids", spy)
    assert main(_argv(corpus, config, tmp_path, "--eval-every", "0", "--no-samples")) == 0
    log = json.loads((tmp_path / "out" / "training_log.json").read_text())
    assert contexts == [POSITIONS] and log["result"]["heldout_context"] == POSITIONS
    assert len(log["evals"]) == 3
    end = log["result"]["expert_load_spread_end"]
    assert end and all(v >= 1.0 for v in end.values()), end  # 1.0 is perfect balance; 0.0 is impossible


def test_the_log_and_checkpoint_are_written_before_the_samples(corpus, config, tmp_path, monkeypatch):
    def broken(model_dir):
        assert (model_dir / "training_log.json").is_file() and (model_dir / "model.safetensors").is_file()
        raise RuntimeError("sampling broke")

    monkeypatch.setattr(train_run, "greedy_samples", broken)
    with pytest.raises(SystemExit):
        main(_argv(corpus, config, tmp_path, "--eval-every", "1e9"))
    log = json.loads((tmp_path / "out" / "training_log.json").read_text())
    assert log["result"]["steps"] == 3 and "samples" not in log


def test_the_samples_are_added_to_the_log(corpus, config, tmp_path, monkeypatch):
    monkeypatch.setattr(train_run, "greedy_samples", lambda model_dir: [{"prompt": "The", "completion": " end"}])
    assert main(_argv(corpus, config, tmp_path, "--eval-every", "1e9")) == 0
    log = json.loads((tmp_path / "out" / "training_log.json").read_text())
    assert log["samples"] == [{"prompt": "The", "completion": " end"}] and log["result"]["total_wall_s"] > 0


def test_recent_spreads_of_an_empty_window_repeat_the_last_one():
    cfg = ModelConfig.from_hf_dict(KIMI_K3)
    model = init_model(cfg)
    balancer = ExpertBalancer(model)
    assert balancer.recent_spreads() == {} and balancer.spreads() == {}  # nothing counted: no spread, not 0
    model(torch.randint(0, cfg.vocab_size, (2, 8)))
    balancer.step()
    first = balancer.recent_spreads()
    assert first and all(v >= 1.0 for v in first.values())
    assert balancer.recent_spreads() == first
    balancer.remove()


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--minutes", "1e307"),
        ("--minutes", "600000"),
        ("--batch-size", str(10**20)),
        ("--warmup-steps", str(10**400)),
        ("--max-steps", str(10**30)),
        ("--bias-update-rate", "1e308"),
    ],
)
def test_numbers_that_overflow_are_refused_by_the_parser(corpus, config, tmp_path, capsys, flag, value):
    err = _refused([*_argv(corpus, config, tmp_path), flag, value], capsys)
    assert f"{flag}: expected at most" in err


def test_a_batch_memory_cannot_hold_is_refused_before_training(corpus, config, tmp_path, capsys):
    err = _refused(_argv(corpus, config, tmp_path, "--batch-size", "1000000000"), capsys)
    assert "lower --batch-size or --seq-len" in err and "[train " not in err
    assert not (tmp_path / "out").exists()


def test_running_out_of_memory_in_a_step_names_the_settings(monkeypatch):
    import nonstop.train.trainer as trainer

    def no_memory(*args):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: 1 TB")

    monkeypatch.setattr(trainer, "next_token_loss", no_memory)
    model = init_model(ModelConfig.from_hf_dict(KIMI_K3))
    tc = TrainConfig(threads=1, batch_size=2, seq_len=16, max_steps=1)
    with pytest.raises(TrainingOutOfMemory, match="lower --batch-size .now 2. or --seq-len .now 16."):
        train(model, np.arange(200, dtype=np.uint16) % 100, None, tc, log=lambda _: None)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_an_output_directory_that_cannot_be_made_is_refused_before_training(corpus, config, tmp_path, capsys):
    argv = _argv(corpus, config, tmp_path)
    argv[argv.index("--out") + 1] = "/proc/nonstop-test/out"
    err = _refused(argv, capsys)
    assert "--out /proc/nonstop-test/out: cannot create the directory" in err and "[train " not in err


def test_the_output_pre_check_leaves_nothing_behind(corpus, config, tmp_path, capsys):
    argv = _argv(corpus, config, tmp_path, "--min-lr", "1", "--lr", "0.1")
    argv[argv.index("--out") + 1] = str(tmp_path / "new" / "out")
    _refused(argv, capsys)
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("kept", [0.0, 0.05, 0.5])  # of the file: empty, a cut header, half the ids
def test_a_broken_token_cache_is_tokenized_again(corpus, tmp_path, capsys, kept):
    text = corpus / "heldout.txt"
    good = cached_token_ids(text, TOKENIZER, tmp_path / "tokens")
    (cache,) = (tmp_path / "tokens").iterdir()
    whole = cache.read_bytes()
    cache.write_bytes(whole[: int(len(whole) * kept)])
    capsys.readouterr()
    assert np.array_equal(cached_token_ids(text, TOKENIZER, tmp_path / "tokens"), good)
    err = capsys.readouterr().err
    assert f"{cache} is unreadable" in err and "tokenizing" in err and len(err.strip().splitlines()) == 1
    assert np.array_equal(np.load(cache), good)  # rewritten
    assert [p.name for p in (tmp_path / "tokens").iterdir()] == [cache.name]  # no temporary file left


def test_an_old_chat_template_left_in_out_is_noted_as_synth_notes_it(corpus, config, tmp_path, capsys):
    """The loader prefers out/chat_template.jinja to the trained tokenizer's template: train said nothing."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "chat_template.jinja").write_text("{{ messages[0].content }}")
    assert main(_argv(corpus, config, tmp_path, "--max-steps", "1", "--no-samples")) == 0
    err = capsys.readouterr().err
    assert f"note: chat_template.jinja left in {out}" in err and "remove it if it belongs to an old model" in err
    assert (out / "chat_template.jinja").read_text() == "{{ messages[0].content }}"  # the user's file: kept
    assert main(_argv(corpus, config, tmp_path, "--max-steps", "1", "--no-samples", "--out", str(tmp_path / "o2"))) == 0
    assert "note:" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("cache_dir", "message"),
    [
        ("afile", "--cache-dir {tmp}/afile is an existing file, not a directory"),
        ("afile/tokens", "--cache-dir {tmp}/afile/tokens lies under {tmp}/afile, which is a file"),
        pytest.param(
            "/proc/nonstop-test/tokens",
            "--cache-dir /proc/nonstop-test/tokens: cannot create the directory",
            marks=pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's"),
        ),
    ],
)
def test_a_cache_dir_that_cannot_hold_the_tokens_is_refused_before_tokenizing(
    corpus, config, tmp_path, capsys, cache_dir, message
):
    """It failed after the tokenizing with "[Errno 17] File exists: 'afile'", naming no flag."""
    (tmp_path / "afile").write_text("mine")
    path = cache_dir if cache_dir.startswith("/") else str(tmp_path / cache_dir)
    argv = _argv(corpus, config, tmp_path)
    argv[argv.index("--cache-dir") + 1] = path
    err = _refused(argv, capsys)
    assert message.format(tmp=tmp_path) in err and "[train " not in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "afile").read_text() == "mine" and not (tmp_path / "out").exists()


def test_a_missing_held_out_split_is_refused_before_the_training_split_is_tokenized(
    corpus, config, tmp_path, capsys, monkeypatch
):
    tokenized = []
    tokenize = train_run.cached_token_ids
    monkeypatch.setattr(
        train_run, "cached_token_ids", lambda text, *a: tokenized.append(text.name) or tokenize(text, *a)
    )
    (corpus / "heldout.txt").unlink()
    err = _refused(_argv(corpus, config, tmp_path), capsys)
    assert "heldout.txt not found" in err and "train.txt" not in tokenized


def test_the_final_held_out_score_is_the_bf16_checkpoints_as_the_model_card_says(corpus, config, tmp_path):
    """The model card said the training log's held-out figure was of "the weights as trained"; the run scores
    the checkpoint it wrote (bf16), read back."""
    from nonstop.engine.perplexity import score_token_ids
    from nonstop.model.build import load_model

    assert main(_argv(corpus, config, tmp_path, "--no-samples")) == 0
    out = tmp_path / "out"
    logged = json.loads((out / "training_log.json").read_text())["result"]["heldout_mean_nll"]
    heldout = cached_token_ids(corpus / "heldout.txt", TOKENIZER, tmp_path / "tokens")
    saved = load_model(ModelConfig.from_file(config), out, torch.float32)
    assert logged == round(score_token_ids(saved, heldout, context=POSITIONS, batch_size=8).mean_nll, 4)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    card = " ".join((ASSETS / "k3-nano" / "README.md").read_text().split())
    about_the_log = card[card.index("`result.heldout_perplexity`") :].split(";")[0]
    assert "bf16 checkpoint" in about_the_log and "as trained" not in about_the_log


def test_zero_warmup_steps_are_accepted_and_start_at_the_peak():
    """``--warmup-steps 0`` was refused as not positive, though the schedule needs no warmup: step 0 is then
    past warmup at decay progress 0, so its rate is the peak (cos 0 = 1). A negative count is still refused."""
    from nonstop.cli import build_parser
    from nonstop.train.schedule import learning_rate

    parser = build_parser()
    assert parser.parse_args(["train", "--out", "o", "--warmup-steps", "0"]).warmup_steps == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--out", "o", "--warmup-steps", "-1"])
    assert learning_rate(0, 0.0, 3e-3, 3e-4, 0) == 3e-3
    assert learning_rate(0, 0.0, 3e-3, 3e-4, 4) == 3e-3 / 4  # with warmup: (step + 1) / warmup of the peak
