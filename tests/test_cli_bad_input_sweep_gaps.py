"""Black-box sweep of the CLI on damaged checkpoints and odd inputs: each must end with ONE line
'nonstop: error: ...' naming what is wrong and exit status 2 (never 'internal error', status 1, and never
a silent success). Checkpoints are tiny synth llama models (byte tokenizer) damaged one way each."""

from __future__ import annotations

import copy
import json
import shutil
import struct
from pathlib import Path

import pytest
import torch

from nonstop import cli
from tests.tiny_configs import LLAMA

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad_input")
    cfg = root / "llama.json"
    cfg.write_text(json.dumps({**LLAMA, "vocab_size": 256}))
    out = root / "ck"
    assert cli.main(["synth", "--config", str(cfg), "--out", str(out), "--dtype", "float32"]) == 0
    return out


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        rc = cli.main(argv)
    except SystemExit as exc:
        rc = exc.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("nonstop:")]


def _clone(good: Path, tmp_path: Path) -> Path:
    d = tmp_path / "ck"
    shutil.copytree(good, d)
    return d


def _header(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _write(path: Path, header: dict, data: bytes) -> None:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def _lie(field: str):
    """A header edit on the tensor model.layers.0.input_layernorm.weight (40 fp32 values)."""

    def edit(h: dict) -> None:
        e = h["model.layers.0.input_layernorm.weight"]
        if field == "dtype":
            e["dtype"] = "F16"
        elif field == "shape":
            e["shape"] = [41]
        elif field == "offsets_past_end":
            a, b = e["data_offsets"]
            e["data_offsets"] = [a + 10**6, b + 10**6]
        elif field == "offsets_reversed":
            a, b = e["data_offsets"]
            e["data_offsets"] = [b, a]

    return edit


@pytest.mark.parametrize(
    ("lie", "words"),
    [
        ("dtype", "F16"),
        ("shape", "[41]"),
        ("offsets_past_end", "truncated"),
        ("offsets_reversed", "corrupt"),
    ],
)
def test_a_safetensors_header_that_lies_is_one_error_line(good, tmp_path, capsys, lie, words):
    """A header whose dtype, shape or data offsets disagree with the bytes stored is refused by ``info``
    (which checks headers before anything loads) with one line naming the tensor; a loader that trusted the
    header would read the wrong bytes silently."""
    d = _clone(good, tmp_path)
    h, data = _header(d / "model.safetensors")
    _lie(lie)(h)
    _write(d / "model.safetensors", h, data)
    rc, out, err = _run(["info", "-m", str(d)], capsys)
    assert rc == 2 and out == ""
    (line,) = _errors(err)
    assert line.startswith("nonstop: error:") and "input_layernorm" in line and words in line


@pytest.mark.parametrize("cut", [0, 4, 50, "half"])
def test_a_truncated_safetensors_file_is_one_error_line(good, tmp_path, capsys, cut):
    """An empty file, one cut inside the length prefix, inside the header, or inside the data: status 2 and
    one line naming the file as truncated or corrupt."""
    d = _clone(good, tmp_path)
    raw = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(raw[: len(raw) // 2 if cut == "half" else cut])
    rc, _, err = _run(["info", "-m", str(d)], capsys)
    assert rc == 2
    (line,) = _errors(err)
    assert "model.safetensors" in line and ("truncated" in line or "corrupt" in line)


def test_missing_and_extra_tensors_are_named(good, tmp_path, capsys):
    """A checkpoint re-saved without one tensor, or with a tensor of a layer the config does not have, is
    refused naming that tensor (a missing weight must not be left at its random or zero init)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(good / "model.safetensors")
    gone = "model.layers.1.mlp.up_proj.weight"
    d = _clone(good, tmp_path)
    save_file({k: v for k, v in tensors.items() if k != gone}, d / "model.safetensors")
    rc, _, err = _run(["info", "-m", str(d)], capsys)
    assert rc == 2 and "missing tensor" in err and gone in err
    extra = "model.layers.7.mlp.up_proj.weight"
    save_file({**tensors, extra: torch.zeros(3)}, d / "model.safetensors")
    rc, _, err = _run(["info", "-m", str(d)], capsys)
    assert rc == 2 and "unexpected tensor" in err and extra in err


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf_weights_stop_generate(good, tmp_path, capsys, value):
    """A weight holding one NaN / inf: generate refuses it at load naming the tensor (not NaN logits that
    sample token 0 forever)."""
    from safetensors.torch import load_file, save_file

    d = _clone(good, tmp_path)
    tensors = load_file(d / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.weight"
    tensors[name][0, 0] = value
    save_file(tensors, d / "model.safetensors")
    rc, out, err = _run(["generate", "-m", str(d), "--backend", "reference", "-n", "2", "hi"], capsys)
    assert rc == 2 and out == ""
    assert name in _errors(err)[-1] and "NaN or infinite" in err


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{ not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ("null", "must be a JSON object"),
        ("{}", "missing required field 'model_type'"),
        ('{"model_type": "gpt99"}', "unsupported model_type 'gpt99'"),
    ],
)
def test_config_json_not_a_config_is_one_error_line(good, tmp_path, capsys, text, words):
    """config.json that is not JSON, not an object, empty, or of an unknown family: one line naming the file."""
    d = _clone(good, tmp_path)
    (d / "config.json").write_text(text)
    rc, _, err = _run(["info", "-m", str(d)], capsys)
    assert rc == 2
    (line,) = _errors(err)
    assert "config.json" in line and words in line


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("hidden_size", 0, "must be positive"),
        ("vocab_size", -4, "must be positive"),
        ("num_attention_heads", "5", "must be an integer"),
        ("intermediate_size", 40.5, "must be an integer"),
        ("num_hidden_layers", True, "must be an integer"),
        ("num_hidden_layers", 10**12, "limit"),
        ("eos_token_id", 10**5, "outside the vocabulary"),
        ("rms_norm_eps", -1, "must be > 0"),
    ],
)
def test_config_field_of_wrong_type_or_size_names_the_field(good, tmp_path, capsys, field, value, words):
    """A zero, negative, string, float, bool or absurdly large size in config.json is refused with the field
    named (10**12 layers must not try to build 10**12 layers)."""
    d = _clone(good, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg[field] = value
    (d / "config.json").write_text(json.dumps(cfg))
    rc, _, err = _run(["info", "-m", str(d)], capsys)
    assert rc == 2
    (line,) = _errors(err)
    assert field in line and words in line


def test_no_config_and_a_file_for_a_directory(good, tmp_path, capsys):
    """A directory without config.json, and a plain file given as the model: one line each, status 2."""
    d = _clone(good, tmp_path)
    (d / "config.json").unlink()
    rc, _, err = _run(["info", "-m", str(d)], capsys)
    assert rc == 2 and "config.json not found" in err
    f = tmp_path / "model.txt"
    f.write_text("hi")
    rc, _, err = _run(["info", "-m", str(f)], capsys)
    assert rc == 2 and "not a directory" in err


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("tokenizer.json", "{bad", "cannot load tokenizer"),
        ("tokenizer.json", "", "cannot load tokenizer"),
        ("generation_config.json", "{bad", "not valid JSON"),
        ("generation_config.json", "[]", "must be a JSON object"),
        ("generation_config.json", '{"temperature": "hot"}', "temperature"),
        ("generation_config.json", '{"top_p": 5, "do_sample": true}', "top_p"),
        ("generation_config.json", '{"max_new_tokens": -3}', "max_new_tokens"),
    ],
)
def test_broken_tokenizer_or_generation_config_stops_generate(good, tmp_path, capsys, name, text, words):
    """A broken tokenizer.json or generation_config.json is refused by generate naming the file (not ignored,
    which would silently sample with other settings or other ids)."""
    d = _clone(good, tmp_path)
    (d / name).write_text(text)
    rc, _, err = _run(["generate", "-m", str(d), "--backend", "reference", "-n", "2", "hi"], capsys)
    assert rc == 2
    (line,) = _errors(err)
    assert name in line and words in line


def test_index_naming_a_missing_shard(good, tmp_path, capsys):
    """A sharded checkpoint whose index names a shard that is not there: one line naming the shard."""
    d = tmp_path / "sharded"
    cfg = json.loads((good / "config.json").read_text())
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    rc, _, _ = _run(
        [
            "synth",
            "--config",
            str(tmp_path / "c.json"),
            "--out",
            str(d),
            "--shard-size",
            "0.00005",
        ],
        capsys,
    )
    assert rc == 0
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    (d / shards[1]).unlink()
    rc, _, err = _run(["info", "-m", str(d)], capsys)
    assert rc == 2
    (line,) = _errors(err)
    assert shards[1] in line and "missing" in line


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["-n", "10000000000000", "hi"], "exceeds the model's context of 512"),
        (["-n", "2", "x" * 600], "prompt (600 tokens)"),
        (["-n", "2", ""], "empty prompt"),
        (["-n", "2", "\udcff"], "not valid UTF-8"),
        (["-t", "nan", "hi"], "temperature"),
        (["--stop", "", "hi"], "stop"),
        (["--prompt-ids", "999999"], "outside the vocabulary"),
        (["--seed", str(2**70), "hi"], "seed"),
    ],
)
def test_odd_generate_values_are_one_error_line(good, capsys, argv, words):
    """A max-tokens past the context, a prompt longer than the context, an empty prompt, a lone surrogate,
    a NaN temperature, an empty stop string, an id outside the vocabulary, a seed past 64 bits: status 2,
    one line, nothing generated."""
    rc, out, err = _run(["generate", "-m", str(good), "--backend", "reference", *argv], capsys)
    assert rc == 2 and out == ""
    (line,) = _errors(err)
    assert line.startswith("nonstop: error:") and words in line


def test_unicode_prompt_round_trips_through_the_byte_tokenizer(good, capsys):
    """A prompt of multi-byte UTF-8 (an emoji, an accent) is echoed exactly and counted in bytes (11 for
    '😀 héllo': 4 + 1 + 1 + 2 + 3)."""
    rc, out, err = _run(
        ["generate", "-m", str(good), "--backend", "reference", "-n", "1", "😀 héllo"],
        capsys,
    )
    assert rc == 0 and out.startswith("😀 héllo")
    assert "prompt 11 tokens" in err


def test_chip_file_with_a_nan_figure(tmp_path, capsys):
    """``plan --chip-file`` whose entry has a NaN bandwidth (JSON NaN) is refused naming the figure, not
    planned into NaN ms/token."""
    from nonstop.plan.chips import CATALOGUE

    entry = copy.deepcopy(json.loads(Path(CATALOGUE).read_text())["h100"])
    entry["hbm_gbps"] = float("nan")
    path = tmp_path / "chips.json"
    path.write_text(json.dumps({"mychip": entry}))
    rc, out, err = _run(["plan", "-m", "k3-nano", "--chip", "mychip", "--chip-file", str(path)], capsys)
    assert rc == 2 and out == ""
    (line,) = _errors(err)
    assert "hbm_gbps" in line and "nan" in line


@pytest.mark.parametrize("ids", ["1,,2", "1,2,", ",1"])
def test_prompt_ids_with_an_empty_item_are_refused(good, capsys, ids):
    """An empty item between commas is a missing id, not a separator to skip ("1,,2" was read as [1, 2]);
    commas, spaces and both together still separate ids."""
    rc, out, err = _run(["generate", "-m", str(good), "--backend", "reference", "--prompt-ids", ids], capsys)
    assert rc == 2 and out == ""
    assert f"--prompt-ids: token ids: an empty item between commas in '{ids}'" in err, err
    argv = ["generate", "-m", str(good), "--backend", "reference", "-n", "1", "--prompt-ids", "1, 2"]
    rc, out, err = _run(argv, capsys)
    assert rc == 0 and "prompt 2 tokens" in err, err


def test_perplexity_of_an_empty_path_says_so(good, capsys):
    """``perplexity ''`` names the empty path (it read as the current directory: ".: not a regular file")."""
    rc, _, err = _run(["perplexity", "-m", str(good), "", "--tokenizer", "bytes"], capsys)
    assert rc == 2
    (line,) = _errors(err)
    assert line == "nonstop: error: the text file to score is an empty path: give a file name"
