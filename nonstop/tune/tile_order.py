"""The tile-order tunable of the ``search`` proposer: the order in which a launch's programs walk its tiles.

A built-in launcher kernel (``kernels/launch.launcher``) runs tile ``pid = tl.program_id(0)``. Programs
start in about pid order, so the order decides which weight slices and output columns are in flight
together (DRAM channels, L2 sharing with the previous launch). A tile-order candidate carries its own
copy of the launcher kernel with the tile index permuted, and launches it instead of the built-in one:

* ``reversed``: tile n - 1 - pid (the last tiles first);
* ``interleaved``: even programs take the first half of the tiles, odd ones the second half.

Only single-phase launchers take an order: a two-phase launch's tiles follow its ticket protocol, not the
program id. Each order is a permutation of 0..n-1; the verifier checks the result like any other candidate.
"""

from __future__ import annotations

import ast
import inspect
import re

from nonstop.kernels.launch import declaration, python_function

ORDERS = {
    "reversed": "tl.num_programs(0) - 1 - tl.program_id(0)",
    "interleaved": "tl.program_id(0) % 2 * ((tl.num_programs(0) + 1) // 2) + tl.program_id(0) // 2",
}


def ordered_kernel(module, launcher_source: str) -> str | None:
    """The name of the single-phase launcher kernel that ``launcher_source`` (a launch function of
    ``module``) launches, or None if it launches none or several (or a two-phase one)."""
    tree = ast.parse(launcher_source)
    names = {
        n.func.value.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript) and isinstance(n.func.value, ast.Name)
    }
    if len(names) != 1:
        return None
    name = names.pop()
    decl = declaration(getattr(module, name, None))
    return name if decl is not None and decl.first is None else None


def ordered_source(kernel, order: str) -> tuple[str, str, list[str]]:
    """(new kernel name, its source, the imports it needs): ``kernel``'s launcher with the tile ``order``."""
    decl = declaration(kernel)
    source = inspect.getsource(python_function(kernel))
    old = python_function(kernel).__name__
    new = f"{old}_{order}"
    source = re.sub(rf"\bdef {old}\(", f"def {new}(", source, count=1)
    source, count = re.subn(r"pid = tl\.program_id\(0\)", f"pid = {ORDERS[order]}", source, count=1)
    if count != 1:
        raise ValueError(f"{old}: not a generated launcher (no pid = tl.program_id(0))")
    tile = python_function(decl.tile_fn)
    imports = [
        "import triton",
        "import triton.language as tl",
        f"from {tile.__module__} import {tile.__name__} as tile_fn",
        "from nonstop.kernels.launch import pdl_wait, prefetch_l2",
    ]
    return new, source, imports
