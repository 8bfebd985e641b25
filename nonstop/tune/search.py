"""The ``search`` proposer: the current kernel's own tunables (tile sizes, warps, pipeline stages, split
factors), one change at a time from the best configuration so far (coordinate descent; the best moves
only when a GPU times a faster one).

Two kinds of candidate file, both plain candidates that go through the same verifier:
* the built-in launcher takes tile overrides (``linear_residual``, ``lm_head``, ``mlp``: ``**blocks``;
  ``gqa_attn``, ``mla_attn``: ``split_tokens``): a wrapper that calls it with other values;
* otherwise the launcher's source with the keyword arguments of its kernel launch rewritten
  (``num_warps``, ``NUM_STAGES``, loop tile sizes halved or doubled), its free names imported from its
  module; a helper that hands out persistent scratch (``expert_scratch``: out of a candidate's reach, see
  ``allowed.py``) is copied in with its ``workspace(...)`` calls made per-call ``torch.zeros``, and so are
  the launcher's own ``workspace(...)`` calls (``attnres_mix_norm``); a launcher that launches one
  single-phase kernel also varies its tile order (``tile_order.py``: the candidate carries a copy of the
  launcher kernel with the tile index permuted).
"""

from __future__ import annotations

import ast
import builtins
import inspect
import textwrap

from nonstop.tune.allowed import ZEROED_HELPERS, returns_workspace
from nonstop.tune.candidate import Candidate, RoundContext
from nonstop.tune.tile_order import ORDERS, ordered_kernel, ordered_source

# keyword overrides of launchers that take them, with the values to try
OVERRIDES = {
    "linear_residual": {
        "BLOCK_N": [16, 32, 64, 128],
        "BLOCK_K": [64, 128, 256, 512],
        "NUM_STAGES": [1, 2, 3, 4],
        "num_warps": [2, 4, 8],
    },
    "mlp": {
        "BLOCK_I": [16, 32, 64],
        "BLOCK_K": [64, 128, 256],
        "BLOCK_N": [16, 32, 64],
        "BLOCK_KD": [64, 128, 256],
        "NUM_STAGES": [1, 2, 3],
        "num_warps": [4, 8],
    },
    "gqa_attn": {"split_tokens": [64, 128, 256, 512, 1024]},
    "mla_attn": {"split_tokens": [64, 128, 256, 512, 1024]},
}
OVERRIDES["lm_head"] = OVERRIDES["linear_residual"]
# keyword arguments of a kernel launch that only change speed: constants to try, or "scale" (x 1/2, x 2)
LAUNCH_TUNABLES = {
    "num_warps": [2, 4, 8, 16],
    "NUM_STAGES": [1, 2, 3, 4],
    "num_stages": [1, 2, 3, 4],
    "BLOCK_N": "scale",
    "BLOCK_K": "scale",
    "BLOCK_I": "scale",
    "BLOCK_KD": "scale",
    "BLOCK_S": "scale",
    "BLOCK_V": "scale",
    "tile_order": ["identity", *ORDERS],  # not a launch keyword: the launcher kernel's tile order
}


def _builtin(kind: str):
    from nonstop.kernels import KERNELS

    return KERNELS[kind]


# ----------------------------------------------------------------------------- wrapper candidates


def wrapper_source(kind: str, overrides: dict) -> str:
    fn = _builtin(kind)
    args = ", ".join(f"{k}={v!r}" for k, v in sorted(overrides.items()))
    return textwrap.dedent(f'''\
        """search candidate for {kind}: the built-in launcher with {args or "its defaults"}."""

        from {fn.__module__} import {fn.__name__} as builtin


        def launch(op, env):
            builtin(op, env, {args})
        ''')


# ----------------------------------------------------------------------------- rewritten launchers


class _Launches(ast.NodeVisitor):
    """Keyword arguments of ``kernel[grid](...)`` calls (the Triton launches) in a function."""

    def __init__(self):
        self.keywords: list[ast.keyword] = []

    def visit_Call(self, node):
        if isinstance(node.func, ast.Subscript):
            self.keywords += [k for k in node.keywords if k.arg in LAUNCH_TUNABLES]
        self.generic_visit(node)


class _NoItemAssignment(ast.NodeTransformer):
    """``d["k"] = v`` on a local dict -> ``d = {**d, "k": v}`` (a candidate may not assign items)."""

    def visit_Assign(self, node):
        t = node.targets[0]
        if len(node.targets) == 1 and isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
            merged = ast.Dict(keys=[None, t.slice], values=[ast.Name(t.value.id, ast.Load()), node.value])
            return ast.Assign(targets=[ast.Name(t.value.id, ast.Store())], value=merged)
        return node


class _PerCallScratch(ast.NodeTransformer):
    """``workspace(name, numel, dtype, device[, zero])`` -> ``torch.zeros(numel, dtype=dtype, device=device)``."""

    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "workspace":
            _, numel, dtype, device = node.args[:4]
            zeros = ast.Attribute(ast.Name("torch", ast.Load()), "zeros", ast.Load())
            return ast.Call(zeros, [numel], [ast.keyword("dtype", dtype), ast.keyword("device", device)])
        return node


def _per_call_copy(obj) -> ast.FunctionDef:
    """The source of a scratch helper with its persistent workspaces made per-call zeroed tensors."""
    func = ast.parse(textwrap.dedent(inspect.getsource(obj))).body[0]
    func.decorator_list = []
    func = _PerCallScratch().visit(func)
    ast.fix_missing_locations(func)
    return func


def _free_names(fn: ast.FunctionDef) -> list[str]:
    bound = {a.arg for a in fn.args.args + fn.args.posonlyargs + fn.args.kwonlyargs}
    bound |= {a.arg for a in (fn.args.vararg, fn.args.kwarg) if a is not None}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
    loads = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return sorted(loads - bound - set(dir(builtins)))


def launch_tunables(kind: str) -> dict[str, str]:
    """{keyword: its expression in the built-in launcher} for the tunable launch keywords, and
    ``tile_order: identity`` when the launcher launches one single-phase kernel."""
    fn = _builtin(kind)
    source = textwrap.dedent(inspect.getsource(fn))
    finder = _Launches()
    finder.visit(ast.parse(source))
    out = {k.arg: ast.unparse(k.value) for k in finder.keywords}
    if ordered_kernel(inspect.getmodule(fn), source):
        out["tile_order"] = "identity"
    return out


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit_Name(self, node):
        return ast.Name(self.new, node.ctx) if node.id == self.old else node


def rewritten_source(kind: str, overrides: dict[str, str]) -> str:
    """The built-in launcher of ``kind`` renamed ``launch`` with keyword expressions replaced."""
    import triton.language as tl

    fn = _builtin(kind)
    module = inspect.getmodule(fn)
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    func = tree.body[0]
    func.name = "launch"
    func.decorator_list = []
    finder = _Launches()
    finder.visit(func)
    for k in finder.keywords:
        if k.arg in overrides:
            k.value = ast.parse(overrides[k.arg], mode="eval").body
    func = _NoItemAssignment().visit(func)
    func = _PerCallScratch().visit(func)  # a launcher that takes scratch itself (attnres) gets it per call
    kernels, imports = [], []
    order = overrides.get("tile_order", "identity")
    if order != "identity":
        old = ordered_kernel(module, textwrap.dedent(inspect.getsource(fn)))
        new, source, imports = ordered_source(getattr(module, old), order)
        func = _Rename(old, new).visit(func)
        kernels.append(source)
    ast.fix_missing_locations(func)
    names, copied = [], []
    pending = [n for n in _free_names(func) if not (kernels and n == new)]
    while pending:
        name = pending.pop(0)
        obj = getattr(module, name)
        if obj is tl:
            imports.append(f"import triton.language as {name}")
        elif inspect.ismodule(obj):
            imports.append(f"import {obj.__name__}" + (f" as {name}" if obj.__name__ != name else ""))
        elif inspect.isfunction(obj) and returns_workspace(obj) and name not in ZEROED_HELPERS:
            copied.append(_per_call_copy(obj))
            seen = set(pending) | set(names) | {i.split()[-1] for i in imports}
            pending += [n for n in _free_names(copied[-1]) if n not in seen and n != name]
        else:
            names.append(name)
    change = ", ".join(f"{k}={v}" for k, v in sorted(overrides.items()))
    head = f'"""search candidate for {kind}: the built-in launcher with {change}."""\n\n'
    body = "\n".join(sorted(set(imports)))
    if names:
        body += f"\n\nfrom {module.__name__} import {', '.join(sorted(set(names)))}"
    parts = [k.strip() for k in kernels] + [ast.unparse(f) for f in [*copied, func]]
    return head + body + "\n\n\n" + "\n\n\n".join(parts) + "\n"


def _scaled(expr: str, factor: str) -> str:
    return f"max(16, ({expr}) // 2)" if factor == "half" else f"({expr}) * 2"


# ----------------------------------------------------------------------------- the proposer


class SearchProposer:
    """One-change-at-a-time variants of the built-in kernel around the best configuration so far."""

    name = "search"
    stopped = None  # it stops by proposing nothing (every move tried)

    def __init__(self, kind: str):
        self.kind = kind
        self.tried: set[tuple] = set()
        self.best: dict = {}
        self.best_total: float | None = None  # summed median ms of the best configuration (GPU)
        self.by_id: dict[str, dict] = {}
        fn = _builtin(kind)
        params = inspect.signature(fn).parameters.values()
        self.wrapper = kind in OVERRIDES and any(p.kind == p.VAR_KEYWORD or p.name in OVERRIDES[kind] for p in params)
        self.defaults = {} if self.wrapper else launch_tunables(kind)

    def moves(self) -> list[dict]:
        """Configurations one change away from ``self.best`` (not tried yet)."""
        out = []
        if self.wrapper:
            for key, values in OVERRIDES[self.kind].items():
                out += [{**self.best, key: v} for v in values if self.best.get(key) != v]
        else:
            for key, expr in self.defaults.items():
                options = LAUNCH_TUNABLES[key]
                if options == "scale":
                    values = [_scaled(expr, f) for f in ("half", "double")]
                else:
                    values = [str(v) for v in options if str(v) != expr]
                out += [{**self.best, key: v} for v in values if self.best.get(key) != v]
        return [m for m in out if tuple(sorted(m.items())) not in self.tried]

    def source(self, config: dict) -> str:
        return wrapper_source(self.kind, config) if self.wrapper else rewritten_source(self.kind, config)

    def propose(self, context: RoundContext, n: int) -> list[Candidate]:
        self.learn(context)
        out = []
        for config in self.moves()[:n]:
            self.tried.add(tuple(sorted(config.items())))
            cid = f"r{context.round}c{len(out) + 1}"
            self.by_id[cid] = config
            out.append(
                Candidate(cid, self.source(config), self.name, ", ".join(f"{k}={v}" for k, v in sorted(config.items())))
            )
        return out

    def learn(self, context: RoundContext) -> None:
        """Move the centre to the fastest configuration timed so far (the shapes' medians summed) when it
        beats the built-in kernel."""
        if self.best_total is None and context.baseline:
            self.best_total = sum(t["median_ms"] for t in context.baseline.values())
        for outcome in context.previous:
            config = self.by_id.get(outcome.candidate.id)
            if config is None or not outcome.accepted or not outcome.timing:
                continue
            total = sum(t["median_ms"] for t in outcome.timing.values())
            if self.best_total is None or total < self.best_total:
                self.best_total, self.best = total, config
