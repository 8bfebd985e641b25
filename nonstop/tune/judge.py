"""The parent's judgement of what the child observed: every rule of a verification, as messages.

For each call on a state (packed bytes ``before``, the twin's bytes ``after``):
* the launch raised nothing, ran at least one Triton kernel, no torch operator computed in the
  candidate (or in nonstop code other than cache bookkeeping and ``nonstop.kernels`` helpers), no
  function of the harness was patched, no thread was started, every two-phase counter is back at zero;
* no guard band around any storage changed; every storage the twin leaves as it is came back bitwise
  unchanged (inputs, weights, caches); every tensor is still the same view of the same storage;
* in the storages the twin writes: elements the twin leaves alone are bitwise unchanged, elements it
  writes are within the dtype tolerance of the twin (a NaN left over from the poison is a miss);
* the second call on a copy of a state gives bitwise the same bytes (fp32 atomics in kinds whose
  built-in kernel accumulates with them may differ by rounding on a GPU).
"""

from __future__ import annotations

import torch

from nonstop.tune.state import Packed, View, dtype_of

# (rtol, atol) by the model dtype of a case: what the kernel tests use (tests/kernels/harness.py)
TOLERANCE = {torch.float32: (2e-4, 2e-5), torch.float16: (2e-2, 2e-2), torch.bfloat16: (2e-2, 2e-2)}
# kinds whose built-in kernel sums split-K partials with fp32 atomics: on a GPU the order varies
ATOMIC_KINDS = {"moe_experts": (1e-5, 1e-6)}
INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def typed(raw: torch.Tensor, view: View) -> torch.Tensor:
    """``view`` of a storage given as flat uint8 bytes ``raw`` (CPU)."""
    return torch.empty(0, dtype=dtype_of(view.dtype)).set_(raw.untyped_storage(), view.offset, view.shape, view.stride)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(INT_OF_SIZE[t.element_size()]) if t.dtype != torch.bool else t.view(torch.uint8)


def _where(mask: torch.Tensor) -> str:
    idx = mask.nonzero()
    return str(tuple(idx[0].tolist())) if len(idx) else "?"


def compare_output(
    path: str, view: View, before: torch.Tensor, after: torch.Tensor, got: torch.Tensor, tol: tuple[float, float]
) -> str | None:
    """The first problem of one tensor in an output storage, or None."""
    b, w, g = typed(before, view), typed(after, view), typed(got, view)
    if g.numel() == 0:
        return None
    untouched = bits(b) == bits(w)
    moved = untouched & (bits(g) != bits(b))
    if moved.any():
        return (
            f"{path}: changed {int(moved.sum())} element(s) that the twin leaves as they are (first at {_where(moved)})"
        )
    written = ~untouched
    if not written.any():
        return None
    gw, ww = g[written], w[written]
    if g.is_floating_point():
        ok = torch.isclose(gw.double(), ww.double(), rtol=tol[0], atol=tol[1], equal_nan=True)
    else:
        ok = gw == ww
    if bool(ok.all()):
        return None
    bad = torch.zeros_like(written)
    bad[written] = ~ok
    first = tuple(bad.nonzero()[0].tolist())
    got_v, want_v = g[first].item(), w[first].item()
    nan_left = g.is_floating_point() and bool(torch.isnan(gw[~ok]).any())
    hint = " (NaN from the poisoned output: not written)" if nan_left else ""
    return (
        f"{path}: {int((~ok).sum())} of {int(written.sum())} written element(s) differ from the twin beyond "
        f"rtol={tol[0]:g} atol={tol[1]:g}; first at {first}: got {got_v:.6g}, twin {want_v:.6g}{hint}"
    )


def uncovered_changed(before: torch.Tensor, got: torch.Tensor, views: list[View]) -> bool:
    """True if bytes of the storage outside every tensor view changed."""
    diff = before != got
    if not diff.any():
        return False
    for v in views:  # the usual case: one view spans the whole storage
        size = dtype_of(v.dtype).itemsize
        contiguous = all(st == p for st, p in zip(v.stride, _contiguous_strides(v.shape)))
        if v.offset == 0 and contiguous and _numel(v.shape) * size == before.numel():
            return False
    covered = torch.zeros(before.numel(), dtype=torch.bool)
    for v in views:
        size = dtype_of(v.dtype).itemsize
        idx = torch.zeros(v.shape, dtype=torch.long) if v.shape else torch.zeros((), dtype=torch.long)
        for d, (n, s) in enumerate(zip(v.shape, v.stride)):
            shape = [1] * len(v.shape)
            shape[d] = n
            idx = idx + (torch.arange(n) * s).view(shape)
        start = (idx.reshape(-1) + v.offset) * size
        for k in range(size):
            covered[(start + k).clamp_(max=before.numel() - 1)] = True
    return bool((diff & ~covered).any())


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _contiguous_strides(shape) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return list(reversed(out))


def judge_call(
    rec: dict, packed: Packed, after: list[torch.Tensor], outputs: list[int], tol: tuple[float, float], label: str
) -> list[str]:
    """Everything wrong with one call (empty: the call is right)."""
    if rec.get("error"):
        return [f"{label}: launch raised {rec['error']}"]
    problems = [f"{label}: {v}" for v in rec.get("violations", [])]
    if rec.get("triton_launches", 0) == 0:
        problems.append(f"{label}: no Triton kernel ran (a candidate must compute with Triton kernels)")
    if rec.get("patched"):
        problems.append(f"{label}: the call replaced {', '.join(rec['patched'])}")
    if rec.get("new_threads"):
        problems.append(f"{label}: the call started {rec['new_threads']} thread(s)")
    if rec.get("dirty_counters"):
        problems.append(
            f"{label}: left the persistent counters {', '.join(rec['dirty_counters'])} nonzero (two-phase counters "
            "must be back at zero after a launch: a value kept across calls is state, e.g. a call count)"
        )
    by_storage: dict[int, list[str]] = {}
    for path, index in packed.paths.items():
        by_storage.setdefault(packed.views[index].storage, []).append(path)
    for s in rec.get("guards_broken", []):
        problems.append(
            f"{label}: wrote outside its tensors: the guard band around "
            f"{', '.join(by_storage.get(s, ['a storage'])[:3])} changed"
        )
    for s in rec.get("modified", []):
        problems.append(
            f"{label}: modified an input the twin leaves as it is: {', '.join(by_storage.get(s, ['a storage'])[:3])}"
        )
    views = packed.path_views()
    got_views = rec.get("views", {})
    for path, v in views.items():
        g = got_views.get(path)
        if g is None or (g[0], g[1], tuple(g[2]), tuple(g[3]), g[4]) != (
            v.storage,
            v.offset,
            v.shape,
            v.stride,
            v.dtype,
        ):
            problems.append(
                f"{label}: {path} is no longer the tensor it was (outputs must be written in place, no tensor replaced)"
            )
    if problems:
        return problems
    for s in outputs:
        got = rec["outputs"].get(s)
        if got is None:
            problems.append(f"{label}: output storage {s} missing from the child's result")
            continue
        paths = by_storage.get(s, [])
        for path in paths:
            problem = compare_output(path, views[path], packed.storages[s], after[s], got, tol)
            if problem:
                problems.append(f"{label}: {problem}")
                break
        if not problems and uncovered_changed(packed.storages[s], got, [views[p] for p in paths]):
            problems.append(
                f"{label}: wrote bytes of {paths[0] if paths else 'a storage'}'s storage outside the tensor"
            )
    return problems


def judge_determinism(first: dict, second: dict, packed: Packed, kind: str, on_gpu: bool, label: str) -> list[str]:
    """The second call on a copy of the same state must give the same bytes."""
    views = packed.path_views()
    by_storage: dict[int, list[str]] = {}
    for path, index in packed.paths.items():
        by_storage.setdefault(packed.views[index].storage, []).append(path)
    loose = ATOMIC_KINDS.get(kind) if on_gpu else None
    for s, a in first["outputs"].items():
        b = second["outputs"].get(s)
        if b is not None and torch.equal(a, b):
            continue
        for path in by_storage.get(s, []):
            ta, tb = typed(a, views[path]), typed(b, views[path])
            if (
                loose is not None
                and ta.is_floating_point()
                and bool(torch.isclose(ta.double(), tb.double(), rtol=loose[0], atol=loose[1], equal_nan=True).all())
            ):
                continue
            if not torch.equal(bits(ta), bits(tb)):
                diff = bits(ta) != bits(tb)
                return [
                    f"{label}: not deterministic: two calls on the same inputs gave different {path} "
                    f"({int(diff.sum())} element(s), first at {_where(diff)})"
                ]
    return []


def no_op_detectable(packed: Packed, after: list[torch.Tensor], outputs: list[int], tol: tuple[float, float]) -> bool:
    """True if a launch that writes nothing would fail ``judge_call`` on this state (a sanity check of the
    case itself: otherwise a do-nothing kernel could pass it)."""
    views = packed.path_views()
    for s in outputs:
        for path, v in views.items():
            if v.storage == s and compare_output(path, v, packed.storages[s], after[s], packed.storages[s], tol):
                return True
    return False
