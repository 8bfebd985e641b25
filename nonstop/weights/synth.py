"""Random-weight checkpoints in the exact HF layout of a config, at any scale.

``write_checkpoint`` streams tensors shard by shard, names and shapes from ``checkpoint_layout``, so
the result loads in nonstop and - for llama, deepseek_v3 and kimi_linear - in transformers'
``from_pretrained``. Its memory stays at one shard (``max_shard_bytes``, or a larger tensor, which gets a
shard of its own) plus at most ``2 * DRAW_CHUNK`` float32 values (128 MiB) while a tensor is drawn.
``random_state_dict`` gives the same weights in memory without touching the disk.

The tokenizer is the preset's (its files copied), else a byte-level one (token id = byte value) when the
vocabulary holds the 256 bytes, else none: a model with a smaller vocabulary is a tokenizer-less
checkpoint, driven with token ids. Over an old checkpoint, every file synth owns (``weights.write.SIDE_FILES``) that
the new one lacks is removed, so no stale tokenizer outlives its model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from nonstop.config import ModelConfig
from nonstop.weights.layout import TensorSpec, checkpoint_layout
from nonstop.weights.write import SIDE_FILES, staged_checkpoint, write_side_files

INIT_STD = 0.02
BYTE_VOCAB = 256  # a byte-level tokenizer needs one id per byte
DRAW_CHUNK = 1 << 24  # float32 values drawn at a time into a large CPU tensor (64 MiB); a multiple of 16


def _normal(shape: tuple[int, ...], std: float, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """``(torch.randn(shape, generator=gen) * std).to(dtype)``, the same values and ``gen`` left in the same
    state, without its full-size float32 temporaries: a CPU tensor of at least ``2 * DRAW_CHUNK`` values is
    drawn ``DRAW_CHUNK`` at a time into the result (CPU randn turns its uniform draws into normals 16 at a
    time, the last 16 redrawn when the count is not a multiple of 16: chunks of a multiple of 16, the last
    one at least 16 long, draw what one call draws). Another device's generator draws the tensor at once."""
    numel = math.prod(shape)
    if gen.device.type != "cpu" or numel < 2 * DRAW_CHUNK:
        return torch.randn(shape, generator=gen, device=gen.device).mul_(std).to(dtype)
    out = torch.empty(shape, dtype=dtype)
    flat, start = out.view(-1), 0
    while start < numel:
        stop = numel if numel - start < 2 * DRAW_CHUNK else start + DRAW_CHUNK
        flat[start:stop] = torch.randn(stop - start, generator=gen).mul_(std)
        start = stop
    return out


def _random(spec: TensorSpec, shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """One tensor of ``spec``'s init kind, drawn with ``gen`` on ``gen``'s device."""
    init, dev = spec.init, gen.device
    if init == "ones":
        return torch.ones(shape, dtype=dtype, device=dev)
    if init == "zeros":
        return torch.zeros(shape, dtype=dtype, device=dev)
    if init == "bias":  # small, so that it changes the expert choice now and then but not always
        return _normal(shape, 0.01, torch.float32, gen)
    if init == "A_log":  # per-head decay rates exp(A) in [1, 16] (FLA's initialisation)
        return torch.empty(shape, device=dev).uniform_(1.0, 16.0, generator=gen).log()
    if init == "dt_bias":  # softplus⁻¹ of dt in [1e-3, 1e-1], log-uniform
        dt = torch.empty(shape, device=dev).uniform_(math.log(1e-3), math.log(1e-1), generator=gen).exp()
        return dt + torch.log(-torch.expm1(-dt))
    if init == "mxfp4_packed":  # random E2M1 codes
        return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8, device=dev)
    if init == "mxfp4_scale":  # 2^-9 .. 2^-5: weights of a few hundredths, like INIT_STD
        return torch.randint(118, 123, shape, generator=gen, dtype=torch.uint8, device=dev)
    return _normal(shape, INIT_STD, dtype, gen)


def iter_random_tensors(
    cfg: ModelConfig, dtype: torch.dtype, seed: int, draw_on="cpu"
) -> Iterator[tuple[TensorSpec, str, torch.Tensor]]:
    """(spec, HF name, tensor) for every on-disk tensor of ``cfg``, reproducibly for ``seed``, drawn on the
    device ``draw_on`` (another device's generator gives other values with the same distributions)."""
    gen = torch.Generator(device=draw_on).manual_seed(seed)
    for spec in checkpoint_layout(cfg):
        for name in spec.names:
            yield spec, name, _random(spec, spec.hf_shape, spec.torch_dtype(dtype), gen).to(spec.torch_dtype(dtype))


def random_state_dict(
    cfg: ModelConfig, dtype: torch.dtype = torch.float32, device="cpu", seed: int = 0, draw_on_device: bool = False
) -> dict[str, torch.Tensor]:
    """{internal param: tensor} with exactly the weights ``write_checkpoint(cfg, seed=seed)`` writes; with
    ``draw_on_device`` drawn on ``device`` instead (no host copy of tens of GB; other values, the same
    distributions)."""
    parts: dict[str, list[torch.Tensor]] = {}
    specs: dict[str, TensorSpec] = {}
    for spec, _, t in iter_random_tensors(cfg, dtype, seed, device if draw_on_device else "cpu"):
        parts.setdefault(spec.param, []).append(t)
        specs[spec.param] = spec
    state = {}
    for param, ts in parts.items():
        spec = specs[param]
        t = torch.stack(ts) if len(spec.names) > 1 else ts[0].reshape(spec.shape)
        state[param] = t.to(device)
    return state


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE: printable Latin-1
    bytes map to themselves, the others to code points 256, 257, ... in byte order."""
    printable = (
        set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), ord("ÿ") + 1))
    )
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def write_byte_tokenizer(out_dir: Path) -> None:
    """A byte-level tokenizer.json with token id = byte value (no merges), for random checkpoints."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(out_dir / "tokenizer.json"))


def write_checkpoint(
    cfg: ModelConfig,
    out_dir: str | Path,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_bytes: int = 4 << 30,
    tokenizer_dir: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
    removed: list[str] | None = None,
) -> Path:
    """Write config.json, generation_config.json, a tokenizer (when one can be made) and random
    weights (``model.safetensors``, or shards + ``model.safetensors.index.json``) to ``out_dir``, staged
    (``weights.write``): they replace a checkpoint already there only once all are written, and the old
    checkpoint's weight files and files of ``SIDE_FILES`` that the new one has not are removed (their names
    appended to ``removed``)."""

    out_dir = Path(out_dir)
    with staged_checkpoint(out_dir, replaces=SIDE_FILES, removed=removed) as stage:
        write_side_files(stage, cfg, dtype, {}, tokenizer_dir)
        if tokenizer_dir is None and cfg.vocab_size >= BYTE_VOCAB:
            write_byte_tokenizer(stage)
        _write_random_weights(cfg, stage, seed, dtype, max_shard_bytes, progress)
    return out_dir


def _tensor_bytes(cfg: ModelConfig, dtype: torch.dtype) -> Iterator[int]:
    """The size in bytes of each tensor ``iter_random_tensors(cfg, dtype, ...)`` yields, in its order."""
    for spec in checkpoint_layout(cfg):
        nbytes = math.prod(spec.hf_shape) * spec.torch_dtype(dtype).itemsize
        yield from (nbytes for _ in spec.names)


def _write_random_weights(
    cfg: ModelConfig,
    out_dir: Path,
    seed: int,
    dtype: torch.dtype,
    max_shard_bytes: int,
    progress: Callable[[int, int], None] | None,
) -> None:
    """``model.safetensors``, or shards of at most ``max_shard_bytes`` + ``model.safetensors.index.json``."""
    from safetensors.torch import save_file

    total = sum(len(s.names) for s in checkpoint_layout(cfg))
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    temp_names = []
    weight_map: dict[str, str] = {}
    total_bytes = 0

    def flush() -> None:
        nonlocal size
        if not shards[-1]:
            return
        name = f"shard-{len(temp_names):05d}.tmp.safetensors"
        save_file(shards[-1], str(out_dir / name), metadata={"format": "pt"})
        temp_names.append((name, list(shards[-1])))
        shards[-1] = {}
        size = 0

    tensors = iter_random_tensors(cfg, dtype, seed)
    for i, nbytes in enumerate(_tensor_bytes(cfg, dtype)):
        if size and size + nbytes > max_shard_bytes:
            flush()  # before the next tensor is drawn: memory holds one shard at a time
        _, name, t = next(tensors)
        shards[-1][name] = t.contiguous()
        size += nbytes
        total_bytes += nbytes
        if progress is not None:
            progress(i + 1, total)
    flush()
    if len(temp_names) == 1:
        (out_dir / temp_names[0][0]).rename(out_dir / "model.safetensors")
        return
    n = len(temp_names)
    for k, (tmp, names) in enumerate(temp_names):
        final = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        (out_dir / tmp).rename(out_dir / final)
        weight_map.update({nm: final for nm in names})
    index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
