"""Gaps found by a mutation audit of ``nonstop.weights`` (safetensors reader, loader, layout, slice reader).
Files are written byte by byte from the safetensors format (8-byte little-endian header length, JSON header,
data; offsets relative to the data); expected values come from that definition, from hand arithmetic or from
transformers' own configs."""

from __future__ import annotations

import copy
import json
import os
import struct

import pytest
import torch

from nonstop.weights.errors import CheckpointError
from nonstop.weights.safetensors_file import SafetensorsFile, unreadable
from nonstop.weights.slices import SliceReader


def _file(path, header, data: bytes = b""):
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)
    return path


def _entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


# ----------------------------------------------------------------------------- safetensors dtypes


@pytest.mark.parametrize(
    "dtype,data,torch_dtype,want",
    [
        ("F64", struct.pack("<2d", 1.0 / 3.0, -2.5), torch.float64, [1.0 / 3.0, -2.5]),
        ("BOOL", bytes([1, 0]), torch.bool, [True, False]),
        ("I16", struct.pack("<2h", -2, 300), torch.int16, [-2, 300]),
        ("I64", struct.pack("<2q", -(1 << 40), 7), torch.int64, [-(1 << 40), 7]),
    ],
)
def test_a_dtype_string_gives_its_torch_dtype_and_exact_values(tmp_path, dtype, data, torch_dtype, want):
    """Catches a wrong entry in the dtype table that the values alone hide: BOOL read as uint8 (``[1, 0] ==
    [True, False]`` in Python), F64 mapped to float32 (a valid 16-byte [2] tensor refused as corrupt, or its
    values rounded)."""
    f = SafetensorsFile(_file(tmp_path / "x.safetensors", {"w": _entry(dtype, [2], 0, len(data))}, data))
    assert f.meta("w") == (torch_dtype, (2,))
    got = f.tensor("w")
    assert got.dtype == torch_dtype
    assert got.tolist() == want


# ----------------------------------------------------------------------------- files that are not files


def test_a_pipe_or_a_device_is_not_a_regular_file(tmp_path):
    """Catches ``unreadable`` accepting any non-directory: opening a pipe would block the read forever, and a
    device would be read as a checkpoint."""
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    assert unreadable(fifo) == "not a regular file: a pipe, socket or device"
    assert unreadable("/dev/null") == "not a regular file: a pipe, socket or device"
    with pytest.raises(CheckpointError, match=r"model\.safetensors: cannot read \(not a regular file"):
        SafetensorsFile(fifo)


def test_a_broken_symlink_is_named_as_one(tmp_path):
    """Catches ``unreadable`` treating a dangling link as an absent file (the user is then told "No such file"
    about a path that ``ls`` shows)."""
    link = tmp_path / "model.safetensors"
    link.symlink_to(tmp_path / "gone.safetensors")
    assert unreadable(link) == "a broken symbolic link"
    assert unreadable(tmp_path / "absent.safetensors") is None
    with pytest.raises(CheckpointError, match=r"cannot read \(a broken symbolic link\)"):
        SafetensorsFile(link)


# ----------------------------------------------------------------------------- slice reader


@pytest.mark.parametrize(
    "dim,start,stop,want",
    [(None, 0, None, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]), (1, 1, 3, [[1, 2], [5, 6], [9, 10]])],
)
def test_short_positioned_reads_are_continued_not_called_truncation(tmp_path, monkeypatch, dim, start, stop, want):
    """Linux ``pread`` / ``preadv`` return at most 0x7ffff000 bytes per call, so a tensor over 2 GiB read in one
    run (K3's embedding, 163840 x 7168 bf16 = 2.35 GB, on a tp=1 rank) came back short and ``SliceReader``
    called the valid file "truncated". Simulated with reads that return at most 5 bytes per call: the reader
    must go on until it has every byte (whole tensor and a column slice of 3 runs), counting each once."""
    data = struct.pack("<12i", *range(12))
    f = SafetensorsFile(_file(tmp_path / "c.safetensors", {"t": _entry("I32", [3, 4], 0, 48)}, data))
    real_pread, real_preadv = os.pread, os.preadv
    monkeypatch.setattr(os, "pread", lambda fd, n, off: real_pread(fd, min(n, 5), off))
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: real_preadv(fd, [memoryview(bufs[0])[:5]], off))
    r = SliceReader()
    try:
        got = r.read(f, "t", dim=dim, start=start, stop=stop)
    finally:
        r.close()
    assert got.tolist() == want
    assert r.bytes_read == 4 * sum(len(row) for row in want)


def test_a_file_that_really_ends_early_is_still_called_truncated(tmp_path):
    """Continuing short reads must stop at the end of the file: a header promising 48 bytes over 20 on disk is
    a CheckpointError naming the truncation (not a loop, not a tensor of junk)."""
    header = {"t": _entry("I32", [3, 4], 0, 48)}
    path = _file(tmp_path / "c.safetensors", header, struct.pack("<12i", *range(12)))
    f = SafetensorsFile(path)  # opened whole, then cut short under the reader
    os.truncate(path, path.stat().st_size - 28)
    r = SliceReader()
    try:
        with pytest.raises(CheckpointError, match=r"truncated file \(wanted 48 bytes at offset \d+, got 20\)"):
            r.read(f, "t")
    finally:
        r.close()


# ----------------------------------------------------------------------------- layout


def test_the_latent_moe_norm_is_in_the_layout_only_when_the_config_turns_it_on():
    """Catches ``routed_expert_norm`` required regardless of ``latent_moe_use_norm``: a latent-MoE checkpoint
    without the norm would be refused as missing a tensor it never had (and synth would write one)."""
    from nonstop.config import ModelConfig
    from nonstop.weights.layout import checkpoint_layout
    from tests.tiny_configs import KIMI_K3

    def norms(raw):
        cfg = ModelConfig.from_hf_dict(raw)
        return cfg, {s.names[0]: s.hf_shape for s in checkpoint_layout(cfg) if "routed_expert_norm" in s.param}

    on_cfg, on = norms(KIMI_K3)
    text = KIMI_K3["text_config"]
    moe_layers = [i for i in range(text["num_hidden_layers"]) if i >= text["first_k_dense_replace"]]
    assert on == {
        f"{on_cfg.weight_prefix}layers.{i}.block_sparse_moe.routed_expert_norm.weight": (
            text["routed_expert_hidden_size"],
        )
        for i in moe_layers
    }
    off = copy.deepcopy(KIMI_K3)
    off["text_config"]["latent_moe_use_norm"] = False
    off_cfg, none = norms(off)
    assert none == {}
    names = [n for s in checkpoint_layout(off_cfg) for n in s.names]
    assert any(n.endswith("block_sparse_moe.routed_expert_down_proj.weight") for n in names)


def test_random_checkpoints_start_linear_biases_at_zero():
    """Catches linear biases drawn like weights (``init`` normal instead of zeros): a synth checkpoint of a
    biased Llama (``attention_bias`` / ``mlp_bias``) must carry zero biases, as transformers initialises them."""
    from nonstop.config import ModelConfig
    from nonstop.weights.synth import random_state_dict
    from tests.tiny_configs import LLAMA

    raw = {**LLAMA, "attention_bias": True, "mlp_bias": True}
    state = random_state_dict(ModelConfig.from_hf_dict(raw), seed=3)
    biases = {k: v for k, v in state.items() if k.endswith(".bias")}
    per_layer = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert len(biases) == LLAMA["num_hidden_layers"] * len(per_layer)
    assert all(bool(v.eq(0).all()) for v in biases.values())
    assert state["layers.0.self_attn.q_proj.weight"].std() > 0.01  # the weights themselves are drawn


def test_a_0d_tensor_cannot_be_sliced_along_a_dimension(tmp_path):
    """Catches the 0-d guard dropped: ``dim=0`` of a scalar must be refused, not answered with the element."""
    f = SafetensorsFile(_file(tmp_path / "s.safetensors", {"s": _entry("I32", [], 0, 4)}, struct.pack("<i", 9)))
    r = SliceReader()
    try:
        assert r.read(f, "s").tolist() == 9
        with pytest.raises(ValueError, match="a 0-d tensor has no dim 0 to slice"):
            r.read(f, "s", dim=0, start=0, stop=1)
    finally:
        r.close()


# ----------------------------------------------------------------------------- loader checks


def test_an_e5m2_weight_overflowed_by_its_scale_names_the_scale():
    """E5M2's largest value is 57344: 57344 x 1e34 = 5.7e38 overflows float32 (3.4e38), while 448 (E4M3's
    largest) x 1e34 would not. Catches the overflow bound computed with E4M3's maximum for every fp8 format
    (the error then blames the weight's data, not the corrupt scale)."""
    from pathlib import Path
    from types import SimpleNamespace

    from nonstop.weights.loader import check_fp8_dequantized

    w = torch.full((2, 2), 57344.0).to(torch.float8_e5m2)
    assert w.float().max().item() == 57344.0
    scale = torch.tensor([[1e34]])
    out = w.float() * scale
    assert torch.isinf(out).all()
    located = {"m.weight_scale_inv": SimpleNamespace(path=Path("/x/m.safetensors"))}
    with pytest.raises(CheckpointError, match=r"'m.weight_scale_inv' in m.safetensors holds scales up to 1e\+34"):
        check_fp8_dequantized("m.weight", w, "m.weight_scale_inv", scale, out, located)


def test_tied_head_values_are_compared_past_the_first_4096_rows():
    """The tied-head check compares 4096 rows at a time; catches the loop stopping after the first chunk (a
    vocabulary-sized LM head differing only in its last rows would be silently dropped)."""
    from nonstop.weights.loader import _same_values

    a = torch.arange(4100 * 2, dtype=torch.float32).reshape(4100, 2)
    b = a.clone()
    assert _same_values(a, b)
    b[4099, 1] += 1
    assert not _same_values(a, b)
    assert not _same_values(a, b[:4099])


# ----------------------------------------------------------------------------- staged writes


def test_a_failed_write_keeps_an_empty_output_directory_the_user_made(tmp_path):
    """Catches the failure cleanup removing ``out_dir`` whenever it is empty: only a directory the write itself
    created may go; one the user made beforehand stays (and a new one the write made is removed)."""
    from nonstop.weights.write import staged_checkpoint

    mine = tmp_path / "mine"
    mine.mkdir()
    with pytest.raises(RuntimeError, match="boom"), staged_checkpoint(mine) as stage:
        (stage / "model.safetensors").write_bytes(b"x")
        raise RuntimeError("boom")
    assert mine.is_dir() and list(mine.iterdir()) == []
    fresh = tmp_path / "fresh"
    with pytest.raises(RuntimeError, match="boom"), staged_checkpoint(fresh):
        raise RuntimeError("boom")
    assert not fresh.exists()


def test_zero_padding_is_recognised_only_along_a_single_long_dimension(tmp_path):
    """A zero-padded vector (K3's A_log) may be stored longer in a shape with ONE dimension above 1; catches a
    two-dimensional [8, 2] tensor (zeros past its first 4 values) taken as padding of a 4-vector instead of
    refused as the wrong shape."""
    from nonstop.weights.layout import TensorSpec
    from nonstop.weights.loader import _zero_padded

    spec = TensorSpec("layers.0.self_attn.A_log", (4,), ("a",), (4,), kind="fp32", zero_padded=True)
    vals = [1.0, 2.0, 3.0, 4.0] + [0.0] * 12
    data = struct.pack("<16f", *vals)
    flat = SafetensorsFile(_file(tmp_path / "flat.safetensors", {"a": _entry("F32", [1, 16, 1], 0, 64)}, data))
    assert _zero_padded("a", spec, flat, (1, 16, 1))
    two = SafetensorsFile(_file(tmp_path / "two.safetensors", {"a": _entry("F32", [8, 2], 0, 64)}, data))
    assert not _zero_padded("a", spec, two, (8, 2))


def test_random_mxfp4_scales_give_weights_of_a_few_hundredths():
    """Synth's MXFP4 scale bytes are 118..122 (2^-9 .. 2^-5, so |w| <= 6 * 2^-5 < 0.19); catches them drawn
    over the whole accepted range (weights up to 6 * 2^113: a random model that overflows at once)."""
    from nonstop.config import ModelConfig
    from nonstop.weights import mxfp4
    from nonstop.weights.synth import random_state_dict
    from tests.tiny_configs import KIMI_K3_MXFP4

    state = random_state_dict(ModelConfig.from_hf_dict(KIMI_K3_MXFP4), seed=1)
    scales = torch.cat([v.reshape(-1) for k, v in state.items() if k.endswith("_scale")])
    assert scales.dtype == torch.uint8 and scales.numel() > 0
    assert int(scales.min()) >= 118 and int(scales.max()) <= 122
    packed = next(v for k, v in state.items() if k.endswith("w1_packed"))
    scale = next(v for k, v in state.items() if k.endswith("w1_scale"))
    w = mxfp4.dequantize(packed, scale, packed.shape[-1] * 2)
    assert float(w.abs().max()) <= 6 * 2.0**-5
