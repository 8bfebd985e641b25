"""Reading the tuning store: the verified kernels ``nonstop tune`` kept, used by the ``superop`` executor.

The store is one JSON file (default ``~/.cache/nonstop/tuning.json``; ``NONSTOP_TUNING_STORE`` names
another, ``off`` disables it) written by ``nonstop/tune/store.py``::

    {"version": 1, "entries": {DEVICE: {KIND: {SHAPE: {"kernel": "kernels/<kind>-<sha>.py",
                                                       "sha256": ..., "proposer": ..., ...}}}}}

DEVICE is ``device_name`` (the CUDA device name, or "cpu" for the Triton interpreter), SHAPE is
``shape_key(op, B, T, act_dtype)``: the step shape, the op's weight shapes, the dtypes and a fingerprint of
what else the op computes with (activation, eps, softmax scale, routing: a winner verified on one model never
runs on another that computes otherwise). Ops of one model differing only in ``VARIANT_ATTRS`` share a key;
an entry's ``variants`` lists those its verification covered (``op_variant``), and the others run the built-in
kernel (a deep model's later variants, which the verification's cut model does not hold). A kernel file is a
candidate that passed ``nonstop tune verify`` at that shape on that device; its SHA-256 is checked
again before it is imported, and a file that is missing, altered or fails to import is skipped with
a warning (the built-in kernel runs). A store file that cannot be used (unreadable, not JSON, not a
tuning store, an entry without its kernel or with a field of the wrong type: ``entry_problem``) is reported
in one line and read as empty by ``load_store``; ``read_store`` (the writer's
and ``tune --list``'s reader) raises ``StoreError`` instead, so the file is never replaced.

``use_tuned(table, program, device, stats)`` returns the executor's kernel table with every kind that
has stored winners for this device wrapped: a call looks up (op shape, B, T) and runs the stored
``launch`` or, for shapes without one, the built-in kernel. This module reads only; it imports nothing
from ``nonstop.tune``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import logging
import os
import warnings
from pathlib import Path

import torch

STORE_ENV = "NONSTOP_TUNING_STORE"
STORE_VERSION = 1
log = logging.getLogger("nonstop.tuning")
_warned: set[str] = set()  # store problems already reported by ``load_store`` (once per process each)


class StoreError(ValueError):
    """The tuning store file exists but cannot be used: unreadable, not JSON, or not a tuning store. A
    ``ValueError``, so the commands report it as a one-line user error (``commands/errors.py``)."""


def store_path() -> Path | None:
    """The store file: ``$NONSTOP_TUNING_STORE``, else ``tuning.json`` in the cache root (``cache_dirs.cache_root``:
    ``$NONSTOP_CACHE_DIR``, else ``$XDG_CACHE_HOME/nonstop``, default ``~/.cache/nonstop``), as the other cached
    files; None when the variable is "off", "0" or empty."""
    from nonstop.cache_dirs import cache_root

    value = os.environ.get(STORE_ENV)
    if value is not None:
        return None if value.strip().lower() in ("", "0", "off", "none") else Path(value).expanduser()
    return cache_root() / "tuning.json"


def device_name(device) -> str:
    """The store's device key: the CUDA device name (e.g. "NVIDIA H100 80GB HBM3"), or "cpu"."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


# attributes that tell apart ops of one kind in one model with the same weight shapes (attention residuals'
# block counts, a projection that starts a block or adds to it): they share a store key, and an entry lists the
# ones its verification covered (``op_variant``)
VARIANT_ATTRS = ("accumulate", "n_blocks", "store_block")
_PLAIN = (int, float, bool, str, type(None), tuple, list)


def op_variant(op) -> str:
    """ "accumulate=True", "n_blocks=2 store_block=None", "" : the op's ``VARIANT_ATTRS``."""
    return " ".join(f"{k}={op.attrs[k]!r}" for k in VARIANT_ATTRS if k in op.attrs)


def _semantics(op, keyed: set) -> str:
    """ " attrs=1a2b3c4d5e": a hash of the op's other static attributes (activation, betas, eps, softmax scale,
    RoPE magnitude and layout, the MoE routing config; not ``keyed``, already in the key, nor its cache layer),
    "" when it has none."""
    import dataclasses

    items = []
    for k, v in sorted(op.attrs.items()):
        if k in keyed or k in VARIANT_ATTRS or k == "cache_layer":
            continue
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            items.append((k, repr(v)))
        elif isinstance(v, _PLAIN):
            items.append((k, repr(v)))
    return " attrs=" + hashlib.sha256(repr(items).encode()).hexdigest()[:10] if items else ""


def shape_key(op, B: int, T: int, act_dtype=None) -> str:
    """ "B1xT1 A_log=4:float32 w=2048x2048 bfloat16 attrs=1a2b3c4d5e": the step shape, the op's weight shapes
    (by role, sorted) - or, for an op without weights (attention), its integer attributes - the dtype of its
    activations ``act_dtype`` (None: of its first floating-point weight), and a hash of its other attributes
    (``_semantics``); a weight of another dtype than that one names its own (a bf16 model's fp32 ``A_log``,
    router bias or ``inv_freq``, packed uint8 experts), so a winner verified at one model dtype never runs at
    another."""
    dtype = act_dtype or next((t.dtype for _, t in sorted(op.weights.items()) if t.is_floating_point()), None)
    keyed: set = set()
    if op.weights:
        what = " ".join(
            f"{n}={'x'.join(map(str, t.shape))}" + ("" if t.dtype == dtype else f":{_dtype_name(t.dtype)}")
            for n, t in sorted(op.weights.items())
        )
    else:
        keyed = {
            k
            for k, v in op.attrs.items()
            if isinstance(v, int) and not isinstance(v, bool) and k != "cache_layer" and k not in VARIANT_ATTRS
        }
        what = " ".join(f"{k}={op.attrs[k]}" for k in sorted(keyed))
    return f"B{B}xT{T} {what} {_dtype_name(dtype)}{_semantics(op, keyed)}"


def program_shape_key(program, op, B: int, T: int) -> str:
    """``shape_key`` of ``op`` in ``program`` (a lowered Program): its activations' dtype is its first input
    buffer's, as the executor finds it at run time."""
    return shape_key(op, B, T, program.buffers[op.reads[0]].torch_dtype(program.dtype))


def _empty() -> dict:
    return {"version": STORE_VERSION, "entries": {}}


def _layout_problem(data) -> str | None:
    """Why ``data`` is not a tuning store's JSON (see the module docstring), None when it is one."""
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        return 'it is not a tuning store (expected {"version": 1, "entries": {...}})'
    if data.get("version", STORE_VERSION) != STORE_VERSION:
        return f"it has version {data['version']!r}; this nonstop reads version {STORE_VERSION}"
    for device, kinds in data["entries"].items():
        if not isinstance(kinds, dict):
            return f"entries[{device!r}] is not an object"
        for kind, shapes in kinds.items():
            if not isinstance(shapes, dict):
                return f"entries[{device!r}][{kind!r}] is not an object"
            for key, entry in shapes.items():
                problem = entry_problem(entry)
                if problem:
                    return f"entries[{device!r}][{kind!r}][{key!r}] {problem}"
    return None


_NUMBER_OR_NULL = ((int, float, type(None)), "a number or null")
# the fields of an entry its readers rely on: name -> (accepted types, what they are in words, required)
ENTRY_FIELDS = {
    "kernel": (str, "text", True),
    "sha256": (str, "text", True),
    "proposer": (str, "text", False),
    "candidate": (str, "text", False),
    "created": (str, "text", False),
    "round": (int, "an integer", False),
    "rules": (int, "an integer", False),
    "timed": (bool, "true or false", False),
    "time_ms": (*_NUMBER_OR_NULL, False),
    "builtin_ms": (*_NUMBER_OR_NULL, False),
    "floor_ms": (*_NUMBER_OR_NULL, False),
    "variants": (list, "a list", False),
}


def entry_problem(entry) -> str | None:
    """Why one store entry cannot be read ("has no 'kernel'", "'time_ms' is str, not a number or null"),
    None when its fields (``ENTRY_FIELDS``) are there and of their types."""
    if not isinstance(entry, dict):
        return "is not an object"
    for name, (types, words, required) in ENTRY_FIELDS.items():
        if name not in entry:
            if required:
                return f"has no {name!r}"
            continue
        value = entry[name]
        is_bool = isinstance(value, bool)
        if not isinstance(value, types) or (is_bool and types is not bool):
            return f"has {name!r} {type(value).__name__} {value!r:.40}, not {words}"
    if entry.get("timed") and entry.get("time_ms") is None:
        return "is timed but has no 'time_ms'"
    return None


def read_store(path: Path | None) -> dict:
    """The store's JSON ({"version", "entries"}), empty when there is none; ``StoreError`` naming the
    file and the reason when it exists but cannot be used (the writer must never replace such a file)."""
    if path is None:
        return _empty()
    try:
        if not path.exists():
            return _empty()
        if path.is_dir():
            raise StoreError(f"tuning store {path} is a directory, not a JSON file")
        if not path.is_file():
            raise StoreError(f"tuning store {path} is not a regular file")
        raw = path.read_bytes()
    except OSError as exc:
        raise StoreError(f"tuning store {path} cannot be read ({exc.strerror or exc})") from None
    try:
        data = json.loads(raw)
    except UnicodeDecodeError:
        raise StoreError(f"tuning store {path} is not valid JSON (not UTF-8 text)") from None
    except ValueError as exc:  # json.JSONDecodeError
        raise StoreError(f"tuning store {path} is not valid JSON ({exc})") from None
    except RecursionError:
        raise StoreError(f"tuning store {path} is not valid JSON (nested too deeply)") from None
    problem = _layout_problem(data)
    if problem:
        raise StoreError(f"tuning store {path} cannot be used: {problem}")
    return data


def load_store(path: Path | None) -> dict:
    """``read_store`` for running: a store that cannot be used is reported in one line (once per process
    and problem, on the ``nonstop.tuning`` logger: plain stderr when logging is not configured) and read
    as empty, so the built-in kernels run."""
    try:
        return read_store(path)
    except StoreError as exc:
        message = f"{exc}; using the built-in kernels"
        if message not in _warned:
            _warned.add(message)
            log.warning(message)
        return _empty()


# the candidate rules (tune/static_check.py) a stored kernel was checked under; 2 closed attribute chains off
# imported names and kernels, match statements' class patterns and builtins unlocked by binding their names
# (ways to run any code or keep state); 3 closed kernels called from host code, torch.Tensor through another
# name, printed tensors and value reads inside nonstop.kernels helpers; 4: the verification also covers a
# speculative step at every tuned T > 1, a cached context past several pages and KV splits, RoPE frequencies
# of its own, and the entry lists the variants it covered; a kernel checked under older rules is not run
CANDIDATE_RULES = 4


def rules_problem(entry: dict) -> str | None:
    """Why a stored kernel checked under other candidate rules than this nonstop's is not run, else None."""
    rules = entry.get("rules", 1)
    if rules != CANDIDATE_RULES:
        return (
            f"was checked under candidate rules {rules}, not this nonstop's {CANDIDATE_RULES} (tune again, or check "
            "the file with nonstop tune verify --kernel FILE)"
        )
    return None


PLAIN_LAUNCH_ARGS = (torch.Tensor, int, float, bool, str, type(None), torch.dtype)  # and Triton's dtypes


def _leaves(value):
    """The values a launch argument holds: itself, or the leaves of a tuple or Triton ``constexpr`` wrapping."""
    if isinstance(value, tuple):
        for v in value:
            yield from _leaves(v)
    elif type(value).__name__ == "constexpr":
        yield from _leaves(getattr(value, "value", None))
    else:
        yield value


def _plain_arg(value) -> bool:
    return all(isinstance(v, PLAIN_LAUNCH_ARGS) or type(v).__name__ == "dtype" for v in _leaves(value))  # tl.float32


def _constexpr_params(fn) -> tuple[list[str], set[str]]:
    """The parameter names of a kernel's Python function, in order, and those annotated ``tl.constexpr`` (read as
    Triton reads them: the annotation, an object or a string, names constexpr)."""
    params = list(inspect.signature(fn).parameters.values())
    return [p.name for p in params], {p.name for p in params if "constexpr" in str(p.annotation)}


def _holds_tensor(value) -> bool:
    return any(isinstance(v, torch.Tensor) for v in _leaves(value))


def plain_launch_args(module) -> None:
    """Make every Triton kernel ``module`` (a candidate or stored kernel file) defines refuse a launch with an
    argument other than a tensor, number, string, None, dtype or a tuple of them, and a tensor for a constexpr
    parameter. Under TRITON_INTERPRET=1 a constexpr argument reaches the kernel body as the object itself: a dict
    or list launched so (``op.attrs``, ``env.buf``) is state the kernel could change in place (``attrs |= ...``),
    outliving the call, and a tensor one the body could compute on with torch (``A.sum(1)``), unrecorded."""
    for obj in list(vars(module).values()):
        fn = getattr(obj, "fn", None)
        if getattr(fn, "__module__", None) != module.__name__ or not callable(getattr(obj, "run", None)):
            continue

        name = getattr(fn, "__name__", "kernel")
        order, constexpr = _constexpr_params(fn)

        def run(*args, _kernel=obj, _name=name, _order=order, _constexpr=constexpr, **kwargs):
            launch_args = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
            for value in (*args, *launch_args.values()):
                if not _plain_arg(value):
                    raise TypeError(
                        f"kernel {_name} launched with a {type(value).__name__}: a kernel takes tensors, numbers, "
                        "strings, None, dtypes or tuples of them"
                    )
            bound = {**dict(zip(_order, args)), **launch_args}
            for param in sorted(_constexpr & bound.keys()):
                if _holds_tensor(bound[param]):
                    raise TypeError(f"kernel {_name} launched with a tensor for its constexpr parameter {param}")
            return type(_kernel).run(_kernel, *args, **kwargs)  # the class's run, as launch counting patches it

        obj.run = run


def kernel_problem(root: Path, entry: dict) -> str | None:
    """Why the stored kernel file of ``entry`` (relative to the store's directory ``root``) cannot be used
    ("is missing", "changed since it was verified ..."), None when it holds what was verified (SHA-256)."""
    try:
        source = (root / entry.get("kernel", "")).read_bytes()
    except OSError:
        return "is missing"
    if hashlib.sha256(source).hexdigest() != entry.get("sha256"):
        return "changed since it was verified (SHA-256 differs)"
    return None


def load_kernel(root: Path, entry: dict):
    """The ``launch`` of a stored kernel file after checking its SHA-256 and the rules it was checked under;
    None (with a warning) if the file is missing, changed since it was verified, was checked under older
    candidate rules (``rules_problem``), or does not import."""
    path = root / entry.get("kernel", "")
    problem = kernel_problem(root, entry) or rules_problem(entry)
    if problem:
        warnings.warn(f"tuned kernel {path} {problem}; using the built-in kernel", RuntimeWarning, stacklevel=2)
        return None
    try:
        spec = importlib.util.spec_from_file_location(f"nonstop_tuned_{entry['sha256'][:16]}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        plain_launch_args(module)
        return module.launch
    except Exception as exc:  # noqa: BLE001 - a stored file that no longer imports must not stop a run
        warnings.warn(
            f"tuned kernel {path} does not import ({type(exc).__name__}: {exc}); using the built-in kernel",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


class TunedKind:
    """The launch function of one kind with stored winners: per (op shape, B, T) the stored kernel,
    else the built-in ``fallback``. ``used`` counts the calls that ran a stored kernel, by shape key;
    ``refused`` holds the shapes whose winner an executor could not run, with the reason (``refuse``)."""

    def __init__(self, kind: str, fallback, entries: dict, root: Path):
        self.kind = kind
        self.fallback = fallback
        self.entries = entries
        self.root = root
        self.loaded: dict[str, object] = {}
        self.keys: dict[tuple, str] = {}  # (id(op), B, T) -> shape key (the program's ops live as long as the executor)
        self.used: dict[str, int] = {}
        self.refused: dict[str, str] = {}
        self.unverified: dict[str, list[str]] = {}  # key -> variants its winner was not verified on (built-in ran)

    def key(self, op, env) -> str:
        at = (id(op), env.B, env.T)
        if at not in self.keys:
            self.keys[at] = shape_key(op, env.B, env.T, env.buf[op.reads[0]].dtype)
        return self.keys[at]

    def refuse(self, op, env, reason: str) -> None:
        """From now on the built-in kernel runs at this call's shape; the last call there is not counted
        as the winner's (the megakernel refuses winners it cannot run as tasks, ``codegen/record.py``)."""
        key = self.key(op, env)
        if key not in self.refused:
            warnings.warn(
                f"{self.kind} at {key}: {reason}; the built-in kernel runs there", RuntimeWarning, stacklevel=2
            )
        self.refused[key] = reason
        if self.used.get(key):
            self.used[key] -= 1

    def launch_for(self, key: str):
        if key not in self.loaded:
            entry = self.entries.get(key)
            self.loaded[key] = load_kernel(self.root, entry) if entry else None
        return self.loaded[key]

    def covers(self, op, key: str) -> bool:
        """Whether the winner at ``key`` was verified on ``op``'s variant (``op_variant``); notes it when not."""
        variant = op_variant(op)
        if variant in self.entries[key].get("variants", ()):
            return True
        seen = self.unverified.setdefault(key, [])
        if variant not in seen:
            seen.append(variant)
        return False

    def __call__(self, op, env, **kwargs):
        key = self.key(op, env)
        usable = key in self.entries and key not in self.refused and self.covers(op, key)
        launch = self.launch_for(key) if usable else None
        if launch is None or kwargs:
            return self.fallback(op, env, **kwargs)
        self.used[key] = self.used.get(key, 0) + 1
        return launch(op, env)


def use_tuned(table: dict, program, device, stats: dict | None = None) -> dict:
    """``table`` with the kinds of ``program`` that have stored winners for ``device`` dispatched through
    ``TunedKind``; ``stats["tuned"]`` (when given) lists them: {kind: {"shapes": n, "used": {key: calls},
    "refused": {key: why}, "unverified": {key: [variants its winner was not verified on]}}}."""
    path = store_path()
    entries = load_store(path)["entries"].get(device_name(device), {})
    kinds = {op.kind for op in program.ops} & set(entries) & set(table)
    if not kinds:
        return table
    out = dict(table)
    for kind in sorted(kinds):
        out[kind] = TunedKind(kind, table[kind], entries[kind], path.parent)
    if stats is not None:
        stats["tuned"] = {
            k: {
                "shapes": len(entries[k]),
                "used": out[k].used,
                "refused": out[k].refused,
                "unverified": out[k].unverified,
            }
            for k in sorted(kinds)
        }
    return out
