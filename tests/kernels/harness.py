"""Check one super-op kind's Triton kernel against its plain-torch twin inside a real decode step.

A tiny random model (odd shapes) prefills a few sequences of different lengths, then runs one step of
B sequences × T tokens through the Program with the twins. Every op of the requested kind runs both
ways on clones of the step state (``nonstop/runtime/twin_check.py``: the kernel's outputs poisoned
first, accumulators randomised alike); all written buffers and all cache/state tensors must agree.
Written buffers are the op's ``writes`` and the elements its twin changes in any other buffer (a side
write: attnres's store into ``blocks``, a buffer the op also reads), poisoned alike (``twin_check.outputs``).
"""

from __future__ import annotations

import torch

from nonstop.cache.pages import PAGE_SIZE
from nonstop.cache.state import ModelCache
from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from nonstop.program.lower import lower
from nonstop.program.reference import REFERENCE, StepEnv
from nonstop.runtime.cuda_graph import fit_pools
from nonstop.runtime.twin_check import outputs, run_both, state_tensors


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
    slots: list[int] | None = None,
    page_size: int = PAGE_SIZE,
) -> int:
    """Run the comparison; returns how many ops of ``kind`` were checked (asserts on mismatch).
    keep_states: a speculative-verification step (KDA per-token histories compared too, poisoned first).
    slots: the step's slots in row order (default 0..B-2 and the fresh slot len(prompt_lens); B follows them);
    page_size: tokens per attention-cache page."""
    cfg = ModelConfig.from_hf_dict(raw_config)
    model = random_model(cfg, dtype, device=device, seed=seed)
    program = lower(model)
    gen = torch.Generator().manual_seed(seed + 1)
    cache = ModelCache(cfg, num_slots=len(prompt_lens) + 1, capacity=4, dtype=dtype, device=device, page_size=page_size)
    for slot, n in enumerate(prompt_lens):  # realistic caches and states, via the reference model
        ids = torch.randint(0, cfg.vocab_size, (1, n), generator=gen).to(device)
        batch = cache.batch([slot], n)
        model(ids, cache, batch)
        cache.advance(batch)
    if slots is None:
        slots = list(range(B - 1)) + [len(prompt_lens)]  # the last row starts a fresh sequence (start == 0)
    B = len(slots)
    for layer in cache.layers:  # ... in a slot holding junk state: kernels must start it from zeros
        if not hasattr(layer, "tensors"):
            layer.recurrent[len(prompt_lens)].normal_(generator=gen)
            layer.conv[len(prompt_lens)].normal_(generator=gen)
    batch = cache.batch(slots, T, keep_states=keep_states)
    fit_pools(cache)  # as the executors do before a step (state_tensors reads the pools before the kernel runs)
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
            run = run_both(op, env, kernel, gen)
            for name, (got, want) in outputs(op, run).items():
                torch.testing.assert_close(
                    got.float(), want.float(), **tol, msg=lambda m, op=op, name=name: f"{op.name} -> {name}: {m}"
                )
            got_state = state_tensors(run.got)
            for name, t in state_tensors(run.want).items():
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
