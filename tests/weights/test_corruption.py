"""Checkpoint corruption: every error path of loading a checkpoint (config, index, safetensors headers
and data, tensors, tokenizer and generation files), on each family, ends ``nonstop generate`` with one
line that names the file (and the tensor or field) - exit status 2, no traceback, no hang."""

from __future__ import annotations

import json
import shutil
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from nonstop.cli import main
from nonstop.config import ModelConfig
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import DEEPSEEK, KIMI_K3_MXFP4, KIMI_LINEAR_RELEASE, LLAMA

FAMILIES = {"llama": LLAMA, "deepseek_v3": DEEPSEEK, "kimi_linear": KIMI_LINEAR_RELEASE, "kimi_k3": KIMI_K3_MXFP4}
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """family -> (single-file checkpoint, sharded checkpoint)."""
    root = tmp_path_factory.mktemp("pristine")
    out = {}
    for family, raw in FAMILIES.items():
        cfg = ModelConfig.from_hf_dict(raw)
        single = write_checkpoint(cfg, root / family / "single", seed=1, dtype=torch.float32)
        sharded = write_checkpoint(cfg, root / family / "sharded", seed=1, dtype=torch.float32, max_shard_bytes=30_000)
        assert (sharded / INDEX).exists()
        out[family] = (single, sharded)
    return out


def _header(path) -> dict:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n])


def _set_header(path, header: dict) -> None:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])


def _first_tensor(path) -> str:
    return sorted(k for k in _header(path) if k != "__metadata__")[0]


def _float_tensor(path) -> str:
    return next(
        k for k, e in sorted(_header(path).items()) if k != "__metadata__" and e["dtype"] == "F32" and "norm" in k
    )


def _matrix_tensor(path) -> str:
    """A 2-D float projection weight (every family has an attention output projection)."""
    return next(
        k
        for k, e in sorted(_header(path).items())
        if k.endswith("o_proj.weight") and e["dtype"] == "F32" and len(e["shape"]) == 2
    )


def _rewrite(path, change) -> None:
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


def _edit_json(path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _shard(d):
    return sorted(d.glob("model-*.safetensors"))[0]


# Each case: (uses the sharded checkpoint, corrupt(dir) -> substrings the error line must hold).
def c_config_missing(d):
    (d / "config.json").unlink()
    return ["config.json not found"]


def c_config_not_json(d):
    (d / "config.json").write_text("{ nope")
    return ["config.json", "not valid JSON"]


def c_config_not_object(d):
    (d / "config.json").write_text("[1, 2]")
    return ["config.json", "JSON object"]


def c_config_wrong_type(d):
    _edit_json(d / "config.json", lambda c: (c.get("text_config") or c).update(hidden_size="64"))
    return ["config.json", "hidden_size"]


def c_config_negative_context(d):
    _edit_json(d / "config.json", lambda c: (c.get("text_config") or c).update(max_position_embeddings=-5))
    return ["config.json", "max_position_embeddings"]


def c_config_absurd_layers(d):
    _edit_json(d / "config.json", lambda c: (c.get("text_config") or c).update(num_hidden_layers=10**12))
    return ["config.json", "num_hidden_layers"]


def c_index_not_json(d):
    (d / INDEX).write_text("{")
    return [INDEX, "not valid JSON"]


def c_index_weight_map_list(d):
    _edit_json(d / INDEX, lambda i: i.update(weight_map=list(i["weight_map"])))
    return [INDEX, "weight_map"]


def c_index_value_not_string(d):
    name = sorted(json.loads((d / INDEX).read_text())["weight_map"])[0]
    _edit_json(d / INDEX, lambda i: i["weight_map"].update({name: 7}))
    return [INDEX, name]


def c_index_value_escapes_dir(d):
    name = sorted(json.loads((d / INDEX).read_text())["weight_map"])[0]
    _edit_json(d / INDEX, lambda i: i["weight_map"].update({name: "../../etc/passwd"}))
    return [INDEX, name]


def c_index_empty(d):
    _edit_json(d / INDEX, lambda i: i.update(weight_map={}))
    return [INDEX, "no tensors"]


def c_shard_missing(d):
    shard = _shard(d)
    shard.unlink()
    return [INDEX, shard.name, "missing"]


def c_shard_lacks_listed_tensor(d):
    wm = json.loads((d / INDEX).read_text())["weight_map"]
    name = sorted(wm)[0]
    other = next(s for s in sorted(set(wm.values())) if s != wm[name])
    _edit_json(d / INDEX, lambda i: i["weight_map"].update({name: other}))
    return [name, other]


def c_tensor_in_two_shards(d):
    wm = json.loads((d / INDEX).read_text())["weight_map"]
    name = sorted(wm)[0]
    other = next(s for s in sorted(set(wm.values())) if s != wm[name])
    _rewrite(d / other, lambda t: t.update({name: load_file(str(d / wm[name]))[name]}))
    return [name, "appears in both", other, wm[name]]


def c_shard_is_a_directory(d):
    shard = _shard(d)
    shard.unlink()
    shard.mkdir()
    return [shard.name, "cannot read"]


def c_truncated_data(d):
    p = d / "model.safetensors"
    p.write_bytes(p.read_bytes()[:-100])
    return ["model.safetensors", "truncated"]


def c_no_header(d):
    (d / "model.safetensors").write_bytes(b"\x05\x00")
    return ["model.safetensors", "truncated or corrupt"]


def c_header_longer_than_file(d):
    p = d / "model.safetensors"
    p.write_bytes(struct.pack("<Q", 10**9) + p.read_bytes()[8:])
    return ["model.safetensors", "header of 1000000000 bytes"]


def c_header_not_json(d):
    p = d / "model.safetensors"
    data = bytearray(p.read_bytes())
    data[8:16] = b"@@@@@@@@"
    p.write_bytes(bytes(data))
    return ["model.safetensors", "header"]


def c_header_entry_garbage(d):
    p = d / "model.safetensors"
    h = _header(p)
    name = _first_tensor(p)
    h[name] = {"dtype": "F32", "shape": "big", "data_offsets": [0, 4]}
    _set_header(p, h)
    return ["model.safetensors", name]


def c_header_not_object(d):
    p = d / "model.safetensors"
    data = p.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    raw = b"[1, 2]".ljust(n)  # valid JSON of the same length, but a list
    p.write_bytes(data[:8] + raw + data[8 + n :])
    return ["model.safetensors", "header", "JSON object"]


def c_header_negative_shape(d):
    p = d / "model.safetensors"
    h = _header(p)
    name = _float_tensor(p)
    h[name]["shape"] = [-1, *h[name]["shape"][1:]] if len(h[name]["shape"]) > 1 else [-1]
    _set_header(p, h)
    return ["model.safetensors", name, "negative shape"]


def c_unknown_dtype(d):
    p = d / "model.safetensors"
    h = _header(p)
    name = _first_tensor(p)
    h[name]["dtype"] = "F8_E8M0"
    _set_header(p, h)
    return ["model.safetensors", name, "F8_E8M0"]


def c_offsets_do_not_fit_shape(d):
    p = d / "model.safetensors"
    h = _header(p)
    name = _float_tensor(p)
    h[name]["shape"] = [h[name]["shape"][0] + 1] + h[name]["shape"][1:]
    _set_header(p, h)
    return ["model.safetensors", name]


def c_header_length_short(d):
    """The header's padding dropped by a length 4 short: every tensor would be read 4 bytes early."""
    p = d / "model.safetensors"
    data = p.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    raw = json.dumps(_header(p)).encode() + b"    "
    p.write_bytes(struct.pack("<Q", len(raw) - 4) + raw + data[8 + n :])
    return ["model.safetensors", "corrupt safetensors file", "the tensors end at byte"]


def c_tensors_share_bytes(d):
    p = d / "model.safetensors"
    h = _header(p)
    a, b = sorted((e["data_offsets"], k) for k, e in h.items() if k != "__metadata__")[-2:]
    h[b[1]]["data_offsets"] = [a[0][0], a[0][0] + b[0][1] - b[0][0]]  # the last tensor aliases the one before
    _set_header(p, h)
    return ["model.safetensors", "corrupt safetensors file", b[1]]


def c_no_weights(d):
    (d / "model.safetensors").unlink()
    return [str(d), "no safetensors"]


def c_tensor_twice(d):
    name = _first_tensor(d / "model.safetensors")
    save_file({name: load_file(str(d / "model.safetensors"))[name]}, str(d / "extra.safetensors"))
    return [name, "extra.safetensors", "model.safetensors"]


def c_missing_tensor(d):
    name = _float_tensor(d / "model.safetensors")
    _rewrite(d / "model.safetensors", lambda t: t.pop(name))
    return [name, "model.safetensors", "missing"]


def c_unexpected_tensor(d):
    _rewrite(d / "model.safetensors", lambda t: t.update({"model.layers.0.surprise.weight": torch.zeros(3)}))
    return ["model.layers.0.surprise.weight", "model.safetensors"]


def c_wrong_shape(d):
    name = _float_tensor(d / "model.safetensors")
    _rewrite(d / "model.safetensors", lambda t: t.update({name: torch.ones(t[name].numel() + 1)}))
    return [name, "model.safetensors", "shape"]


def c_wrong_dtype(d):
    name = _float_tensor(d / "model.safetensors")
    _rewrite(d / "model.safetensors", lambda t: t.update({name: t[name].to(torch.int32)}))
    return [name, "model.safetensors", "dtype"]


def c_nan_in_weights(d):
    name = _float_tensor(d / "model.safetensors")

    def poison(t):
        t[name] = t[name].clone()
        t[name].view(-1)[0] = float("nan")

    _rewrite(d / "model.safetensors", poison)
    return [name, "model.safetensors", "NaN"]


def _to_fp8(d, scale: torch.Tensor | None) -> str:
    """Store a projection weight as fp8 with ``scale`` as its ``weight_scale_inv`` (None: no scale)."""
    name = _matrix_tensor(d / "model.safetensors")

    def quantise(t):
        t[name] = t[name].to(torch.float8_e4m3fn)
        if scale is not None:
            t[name[: -len(".weight")] + ".weight_scale_inv"] = scale

    _rewrite(d / "model.safetensors", quantise)
    return name


def c_fp8_without_scale(d):
    name = _to_fp8(d, None)
    return [name, "model.safetensors", "fp8", "weight_scale_inv", "missing"]


def c_fp8_scale_wrong_shape(d):
    name = _to_fp8(d, torch.ones(2, 3))
    return [name[: -len(".weight")] + ".weight_scale_inv", "model.safetensors", "shape [2, 3]", "expected [1, 1]"]


def c_fp8_scale_nan(d):
    name = _to_fp8(d, torch.full((1, 1), float("nan")))
    return [name[: -len(".weight")] + ".weight_scale_inv", "model.safetensors", "NaN"]


def c_generation_config_not_json(d):
    (d / "generation_config.json").write_text("{,}")
    return ["generation_config.json", "not valid JSON"]


def c_generation_config_bad_field(d):
    _edit_json(d / "generation_config.json", lambda g: g.update(temperature="hot"))
    return ["generation_config.json", "temperature"]


def c_generation_config_bad_eos(d):
    _edit_json(d / "generation_config.json", lambda g: g.update(eos_token_id="two"))
    return ["generation_config.json", "eos_token_id"]


def c_generation_config_eos_outside_vocab(d):
    _edit_json(d / "generation_config.json", lambda g: g.update(eos_token_id=10**6))
    return ["generation_config.json", "eos_token_id", "outside the vocabulary"]


def c_generation_config_max_new_tokens_past_context(d):
    _edit_json(d / "generation_config.json", lambda g: g.update(max_new_tokens=10**9))
    return ["generation_config.json", "max_new_tokens", "context"]


def c_tokenizer_config_not_json(d):
    (d / "tokenizer_config.json").write_text("nope")
    return ["tokenizer_config.json", "not valid JSON"]


def c_tokenizer_json_corrupt(d):
    (d / "tokenizer.json").write_text('{"model": 3}')
    return ["tokenizer.json", "cannot load"]


def c_tiktoken_model_corrupt(d):
    (d / "tokenizer.json").unlink(missing_ok=True)
    (d / "tiktoken.model").write_text("YQ== 0\nnot-base64! 1\n")
    return ["tiktoken.model", "line 2"]


def c_chat_template_not_utf8(d):
    (d / "chat_template.jinja").write_bytes(b"\xff\xfe{{ messages }}")
    return ["chat_template.jinja", "cannot read"]


SINGLE = [
    c_config_missing,
    c_config_not_json,
    c_config_not_object,
    c_config_wrong_type,
    c_config_negative_context,
    c_config_absurd_layers,
    c_truncated_data,
    c_no_header,
    c_header_longer_than_file,
    c_header_not_json,
    c_header_not_object,
    c_header_entry_garbage,
    c_header_negative_shape,
    c_unknown_dtype,
    c_offsets_do_not_fit_shape,
    c_header_length_short,
    c_tensors_share_bytes,
    c_no_weights,
    c_tensor_twice,
    c_missing_tensor,
    c_unexpected_tensor,
    c_wrong_shape,
    c_wrong_dtype,
    c_nan_in_weights,
    c_fp8_without_scale,
    c_fp8_scale_wrong_shape,
    c_fp8_scale_nan,
    c_generation_config_not_json,
    c_generation_config_bad_field,
    c_generation_config_bad_eos,
    c_generation_config_eos_outside_vocab,
    c_generation_config_max_new_tokens_past_context,
    c_tokenizer_config_not_json,
    c_tokenizer_json_corrupt,
    c_tiktoken_model_corrupt,
    c_chat_template_not_utf8,
]
SHARDED = [
    c_index_not_json,
    c_index_weight_map_list,
    c_index_value_not_string,
    c_index_value_escapes_dir,
    c_index_empty,
    c_shard_missing,
    c_shard_lacks_listed_tensor,
    c_tensor_in_two_shards,
    c_shard_is_a_directory,
]
CASES = [(c, False) for c in SINGLE] + [(c, True) for c in SHARDED]


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("case, sharded", CASES, ids=[c.__name__[2:] for c, _ in CASES])
def test_corruption_is_one_clear_line(family, case, sharded, pristine, tmp_path, capsys):
    d = tmp_path / "ckpt"
    shutil.copytree(pristine[family][sharded], d)
    if not (d / "tokenizer_config.json").exists():
        (d / "tokenizer_config.json").write_text("{}")
    expected = case(d)
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", str(d), "--prompt-ids", "1,2", "-n", "1", "--no-preflight"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("nonstop: error:")]
    assert e.value.code == 2 and len(errors) == 1 and "Traceback" not in err, err
    for part in expected:
        assert part in errors[0], (part, errors[0])


def test_the_pristine_checkpoints_load(pristine, capsys):
    """The corruptions above are what fails: each untouched checkpoint generates."""
    for single, sharded in pristine.values():
        for d in (single, sharded):
            assert main(["generate", "--model", str(d), "--prompt-ids", "1,2", "-n", "1", "--no-preflight"]) == 0
    capsys.readouterr()
