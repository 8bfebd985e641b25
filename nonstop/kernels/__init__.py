"""Triton super-op kernels, one module per family, each naming the reference twin it must equal.

Conventions (shared by the ``superop`` executor and the megakernel):
* every super-op kind's work is a ``@triton.jit`` *tile function* taking raw pointers, strides,
  sizes and a tile index, so the persistent megakernel can call the same body for one of its tasks;
* a thin ``@triton.jit`` launcher kernel calls the tile function with ``tl.program_id(0)``; it takes
  ``USE_PDL: tl.constexpr`` and starts with ``pdl_wait(USE_PDL)`` (``pdl.py``);
* a Python ``launch(op, env)`` with the signature of the twins in ``nonstop/program/reference.py``
  sets up pointers and launches once; each module exports ``KERNELS = {kind: launch}``.
Modules are imported lazily (Triton is optional; ``TRITON_INTERPRET=1`` runs them on a CPU).
"""

from __future__ import annotations

import importlib

FAMILY_MODULES = ("common", "kda", "mla", "gqa", "moe")


def _collect() -> dict:
    table = {}
    for name in FAMILY_MODULES:
        try:
            module = importlib.import_module(f"nonstop.kernels.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"nonstop.kernels.{name}":
                continue  # family not written yet
            raise
        table.update(module.KERNELS)
    return table


KERNELS = _collect()
