"""Check one super-op kind's Triton kernel against its plain-torch twin inside a real decode step.

A tiny random model (odd shapes) prefills a few sequences of different lengths, then runs one step of
B sequences × T tokens through the Program with the twins. Right before every op of the requested
kind, the whole step state (activation buffers, caches, recurrent state) is cloned; the twin runs on
one copy and the kernel on the other, whose outputs (non-accumulating writes and the cache rows the
step appends, when the twin writes them) are first poisoned with NaN; the buffers an op accumulates into
start from the same random values in both copies. All written buffers and all cache/state tensors must agree.
"""

from __future__ import annotations

import copy

import torch

from nonstop.cache.state import ModelCache
from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from nonstop.program.lower import lower
from nonstop.program.reference import REFERENCE, StepEnv


def _clone_env(env: StepEnv) -> StepEnv:
    return StepEnv({k: v.clone() for k, v in env.buf.items()}, copy.deepcopy(env.cache), env.batch)


def _step_cache_rows(op, env: StepEnv) -> dict[str, torch.Tensor] | None:
    """The pool rows this step's tokens occupy in the op's token cache: {tensor name: rows [B·T, ...]}."""
    layer = op.attrs.get("cache_layer")
    if layer is None or not hasattr(env.cache.layers[layer], "tensors"):
        return None
    cache = env.cache.layers[layer]
    cache.fit_pool()
    rows = cache.pages.rows(env.batch.slots, env.batch.positions)
    return {k: t[rows] for k, t in cache.tensors.items()}


def _writes_cache(op, before: StepEnv, after: StepEnv) -> bool:
    """True if the twin changed the step's cache rows (an appending op, not a reader such as *_attn)."""
    old, new = _step_cache_rows(op, before), _step_cache_rows(op, after)
    return old is not None and any(not torch.equal(old[k].nan_to_num(), new[k].nan_to_num()) for k in old)


def _poison(op, env: StepEnv, cache_rows: bool) -> None:
    for name in op.writes:
        if not op.attrs.get("accumulate", False) and env.buf[name].dtype.is_floating_point:
            env.buf[name].fill_(float("nan"))
    if cache_rows:
        cache = env.cache.layers[op.attrs["cache_layer"]]
        rows = cache.pages.rows(env.batch.slots, env.batch.positions)
        for t in cache.tensors.values():
            t[rows] = float("nan")


def _randomize_accumulators(op, gen: torch.Generator, *envs: StepEnv) -> None:
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


def _poison_history(op, env: StepEnv) -> None:
    """NaN in the step's rows of the KDA history the op keeps, so its kernel must write every one."""
    kind = {"kda_in_proj": "conv", "kda_core": "recurrent"}.get(op.kind)
    if not env.batch.keep_states or kind is None:
        return
    hist = getattr(env.cache.layers[op.attrs["cache_layer"]], f"history_{kind}")
    if hist is not None:
        hist[env.batch.slots, : env.T] = float("nan")


def _state_tensors(env: StepEnv) -> dict[str, torch.Tensor]:
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


def check_kernel(
    kind: str,
    raw_config: dict,
    kernel,
    dtype=torch.float32,
    B: int = 2,
    T: int = 1,
    prompt_lens=(5, 3, 7),
    seed: int = 0,
    rtol=None,
    atol=None,
    device="cpu",
    keep_states: bool = False,
) -> int:
    """Run the comparison; returns how many ops of ``kind`` were checked (asserts on mismatch).
    keep_states: a speculative-verification step (KDA per-token histories compared too, poisoned first)."""
    cfg = ModelConfig.from_hf_dict(raw_config)
    model = random_model(cfg, dtype, device=device, seed=seed)
    program = lower(model)
    gen = torch.Generator().manual_seed(seed + 1)
    cache = ModelCache(cfg, num_slots=len(prompt_lens) + 1, capacity=4, dtype=dtype, device=device)
    for slot, n in enumerate(prompt_lens):  # realistic caches and states, via the reference model
        ids = torch.randint(0, cfg.vocab_size, (1, n), generator=gen).to(device)
        batch = cache.batch([slot], n)
        model(ids, cache, batch)
        cache.advance(batch)
    slots = list(range(B - 1)) + [len(prompt_lens)]  # the last row starts a fresh sequence (start == 0)
    for layer in cache.layers:  # ... in a slot holding junk state: kernels must start it from zeros
        if not hasattr(layer, "tensors"):
            layer.recurrent[len(prompt_lens)].normal_(generator=gen)
            layer.conv[len(prompt_lens)].normal_(generator=gen)
    batch = cache.batch(slots, T, keep_states=keep_states)
    env = StepEnv(program.allocate(B * T, device), cache, batch)
    env.buf["ids"].copy_(torch.randint(0, cfg.vocab_size, (B * T,), generator=gen))
    tol = (
        {"rtol": rtol, "atol": atol}
        if rtol is not None
        else ({"rtol": 2e-4, "atol": 2e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2})
    )
    checked = 0
    for op in program.ops:
        if op.kind == kind:
            want, got = _clone_env(env), _clone_env(env)
            _randomize_accumulators(op, gen, want, got)
            REFERENCE[kind](op, want)
            _poison(op, got, cache_rows=_writes_cache(op, got, want))
            _poison_history(op, got)
            kernel(op, got)
            for name in op.writes:
                torch.testing.assert_close(
                    got.buf[name].float(),
                    want.buf[name].float(),
                    **tol,
                    msg=lambda m, op=op, name=name: f"{op.name} -> {name}: {m}",
                )
            got_state = _state_tensors(got)
            for name, t in _state_tensors(want).items():
                torch.testing.assert_close(
                    got_state[name].float(),
                    t.float(),
                    **tol,
                    msg=lambda m, op=op, name=name: f"{op.name} state {name}: {m}",
                )
            checked += 1
        REFERENCE[op.kind](op, env)
    assert checked > 0, f"the config has no {kind} op"
    return checked
