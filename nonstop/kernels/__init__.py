"""Triton super-op kernels, one module per family, each naming the reference twin it must equal.

Conventions (shared by the ``superop`` executor and the megakernel):
* a super-op kind's work is a ``@triton.jit`` *tile function* taking raw pointers, strides, sizes and a
  tile index, so the persistent megakernel can call the same body for one of its tasks;
* its launcher kernel is generated from the tile function (``launch.launcher``): the same parameters
  plus ``USE_PDL``; a Python ``launch(op, env)`` with the signature of the twins in
  ``nonstop/program/reference.py`` sets up pointers and launches once; each module exports
  ``KERNELS = {kind: launch}``, and may export ``REFUSALS = {kind: refusal(attrs) -> reason or None}`` for
  attribute values its kernel does not take (the executor refuses such a model before it loads a step);
* shared pieces: ``platform`` (interpreter, device target, sizes, dot policy), ``gemv`` (the GEMV tile,
  the RMS helper, the matmul helper), ``launch`` (launchers, PDL, the multi-phase protocol, workspaces).
Triton is needed to import the kernel modules (``TRITON_INTERPRET=1`` runs them on a CPU); ``KERNELS`` and
``REFUSALS`` are built on first access, so ``nonstop.kernels.platform`` imports without Triton. Every family module is
required: a missing one is an import error, never a silently smaller table.
"""

from __future__ import annotations

import importlib

FAMILY_MODULES = ("dense", "attnres", "kda", "mla", "gqa", "moe", "sample")


def _collect(name: str) -> dict:
    table = {}
    for family in FAMILY_MODULES:
        table.update(getattr(importlib.import_module(f"nonstop.kernels.{family}"), name, {}))
    return table


def __getattr__(name: str):
    if name in ("KERNELS", "REFUSALS"):
        table = globals()[name] = _collect(name)
        return table
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
