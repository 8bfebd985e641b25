"""Load a safetensors checkpoint (single file or sharded with ``model.safetensors.index.json``) into
a ``CausalLM`` by the HF tensor names of ``checkpoint_layout``.

Every failure is a ``CheckpointError`` naming the tensor and the file: a missing tensor, an
unexpected one, a wrong shape or dtype, a truncated or corrupt file, a shard the index names but
that is not there, a ``*.safetensors`` file beside the index that the index does not name (a stale single file
that transformers would read instead), an index that is not ``{"weight_map": {tensor: shard file}}``, a tensor
held by two files (with or without an index: a broken or mixed download), PyTorch ``.bin`` weights without
safetensors, an fp8 tensor without a matching scale or with a scale that is not float32 / bfloat16 / float16, a
``weight_scale_inv`` beside a weight not stored as fp8 (a half-converted checkpoint), an fp8 scale
that makes its weight overflow (named: the scale, with its largest value), an MXFP4 scale byte above
``mxfp4.MAX_SCALE`` (255 is NaN), float data holding NaN or infinity (or finite values beyond the range of the
dtype asked for), a tied checkpoint whose extra LM head is not the embedding.
"""

from __future__ import annotations

from pathlib import Path

import torch

from nonstop.config import ModelConfig
from nonstop.config_parse import fp8_block_size
from nonstop.jsonfile import read_json_object
from nonstop.weights import mxfp4
from nonstop.weights.errors import CheckpointError
from nonstop.weights.layout import TensorSpec, checkpoint_layout, ignored_tensor
from nonstop.weights.safetensors_file import SafetensorsFile, unreadable

INDEX = "model.safetensors.index.json"
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # weight_scale_inv as DeepSeek-V3 / K2 store it
PYTORCH_WEIGHTS = ("pytorch_model*.bin", "*.pth", "*.pt")  # formats nonstop does not read (pickles)


def read_index(index_path: Path) -> dict[str, str]:
    """The ``weight_map`` of a sharded checkpoint's index: {tensor name: shard file in the same directory}."""
    why = unreadable(index_path)
    if why:
        raise CheckpointError(f"{index_path}: cannot read ({why})")
    raw = read_json_object(index_path, CheckpointError)
    weight_map = raw.get("weight_map")
    if not isinstance(weight_map, dict):
        got = type(weight_map).__name__ if "weight_map" in raw else "nothing"
        raise CheckpointError(
            f"{index_path}: corrupt index: 'weight_map' must be an object of tensor name -> shard file, got {got}"
        )
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or Path(shard).name != shard or shard in (".", ".."):
            raise CheckpointError(
                f"{index_path}: corrupt index: tensor {name!r} maps to {shard!r}, not a shard file "
                "name in the checkpoint directory"
            )
    return weight_map


def checkpoint_files(model_dir: str | Path) -> dict[str, SafetensorsFile]:
    """name -> open file for every tensor of the checkpoint in ``model_dir``. A tensor in two files is an
    error, with an index too: a shard holding a tensor the index places in another is a broken or mixed download.
    With an index, every ``*.safetensors`` file in ``model_dir`` must be one of its shards."""
    model_dir = Path(model_dir)
    index_path = model_dir / INDEX
    try:
        indexed = index_path.exists() or index_path.is_symlink()
        files = sorted(model_dir.glob("*.safetensors"))
        pickles = [] if indexed or files else sorted(p.name for g in PYTORCH_WEIGHTS for p in model_dir.glob(g))
    except OSError as exc:
        raise CheckpointError(f"{model_dir}: cannot read ({exc.strerror})") from None
    if pickles:
        raise CheckpointError(
            f"{model_dir} holds PyTorch weights ({pickles[0]}), which nonstop does not read: convert the checkpoint "
            "to safetensors (e.g. transformers' save_pretrained(DIR, safe_serialization=True))"
        )
    if not indexed and not files:
        raise CheckpointError(f"no safetensors checkpoint in {model_dir} (expected model.safetensors or {INDEX})")
    if indexed:
        shards, weight_map = _indexed_shards(model_dir, index_path)
        _refuse_unindexed(index_path, files, shards)
        located = {name: shards[shard] for name, shard in weight_map.items()}
        opened = list(shards.values())
    else:
        weight_map, located = {}, {}
        opened = [SafetensorsFile(path) for path in files]
    for f in opened:
        for name in f.entries:
            first = located.setdefault(name, f)
            if first is not f:
                placed = f" (the index places it in {first.path.name})" if name in weight_map else ""
                raise CheckpointError(
                    f"tensor {name!r} appears in both {first.path.name} and {f.path.name}{placed}: a broken or mixed "
                    "download"
                )
    return located


def _indexed_shards(model_dir: Path, index_path: Path) -> tuple[dict[str, SafetensorsFile], dict[str, str]]:
    """({shard file name: open file}, weight_map) of a sharded checkpoint, each listed tensor checked to be in
    the shard its index names."""
    weight_map = read_index(index_path)
    if not weight_map:
        raise CheckpointError(f"{index_path}: the index lists no tensors")
    shards = {}
    for s in sorted(set(weight_map.values())):
        if not (model_dir / s).exists() and not (model_dir / s).is_symlink():  # a broken link: SafetensorsFile says so
            first = next(n for n, f in weight_map.items() if f == s)
            raise CheckpointError(f"{index_path}: shard {s!r} (holding e.g. {first!r}) is missing from {model_dir}")
        shards[s] = SafetensorsFile(model_dir / s)
    for name, s in weight_map.items():
        if name not in shards[s].entries:
            raise CheckpointError(
                f"{index_path}: tensor {name!r} is listed in shard {s!r} but that file does not contain it"
            )
    return shards, weight_map


def _refuse_unindexed(index_path: Path, files: list[Path], shards: dict[str, SafetensorsFile]) -> None:
    """CheckpointError naming the ``files`` that are not among the index's ``shards``: nonstop would ignore
    them, a stale or mixed download (transformers reads a ``model.safetensors`` before the index, so the two
    engines would load different weights)."""
    stray = [p.name for p in files if p.name not in shards]
    if stray:
        noun, them = ("file", "it holds") if len(stray) == 1 else ("files", "they hold")
        raise CheckpointError(
            f"{index_path.parent} holds {', '.join(stray)}, which {index_path.name} does not list: remove the stale "
            f"{noun}, or the index if {them} the checkpoint"
        )


def _check_fp8_scale(name: str, w_shape, scale_name: str, located: dict, block) -> None:
    """The scale of a block-quantised fp8 weight [R, C] must be [ceil(R / b0), ceil(C / b1)] of a float dtype
    (``FP8_SCALE_DTYPES``): an integer one (e.g. E8M0 exponent bytes) would be read as plain multipliers."""
    f = located[scale_name]
    s_dtype, s_shape = f.meta(scale_name)
    if s_dtype not in FP8_SCALE_DTYPES:
        expected = ", ".join(str(d) for d in FP8_SCALE_DTYPES)
        raise CheckpointError(
            f"tensor {scale_name!r} in {f.path.name} has dtype {s_dtype}, expected one of {expected} (the block "
            f"scales of fp8 {name!r}; integer or E8M0 scales are not read)"
        )
    want = (-(-w_shape[0] // block[0]), -(-w_shape[1] // block[1])) if len(w_shape) == 2 else None
    if want is None or tuple(s_shape) != want:
        raise CheckpointError(
            f"tensor {scale_name!r} in {f.path.name} has shape {list(s_shape)}, expected "
            f"{list(want) if want else 'a 2-D weight'} (block scales of {name!r} {list(w_shape)}, "
            f"blocks {list(block)})"
        )


def check_finite(name: str, t: torch.Tensor, where: str) -> None:
    """CheckpointError when the float tensor ``name`` (read from file ``where``) holds NaN or inf."""
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise CheckpointError(f"tensor {name!r} in {where} holds {bad} NaN or infinite value(s): corrupt data")


def check_cast(name: str, source: torch.Tensor, cast: torch.Tensor, where: str) -> None:
    """CheckpointError when ``cast`` (tensor ``name`` of file ``where``, ``source`` cast to the model's dtype)
    holds NaN or inf: corrupt data when ``source`` already did, else finite values beyond the dtype's range
    (fp32 weights > 65504 in float16). Only a failed cast looks at ``source`` again."""
    if not cast.is_floating_point() or bool(torch.isfinite(cast).all()):
        return
    check_finite(name, source, where)
    dtype = str(cast.dtype).removeprefix("torch.")
    raise CheckpointError(
        f"tensor {name!r} in {where} holds values beyond {dtype}'s range (largest {torch.finfo(cast.dtype).max:g}): "
        "load the model in bfloat16 or float32"
    )


def check_fp8_dequantized(
    name: str, w: torch.Tensor, scale_name: str, scale: torch.Tensor, out: torch.Tensor, located: dict
) -> torch.Tensor:
    """``out``, the fp8 ``w`` of tensor ``name`` dequantised with (the blocks ``scale`` of) ``scale_name``, after
    checking the scales: CheckpointError for a NaN or infinite scale, or for a finite scale so large that the
    product overflows float32 (named with its largest value). Only scales above float32's max / the fp8
    format's max can overflow, so ``out`` is read again only then; NaN in the fp8 data itself is the weight's
    (``check_cast`` names it)."""
    where = located[scale_name].path.name
    check_finite(scale_name, scale.float(), where)
    largest = float(scale.float().abs().max()) if scale.numel() else 0.0
    can_overflow = largest * torch.finfo(w.dtype).max >= torch.finfo(torch.float32).max
    if not (can_overflow and bool(torch.isinf(out).any())):
        return out
    raise CheckpointError(
        f"tensor {scale_name!r} in {where} holds scales up to {largest:g}: the fp8 weight {name!r} dequantised "
        "with them overflows float32 (corrupt scales)"
    )


def check_mxfp4_scale(name: str, scale: torch.Tensor, where: str) -> None:
    """CheckpointError when the MXFP4 scale tensor ``name`` (uint8 E8M0 exponents, read from file ``where``)
    holds a byte above ``mxfp4.MAX_SCALE``: 255 is NaN, and larger exponents than the bound overflow the GPU
    decoder where the CPU gives finite values. One pass over the scale bytes (1/16 of the packed ones)."""
    top = int(scale.max()) if scale.numel() else 0
    if top > mxfp4.MAX_SCALE:
        count = int((scale > mxfp4.MAX_SCALE).sum())
        what = " (NaN in E8M0)" if top == 255 else ""
        raise CheckpointError(
            f"tensor {name!r} in {where} holds {count} MXFP4 scale byte(s) above {mxfp4.MAX_SCALE}, the largest "
            f"{top}{what}: corrupt data (E8M0 byte s scales by 2^(s-127); nonstop reads s <= {mxfp4.MAX_SCALE})"
        )


def _same_values(a: torch.Tensor, b: torch.Tensor, rows: int = 4096) -> bool:
    """Equal shapes and values, compared ``rows`` rows at a time (a vocabulary-sized matrix in fp32 at once
    would double its memory)."""
    return a.shape == b.shape and all(
        torch.equal(a[i : i + rows].float(), b[i : i + rows].float()) for i in range(0, max(a.shape[0], 1), rows)
    )


def check_tied_head(cfg: ModelConfig, located: dict, resolved: list, values: bool) -> None:
    """A tied checkpoint (``tie_word_embeddings``) may carry its LM head too, which is then not read: only a
    copy of the embedding is accepted. CheckpointError when its shape differs (from the headers) or, with
    ``values``, its values do (a checkpoint whose own LM head the config would silently drop)."""
    head = cfg.lm_head_name
    if not cfg.tie_word_embeddings or head not in located:
        return
    embed = next(names[0] for spec, names in resolved if spec.param == "embed_tokens.weight")
    hf, ef = located[head], located[embed]
    fix = "set tie_word_embeddings to false in config.json to use it, or remove the tensor"
    if hf.meta(head)[1] != ef.meta(embed)[1]:
        raise CheckpointError(
            f"tensor {head!r} in {hf.path.name} has shape {list(hf.meta(head)[1])}, but config.json ties the LM head "
            f"to {embed!r} {list(ef.meta(embed)[1])}: {fix}"
        )
    if values and not _same_values(hf.tensor(head), ef.tensor(embed)):
        raise CheckpointError(
            f"tensor {head!r} in {hf.path.name} differs from {embed!r}, but config.json ties the LM head to the "
            f"embedding (tie_word_embeddings: true), so it would be ignored: {fix}"
        )


def _resolve(spec: TensorSpec, located: dict) -> tuple[str, ...]:
    for names in (spec.names, *spec.aliases):
        if all(n in located for n in names):
            return names
    missing = next(n for n in spec.names if n not in located)
    where = sorted({f.path.name for f in located.values()})
    raise CheckpointError(f"missing tensor {missing!r} (parameter {spec.param}) in {', '.join(where)}")


def _fp8_scale_name(name: str) -> str:
    return name[: -len(".weight")] + ".weight_scale_inv" if name.endswith(".weight") else name + "_scale_inv"


def is_mxfp4_scale(spec: TensorSpec) -> bool:
    """Whether ``spec`` holds MXFP4 E8M0 scale bytes (checked by ``check_mxfp4_scale`` when read)."""
    return spec.kind == "u8" and spec.init == "mxfp4_scale"


def _dequantize_fp8(w: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """DeepSeek/Kimi K2 fp8: w ≈ w_fp8 · scale_inv[i // block0, j // block1]. The scales are gathered per row
    and column, never expanded a whole block at a time: a block larger than the weight costs no memory."""
    rows = torch.arange(w.shape[0], device=scale_inv.device) // min(block[0], w.shape[0])
    cols = torch.arange(w.shape[1], device=scale_inv.device) // min(block[1], w.shape[1])
    return w.float() * scale_inv.float()[rows][:, cols]


def check_tensor(name: str, spec: TensorSpec, located: dict, fp8_block: tuple[int, int]) -> torch.dtype:
    """The dtype of tensor ``name`` after checking its shape and dtype against ``spec`` (CheckpointError
    naming the tensor and file); fp8 weights need their ``weight_scale_inv`` beside them, one scale per
    ``fp8_block`` block."""
    f = located[name]
    dtype, shape = f.meta(name)
    if shape != spec.hf_shape and not _zero_padded(name, spec, f, shape):
        raise CheckpointError(
            f"tensor {name!r} in {f.path.name} has shape {list(shape)}, expected {list(spec.hf_shape)} (parameter "
            f"{spec.param})"
        )
    if spec.kind == "u8":
        if dtype != torch.uint8:
            raise CheckpointError(
                f"tensor {name!r} in {f.path.name} has dtype {dtype}, expected torch.uint8 (packed MXFP4)"
            )
    elif dtype in FP8:
        if _fp8_scale_name(name) not in located:
            raise CheckpointError(
                f"tensor {name!r} in {f.path.name} is fp8 but its scale {_fp8_scale_name(name)!r} is missing"
            )
        _check_fp8_scale(name, shape, _fp8_scale_name(name), located, fp8_block)
    elif not dtype.is_floating_point:
        raise CheckpointError(
            f"tensor {name!r} in {f.path.name} has dtype {dtype}, expected a floating-point dtype (parameter "
            f"{spec.param})"
        )
    return dtype


def _zero_padded(name: str, spec: TensorSpec, f, shape: tuple[int, ...]) -> bool:
    """Whether ``shape`` stores ``spec`` (``zero_padded``) in another shape: one dimension above 1, at least
    ``spec.numel`` long (zero-padded, or exact in another arrangement of ones: K3's [1, 1, H, 1] A_log and
    Kimi Linear's [H] are both accepted for either); CheckpointError when an entry past the live values is
    not zero."""
    long = [s for s in shape if s != 1]
    if not spec.zero_padded or len(long) != 1 or long[0] < spec.numel:
        return False
    tail = f.tensor(name).reshape(-1)[spec.numel :]
    if bool(tail.ne(0).any()):
        raise CheckpointError(
            f"tensor {name!r} in {f.path.name} has {long[0]} entries for the {spec.numel} of parameter {spec.param}, "
            f"and {int(tail.ne(0).sum())} of the {len(tail)} past them are not zero: not padding (does config.json "
            "give the checkpoint's head count?)"
        )
    return True


def _read(name: str, spec: TensorSpec, located: dict, fp8_block) -> torch.Tensor:
    dtype = check_tensor(name, spec, located, fp8_block)
    t = located[name].tensor(name)
    if spec.zero_padded and t.numel() > spec.numel:  # the live values (the padding was checked to be zeros)
        t = t.reshape(-1)[: spec.numel]
    if dtype in FP8 and spec.kind != "u8":
        scale_name = _fp8_scale_name(name)
        scale = located[scale_name].tensor(scale_name)
        return check_fp8_dequantized(name, t, scale_name, scale, _dequantize_fp8(t, scale, fp8_block), located)
    if is_mxfp4_scale(spec):
        check_mxfp4_scale(name, t, located[name].path.name)
    return t


def _empty(located: dict, name: str) -> bool:
    """A tensor of no elements: it holds nothing a model could use, so it is never unexpected (transformers
    writes the shared-expert projections of ``n_shared_experts: 0`` as [H, 0] / [0, H] tensors)."""
    return 0 in located[name].meta(name)[1]


def _fp8_scales(located: dict, resolved: list) -> set[str]:
    """The ``weight_scale_inv`` tensors of the ``resolved`` weights stored as fp8 (the dtype in the header).
    CheckpointError for a scale beside a weight of another dtype: it would be ignored, leaving the weight off
    by its scale (a half-converted checkpoint)."""
    scales = set()
    for name in (n for _, names in resolved for n in names):
        scale = _fp8_scale_name(name)
        if scale not in located:
            continue
        dtype = located[name].meta(name)[0]
        if dtype not in FP8:
            raise CheckpointError(
                f"tensor {scale!r} in {located[scale].path.name} is the fp8 block scale of {name!r}, but that weight "
                f"is {dtype}, not fp8, so the scale would be ignored: a half-converted checkpoint (multiply the "
                "weight by its scales or restore the fp8 weight)"
            )
        scales.add(scale)
    return scales


def resolve_checkpoint(
    cfg: ModelConfig, model_dir: str | Path
) -> tuple[dict, list[tuple[TensorSpec, tuple[str, ...]]], tuple[int, int]]:
    """Open the checkpoint's files (headers only) and match them to ``cfg``: (name -> file, [(spec, the HF
    names holding it)] in checkpoint order, fp8 weight block). CheckpointError for a missing or an
    unexpected tensor."""
    located = checkpoint_files(model_dir)
    resolved = [(spec, _resolve(spec, located)) for spec in checkpoint_layout(cfg)]
    consumed = {n for _, names in resolved for n in names}
    fp8_scales = _fp8_scales(located, resolved)
    unexpected = [
        n
        for n in located
        if n not in consumed and n not in fp8_scales and not ignored_tensor(cfg, n) and not _empty(located, n)
    ]
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise CheckpointError(
            f"unexpected tensor {unexpected[0]!r} in {located[unexpected[0]].path.name}{more}: not part of a "
            f"{cfg.family} model with this config"
        )
    check_tied_head(cfg, located, resolved, values=False)
    return located, resolved, fp8_block_size(cfg.hf)  # validated by the config parser (hf_config_fields), every family


def load_state_dict(
    cfg: ModelConfig, model_dir: str | Path, dtype: torch.dtype, device="cpu", progress=None
) -> dict[str, torch.Tensor]:
    """Read every parameter of ``cfg`` from ``model_dir``: {internal param path: tensor on device}.

    Float weights are cast to ``dtype``; router weights and biases, A_log and dt_bias stay fp32; packed
    MXFP4 experts stay uint8. ``progress(done, total)`` is called after each parameter.
    """
    located, resolved, fp8_block = resolve_checkpoint(cfg, model_dir)
    state = {}
    for i, (spec, names) in enumerate(resolved):
        parts = [_read(n, spec, located, fp8_block) for n in names]
        t = torch.stack(parts) if len(names) > 1 or len(spec.names) > 1 else parts[0].reshape(spec.shape)
        state[spec.param] = t.to(device=device, dtype=spec.torch_dtype(dtype), copy=True)
        check_cast(names[0], t, state[spec.param], located[names[0]].path.name)
        if progress is not None:
            progress(i + 1, len(resolved))
    check_tied_head(cfg, located, resolved, values=True)
    return state
