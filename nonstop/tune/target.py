"""What a tuning or a verification is about: one super-op kind of one model, its tuned shapes and costs.

The *tuned shapes* are the model's own: each distinct set of weight shapes the kind has in the model's
Program, at each requested step shape (B sequences × T tokens; decode is T = 1). They are what a
proposer is shown and what the tuning store is keyed by (``runtime/tuned.shape_key``). Variants of the
kind with the same weight shapes but other attributes (``attnres_mix_norm``'s ``n_blocks`` /
``store_block``, ``linear_residual``'s ``accumulate``) share a store key: a tuned shape lists them
(``others``), and the verification gives each one a case of its own (one per variant, at the first B:
at most one per op of the kind in the cut model). A stored entry lists the variants it covered
(``variants``); a deeper layer's variant that the cut model does not hold runs the built-in kernel. On a
CPU the Triton interpreter is slow: tuned shapes whose weights exceed ``CPU_WEIGHT_LIMIT`` are not verified
there (and cannot be stored); the hidden shapes always are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nonstop.config import ModelConfig
from nonstop.model.build import meta_model
from nonstop.program.ir import SuperOp
from nonstop.program.lower import lower
from nonstop.runtime.tuned import op_variant, program_shape_key
from nonstop.tune.cases import layers_for, variants

CPU_WEIGHT_LIMIT = 64 << 20  # bytes of one op's weights up to which the interpreter verifies real widths


@dataclass(frozen=True)
class TunedShape:
    variant: int  # index into ``variants(program, kind)``
    B: int
    T: int
    key: str  # the tuning store's shape key
    weight_bytes: int
    bytes_moved: int  # the op's bytes read + written at this shape (cost model, at ``context``)
    others: tuple[int, ...] = ()  # the other variants with these weight shapes (other attrs, same store key)
    variants: tuple[str, ...] = ()  # ``op_variant`` of the variant and of the others: what a stored entry covers


@dataclass
class Target:
    kind: str
    model: str  # the name or directory the user gave
    cfg: ModelConfig  # the model cut to the layers the kind needs (``cases.layers_for``)
    dtype: torch.dtype
    device: torch.device
    context: int
    shapes: list[TunedShape] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # tuned shapes this machine cannot verify, and why

    def describe(self) -> str:
        return f"{self.kind} of {self.model} ({str(self.dtype).removeprefix('torch.')}, {self.device})"


def op_signature(op: SuperOp) -> tuple:
    return tuple((n, tuple(t.shape)) for n, t in sorted(op.weights.items()))


def make_target(
    kind: str,
    model: str,
    cfg: ModelConfig,
    dtype: torch.dtype,
    device,
    rows: list[int],
    tokens: int = 1,
    context: int = 256,
) -> Target:
    """The tuned shapes of ``kind`` in ``cfg``'s Program at B in ``rows`` (T = ``tokens``)."""
    cfg = cfg.with_num_layers(layers_for(cfg, kind))
    device = torch.device(device)
    target = Target(kind, model, cfg, dtype, device, context)
    program = lower(meta_model(cfg, dtype))  # each weight in the dtype a loaded model gives it (fp32 A_log...)
    ops = variants(program, kind)
    groups: dict[tuple, list[int]] = {}  # weight shapes -> the variants that have them, in order
    for index, op in enumerate(ops):
        groups.setdefault(op_signature(op), []).append(index)
    for first, *others in groups.values():
        op = ops[first]
        weight_bytes = op.weight_bytes()
        for B in rows:
            cost = op.cost(B * tokens, context, B)
            shape = TunedShape(
                first,
                B,
                tokens,
                program_shape_key(program, op, B, tokens),
                weight_bytes,
                cost.bytes_read + cost.bytes_written,
                tuple(others),
                tuple(dict.fromkeys(op_variant(ops[i]) for i in (first, *others))),
            )
            if device.type != "cuda" and weight_bytes > CPU_WEIGHT_LIMIT:
                target.skipped.append(
                    f"{shape.key}: {weight_bytes / 2**20:.0f} MiB of weights is too large for the Triton interpreter"
                )
                continue
            target.shapes.append(shape)
    return target
