"""``nonstop train`` refuses a run whose loss became NaN ("training diverged ... lower --lr") and writes
nothing. The check ran on each step's loss before its update, so an update that ruined the weights on the
last step (--max-steps, or the budget's end) went unchecked: the run exited 0, reported a held-out NLL of nan
and replaced the checkpoint in --out with the ruined one."""

from __future__ import annotations

import json

import pytest

from nonstop.cli import main
from nonstop.weights.resolve import ASSETS

TOKENIZER = ASSETS / "k3-nano"


def _argv(corpus, tmp_path, out) -> list[str]:
    argv = [
        "train",
        "--corpus",
        str(corpus),
        "--tokenizer",
        str(TOKENIZER),
        "--cache-dir",
        str(tmp_path / "tok"),
    ]
    argv += [
        "--threads",
        "1",
        "--batch-size",
        "1",
        "--seq-len",
        "32",
        "--no-samples",
        "--out",
        str(out),
    ]
    return argv


@pytest.mark.timeout(120)
def test_a_last_step_that_diverges_is_refused_and_keeps_the_old_checkpoint(corpus, tmp_path, capsys):
    """Catches the divergence check skipping the last update: with --lr 1e30 the first step's loss is finite
    (random weights) but its update makes the weights ~1e30, so the held-out NLL is nan. With --max-steps 2
    the command says "training diverged" and exits 2; with --max-steps 1 it must do no less: exit non-zero
    and leave the checkpoint already in --out as it was (it wrote the ruined one and exited 0)."""
    out = tmp_path / "out"
    assert main([*_argv(corpus, tmp_path, out), "--max-steps", "1"]) == 0  # a good checkpoint first
    good = (out / "model.safetensors").read_bytes()
    capsys.readouterr()
    bad = [
        *_argv(corpus, tmp_path, out),
        "--max-steps",
        "1",
        "--lr",
        "1e30",
        "--warmup-steps",
        "0",
    ]
    code = 0
    try:
        code = main(bad)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    log = json.loads((out / "training_log.json").read_text())
    assert code != 0, f"a run whose weights diverged exited 0; held-out NLL {log['result']['heldout_mean_nll']}\n{err}"
    assert (out / "model.safetensors").read_bytes() == good, "the diverged run replaced the checkpoint in --out"
    assert code == 2 and "training diverged" in err and "step 1" in err and "lower --lr" in err, err
