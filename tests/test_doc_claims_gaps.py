"""Claims of the README and docs/distributed.md that no test held the code to: the serve extra's message, the
documented SamplingParams fields and defaults, k3-nano's drafter block size, the held-out perplexity the
cpu_quality row quotes, and the Kimi K3 TP 8 x EP 64 rank Program that docs/distributed.md describes."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest

from nonstop.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = " ".join((ROOT / "README.md").read_text().split())
DIST_DOC = " ".join((ROOT / "docs" / "distributed.md").read_text().split())


def test_serve_without_the_extra_names_it(monkeypatch, capsys):
    """README: 'Installed without the extra, ... nonstop serve says to add it'. A serve that failed with a
    traceback, or named no install line, when fastapi is missing breaks the promise."""
    monkeypatch.setitem(sys.modules, "fastapi", None)  # import fastapi -> ModuleNotFoundError
    with pytest.raises(SystemExit) as e:
        main(["serve", "--no-warmup"])
    err = capsys.readouterr().err.strip()
    assert e.value.code != 0
    assert err.count("\n") == 0 and err.startswith("nonstop: error:"), err
    assert "pip install 'nonstop[serve]'" in err and "fastapi" in err


def test_sampling_params_fields_and_defaults_are_the_documented_ones():
    """README lists SamplingParams' fields in order and says its defaults are vLLM's (temperature 1, no filters,
    16 tokens); a field added, dropped, renamed or reordered, or a default that filters, breaks it."""
    from nonstop import SamplingParams

    listed = re.search(r"`SamplingParams\(([^`]*)\)`;", README).group(1)
    documented = [name.strip() for name in listed.split(",")]
    fields = [f.name for f in dataclasses.fields(SamplingParams) if f.init]  # the constructor's arguments
    assert fields == documented
    sp = SamplingParams()
    assert sp.temperature == 1 and sp.max_tokens == 16  # vLLM's defaults
    assert (sp.top_p, sp.top_k, sp.min_p, sp.repetition_penalty) == (
        1.0,
        -1,
        0.0,
        1.0,
    )  # no filter, no penalty
    assert (sp.presence_penalty, sp.frequency_penalty) == (0.0, 0.0)


def test_k3_nano_drafter_block_size_is_the_documented_seven():
    """README and --help: --num-draft-tokens with dspark is at most the drafter's block size, '7 for k3-nano's';
    and the drafter reads target layers 3/6/8 with a rank-32 Markov head, 1 layer."""
    cfg = json.loads((ROOT / "nonstop" / "assets" / "k3-nano" / "dspark" / "config.json").read_text())
    assert f"{cfg['block_size']} for k3-nano's" in README
    taps = "/".join(str(t) for t in cfg["taps"])
    assert f"{cfg['num_layers']} layer reading target layers {taps}, rank-{cfg['markov_rank']} Markov head" in README


def test_heldout_sample_perplexity_is_the_quoted_fp32_figure(capsys):
    """README's cpu_quality row quotes k3-nano's fp32 perplexity of nonstop/assets/heldout_sample.txt in whole
    windows of 512 (bench/results/cpu_quality.json); `nonstop perplexity` scores the same windows in plain
    torch, so its last line must give that figure (a scoring change, a shifted window or a tokenizer change
    moves it)."""
    recorded = json.loads((ROOT / "bench" / "results" / "cpu_quality.json").read_text())
    fp32 = recorded["formats"]["fp32"]
    assert f"fp32 {fp32['perplexity']:.4f}" in README
    text = str(ROOT / "nonstop" / "assets" / "heldout_sample.txt")
    assert (
        main(
            [
                "perplexity",
                "-m",
                "k3-nano",
                "--dtype",
                "float32",
                "--threads",
                "1",
                text,
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert f"tokens scored: {fp32['tokens_scored']}" in lines
    assert lines[-1].startswith("perplexity: ")
    assert float(lines[-1].split()[-1]) == pytest.approx(fp32["perplexity"], abs=0.01)


def _program(capsys, *extra: str) -> str:
    assert main(["program", "-m", "kimi-k3", "--summary", *extra]) == 0
    return capsys.readouterr().out


def _wire_mb(out: str) -> float:
    return float(re.search(r"bytes on the wire per token per rank: ([\d.]+)MB", out).group(1))


def test_kimi_k3_tp8_ep64_rank_program_is_as_documented(capsys):
    """docs/distributed.md, Costs: Kimi K3 at --tp 8 --ep 64 holds 48 GB per rank, the engine picks the dynamic
    exchange (184 token all-to-alls + 92 split-size exchanges + 187 all-reduces, about 1 MB a token per rank),
    the static one would send about 21 MB, and inside one node (--tp 8 --ep 8) static wins."""
    assert "48 GB of weights per rank" in DIST_DOC
    assert "184 token all-to-alls + 92 split-size exchanges + 187 all-reduces per step" in DIST_DOC
    out = _program(capsys, "--tp", "8", "--ep", "64")
    assert re.search(r"weights per rank: 48GB - 48GB", out), out
    assert "184 token exchanges" in out and "92 split-size exchanges" in out
    assert "dynamic on cuda" in out
    reduces = sum(int(m.group(1)) for m in re.finditer(r"^\s*all_reduce\s+tp\(8\)\s+(\d+)\s", out, flags=re.MULTILINE))
    assert reduces == 187
    assert _wire_mb(out) == pytest.approx(1.0, abs=0.05)  # "about 1 MB on the wire per token per rank"
    static = _program(capsys, "--tp", "8", "--ep", "64", "--exchange", "static")
    assert "about 21 MB per token per rank" in DIST_DOC
    assert _wire_mb(static) == pytest.approx(21, abs=0.5)
    node = _program(capsys, "--tp", "8", "--ep", "8")
    assert "static on cuda" in node and "0 split-size exchanges" in node  # "Inside one node ... static wins"
