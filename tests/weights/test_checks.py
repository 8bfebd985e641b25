"""Checkpoint checks a broken or mixed download meets: the safetensors data layout (header length, aliased or
overlapping tensors), a pipe in place of a file, a tensor in two shards under an index, a tied model's extra LM
head, fp16 overflow told from corrupt data, .bin-only directories, ``nonstop info`` reading the headers, and
model names and files that are not what they look like. Each error is one line naming the file."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import struct
import threading

import pytest
import torch
from safetensors.torch import load_file, save_file

from nonstop.cli import main
from nonstop.config import ConfigError, ModelConfig
from nonstop.weights.errors import CheckpointError
from nonstop.weights.loader import checkpoint_files, load_state_dict, resolve_checkpoint
from nonstop.weights.resolve import resolve_model
from nonstop.weights.safetensors_file import SafetensorsFile
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import LLAMA

CFG = ModelConfig.from_hf_dict(LLAMA)  # tied: tie_word_embeddings true, no lm_head.weight written
K = "model.layers.0.self_attn.k_proj.weight"
V = "model.layers.0.self_attn.v_proj.weight"
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("checks")
    single = write_checkpoint(CFG, root / "single", seed=3, dtype=torch.float32)
    sharded = write_checkpoint(CFG, root / "sharded", seed=3, dtype=torch.float32, max_shard_bytes=20_000)
    return single, sharded


@pytest.fixture()
def ckpt(pristine, tmp_path):
    return shutil.copytree(pristine[0], tmp_path / "m")


def _split(path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _write(path, header: dict, body: bytes, pad: int = 0, length_delta: int = 0) -> None:
    raw = json.dumps(header).encode() + b" " * pad
    path.write_bytes(struct.pack("<Q", len(raw) + length_delta) + raw + body)


def _set_offsets(path, name: str, begin: int) -> None:
    header, body = _split(path)
    b, e = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin, begin + e - b]
    _write(path, header, body)


def test_a_header_length_four_short_reads_shifted_weights(ckpt):
    """The header's JSON still parses (its padding dropped), but every tensor would be read 4 bytes early."""
    path = ckpt / "model.safetensors"
    header, body = _split(path)
    _write(path, header, body, pad=4, length_delta=-4)
    with pytest.raises(CheckpointError, match=r"model.safetensors: corrupt safetensors file: the tensors end at byte"):
        SafetensorsFile(path)


def test_bytes_after_the_last_tensor(ckpt):
    path = ckpt / "model.safetensors"
    path.write_bytes(path.read_bytes() + b"\0" * 8)
    with pytest.raises(CheckpointError, match=r"model.safetensors: .*data after the last tensor"):
        SafetensorsFile(path)


def test_two_tensors_sharing_bytes(ckpt):
    path = ckpt / "model.safetensors"
    header, _ = _split(path)
    _set_offsets(path, V, header[K]["data_offsets"][0])  # v_proj aliases k_proj
    with pytest.raises(CheckpointError, match=r"model.safetensors: corrupt safetensors file: tensor '.*' starts at"):
        SafetensorsFile(path)


def test_partly_overlapping_tensors(ckpt):
    path = ckpt / "model.safetensors"
    header, _ = _split(path)
    (_, a), (b, name) = sorted((e["data_offsets"], n) for n, e in header.items() if n != "__metadata__")[:2]
    _set_offsets(path, name, b[0] - 4)  # its first 4 bytes are the last 4 of the tensor before it
    with pytest.raises(CheckpointError, match=rf"tensor {name!r} starts at byte {b[0] - 4} .*overlaps {a!r}"):
        SafetensorsFile(path)


def test_a_gap_between_tensors(ckpt):
    path = ckpt / "model.safetensors"
    header, body = _split(path)
    last = max((e["data_offsets"][1], n) for n, e in header.items() if n != "__metadata__")[1]
    b, e = header[last]["data_offsets"]
    header[last]["data_offsets"] = [b + 4, e + 4]
    _write(path, header, body[:b] + b"\0" * 4 + body[b:])
    with pytest.raises(CheckpointError, match=rf"tensor {last!r} starts at byte {b + 4} .*leaves bytes {b}..{b + 4}"):
        SafetensorsFile(path)


def test_a_pipe_named_model_safetensors_does_not_hang(ckpt):
    path = ckpt / "model.safetensors"
    path.unlink()
    os.mkfifo(path)
    result = []

    def open_it():
        try:
            SafetensorsFile(path)
        except CheckpointError as exc:
            result.append(str(exc))

    t = threading.Thread(target=open_it, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # unblock the reader so the thread ends
        with open(path, "wb"):
            pass
    assert result and "model.safetensors: cannot read (not a regular file" in result[0], result


def test_a_tensor_in_two_shards_is_refused_with_an_index(pristine, tmp_path):
    d = shutil.copytree(pristine[1], tmp_path / "s")
    weight_map = json.loads((d / INDEX).read_text())["weight_map"]
    name = sorted(weight_map)[0]
    other = next(s for s in sorted(set(weight_map.values())) if s != weight_map[name])
    tensors = load_file(str(d / other))
    tensors[name] = load_file(str(d / weight_map[name]))[name]
    save_file(tensors, str(d / other))
    with pytest.raises(CheckpointError, match=rf"{name!r} appears in both .*the index places it in {weight_map[name]}"):
        checkpoint_files(d)


def _add_lm_head(d, change) -> None:
    path = d / "model.safetensors"
    tensors = load_file(str(path))
    tensors["lm_head.weight"] = change(tensors["model.embed_tokens.weight"].clone())
    save_file(tensors, str(path))


def test_a_tied_checkpoint_may_carry_a_copy_of_its_embedding(ckpt):
    _add_lm_head(ckpt, lambda e: e)
    assert "lm_head.weight" not in load_state_dict(CFG, ckpt, torch.float32)


def test_a_tied_checkpoint_with_another_lm_head_is_refused(ckpt):
    _add_lm_head(ckpt, lambda e: e * 2)
    with pytest.raises(CheckpointError, match=r"'lm_head.weight' in model.safetensors differs from 'model.embed_tok"):
        load_state_dict(CFG, ckpt, torch.float32)
    _add_lm_head(ckpt, lambda e: e[:-1])
    with pytest.raises(CheckpointError, match=r"'lm_head.weight' in model.safetensors has shape \[130, 40\]"):
        resolve_checkpoint(CFG, ckpt)  # from the headers alone


def test_fp16_overflow_is_not_called_corrupt_data(ckpt):
    path = ckpt / "model.safetensors"
    tensors = load_file(str(path))
    tensors[K] = tensors[K].clone()
    tensors[K][0, 0] = 1e6  # finite in fp32, inf in fp16
    save_file(tensors, str(path))
    assert load_state_dict(CFG, ckpt, torch.float32)["layers.0.self_attn.k_proj.weight"][0, 0] == 1e6
    with pytest.raises(CheckpointError, match=rf"{K!r} in model.safetensors holds values beyond float16's range"):
        load_state_dict(CFG, ckpt, torch.float16)
    tensors[K][0, 0] = float("inf")
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match="holds 1 NaN or infinite value"):
        load_state_dict(CFG, ckpt, torch.float16)


def test_pytorch_bin_weights_are_named(ckpt):
    (ckpt / "model.safetensors").rename(ckpt / "pytorch_model.bin")
    with pytest.raises(
        CheckpointError, match=r"holds PyTorch weights \(pytorch_model.bin\).*convert .* to safetensors"
    ):
        checkpoint_files(ckpt)


def test_info_checks_the_headers(ckpt, capsys):
    assert main(["info", "-m", str(ckpt)]) == 0
    assert "checkpoint   " in capsys.readouterr().out
    path = ckpt / "model.safetensors"
    for broken in (b"", path.read_bytes()[:-100], b"version https://git-lfs.github.com/spec/v1\noid sha256:0\n"):
        path.write_bytes(broken)
        with pytest.raises(SystemExit) as e:
            main(["info", "-m", str(ckpt)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith("nonstop: error: ") and "model.safetensors" in err, err
    assert main(["info", "-m", "llama-3.2-1b"]) == 0  # a preset has no files to check


def test_a_hub_name_is_told_that_nothing_is_downloaded():
    with pytest.raises(ConfigError, match=r"'meta-llama/Llama-3.2-1B' .*Hugging Face Hub are not supported"):
        resolve_model("meta-llama/Llama-3.2-1B")
    with pytest.raises(ConfigError, match=r"neither a checkpoint directory nor a known name; bundled"):
        resolve_model("no-such-model")


def test_config_json_a_symlink_loop_or_a_directory(ckpt):
    cfg = ckpt / "config.json"
    cfg.unlink()
    cfg.symlink_to(cfg)
    with pytest.raises(ConfigError, match=r"config.json: cannot read \(Too many levels of symbolic links\)"):
        resolve_model(ckpt)
    cfg.unlink()
    cfg.mkdir()
    with pytest.raises(ConfigError) as e:
        resolve_model(ckpt)
    assert str(e.value).count(str(cfg)) == 1 and "a directory" in str(e.value), e.value
    loop = ckpt.parent / "loop"
    loop.symlink_to(loop)
    with pytest.raises(ConfigError, match=r"loop: cannot read \(Too many levels of symbolic links\)"):
        resolve_model(loop)


def test_the_index_a_directory_is_named_once(pristine, tmp_path):
    d = shutil.copytree(pristine[1], tmp_path / "s")
    (d / INDEX).unlink()
    (d / INDEX).mkdir()
    with pytest.raises(CheckpointError) as e:
        checkpoint_files(d)
    assert str(e.value).count(INDEX) == 1 and "a directory" in str(e.value), e.value


def test_an_unreadable_checkpoint_is_a_config_error(ckpt, monkeypatch):
    """Without permission to read the directory (as root every file is readable: the denial is simulated)."""
    real = pathlib.Path.stat

    def stat(self, *args, **kwargs):
        if self.parent == ckpt:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "stat", stat)
    with pytest.raises(ConfigError, match=r"config.json: cannot read \(Permission denied\)"):
        resolve_model(ckpt)
    with pytest.raises(CheckpointError, match=r"cannot read \(Permission denied\)"):
        checkpoint_files(ckpt)


def _generation(d, **fields) -> None:
    path = d / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"eos_token_id": 99999}, r"'eos_token_id' is 99999, outside the vocabulary \(vocab_size 131\)"),
        ({"eos_token_id": [2, 131]}, "'eos_token_id' is 131, outside"),
        ({"bos_token_id": 131}, "'bos_token_id' is 131, outside"),
        ({"bos_token_id": "1"}, "'bos_token_id' must be a token id"),
        ({"do_sample": "yes"}, "'do_sample' must be true or false, got 'yes'"),
        ({"max_new_tokens": 10**9}, "'max_new_tokens' is 1000000000, which leaves no room for a prompt .* 512 tokens"),
        ({"max_new_tokens": 512}, "'max_new_tokens' is 512"),
    ],
)
def test_generation_config_checked_against_the_model(ckpt, fields, message):
    from nonstop.engine.generation_config import load_generation_config

    _generation(ckpt, **fields)
    with pytest.raises(CheckpointError, match="generation_config.json: field " + message):
        load_generation_config(ckpt)


def test_generation_config_that_fits(ckpt):
    from nonstop.engine.generation_config import load_generation_config

    _generation(ckpt, max_new_tokens=511, do_sample=True, bos_token_id=1, eos_token_id=[2, 130])
    assert load_generation_config(ckpt).defaults["max_tokens"] == 511
    loop = ckpt / "generation_config.json"
    loop.unlink()
    loop.symlink_to(loop)  # not taken for an absent file
    with pytest.raises(CheckpointError, match=r"generation_config.json: cannot read \(Too many levels"):
        load_generation_config(ckpt)
