"""One super-op's kernel against its plain-torch twin on the same step state (tests and a GPU check).

``run_both(op, env, kernel, gen)`` clones the whole step state (activation buffers, caches, recurrent
state) twice, runs the twin on one copy and ``kernel`` on the other, whose outputs (non-accumulating
writes, the cache rows the step appends when the twin writes them, the KDA histories a speculative
step keeps) are first poisoned with NaN; the buffers an op accumulates into (``out += y``) start from
the same random values in both copies. A buffer outside ``op.writes`` that the twin changes too (attnres's
store into ``blocks``, which the op also reads) is a side write: the elements the twin changes there are
poisoned alike. The caller compares ``outputs(run)`` and ``state_tensors`` of the two copies:
``tests/kernels/harness.py`` asserts on tiny odd shapes under Triton's interpreter, ``bench/op_check.py``
reports the errors at full width on a GPU.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import torch

from nonstop.program.reference import REFERENCE, StepEnv


def clone_env(env: StepEnv) -> StepEnv:
    return StepEnv({k: v.clone() for k, v in env.buf.items()}, copy.deepcopy(env.cache), env.batch)


def step_cache_rows(op, env: StepEnv) -> dict[str, torch.Tensor] | None:
    """The pool rows this step's tokens occupy in the op's token cache: {tensor name: rows [B·T, ...]}."""
    layer = op.attrs.get("cache_layer")
    if layer is None or not hasattr(env.cache.layers[layer], "tensors"):
        return None
    cache = env.cache.layers[layer]
    cache.fit_pool()
    rows = cache.pages.rows(env.batch.slots, env.batch.positions)
    return {k: t[rows] for k, t in cache.tensors.items()}


def writes_cache(op, before: StepEnv, after: StepEnv) -> bool:
    """True if the twin changed the step's cache rows (an appending op, not a reader such as *_attn)."""
    old, new = step_cache_rows(op, before), step_cache_rows(op, after)
    return old is not None and any(not torch.equal(old[k].nan_to_num(), new[k].nan_to_num()) for k in old)


def poison(op, env: StepEnv, cache_rows: bool) -> None:
    for name in op.writes:
        if not op.attrs.get("accumulate", False) and env.buf[name].dtype.is_floating_point:
            env.buf[name].fill_(float("nan"))
    if cache_rows:
        cache = env.cache.layers[op.attrs["cache_layer"]]
        rows = cache.pages.rows(env.batch.slots, env.batch.positions)
        for t in cache.tensors.values():
            t[rows] = float("nan")


def randomize_accumulators(op, gen: torch.Generator, *envs: StepEnv) -> None:
    """The same random values in every copy of the buffers an accumulating op adds into (``out += y``), so
    a kernel that overwrites them instead of adding fails (the twins' step left them zero or small)."""
    if not op.attrs.get("accumulate", False):
        return
    for name in op.writes:
        buf = envs[0].buf[name]
        if buf.dtype.is_floating_point:
            noise = torch.randn(buf.shape, generator=gen).to(buf.device, buf.dtype)
            for env in envs:
                env.buf[name].copy_(noise)


def poison_history(op, env: StepEnv) -> None:
    """NaN in the step's rows of the KDA history the op keeps, so its kernel must write every one."""
    kind = {"kda_in_proj": "conv", "kda_core": "recurrent"}.get(op.kind)
    if not env.batch.keep_states or kind is None:
        return
    hist = getattr(env.cache.layers[op.attrs["cache_layer"]], f"history_{kind}")
    if hist is not None:
        hist[env.batch.slots, : env.T] = float("nan")


def state_tensors(env: StepEnv) -> dict[str, torch.Tensor]:
    out = {}
    for i, layer in enumerate(env.cache.layers):
        if hasattr(layer, "tensors"):
            for k in layer.tensors:
                out[f"L{i}.{k}"] = layer.read(env.batch, k)  # every row's tokens 0..end-1, through the page table
        else:
            out[f"L{i}.recurrent"] = layer.recurrent
            out[f"L{i}.conv"] = layer.conv
            if env.batch.keep_states:  # speculative verification: the state after every token of the step
                for kind in ("recurrent", "conv"):
                    hist = getattr(layer, f"history_{kind}")
                    if hist is not None:
                        out[f"L{i}.history_{kind}"] = hist[env.batch.slots, : env.T]
    return out


class TwinRun(NamedTuple):
    """One op run both ways: ``want`` the twin's copy of the step state, ``got`` the kernel's; ``side``:
    {buffer outside ``op.writes``: bool mask of the elements the twin changed there} (``side_writes``)."""

    want: StepEnv
    got: StepEnv
    side: dict[str, torch.Tensor]


def side_writes(op, before: StepEnv, after: StepEnv) -> dict[str, torch.Tensor]:
    """{buffer: mask of the changed elements} for each buffer outside ``op.writes`` that differs between
    ``before`` and ``after`` the twin ran (NaN equal to NaN: ``program.allocate`` leaves buffers unset)."""
    out = {}
    for name, new in after.buf.items():
        if name in op.writes:
            continue
        old = before.buf[name]
        changed = new != old
        if new.dtype.is_floating_point:
            changed &= ~(new.isnan() & old.isnan())
        if changed.any():
            out[name] = changed
    return out


def run_both(op, env: StepEnv, kernel, gen: torch.Generator) -> TwinRun:
    """``op`` run by its twin and by ``kernel`` on two clones of ``env`` (left as it was)."""
    want, got = clone_env(env), clone_env(env)
    randomize_accumulators(op, gen, want, got)
    REFERENCE[op.kind](op, want)
    side = side_writes(op, env, want)
    poison(op, got, cache_rows=writes_cache(op, got, want))
    for name, mask in side.items():
        if got.buf[name].dtype.is_floating_point:
            got.buf[name][mask] = float("nan")
    poison_history(op, got)
    kernel(op, got)
    return TwinRun(want, got, side)


def outputs(op, run: TwinRun) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{buffer: (the kernel's values, the twin's)} of what ``op`` writes: each of ``op.writes`` whole, and
    of each side write the elements the twin changed."""
    out = {name: (run.got.buf[name], run.want.buf[name]) for name in op.writes}
    for name, mask in run.side.items():
        out[name] = (run.got.buf[name][mask], run.want.buf[name][mask])
    return out
