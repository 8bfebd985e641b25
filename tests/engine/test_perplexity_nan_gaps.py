"""``nonstop perplexity`` on a model whose logits are not finite in the chosen dtype (float16 overflow): the
mean NLL is NaN. The command printed "perplexity: nan" and exited 0, so a script reading the last line got a
number-shaped nothing; it now refuses with one line naming the dtype and what to try. An overflow to +inf
(float32, the same weights) is still a result: "perplexity: inf"."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from nonstop.cli import main
from tests.engine.tiny_models import synth_checkpoint


@pytest.fixture(scope="module")
def blown_up(tmp_path_factory):
    """A tiny Llama whose matrices are scaled to a largest value of 6e4: each holds in float16 (the loader's
    range check passes) but their products do not (inf, then NaN through the next norm)."""
    out = synth_checkpoint("llama", tmp_path_factory.mktemp("nan") / "m")
    (shard,) = sorted(out.glob("*.safetensors"))
    tensors = load_file(shard)
    for name, t in tensors.items():
        if t.dim() == 2:
            tensors[name] = t * (6e4 / t.abs().max())
    save_file(tensors, shard, metadata={"format": "pt"})
    text = out / "t.txt"
    text.write_bytes(b"the quick brown fox " * 4)
    return out, text


def _run(model, text, dtype):
    try:
        return main(["perplexity", "-m", str(model), str(text), "--tokenizer", "bytes", "--dtype", dtype])
    except SystemExit as exc:
        return exc.code


def test_a_nan_log_likelihood_is_refused_with_the_dtype_named(blown_up, capsys):
    """Catches "perplexity: nan" printed with exit status 0."""
    rc = _run(*blown_up, "float16")
    captured = capsys.readouterr()
    assert rc == 2, captured.out
    assert "perplexity:" not in captured.out
    assert "float16" in captured.err and "--dtype" in captured.err and "internal error" not in captured.err


def test_a_nan_from_float16_is_not_a_nan_in_float32(blown_up, capsys):
    """The same weights in float32 give a finite or infinite perplexity, never the error (the check is about NaN
    only, not about a large loss)."""
    rc = _run(*blown_up, "float32")
    out = capsys.readouterr().out
    assert rc == 0
    value = float(out.strip().splitlines()[-1].split(":")[1])
    assert value > 1 and not torch.isnan(torch.tensor(value))
