"""What ``nonstop synth`` / ``write_checkpoint`` put on disk, checked from the files alone: a shard may hold
exactly ``max_shard_bytes``; the index lists every tensor exactly once, in 1-based HF shard names, with the
bytes really written as total_size (fp32 tensors of a bf16 checkpoint included); --shard-size counts GB of
10^9 bytes; the side files (config.json's torch_dtype, generation_config.json's ids), a 256-id vocabulary's
byte tokenizer, a preset's own tokenizer, and progress on a terminal every 5%."""

from __future__ import annotations

import io
import json
import math
import re

import torch
from safetensors import safe_open

from nonstop.cli import main
from nonstop.commands.synth import progress_printer
from nonstop.config import ModelConfig
from nonstop.weights.resolve import ASSETS
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import KIMI_LINEAR_RELEASE, LLAMA

ITEMSIZE = {"F32": 4, "BF16": 2, "F16": 2, "U8": 1}


def _on_disk(out) -> dict[str, tuple[str, int]]:
    """{tensor name: (file, bytes)} read from every .safetensors file in ``out``; a name twice is an error."""
    found = {}
    for path in sorted(out.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            assert f.metadata() == {"format": "pt"}, path  # transformers refuses files without it
            for name in f.keys():
                part = f.get_slice(name)
                assert name not in found, f"{name} in {found.get(name)} and {path.name}"
                found[name] = (path.name, math.prod(part.get_shape()) * ITEMSIZE[part.get_dtype()])
    return found


def test_a_shard_may_hold_exactly_max_shard_bytes(tmp_path):
    cfg = ModelConfig.from_hf_dict(LLAMA)
    one = write_checkpoint(cfg, tmp_path / "one", dtype=torch.float32)
    total = sum(n for _, n in _on_disk(one).values())
    exact = write_checkpoint(cfg, tmp_path / "exact", dtype=torch.float32, max_shard_bytes=total)
    assert sorted(p.name for p in exact.glob("*.safetensors")) == ["model.safetensors"]
    assert not (exact / "model.safetensors.index.json").exists()
    under = write_checkpoint(cfg, tmp_path / "under", dtype=torch.float32, max_shard_bytes=total - 1)
    assert (under / "model.safetensors.index.json").exists()


def test_the_index_lists_every_tensor_once_with_the_bytes_written(tmp_path):
    """A bf16 kimi_linear checkpoint keeps its KDA A_log / dt_bias in fp32: total_size is what the files hold."""
    cfg = ModelConfig.from_hf_dict(KIMI_LINEAR_RELEASE)
    out = write_checkpoint(cfg, tmp_path / "m", dtype=torch.bfloat16, max_shard_bytes=20_000)
    disk = _on_disk(out)
    assert any(n % 4 == 0 and "A_log" in name for name, (_, n) in disk.items())  # the premise: fp32 tensors
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {name: file for name, (file, _) in disk.items()}
    assert index["metadata"]["total_size"] == sum(n for _, n in disk.values())
    files = sorted({file for file, _ in disk.values()})
    assert files == [f"model-{k:05d}-of-{len(files):05d}.safetensors" for k in range(1, len(files) + 1)]
    for file in files:  # at most max_shard_bytes, unless one tensor alone is larger
        sizes = [n for f, n in disk.values() if f == file]
        assert sum(sizes) <= 20_000 or len(sizes) == 1, (file, sizes)


def test_shard_size_is_in_gb_of_a_billion_bytes(tmp_path, capsys):
    """A --shard-size one byte short of the whole model (in 10^9-byte GB) splits it; read as GiB (7% more) it
    would not."""
    argv = ["synth", "--preset", "k3-nano", "--num-layers", "1", "--dtype", "fp32", "--no-preflight"]
    assert main([*argv, "--out", str(tmp_path / "one")]) == 0
    total = sum(n for _, n in _on_disk(tmp_path / "one").values())
    assert main([*argv, "--out", str(tmp_path / "s"), "--shard-size", repr((total - 1) / 1e9)]) == 0
    assert (tmp_path / "s" / "model.safetensors.index.json").exists()
    assert not (tmp_path / "s" / "model.safetensors").exists()
    # a size no int holds in bytes (1e300 GB) is one shard, not an OverflowError
    assert main([*argv, "--out", str(tmp_path / "huge"), "--shard-size", "1e300"]) == 0
    assert sorted(p.name for p in (tmp_path / "huge").glob("model*")) == ["model.safetensors"]


def test_side_files_name_the_dtype_and_the_ids(tmp_path):
    """LLAMA's tiny config: bos 1, eos 2 (one id: written as a number, as HF writes it), no pad."""
    cfg = ModelConfig.from_hf_dict(LLAMA)
    out = write_checkpoint(cfg, tmp_path / "m", dtype=torch.bfloat16)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen == {k: LLAMA[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if LLAMA.get(k) is not None}
    assert isinstance(gen["eos_token_id"], int)


def test_a_vocabulary_of_exactly_256_ids_gets_the_byte_tokenizer(tmp_path):
    from tokenizers import Tokenizer

    out = write_checkpoint(ModelConfig.from_hf_dict({**LLAMA, "vocab_size": 256}), tmp_path / "m")
    assert Tokenizer.from_file(str(out / "tokenizer.json")).encode("é!").ids == [0xC3, 0xA9, 0x21]


def test_a_preset_keeps_its_own_tokenizer(tmp_path, capsys):
    out = tmp_path / "nano"
    assert main(["synth", "--preset", "k3-nano", "--num-layers", "1", "--out", str(out), "--no-preflight"]) == 0
    assert (out / "tokenizer.json").read_bytes() == (ASSETS / "k3-nano" / "tokenizer.json").read_bytes()


def test_synth_counts_one_layer_in_the_singular(tmp_path, capsys):
    """The progress line said "1 layers"."""
    argv = ["synth", "--preset", "k3-nano", "--dtype", "fp32", "--no-preflight"]
    assert main([*argv, "--num-layers", "1", "--out", str(tmp_path / "a")]) == 0
    assert "1 layer) to" in capsys.readouterr().err
    assert main([*argv, "--num-layers", "2", "--out", str(tmp_path / "b")]) == 0
    assert "2 layers) to" in capsys.readouterr().err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_is_redrawn_every_5_percent():
    stream = _Terminal()
    report = progress_printer(stream)
    for done in range(1, 41):
        report(done, 40)
    draws = [d for d in stream.getvalue().split("\r") if d]
    assert draws == [f"  {d}/40 tensors" for d in range(2, 40, 2)] + ["  40/40 tensors\n"]
    assert re.fullmatch(r"(\r  \d+/40 tensors)+\n", stream.getvalue())


def test_an_old_index_naming_files_outside_the_directory_removes_none_of_them(tmp_path):
    """A stale or hand-edited index may name "../x": only files inside the output directory are the old
    checkpoint's."""
    out = tmp_path / "m"
    out.mkdir()
    victim = tmp_path / "victim.safetensors"
    victim.write_bytes(b"mine")
    weight_map = {"a": "../victim.safetensors", "b": str(victim)}
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    write_checkpoint(ModelConfig.from_hf_dict(LLAMA), out, dtype=torch.float32)
    assert victim.read_bytes() == b"mine"
    assert (out / "model.safetensors").exists() and not (out / "model.safetensors.index.json").exists()


def test_an_fp8_config_is_written_without_its_quantization_config(tmp_path):
    """The weights are written as plain floats: an fp8 quantization_config would announce scales that are not
    there. MXFP4 experts are written packed, so theirs stays."""
    from tests.tiny_configs import DEEPSEEK, KIMI_K3_MXFP4

    fp8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    out = write_checkpoint(ModelConfig.from_hf_dict({**DEEPSEEK, "quantization_config": fp8}), tmp_path / "a")
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    out = write_checkpoint(ModelConfig.from_hf_dict(KIMI_K3_MXFP4), tmp_path / "b", dtype=torch.float32)
    written = json.loads((out / "config.json").read_text())
    assert "quantization_config" in {**written, **written.get("text_config", {})}
