"""The executor run: a candidate that passed every call is run once more the way the executor runs it.

The calls of a verification rebuild a fresh state for every call: fresh op, fresh buffers with guard bands,
outputs poisoned with NaN. The executor does none of that: it keeps one op per layer and one set of
activation buffers per step shape for its whole life, and an output buffer holds the previous step's
values. A candidate that tells the two apart (a NaN where the executor has a stale value, an op it has
seen before) could be right in every call and wrong in the model. So the child also runs a short decode
through the real ``SuperOpExecutor`` with the candidate as its stored winner (``runtime/tuned.use_tuned``,
from a tuning store of the job's own), and the parent compares its logits with the reference executor's:

* the model: the target's config at its first tuned shape's widths (else the first hidden one), random
  weights from a seed (the child rebuilds it; a weight fingerprint proves it is the same model);
* the steps: a prefill of B sequences in random cache slots, then ``DECODE_STEPS`` steps of B x T
  random tokens (teacher-forced, so no step depends on an earlier step's argmax);
* the table: on a GPU every built-in kernel (CUDA graphs and PDL as the executor decides); on a CPU the
  candidate's kind only, the other kinds as their twins (the interpreter is slow);
* the verdict: per step, max |logits - reference| at most 4x the built-in kernel's own deviation (the same
  run without the store, made before the candidate is imported) plus the dtype tolerance of the logits'
  scale; the stored winner must have run at every decode step.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import torch

DECODE_STEPS = 3
NUM_SLOTS = 8
PAGE_SIZE = 16
DEVIATION_FACTOR = 4.0


def fingerprint(model) -> str:
    """SHA-256 over the model's floating-point weights (name, dtype, shape and bytes of each): the same model
    on both sides. Exact and independent of the thread count (a float sum is neither)."""
    digest = hashlib.sha256()
    for name, t in model.state_dict().items():
        if t.is_floating_point():
            data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
            digest.update(f"{name} {t.dtype} {tuple(t.shape)}\n".encode())
            digest.update(data.numpy().tobytes())
    return digest.hexdigest()


def _steps(cfg, B: int, T: int, rng: random.Random) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    prefill = max(1, min(4, 16 // B))
    lengths = [prefill] + [T] * DECODE_STEPS
    return [torch.randint(0, cfg.vocab_size, (B, n), generator=gen) for n in lengths]


def _decode(executor, cfg, dtype, device, plan: dict) -> list[torch.Tensor]:
    cache = executor.new_cache(cfg, plan["num_slots"], dtype, torch.device(device), PAGE_SIZE)
    out = []
    for ids in plan["steps"]:
        batch = cache.batch(plan["slots"], ids.shape[1])
        logits = executor.forward(ids.to(device), cache, batch)
        cache.advance(batch)
        out.append(logits.float().cpu())
    return out


def plan_executor_run(target, source: str, jobdir: Path, rng: random.Random, hidden_cfg=None) -> dict:
    """The executor run of ``source`` for ``target`` (see the module docstring), with the reference
    executor's logits (``"reference"``; the parent keeps them, the child never sees them)."""
    from nonstop.model.build import random_model
    from nonstop.program.lower import lower
    from nonstop.runtime.executors import ReferenceExecutor
    from nonstop.runtime.tuned import device_name, op_variant, program_shape_key
    from nonstop.tune import store

    shape = target.shapes[0] if target.shapes else None
    cfg = target.cfg if shape is not None else hidden_cfg
    B, T = (shape.B, shape.T) if shape is not None else (2, 1)
    seed = rng.randrange(2**31)
    model = random_model(cfg, target.dtype, device=target.device, seed=seed)
    weights = fingerprint(model)  # before lowering, as the child takes it
    steps = _steps(cfg, B, T, rng)
    plan = {
        "cfg": cfg,
        "dtype": target.dtype,
        "seed": seed,
        "kind": target.kind,
        "steps": steps,
        "num_slots": max(NUM_SLOTS, B + 2),
        "slots": rng.sample(range(max(NUM_SLOTS, B + 2)), B),
        "store": str(jobdir / "store" / "tuning.json"),
        "fingerprint": weights,
        "B": B,
        "T": T,
    }
    program = lower(model)
    ops = [op for op in program.ops if op.kind == target.kind]
    keys: dict[str, list[str]] = {}  # the keys runtime/tuned.TunedKind looks up -> the variants run there
    for op in ops:
        variants = keys.setdefault(program_shape_key(program, op, B, T), [])
        if op_variant(op) not in variants:
            variants.append(op_variant(op))
    for key, variants in sorted(keys.items()):
        entry = {"proposer": "verify", "variants": variants}
        store.record(Path(plan["store"]), device_name(target.device), target.kind, key, source, entry)
    plan["tuned_calls"] = len(ops) * DECODE_STEPS
    with torch.inference_mode():
        reference = _decode(ReferenceExecutor(model), cfg, target.dtype, target.device, plan)
    return {"job": plan, "reference": reference}


def run_executor(plan: dict, device: torch.device, with_store: bool) -> dict:
    """In the child: the plan's decode through ``SuperOpExecutor``, with the job's store (the candidate as
    the stored winner) or without it (the built-in kernel). Returns the logits and what the executor says."""
    from nonstop.model.build import random_model
    from nonstop.program.reference import REFERENCE
    from nonstop.runtime.superop import SuperOpExecutor
    from nonstop.runtime.tuned import STORE_ENV

    os.environ[STORE_ENV] = plan["store"] if with_store else "off"
    model = random_model(plan["cfg"], plan["dtype"], device=device, seed=plan["seed"])
    weights = fingerprint(model)
    table = None
    if device.type != "cuda":
        from nonstop.kernels import KERNELS

        table = {**REFERENCE, plan["kind"]: KERNELS[plan["kind"]]}
    executor = SuperOpExecutor(model, kernels=table)
    with torch.inference_mode():
        logits = _decode(executor, plan["cfg"], plan["dtype"], device, plan)
    tuned = executor.stats.get("tuned", {}).get(plan["kind"], {}).get("used", {})
    return {
        "logits": logits,
        "fingerprint": weights,
        "tuned_calls": sum(tuned.values()),
        "reference_steps": executor.stats.get("reference_steps", 0),
        "graphs": str(executor.stats.get("graphs")),
        "pdl": str(executor.stats.get("pdl")),
    }


def judge_executor_run(planned: dict, builtin: dict | None, got: dict | None, tol: tuple[float, float]) -> list[str]:
    """The problems of the candidate's executor run (empty: it gave the reference's logits)."""
    job = planned["job"]
    where = f"executor run (superop executor with the candidate stored, B={job['B']} T={job['T']})"
    if builtin is None or "error" in builtin:
        raise RuntimeError(f"verifier: the built-in executor run failed: {(builtin or {}).get('error')}")
    if builtin["fingerprint"] != job["fingerprint"]:
        raise RuntimeError("verifier: the child's executor model differs from the parent's (weights fingerprint)")
    if got is None:
        return [f"{where}: did not run"]
    if "error" in got:
        return [f"{where}: raised {got['error']}"]
    if got.get("patched") or got.get("new_threads"):
        return [f"{where}: replaced {got.get('patched')} / started {got.get('new_threads')} thread(s)"]
    if got["tuned_calls"] < job["tuned_calls"]:
        return [f"{where}: the executor ran the stored candidate {got['tuned_calls']} of {job['tuned_calls']} times"]
    steps = len(planned["reference"])
    if len(builtin["logits"]) != steps:
        raise RuntimeError(f"verifier: the built-in executor run gave {len(builtin['logits'])} of {steps} steps")
    if len(got["logits"]) != steps:
        return [f"{where}: gave logits for {len(got['logits'])} of {steps} steps"]
    rtol, atol = tol
    for i, (ref, b, c) in enumerate(zip(planned["reference"], builtin["logits"], got["logits"])):
        scale = float(ref.abs().max())
        dev_b = float((b - ref).abs().max())
        dev_c = float((c - ref).abs().nan_to_num(float("inf")).max())
        bound = DEVIATION_FACTOR * dev_b + rtol * scale + atol
        if not dev_c <= bound:
            return [
                f"{where}: step {i + 1} logits differ from the reference executor's: max |diff| {dev_c:.3g} > "
                f"{bound:.3g} (the built-in kernel's {dev_b:.3g}; logits up to {scale:.3g}): the candidate is "
                "wrong in the model (op variants, attributes or state kept between steps that only the model "
                "exercises)"
            ]
    return []
