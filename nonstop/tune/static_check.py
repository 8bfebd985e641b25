"""Static rules for a candidate kernel file (an allow-list: what is not allowed is rejected).

A candidate is host code that computes pointers, strides and grids and launches Triton kernels. So:

* imports (module level only): ``triton`` (``jit``, ``cdiv``, ``next_power_of_2``,
  ``language``), ``triton.language`` (not ``inline_asm_elementwise``, timers or internals), ``torch``
  (dtypes, zeroed allocation ``zeros``/``zeros_like`` - never ``empty`` -, ``torch.cuda`` device facts:
  nothing that computes), ``math``,
  ``typing``, ``__future__``, and names from ``nonstop.kernels.*`` that are functions, Triton
  kernels or constants defined there (never modules, containers or the twins);
* module level: imports, function definitions (decorator ``triton.jit`` only, and only there: no
  runtime ``triton.jit(f)``, no nested kernels) and constants (no module-level state, so no cache
  across calls);
* nowhere: try/except (fallbacks), with (streams, modes), classes (lazy tensors), global/nonlocal,
  async, yield, imports inside functions, assignment to attributes or items (candidates do not modify
  the objects they get: outputs are written by kernels), ``exec``/``eval``/``compile``/``__import__``/
  ``getattr``/``open``/``globals``/``id`` ..., dunder or private attributes, frame and code attributes,
  module objects passed around; in host code no tensor methods that compute, copy, read values or
  reach storage (``data_ptr``, ``item``, ``copy_``, ``sum`` ...) and no mutating container methods;
  in ``@triton.jit`` functions no torch and no calls to host functions;
* ``launch(op, env)`` must exist at module level (a function, or a name imported from
  ``nonstop.kernels``), and the file must contain or import a Triton kernel.

The dynamic checks (``judge.py``) back every rule that matters: what slips through here is still run
in the sandbox and compared with the twin.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
from types import MappingProxyType

from nonstop.tune.allowed import (
    DTYPES,
    HOST_BUILTINS,
    KERNEL_ATTRS,
    KERNEL_BUILTINS,
    MODULES,
    TL_DTYPES,
    host_attrs,
    kernel_helpers,
    path_problem,
)

MAX_SOURCE = 200_000
JIT_ATTRS = KERNEL_ATTRS  # the name the tests and older callers use

# named in the messages of the most common attempts (the allow-lists reject them anyway)
BANNED_NAMES = set(
    """
    BaseException GeneratorExit KeyboardInterrupt SystemExit __import__ asyncio atexit breakpoint builtins
    classmethod compile concurrent copyright credits ctypes delattr dir eval exec exit format functools gc getattr
    globals hasattr hash help id importlib input inspect io license locals marshal memoryview multiprocessing
    nonstop np numpy object open operator os pathlib pickle print property quit random reload repr setattr shutil
    signal socket staticmethod subprocess super sys threading time traceback type vars weakref
""".split()
)
FRAME_PREFIXES = ("f_", "co_", "gi_", "cr_", "ag_", "tb_")
# builtins host code may not call: binding one of their names (a comprehension variable, a parameter) made it
# a "known" name for the whole function, so that its other uses reached the real builtin (iter, next, map)
SHADOWABLE_BUILTINS = frozenset(n for n in dir(builtins) if not n.startswith("_")) - HOST_BUILTINS


class _Problems(list):
    def add(self, node, msg: str) -> None:
        line = getattr(node, "lineno", None)
        text = f"line {line}: {msg}" if line else msg
        if text not in self and len(self) < 12:
            self.append(text)


def _chain(node) -> list[str] | None:
    """["torch", "cuda", "synchronize"] for ``torch.cuda.synchronize``; None unless a Name starts it."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id] + list(reversed(names))
    return None


def _is_const(node, consts: set[str], path_of) -> bool:
    """True for a constant expression: literals, tuples and arithmetic of them, names in ``consts``, an
    allowed dotted path (``tl.float32``, ``torch.bfloat16.itemsize``: ``path_of`` gives the module path of an
    attribute chain, or None when its head is no module alias or imported path, or the path is not allowed)
    and ``tl.constexpr(constant)``. Nothing else: an attribute chain off another object (a kernel, an
    imported function) would be read at import, out of the allow-list's reach."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Tuple):
        return all(_is_const(e, consts, path_of) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return _is_const(node.operand, consts, path_of)
    if isinstance(node, ast.BinOp):
        return _is_const(node.left, consts, path_of) and _is_const(node.right, consts, path_of)
    if isinstance(node, ast.Name):
        return node.id in consts
    if isinstance(node, ast.Attribute):  # tl.float32, torch.bfloat16
        return path_of(node) is not None
    if isinstance(node, ast.Call):  # tl.constexpr(3)
        return (
            path_of(node.func) == "triton.language.constexpr"
            and all(_is_const(a, consts, path_of) for a in node.args)
            and not node.keywords
        )
    return False


def _bound_names(fn: ast.FunctionDef) -> set[str]:
    """Every name ``fn`` binds anywhere inside it: parameters (its own, nested functions' and lambdas'),
    assignment and loop targets, comprehension variables, nested function names."""
    out = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(node.name)
    return out


def _in_module_decorator(node) -> bool:
    while node is not None:
        if getattr(node, "module_decorator", False):
            return True
        node = getattr(node, "parent", None)
    return False


def _type_position(node) -> bool:
    """True if ``node`` is the class argument of ``isinstance`` (alone or in a tuple there) or
    part of an annotation made of subscripts, tuples and ``|`` only: places a type is compared, never called."""
    parent = getattr(node, "parent", None)
    if isinstance(parent, ast.Tuple):
        node, parent = parent, getattr(parent, "parent", None)
    if isinstance(parent, ast.Call) and len(parent.args) == 2 and parent.args[1] is node:
        return isinstance(parent.func, ast.Name) and parent.func.id == "isinstance"
    while isinstance(parent, (ast.Tuple, ast.BinOp)) or (isinstance(parent, ast.Subscript) and parent.slice is node):
        node, parent = parent, getattr(parent, "parent", None)
    return (
        (isinstance(parent, ast.arg) and parent.annotation is node)
        or (isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and parent.returns is node)
        or (isinstance(parent, ast.AnnAssign) and parent.annotation is node)
    )


def _called(node: ast.Name) -> bool:
    """True if ``node`` is the function of a call, or the kernel of a ``kernel[grid](...)`` launch."""
    parent = getattr(node, "parent", None)
    if isinstance(parent, ast.Call) and parent.func is node:
        return True
    if isinstance(parent, ast.Subscript) and parent.value is node:
        grand = getattr(parent, "parent", None)
        return isinstance(grand, ast.Call) and grand.func is parent
    return False


def _literal(node) -> bool:
    try:
        ast.literal_eval(node)
        return True
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return False


def _plain(value) -> bool:
    """A constant a table may hold: numbers, strings, None, torch / Triton dtypes."""
    return (
        isinstance(value, (int, float, bool, str, type(None)))
        or type(value).__name__ == "dtype"
        or "dtype" in type(value).__name__
    )


def _kernel_object(obj) -> str | None:
    """Why ``obj`` (imported from nonstop.kernels) may not be imported, or None if it may."""
    if isinstance(obj, (int, float, bool, str, type(None))):
        return None
    if inspect.ismodule(obj):
        return "a module"
    if isinstance(obj, tuple) and len(obj) and all(_plain(v) for v in obj):
        return None  # a table of constants (a dict or list would be state a kernel could change)
    if isinstance(obj, MappingProxyType) and len(obj) and all(_plain(v) for v in [*obj, *obj.values()]):
        return None  # a read-only mapping of constants
    if isinstance(obj, (dict, list, set, bytearray)):
        return "a mutable container (a table a candidate may import is a tuple)"
    module = getattr(obj, "__module__", None) or getattr(getattr(obj, "fn", None), "__module__", "") or ""
    fn = getattr(obj, "fn", obj)
    if type(obj).__name__ in ("JITFunction", "InterpretedFunction", "constexpr") or type(obj).__name__.endswith(
        "JITFunction"
    ):
        return (
            None
            if (getattr(fn, "__module__", "") or "").startswith("nonstop.kernels") or type(obj).__name__ == "constexpr"
            else "a kernel from outside nonstop.kernels"
        )
    if inspect.isfunction(obj):
        if not module.startswith("nonstop.kernels"):
            return f"defined in {module}, not in nonstop.kernels"
        if id(obj) not in kernel_helpers():
            return (
                "not a host function a candidate may call (allowed: the KERNELS launchers and the helpers they call, "
                "never launcher or workspace)"
            )
        return None
    return f"a {type(obj).__name__}"


class _Checker:
    def __init__(self, source: str):
        self.source = source
        self.p = _Problems()
        self.modules: dict[str, str] = {}  # alias -> module of ``allowed.MODULES`` ("torch", "triton.language" ...)
        self.imported: dict[str, tuple] = {}  # name -> ("path", "torch.float32") or ("nonstop", object)
        self.consts: set[str] = set()
        self.functions: dict[str, ast.FunctionDef] = {}
        self.jit: set[str] = set()
        self.launch_alias: str | None = None

    # ------------------------------------------------------------------ module level
    def module(self, tree: ast.Module) -> None:
        self.functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        for i, node in enumerate(tree.body):
            if (
                i == 0
                and isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.import_(node)
            elif isinstance(node, ast.FunctionDef):
                if node.decorator_list:
                    self.decorators(node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                self.constant(node)
            else:
                self.p.add(
                    node,
                    f"module-level {type(node).__name__} is not allowed: a candidate's module holds imports, "
                    "functions and constants only (no state kept across calls)",
                )

    def import_(self, node) -> None:
        importable = ", ".join(sorted(m for m in MODULES if m != "__future__"))
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name not in MODULES or a.name == "__future__":
                    self.p.add(
                        node, f"import {a.name} is not allowed (allowed: {importable} and names from nonstop.kernels)"
                    )
                elif a.asname is None:
                    self.modules[a.name.split(".")[0]] = a.name.split(".")[0]
                else:
                    self.modules[a.asname] = a.name
            return
        mod = node.module or ""
        if node.level:
            self.p.add(node, "relative imports are not allowed")
            return
        for a in node.names:
            name = a.asname or a.name
            if a.name == "*":
                self.p.add(node, "import * is not allowed")
            elif mod in MODULES:
                if a.name not in MODULES[mod]:
                    names = ", ".join(sorted(MODULES[mod]))
                    self.p.add(node, f"from {mod} import {a.name} is not allowed (allowed from {mod}: {names})")
                elif f"{mod}.{a.name}" in MODULES:
                    self.modules[name] = f"{mod}.{a.name}"
                elif mod != "__future__":
                    self.imported[name] = ("path", f"{mod}.{a.name}")
                    if (mod == "torch" and a.name in DTYPES) or (mod == "triton.language" and a.name in TL_DTYPES):
                        self.consts.add(name)
            elif mod == "nonstop.kernels" or mod.startswith("nonstop.kernels."):
                self.kernel_import(node, mod, a.name, name)
            else:
                self.p.add(
                    node,
                    f"from {mod} import {a.name} is not allowed (allowed: {importable}, names from nonstop.kernels)",
                )

    def kernel_import(self, node, mod: str, attr: str, name: str) -> None:
        try:
            obj = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as exc:
            self.p.add(node, f"from {mod} import {attr}: {exc}")
            return
        why = _kernel_object(obj)
        if why:
            self.p.add(
                node,
                f"from {mod} import {attr}: {why} (only functions, Triton kernels and constants of "
                "nonstop.kernels may be imported)",
            )
            return
        self.imported[name] = ("nonstop", obj)
        if type(obj).__name__ in ("JITFunction", "InterpretedFunction") or type(obj).__name__.endswith("JITFunction"):
            self.jit.add(name)
        elif type(obj).__name__ == "constexpr" or not callable(obj):
            self.consts.add(name)

    def decorators(self, node: ast.FunctionDef) -> None:
        for d in node.decorator_list:
            target = d.func if isinstance(d, ast.Call) else d
            c = _chain(target)
            resolved = self.resolve(c) if c else None
            if resolved == "triton.jit":
                self.jit.add(node.name)
                if isinstance(d, ast.Call) and (d.args or any(not _literal(k.value) for k in d.keywords)):
                    self.p.add(d, "triton.jit(...) takes constant arguments only")
                d.module_decorator = True  # type: ignore[attr-defined]
                continue
            self.p.add(
                d, f"decorator {ast.unparse(d)} is not allowed (triton.jit only; no autotune, heuristics or caches)"
            )

    def resolve(self, chain: list[str]) -> str | None:
        head = chain[0]
        if head in self.modules:
            return ".".join([self.modules[head]] + chain[1:])
        if head in self.imported and self.imported[head][0] == "path":
            return ".".join([self.imported[head][1]] + chain[1:])
        return None

    def allowed_path(self, node) -> str | None:
        """The module path an attribute chain (or name) names, when its head is a module alias or an imported
        path and the path is within ``allowed.MODULES``; else None."""
        chain = _chain(node)
        full = self.resolve(chain) if chain else None
        return full if full is not None and path_problem(full.split(".")) is None else None

    def plain_annotation(self, node) -> bool:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return True  # a string annotation is never evaluated
        if isinstance(node, ast.Name):
            return node.id in ("int", "float", "bool", "str")
        return self.allowed_path(node) is not None

    def constant(self, node) -> None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        value = node.value
        if isinstance(node, ast.AnnAssign) and not self.plain_annotation(node.annotation):
            self.p.add(
                node,
                f"the annotation {ast.unparse(node.annotation)} is not allowed: a module-level annotation is "
                "evaluated at import (int, float, bool, str or an allowed path such as tl.constexpr)",
            )
            return
        for t in targets:
            if not isinstance(t, ast.Name):
                self.p.add(node, "module-level assignment to anything but a name is not allowed")
                return
        names = [t.id for t in targets]
        if (
            value is not None
            and isinstance(value, ast.Name)
            and (value.id in self.functions or value.id in self.imported)
            and names == ["launch"]
        ):
            self.launch_alias = value.id
            return
        if value is None or not _is_const(value, self.consts, self.allowed_path):
            self.p.add(
                node,
                f"module-level {', '.join(names)} must be a constant (numbers, strings, tuples, dtypes, "
                "tl.constexpr): no module-level state",
            )
            return
        self.consts.update(names)

    # ------------------------------------------------------------------ everywhere
    def everywhere(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                child.parent = node  # type: ignore[attr-defined]
        for node in ast.walk(tree):
            self.node(node)

    def node(self, node) -> None:
        forbidden = {
            ast.Try: "try/except (no fallbacks: a kernel must work or fail)",
            ast.With: "with blocks (streams, modes, contexts)",
            ast.AsyncWith: "async with",
            ast.ClassDef: "class definitions",
            ast.Global: "global (no state across calls)",
            ast.Nonlocal: "nonlocal",
            ast.AsyncFunctionDef: "async functions",
            ast.Await: "await",
            ast.AsyncFor: "async for",
            ast.Yield: "yield",
            ast.YieldFrom: "yield from",
        }
        forbidden[ast.Match] = "match statements (a class pattern reads any attribute)"
        if hasattr(ast, "TryStar"):
            forbidden[ast.TryStar] = "try/except*"
        for cls, what in forbidden.items():
            if isinstance(node, cls):
                self.p.add(node, f"{what} are not allowed in a candidate")
                return
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not isinstance(getattr(node, "parent", None), ast.Module):
            self.p.add(node, "imports inside functions are not allowed (module level only)")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, (ast.Attribute, ast.Subscript)):
                        self.p.add(
                            node,
                            f"assignment to {ast.unparse(sub)} is not allowed: a candidate does not modify "
                            "the objects it gets (kernels write the outputs)",
                        )
                        break
        elif isinstance(node, ast.Name):
            if node.id in BANNED_NAMES or node.id.startswith("__"):
                self.p.add(node, f"the name {node.id!r} is not allowed in a candidate")
            elif node.id in self.modules or self.imported.get(node.id, ("",))[0] == "path":
                self.module_use(node)
        elif isinstance(node, ast.Attribute):
            value = node.value
            if isinstance(value, ast.Name) and (
                value.id in self.jit or value.id in self.functions or self.imported.get(value.id, ("",))[0] == "nonstop"
            ):
                self.p.add(
                    node,
                    f"attribute access on {value.id} is not allowed: a kernel or function of the file or of "
                    f"nonstop.kernels may only be called (or launched as {value.id}[grid](...))",
                )
            if node.attr.startswith("_"):
                self.p.add(node, f"private or dunder attribute .{node.attr} is not allowed")
            elif node.attr.startswith(FRAME_PREFIXES) and _chain(node) and _chain(node)[0] not in self.modules:
                self.p.add(node, f"attribute .{node.attr} (frame / code introspection) is not allowed")
        elif isinstance(node, ast.FunctionDef):
            if node.decorator_list and not isinstance(getattr(node, "parent", None), ast.Module):
                self.p.add(
                    node,
                    f"decorators on the nested function {node.name} are not allowed "
                    "(kernels are module-level @triton.jit functions)",
                )
            for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
                if not _is_const(d, self.consts, self.allowed_path):
                    self.p.add(
                        d, f"default value {ast.unparse(d)} of {node.name}() must be a constant (no state across calls)"
                    )

    def module_use(self, node: ast.Name) -> None:
        """A module alias or a name imported from an allowed module may only start an attribute chain that stays
        inside ``allowed.MODULES`` (``from triton import cdiv; cdiv.x`` is as out of reach as ``triton.cdiv.x``)."""
        top = node
        while isinstance(getattr(top, "parent", None), ast.Attribute) and top.parent.value is top:
            top = top.parent
        chain = _chain(top) if isinstance(top, ast.Attribute) else [node.id]
        full = self.resolve(chain) or node.id
        if full == "triton.jit" and not _in_module_decorator(top):
            self.p.add(node, "triton.jit is only allowed as the decorator of a module-level function")
        if full == "torch.Tensor" and not _type_position(top):
            self.p.add(
                node,
                "torch.Tensor is allowed only as a type (isinstance(x, torch.Tensor), an annotation): called, even "
                "through another name, it allocates uninitialised memory (use torch.zeros)",
            )
        problem = path_problem(full.split("."))
        if problem:
            hint = " (compute belongs in Triton kernels)" if full.startswith("torch.") else ""
            self.p.add(node, f"{full} is not allowed in a candidate: {problem}{hint}")

    # ------------------------------------------------------------------ host code and kernels
    def functions_(self) -> None:
        for name, fn in self.functions.items():
            if name in self.jit:
                self.kernel(fn)
            else:
                self.host(fn)

    def host(self, fn: ast.FunctionDef) -> None:
        module_level = (set(self.functions) | set(self.imported) | self.consts) - set(self.modules)
        callables = (
            set(self.functions)
            | self.jit
            | {n for n, e in self.imported.items() if e[0] == "nonstop" and callable(e[1])}
        ) - self.consts
        bound = _bound_names(fn)
        self.shadowed_builtins(fn, bound)
        known = module_level | set(self.modules) | bound
        attrs = host_attrs()
        for node in ast.walk(fn):
            if isinstance(node, ast.AugAssign):
                self.p.add(
                    node,
                    f"augmented assignment ({ast.unparse(node).strip()}) is not allowed in host code: on a list or "
                    "dict it changes the object in place (write x = x + y)",
                )
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                parent = getattr(node, "parent", None)
                if node.id in self.jit and isinstance(parent, ast.Call) and parent.func is node:
                    self.p.add(
                        node,
                        f"the Triton kernel {node.id} is called from host code: launch it as {node.id}[grid](...) "
                        "(called, under TRITON_INTERPRET=1 its body runs as host Python on the objects it gets)",
                    )
                elif node.id in callables and not _called(node):
                    self.p.add(
                        node,
                        f"{node.id} may only be called (or launched as {node.id}[grid](...)), "
                        "not passed around or inspected",
                    )
                elif node.id not in known | HOST_BUILTINS | BANNED_NAMES and not node.id.startswith("__"):
                    self.p.add(
                        node,
                        f"the name {node.id!r} is not allowed in a candidate (host code may call the builtins "
                        f"{', '.join(sorted(HOST_BUILTINS))})",
                    )
            if not isinstance(node, ast.Attribute):
                continue
            chain = _chain(node)
            if chain and chain[0] in self.modules:
                continue  # module_use checks it
            if isinstance(node.value, ast.Name) and node.value.id in module_level:
                self.p.add(
                    node,
                    f"attribute access on {node.value.id} is not allowed "
                    f"(launch kernels as {node.value.id}[grid](...))",
                )
            elif node.attr not in attrs:
                self.p.add(
                    node,
                    f".{node.attr} is not allowed in host code: host code reads the op, the env, its buffers, caches "
                    "and batch, configs and tensors' metadata and views (no torch compute, copies, value reads, "
                    "storage access, or changes to the objects a launch gets); allowed attributes: "
                    "nonstop/tune/allowed.py HOST_ATTRS",
                )

    def shadowed_builtins(self, fn: ast.FunctionDef, bound: set[str]) -> None:
        """A builtin's name the function may not call, bound in it: the binding made the name "known" in the
        whole function, so that its other uses (outside a comprehension, before an assignment) reached the
        real builtin."""
        for name in sorted(bound & SHADOWABLE_BUILTINS):
            self.p.add(
                fn,
                f"{fn.name} binds the builtin name {name!r}: a name bound anywhere in a function counts as its own "
                "everywhere in it, so a builtin the function may not call must not be bound either",
            )

    def kernel(self, fn: ast.FunctionDef) -> None:
        local = {a.arg for a in fn.args.args + fn.args.posonlyargs + fn.args.kwonlyargs}
        for node in ast.walk(fn):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                local.add(node.id)
            elif isinstance(node, (ast.comprehension,)):
                for sub in ast.walk(node.target):
                    if isinstance(sub, ast.Name):
                        local.add(sub.id)
        self.shadowed_builtins(fn, _bound_names(fn) | local)
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and node.attr not in JIT_ATTRS:
                chain = _chain(node)
                if not (chain and chain[0] in self.modules):
                    self.p.add(node, f".{node.attr} is not a Triton attribute (kernel {fn.name})")
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                n = node.id
                if n in local or n in self.consts or n in self.jit or n in KERNEL_BUILTINS:
                    continue
                if n in self.modules:
                    if self.modules[n] == "torch":
                        self.p.add(node, f"torch inside the Triton kernel {fn.name} is not allowed")
                    continue
                entry = self.imported.get(n)
                if entry is not None and entry[0] == "path" and (entry[1].startswith("triton.") or n in self.consts):
                    continue
                self.p.add(
                    node,
                    f"{fn.name} is a Triton kernel: it may only use Triton functions, constants and its own "
                    f"variables, not {n!r}",
                )

    # ------------------------------------------------------------------ launch
    def launch(self) -> None:
        fn = self.functions.get("launch")
        if fn is not None:
            if "launch" in self.jit:
                self.p.add(fn, "launch must be a Python function that launches kernels, not a Triton kernel")
            self.signature(fn)
        elif self.launch_alias in self.functions:
            if self.launch_alias in self.jit:  # under the interpreter its body would run as host code, unchecked
                self.p.add(None, "launch must be a Python function that launches kernels, not a Triton kernel")
            self.signature(self.functions[self.launch_alias])
        elif "launch" in self.imported or self.launch_alias in self.imported:
            entry = self.imported.get("launch") or self.imported[self.launch_alias]
            obj = entry[1] if entry[0] == "nonstop" else None
            if not callable(obj) or "launch" in self.jit or self.launch_alias in self.jit:
                self.p.add(None, "launch must be a Python launcher function (op, env)")
                return
            try:
                inspect.signature(obj).bind(None, None)
            except TypeError:
                self.p.add(None, f"launch {getattr(obj, '__name__', '')} does not take (op, env)")
        else:
            self.p.add(
                None,
                "no launch(op, env) at module level: a candidate defines launch with the signature of the "
                "op's launcher",
            )
        if not self.jit and not any(e[0] == "nonstop" and callable(e[1]) for e in self.imported.values()):
            self.p.add(
                None,
                "no Triton kernel: a candidate defines a @triton.jit kernel (or uses the kernels of nonstop.kernels)",
            )

    def signature(self, fn: ast.FunctionDef) -> None:
        a = fn.args
        positional = len(a.posonlyargs) + len(a.args)
        required = positional - len(a.defaults)
        if required > 2 or (positional < 2 and a.vararg is None) or any(d is None for d in a.kw_defaults):
            self.p.add(fn, f"{fn.name} must be callable as launch(op, env)")


def static_check(source: str, kind: str | None = None) -> list[str]:
    """The rule violations of a candidate's source (empty: it may go on to the dynamic checks)."""
    if len(source) > MAX_SOURCE:
        return [f"the file has {len(source)} characters; at most {MAX_SOURCE}"]
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [f"syntax error at line {exc.lineno}: {exc.msg}" + (f": {exc.text.strip()}" if exc.text else "")]
    except (RecursionError, MemoryError, ValueError) as exc:
        return [f"the file cannot be parsed: {type(exc).__name__}"]
    c = _Checker(source)
    try:
        c.module(tree)
        c.everywhere(tree)
        c.functions_()
        c.launch()
    except RecursionError:
        c.p.add(None, "the file nests too deeply to check")
    return list(c.p)
