"""``nonstop info``'s parameter line says whether the active count includes the embedding table (tied: it is
the LM head) or not (untied: only a row is looked up), and a checkpoint's tokenizer (or how to do without)."""

from __future__ import annotations

import json

import pytest
import torch

from nonstop.cli import main
from nonstop.commands.common import human
from nonstop.config import ModelConfig
from nonstop.program.footprint import model_footprint
from tests.tiny_configs import LLAMA


@pytest.mark.parametrize("tied", [True, False])
def test_parameters_line_counts_the_embedding_once(tmp_path, capsys, tied):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "tie_word_embeddings": tied}))
    assert main(["synth", "--config", str(path), "--out", str(tmp_path / "ckpt")]) == 0
    assert main(["info", "--model", str(tmp_path / "ckpt")]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("parameters"))
    fp = model_footprint(ModelConfig.from_file(path), torch.bfloat16)
    total, active, embedding = human(fp.total_params), human(fp.active_params), human(fp.embedding_params)
    if tied:  # the table is the LM head: counted in active, which is then the whole model
        assert fp.active_params == fp.total_params
        assert line.endswith(f"active {active} per token, including the {embedding} embedding (tied: the LM head)")
    else:  # a dense model: active + the table not counted = total
        assert fp.active_params + fp.embedding_params == fp.total_params
        assert line.endswith(
            f"active {active} per token, not counting the {embedding} embedding (a row lookup per token)"
        )
    assert line.startswith(f"parameters   total {total}, ") and "(+" not in line


def test_info_names_the_tokenizer_or_says_to_give_token_ids(tmp_path, capsys):
    path = tmp_path / "config.json"
    for vocab, want in (
        (300, "tokenizer    tokenizer.json"),
        (200, "tokenizer    none: prompts and outputs are token ids"),
    ):
        path.write_text(json.dumps({**LLAMA, "vocab_size": vocab}))
        out = tmp_path / f"v{vocab}"
        assert main(["synth", "--config", str(path), "--out", str(out)]) == 0
        capsys.readouterr()
        assert main(["info", "--model", str(out)]) == 0
        assert any(ln.startswith(want) for ln in capsys.readouterr().out.splitlines()), want
