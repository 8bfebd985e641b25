"""Sharded loading: a rank reads only its part of every tensor (by HF name and slice) - its heads, its
part of the dense and shared weights, its vocabulary rows, its experts (MXFP4 included) - with
positioned reads of exactly those bytes (``weights/slices.py``), never the whole checkpoint.

fp8 block-scaled weights (DeepSeek-V3 / Kimi K2) are read as the fp8 part plus the scale blocks that
cover it, and dequantised: w = w_fp8 · scale_inv[i // block0, j // block1].
"""

from __future__ import annotations

from pathlib import Path

import torch

from nonstop.config import ModelConfig
from nonstop.dist.layout import Layout
from nonstop.dist.shard import ParamShard, rank_shards
from nonstop.weights.loader import (
    FP8,
    _fp8_scale_name,
    check_cast,
    check_fp8_dequantized,
    check_mxfp4_scale,
    check_tensor,
    check_tied_head,
    is_mxfp4_scale,
    resolve_checkpoint,
)
from nonstop.weights.slices import SliceReader


def take_shard(full: torch.Tensor, shard: ParamShard) -> torch.Tensor:
    """A rank's part of a whole parameter tensor (random weights, tests): the same cut the loader reads."""
    if shard.experts is not None:
        return full[list(shard.experts)] if shard.experts else full[:0]
    if shard.dim is None:
        return full
    part = full.narrow(shard.dim, shard.start, shard.stop - shard.start)
    return _pad(part, shard)


def _pad(part: torch.Tensor, shard: ParamShard) -> torch.Tensor:
    if not shard.pad:
        return part
    zeros = part.new_zeros(*part.shape[: shard.dim], shard.pad, *part.shape[shard.dim + 1 :])
    return torch.cat([part, zeros], dim=shard.dim)


def _fp8_part(
    w: torch.Tensor, scale_reader, dim: int | None, start: int, block: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantise the fp8 part w [n, k] (rows or columns [start, start + size) of dim ``dim`` of the full
    matrix) with the scale blocks covering it: ``scale_reader(dim, lo, hi)`` reads scale blocks [lo, hi).
    Returns (the dequantised part, the scale blocks read)."""
    n, k = w.shape
    if dim is None:
        dim, start = 0, 0
    size = w.shape[dim]
    lo, hi = start // block[dim], -(-(start + size) // block[dim])
    read = scale_reader(dim, lo, hi)
    scale = read.float().repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    scale = scale.narrow(dim, start - lo * block[dim], size)
    return w.float() * scale[:n, :k], read


def _read_part(
    reader: SliceReader, located: dict, spec, name: str, dim, start: int, stop, shape, fp8_block
) -> torch.Tensor:
    """Elements [start, stop) of ``dim`` of tensor ``name`` viewed as ``shape`` (fp8: dequantised), checked as
    the whole-checkpoint loader checks them (fp8 scales, MXFP4 scale bytes)."""
    f = located[name]
    if check_tensor(name, spec, located, fp8_block) in FP8 and spec.kind != "u8":
        scale_name = _fp8_scale_name(name)
        w = reader.read(f, name, shape, dim, start, stop)
        out, scale = _fp8_part(
            w, lambda d, lo, hi: reader.read(located[scale_name], scale_name, None, d, lo, hi), dim, start, fp8_block
        )
        return check_fp8_dequantized(name, w, scale_name, scale, out, located)
    t = reader.read(f, name, shape, dim, start, stop)
    if is_mxfp4_scale(spec):
        check_mxfp4_scale(name, t, f.path.name)
    return t


def load_rank_state(
    cfg: ModelConfig,
    layout: Layout,
    rank: int,
    model_dir: str | Path,
    dtype: torch.dtype,
    device="cpu",
    reader: SliceReader | None = None,
    progress=None,
    only=None,
) -> dict[str, torch.Tensor]:
    """{internal param: this rank's part} read from ``model_dir``; float weights cast to ``dtype``, router
    and A_log/dt_bias kept fp32, packed MXFP4 kept uint8. ``reader.bytes_read`` counts what was read.
    ``only(param) -> bool`` limits the read to some parameters (e.g. the experts, after a rebalance)."""
    own = reader is None
    reader = reader or SliceReader()
    located, resolved, fp8_block = resolve_checkpoint(cfg, model_dir)
    shards = rank_shards(cfg, layout, rank)
    state = {}
    try:
        for i, ((spec, names), shard) in enumerate(zip(resolved, shards)):
            if only is not None and not only(spec.param):
                continue
            target = spec.torch_dtype(dtype)

            def part(name, dim, start, stop, shape, spec=spec):
                return _read_part(reader, located, spec, name, dim, start, stop, shape, fp8_block)

            if shard.experts is not None:
                parts = [part(names[e], None, 0, None, spec.hf_shape) for e in shard.experts]
                t = torch.stack(parts) if parts else torch.empty(0, *spec.hf_shape)
            else:
                t = _pad(part(names[0], shard.dim, shard.start, shard.stop, spec.shape), shard)
            state[spec.param] = t.reshape(shard.shape).to(device=device, dtype=target)
            check_cast(names[0], t, state[spec.param], located[names[0]].path.name)
            if progress is not None:
                progress(i + 1, len(shards))
    finally:
        if own:
            reader.close()
    if only is None:  # as the single process: a tied checkpoint's own LM head must be the embedding's copy
        check_tied_head(cfg, located, resolved, values=True)
    return state


def random_rank_state(
    cfg: ModelConfig, layout: Layout, rank: int, dtype: torch.dtype, device="cpu", seed: int = 0, only=None
) -> dict[str, torch.Tensor]:
    """This rank's part of the random weights ``random_model(cfg, dtype, seed=seed)`` would hold (presets,
    tests). The values must be the single process's, which come from one generator in checkpoint order,
    so every rank still draws every tensor (``iter_random_tensors``), but cuts each to its part as soon
    as it is drawn: memory holds the rank's part plus one checkpoint tensor (one expert), never the
    whole model."""
    from nonstop.weights.synth import iter_random_tensors

    shards = {s.spec.param: s for s in rank_shards(cfg, layout, rank)}
    drawn: dict[str, list[torch.Tensor | None]] = {}
    state = {}
    for spec, _, t in iter_random_tensors(cfg, dtype, seed):  # drawn whether kept or not: the stream's order
        if only is not None and not only(spec.param):
            continue
        s, kept = shards[spec.param], drawn.setdefault(spec.param, [])
        kept.append(t if s.experts is None or len(kept) in s.experts else None)
        if len(kept) == len(spec.names):  # the parameter is complete: keep the rank's part only
            state[spec.param] = _random_part(s, drawn.pop(spec.param), dtype).to(device)
    return state


def _random_part(s: ParamShard, drawn: list, dtype: torch.dtype) -> torch.Tensor:
    """The part ``s`` of one parameter from its drawn tensors (one per HF name; None: an expert not kept)."""
    if s.experts is not None:  # the rank's experts in its slot order, as take_shard cuts them
        t = torch.stack([drawn[e] for e in s.experts]) if s.experts else torch.empty(0, *s.spec.hf_shape)
        return t.to(s.spec.torch_dtype(dtype))
    t = take_shard(torch.stack(drawn) if len(drawn) > 1 else drawn[0].reshape(s.spec.shape), s)
    return t.clone() if s.dim is not None else t  # a copy of the part: the whole tensor is freed


def is_expert(param: str) -> bool:
    """A routed expert's stacked weight (what a new expert placement moves)."""
    return ".mlp.experts." in param
