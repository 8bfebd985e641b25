"""Put a Program's weights into the CPU executor's format (in place).

* Every weight a super-op multiplies with ``model.linear.linear`` (roles in ``LINEAR_ROLES``) becomes a
  packed weight (``packed.FORMATS``); ``float32`` keeps the tensors when the C++ kernels are unavailable
  (its packed form is the same values in row tiles: a second copy of those weights).
* Routed experts get ``op.attrs["dense_experts"]`` for ``ops.moe_experts_gathered``: the stacked
  weights (MXFP4 dequantised to fp32), as bf16 or int8 (Q, per-channel scales) when asked.
* The tensors a packed weight replaces are overwritten with the values it represents, so the model
  (which shares them: lowering made its parameters views of the packed tensors) computes with the
  same weights when a call runs the reference; in a bf16 / fp16 model those are rounded to its dtype,
  so int8's s·Q there differs from the kernels' exact s·Q by that rounding (2e-4 on a tiny bf16 llama).
* The packed weights' tiles are then copied side by side, in the Program's order, into one allocation on
  huge pages (``hugepages``): the step streams them like one array, with no 4 KiB page boundary to stall
  the prefetchers. When they outgrow the cache on a CPU where that was measured to help (``streams_weights``:
  AMD), the kernels read them with non-temporal prefetches (``gemv.cpp``).
Router, norms, conv taps, MLA's absorbed W_UK / W_UV and the embedding stay as loaded (a tied embedding
is the LM head's tensor: rounded with it).
"""

from __future__ import annotations

import os

import torch

from nonstop.hostinfo import cpu_vendor, last_level_cache_bytes
from nonstop.program.ir import Program
from nonstop.runtime.cpu.hugepages import hugepage_copies, release_free_memory
from nonstop.runtime.cpu.packed import FORMATS
from nonstop.weights import mxfp4
from nonstop.weights.quant import DEFAULT_GROUP, dequantize_int8, group_size, quantize_int8

PLACE_BATCH = 256 << 20  # packed bytes copied onto huge pages at a time (a few wasted KiB per batch)

LINEAR_ROLES = frozenset(
    {
        "w",
        "w_in",
        "w_qkv",
        "gate",
        "up",
        "down",
        "q_b",
        "f_b",
        "g_b",
        "latent_down",
        "latent_up",
        "shared_gate_up",
        "shared_down",
    }
)


def _pack_experts(experts, fmt: str) -> dict:
    stacks = {}
    for name in ("w1", "w3", "w2"):
        if experts.fmt != "dense":  # already 4-bit: keep its exact values, in fp32
            packed = getattr(experts, f"{name}_packed")
            if packed.is_meta:  # shapes only (``streamed_bytes_per_token``): the whole stack in one call
                scale = getattr(experts, f"{name}_scale")
                stacks[name] = mxfp4.dequantize(packed, scale, experts.shapes[name][1], torch.float32)
            else:  # one expert's temporaries at a time
                E = packed.shape[0]
                stacks[name] = torch.stack([experts.weight(name, e, torch.float32) for e in range(E)])
            continue
        w = getattr(experts, name)
        if fmt == "bfloat16":
            stacks[name] = w.to(torch.bfloat16)
            w.data.copy_(stacks[name].to(w.dtype))
        elif fmt == "int8":
            q, s = quantize_int8(w, w.shape[-1])
            stacks[name] = (q, s)
            w.data.copy_(dequantize_int8(q, s).to(w.dtype))
        else:
            stacks[name] = w
    return stacks


def bytes_per_weight(fmt: str, group: int = DEFAULT_GROUP) -> float:
    """Bytes a packed weight of ``fmt`` takes per weight: fp32 4, bf16 2, int8 1 + one fp32 scale per ``group``."""
    return {"float32": 4.0, "bfloat16": 2.0, "int8": 1.0 + 4 / group}[fmt]


def packed_bytes(program: Program, fmt: str) -> int:
    """About the bytes of ``program``'s linear weights packed into ``fmt`` (what the step streams): its
    linear weights at ``fmt``'s bytes per weight (int8 at the default group)."""
    return int(sum(w.numel() for w in _linear_weights(program)) * bytes_per_weight(fmt))


def streamed_bytes_per_token(cfg, dtype: torch.dtype, fmt: str, group: int = DEFAULT_GROUP) -> int:
    """Weight bytes one batch-1 decode step of the ``cpu`` executor streams for ``cfg`` loaded in ``dtype``, its
    weights packed into ``fmt`` (float32 | bfloat16 | int8) with the C++ kernels: the weightless (meta) model's
    Program packed by ``pack_program`` and costed by the cost model (``program/cost.py``), so the router, norms
    and embedding row count in the dtype they stay in, packed weights with their tiles' padding and int8
    scales, and the top-k routed experts as the stacks the executor gathers from (MXFP4 widened to fp32)."""
    from nonstop.model.build import meta_model
    from nonstop.program.lower import lower

    program = lower(meta_model(cfg, dtype))
    pack_program(program, fmt, kernels=True, group=group)
    return program.total_cost(rows=1).weight_bytes


def _linear_weights(program: Program) -> list[torch.Tensor]:
    """The 2-D linear weights ``pack_program`` packs, each once (a tensor shared by ops counts once)."""
    seen: dict[int, torch.Tensor] = {}
    for op in program.ops:
        for role, w in op.weights.items():
            if role in LINEAR_ROLES and isinstance(w, torch.Tensor) and w.dim() == 2:
                seen.setdefault(id(w), w)
    return list(seen.values())


def _expert_stacks(program: Program, fmt: str) -> list[tuple[int, int]]:
    """(numel, bytes kept) of each routed-expert stack ``_pack_experts`` makes: MXFP4 ones widen to fp32,
    dense ones take a bf16 or int8 (+ per-row fp32 scale) copy; dense fp32 reuses the loaded stack (none)."""
    stacks = []
    for op in program.ops:
        if op.kind != "moe_experts":
            continue
        experts = op.attrs["experts"]
        for n, k in experts.shapes.values():
            numel = experts.num_experts * n * k
            if experts.fmt != "dense":
                stacks.append((numel, 4 * numel))
            elif fmt != "float32":
                stacks.append((numel, int(numel * bytes_per_weight(fmt, k))))
    return stacks


def packing_peak_bytes(program: Program, fmt: str) -> int:
    """About the most ``pack_program`` holds at once beside the loaded weights: the packed linear weights,
    the routed experts' stacks, one batch of packed weights being copied onto huge pages (``PLACE_BATCH``
    and the weight that closes it), and the fp32 temporaries of the largest weight or expert stack being
    converted (about four: widened, padded / quantised, tiled, dequantised)."""
    weights = [w.numel() for w in _linear_weights(program)]
    stacks = _expert_stacks(program, fmt)
    largest = max([*weights, *(numel for numel, _ in stacks)], default=0)
    packed = packed_bytes(program, fmt)
    experts = sum(kept for _, kept in stacks)
    return int(
        packed + experts + min(packed, PLACE_BATCH) + max(weights, default=0) * bytes_per_weight(fmt) + largest * 16
    )


# (CPU vendor, the kernels' vector path: 2 AVX-512, 1 AVX2) -> the formats whose weights stream once they
# outgrow half the last-level cache, as measured on whole steps or whole-step GEMV sweeps (2 threads):
STREAMED_FORMATS = {
    ("AuthenticAMD", 2): ("float32", "bfloat16", "int8"),  # Zen 5 VM: +3-10% under load, +-2% quiet
    ("AuthenticAMD", 1): ("int8",),  # Zen 3 VM: fp32 -7..-15%, bf16 -9%, int8 +3%
}
# Anything else reads cached. Intel: on a Xeon VM with AMX (AVX-512 path) the 246M Llama's GEMVs read 11.9 vs
# 28.3 GB/s at fp32, 10.9 vs 28.0 at bf16 and 13.7 vs 26.4 at int8 streamed vs cached, and its fp32 decode ran
# 13.9 vs 31.0 tok/s: there a non-temporal prefetch fills L1 alone, so the stream is held to L1's few fill
# buffers instead of the L2 streamer's many requests in flight.


def streams_weights(
    weight_bytes: int, fmt: str, isa: int, cache_bytes: int | None = None, vendor: str | None = None
) -> bool:
    """Whether the kernels read a step's ``weight_bytes`` of packed ``fmt`` weights with non-temporal prefetches:
    as ``NONSTOP_CPU_STREAM`` says (1 / 0) when it is set, else when ``STREAMED_FORMATS`` lists ``fmt`` for this
    CPU's ``vendor`` (default: ``hostinfo.cpu_vendor()``) and vector path ``isa``
    (``torch.ops.nonstop_cpu.isa_level()``) and the weights exceed half the last-level cache (``cache_bytes``,
    default this CPU's): then no weight is still cached when the next step needs it (the step's other data takes
    its share, and a VM reports a cache its neighbours use too), so keeping the weights out of the caches leaves
    them to the activations, KV cache and code."""
    setting = os.environ.get("NONSTOP_CPU_STREAM", "").strip()
    if setting:
        if setting not in ("0", "1"):
            raise ValueError(f"NONSTOP_CPU_STREAM must be 1 (stream the weights) or 0 (cached loads), not {setting!r}")
        return setting == "1"
    if fmt not in STREAMED_FORMATS.get((cpu_vendor() if vendor is None else vendor, isa), ()):
        return False
    cache = last_level_cache_bytes() if cache_bytes is None else cache_bytes
    return weight_bytes > cache // 2


def pack_program(program: Program, fmt: str, kernels: bool, group: int = DEFAULT_GROUP, stream: bool = False) -> None:
    """Convert ``program``'s weights to ``fmt`` (float32 | bfloat16 | int8); activations become fp32.
    kernels: the C++ kernels are loaded (else packed weights compute in torch). group: int8 scale group
    (columns per scale where it divides K, else per channel; 0: always per channel). stream: the kernels
    read the weights with non-temporal prefetches (``streams_weights``)."""
    done: dict[int, object] = {}  # a tensor shared by ops (tied embeddings) is packed once
    batch: list = []  # packed weights not yet on huge pages: moved a batch at a time to bound the peak
    batch_bytes = 0
    for op in program.ops:
        if op.kind == "moe_experts":
            op.attrs["dense_experts"] = _pack_experts(op.attrs["experts"], fmt)
        if fmt == "float32" and not kernels:
            continue
        for role, w in list(op.weights.items()):
            if role not in LINEAR_ROLES or not isinstance(w, torch.Tensor) or w.dim() != 2:
                continue
            if id(w) not in done:
                extra = {"group": group_size(w.shape[-1], group) if group else w.shape[-1]} if fmt == "int8" else {}
                packed = FORMATS[fmt](w, kernels, **extra)
                packed.stream = stream and packed.kernels
                w.data.copy_(packed.dequantized().to(w.dtype))
                done[id(w)] = packed
                if packed.kernels:
                    batch.append(packed)
                    batch_bytes += sum(getattr(packed, name).nbytes for name in packed.streamed)
                    if batch_bytes >= PLACE_BATCH:
                        place_on_huge_pages(batch)
                        batch, batch_bytes = [], 0
            op.weights[role] = done[id(w)]
    place_on_huge_pages(batch)
    program.dtype = torch.float32
    release_free_memory()


def place_on_huge_pages(packed: list) -> None:
    """Move the tensors the kernels stream (each packed weight's ``streamed`` attributes) into one
    huge-page allocation, in the given order. ``pack_program`` moves them in batches of about
    ``PLACE_BATCH`` bytes, so that the copy never doubles the whole model."""
    fields = [(p, name) for p in packed for name in p.streamed if getattr(p, name).device.type != "meta"]
    for (p, name), copy in zip(fields, hugepage_copies([getattr(p, name) for p, name in fields])):
        setattr(p, name, copy)
