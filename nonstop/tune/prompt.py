"""The prompt an LLM proposer sends: the contract, the twin, the current kernel, shapes, roofline, rules,
and the verifier's messages on the previous round's candidates.

Everything is read from the code as it is (``inspect``): the twin's source and the sources of the
helpers it calls in ``program/reference.py``, the docstrings of the ``nonstop.model`` functions it calls
(the equations), the built-in launcher and the Triton kernels it launches, and what ``launch(op, env)``
receives at the tuned shapes (a meta-device lowering of the model: no weights are built).
"""

from __future__ import annotations

import ast
import inspect
import textwrap

from nonstop.model.build import meta_model
from nonstop.program.lower import lower
from nonstop.tune.allowed import MODULES, TORCH_ALLOCATORS, TORCH_FACTS
from nonstop.tune.candidate import RoundContext
from nonstop.tune.cases import variants
from nonstop.tune.timing import peak_bandwidth

MAX_KERNEL_SOURCE = 24_000


def _torch(names) -> str:
    return " / ".join(f"torch.{n}" for n in sorted(names))


def rules() -> str:
    """The rules of a candidate file, as the prompt states them; the torch names come from the allow-lists
    (``allowed.py``) the static checker applies, so the two cannot drift apart."""
    alloc = _torch(TORCH_ALLOCATORS)
    facts = _torch(TORCH_FACTS - {"Tensor"}) + " / torch.Tensor (a type, for isinstance: calling it allocates)"
    cuda = _torch(f"cuda.{n}" for n in MODULES["torch.cuda"])
    return f"""\
Rules (a static checker and a sandboxed verifier enforce them; a file that breaks one is rejected):
- Compute only in @triton.jit kernels. Host code in launch() computes pointers, strides, sizes and grids,
  allocates scratch with {alloc} only (zeroed: no uninitialised allocation, which may hand
  back the bytes of a previous call), and launches kernels. No torch operators that compute (matmul, +, copy_,
  .to(), .sum() ...), no reading tensor values on the host (.item(), int(t), .tolist()).
- Imports at module level only: triton, triton.language as tl, math, typing, torch: its dtypes, {alloc},
  {facts},
  {cuda};
  and from nonstop.kernels.* its Triton kernels and tiles (e.g. nonstop.kernels.gemv.gemv_rows), constants, the
  built-in launchers and the host helpers they call. Never the twin (nonstop.program.reference) or nonstop.model.
  Every name is checked against allow-lists (nonstop/tune/allowed.py): from each module only its listed names, in
  host code only the basic builtins (len, range, min, max, int, isinstance ...) and the attributes a launcher
  reads (op.weights/attrs/reads/writes, env.buf/cache/batch, config fields, tensor .shape/.stride()/.dtype/
  .device/.numel()/views, dict .get/.items).
- No try/except, with, classes, global/nonlocal, threads, async, exec/eval/getattr/__import__/open, dunder or
  private attributes, str.format, streams, triton.autotune, module-level state (only constants at module level),
  mutable default arguments, assignment to attributes or items of the objects you are given, augmented
  assignment (x += y) in host code.
- Write every output in place in the tensors you are given (env.buf[...], the cache rows / states the twin
  writes); change nothing else: inputs, weights and caches must stay bit for bit as they were.
- Results must match the twin within tolerance (fp32: rtol 2e-4, atol 2e-5; fp16/bf16: 2e-2), be deterministic,
  and hold for every shape: the verifier also runs held-out odd sizes, B and T up to 4, and speculative steps
  (env.batch.keep_states) with fresh random inputs each call, outputs poisoned with NaN and guard bands.
- Answer with ONE complete Python file in a single ```python block, defining launch(op, env)."""


RULES = rules()


def _called_names(fn) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def twin_text(kind: str) -> str:
    """The twin's source, the reference helpers it calls, and the equations (docstrings) of the model
    functions it calls."""
    from nonstop.program import reference

    twin = reference.REFERENCE[kind]
    parts = [f"# nonstop/program/reference.py\n{inspect.getsource(twin)}"]
    for name in sorted(_called_names(twin)):
        obj = getattr(reference, name, None)
        if not inspect.isfunction(obj):
            continue
        if obj.__module__ == reference.__name__:
            parts.append(inspect.getsource(obj))
        elif obj.__module__.startswith("nonstop.model"):
            sig = f"{obj.__module__}.{name}{inspect.signature(obj)}"
            parts.append(f"# {sig}\n#   " + (inspect.getdoc(obj) or "").replace("\n", "\n#   "))
    return "\n".join(parts)


def kernel_text(kind: str) -> str:
    """The built-in launcher and the Triton kernels it launches, with the tile functions they call (two
    levels deep; truncated to ``MAX_KERNEL_SOURCE``)."""
    from nonstop.kernels import KERNELS

    fn = KERNELS[kind]
    parts = [f"# {inspect.getmodule(fn).__name__}\n{inspect.getsource(fn)}"]
    seen: set = set()
    frontier = [fn]
    for _ in range(3):  # launcher -> kernels -> tiles -> their helpers
        found = []
        for f in frontier:
            module = inspect.getmodule(f)
            for name in sorted(_called_names(f) | _subscripted(f)):
                obj = getattr(module, name, None)
                jit = getattr(obj, "fn", None)
                inner = jit if jit is not None else obj
                if not inspect.isfunction(inner) or inner in seen or not inner.__module__.startswith("nonstop.kernels"):
                    continue
                seen.add(inner)
                found.append(inner)
                decorator = "@triton.jit\n" if jit is not None else ""
                parts.append(f"# {inner.__module__}\n{decorator}{inspect.getsource(inner)}")
        frontier = found
    text = "\n".join(parts)
    return text if len(text) <= MAX_KERNEL_SOURCE else text[:MAX_KERNEL_SOURCE] + "\n# ... (truncated)"


def _subscripted(fn) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)}


def contract_text(context: RoundContext) -> str:
    """What ``launch(op, env)`` receives at the target's first tuned shape."""
    t = context.target
    program = lower(meta_model(t.cfg, t.dtype))
    ops = variants(program, t.kind)
    op = ops[0]
    B = t.shapes[0].B if t.shapes else 1
    T = t.shapes[0].T if t.shapes else 1
    R = B * T
    dt = str(t.dtype).removeprefix("torch.")
    lines = [
        f"def launch(op, env) -> None   # called once per {t.kind} op per decode step",
        f"op.kind = {op.kind!r}; op.reads = {op.reads}; op.writes = {op.writes}",
        "op.weights (tensors, contiguous rows):",
    ]
    lines += [f"  {n!r}: {list(w.shape)} {str(w.dtype).removeprefix('torch.')}" for n, w in sorted(op.weights.items())]
    attrs = {k: v for k, v in op.attrs.items() if isinstance(v, (int, float, bool, str, tuple, list, type(None)))}
    lines.append(
        f"op.attrs (static): {attrs}"
        + (f" + {sorted(set(op.attrs) - set(attrs))} (objects)" if set(op.attrs) - set(attrs) else "")
    )
    lines.append(f"env.buf[name]: activation buffers [R, *row_shape], R = env.B * env.T rows (e.g. R = {R}):")
    for name in sorted(set(op.reads) | set(op.writes)):
        spec = program.buffers[name]
        lines.append(
            f"  {name!r}: [R, {', '.join(map(str, spec.row_shape))}] {dt if spec.dtype == 'model' else spec.dtype}"
        )
    lines += [
        "env.B sequences x env.T tokens; env.batch.slots [B] long (cache slot of each sequence),",
        "env.batch.start [B] long (tokens already cached), env.batch.keep_states (speculative step:",
        "KDA kernels also write per-token histories);",
        "env.cache.layers[op.attrs['cache_layer']]: the layer's cache (paged token pool / KDA recurrent+conv state).",
        f"Other variants of this kind in the model: {len(ops) - 1} (same launch must handle all: see op.attrs).",
    ]
    return "\n".join(lines)


def roofline_text(context: RoundContext) -> str:
    t = context.target
    peak, source = peak_bandwidth(t.device)
    lines = []
    for s in t.shapes:
        floor = (
            f", floor {s.bytes_moved / peak * 1e6:.2f} us at {peak / 1e12:.2f} TB/s ({source})"
            if peak != float("inf")
            else ""
        )
        base = context.baseline.get(s.key)
        now = f"; built-in kernel {base['median_ms'] * 1e3:.2f} us" if base else ""
        lines.append(f"- {s.key}: {s.bytes_moved} bytes moved per call{floor}{now}")
    if peak == float("inf"):
        lines.append("(this machine has no GPU: candidates are verified, not timed)")
    return "\n".join(lines) or "(no tuned shapes on this machine)"


def _section(title: str, code: str) -> str:
    return f"## {title}\n```python\n{code}\n```\n"


def build_prompt(context: RoundContext, compact: bool = False) -> tuple[str, str]:
    """(system, user) messages for one candidate of ``context.round``; ``compact`` leaves out the current
    kernel's source (for endpoints with a short context)."""
    t = context.target
    system = (
        "You write fast, correct Triton kernels for nonstop, an LLM inference engine. Decode super-ops are "
        "memory-bound: the goal is to stream every weight byte once at full bandwidth. You answer with one "
        "complete Python file."
    )
    feedback = "\n".join(o.message() for o in context.previous) or "(first round: no candidates verified yet)"
    dtype = str(t.dtype).removeprefix("torch.")
    user = f"""Round {context.round} of {context.rounds}. Write a faster kernel for the super-op kind `{t.kind}` \
of {t.model} ({dtype}, {t.device}).

## The contract
{contract_text(context)}

## The twin it must equal (plain torch; the spec)
```python
{twin_text(t.kind)}
```

{"" if compact else _section("The current kernel (built-in)", kernel_text(t.kind))}
## Shapes and roofline
{roofline_text(context)}

## Verifier messages on the previous round's candidates
{feedback}

{RULES}
"""
    return system, user
