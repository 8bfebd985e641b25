"""Batch-1 decode-step latency on a GPU: nonstop's ``superop`` and ``megakernel`` executors against their peers.

Rows, each timed in the same run on the same random-weight model (bf16):
  eager     the reference model (``CausalLM.forward``), plain PyTorch
  compiled  the reference under ``torch.compile(mode="reduce-overhead")`` (CUDA graphs): our peer
  superop   one Triton launch per super-op, the whole step replayed as one CUDA graph (+ PDL)
  megakernel  the whole step as ONE persistent Triton kernel (one program per SM taking tasks from an
            atomic queue; same tile bodies as superop), its launch replayed from a CUDA graph
Shapes: ``llama-3.2-1b`` (whole model), ``kimi-linear-48b-a3b`` (a slice of its first layers; 98 GB
do not fit one GPU) and a ``kimi-k3`` slice of full-width layers with MXFP4 experts. A slice is timed
with N layers and with 1 layer (the same weights), giving ms per layer = (t_N - t_1) / (N - 1) and an
extrapolation to the full depth: t_1 + (L - 1) · ms per layer (layer 0 is dense; the others are MoE).

Method: first a correctness check at full shape (superop and megakernel, each vs the eager reference over a few greedy
steps after a random prompt: max relative logit error max|Δ| / max|ref|, in fp32, and greedy
agreement; in bf16 also each against an fp32 copy of the reference, beside the bf16 reference's own
distance from it: the floor that bf16 rounding, and the routing flips it causes, set. A check passes within
5e-2 of the bf16 reference, or within twice the floor of fp32). Then each row decodes one token at a fixed
position (the cache is not advanced, so every step has the same shapes; ``--context`` tokens already
cached) ``--warmup`` times, then ``--steps`` times with a CUDA event pair around each step: ms/token is
the median (p10 / p90 too).
Bytes per token come from the Program's cost model (``Program.total_cost(rows=1, context)``: weights
streamed, routed experts only for the top-k chosen, plus cache and activation reads). MBU = achieved
GB/s (bytes read per step / time) ÷ the device-to-device copy bandwidth measured in the same run
(a 1 GiB ``copy_``, counting bytes read + written). Launches per step: the superop executor's own
count (Triton + torch launches of the step) and, for every row, the kernels that the profiler (CUPTI)
sees in one step.

    python bench/decode.py                                  # all shapes, on the GPU (rows skipped past --budget-s)
    python bench/decode.py --shapes llama-3.2-1b --long-context 8192   # one shape per 10-minute call
    python bench/decode.py --shapes kimi-linear-48b-a3b
    python bench/decode.py --shapes kimi-k3-slice
    python bench/decode.py --dry-run                        # = --device cpu --tiny: the whole script, minutes on a CPU

The offline GPU check (``nonstop gpucheck``: every kernel of each timed shape compiled for sm_90a as it
launches - warps, registers, spills, shared memory, CTAs per SM, grid, weight load widths, an acquire after
every spin-wait; the real widths, also in a --tiny run) runs in a background process while the GPU is
timed; its table is printed beside the timings (``--gpucheck-triton DIR`` repeats it under another Triton;
``--no-gpucheck`` skips it).

Results: JSON to ``bench/results/decode_<gpu>[_<shapes>].json`` and ``$OUT`` (when set) with the GPU, driver,
torch / triton versions and the exact command; a table last on stdout.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from script_args import (  # noqa: E402
    choice_list,
    non_negative_float,
    non_negative_int,
    out_file,
    positive_int,
    run,
    thread_count,
)

from nonstop.cache.state import ModelCache  # noqa: E402
from nonstop.config import ModelConfig  # noqa: E402
from nonstop.hostinfo import Clock, copy_bandwidth, cuda_missing, decode_floor, environment  # noqa: E402
from nonstop.kernels.platform import interpreting  # noqa: E402
from nonstop.model.build import assemble_model  # noqa: E402
from nonstop.model.stack import CausalLM  # noqa: E402
from nonstop.weights.resolve import check_device  # noqa: E402

# name -> (preset, layers timed on an 80 GB GPU, depth of the full model); see the module docstring
SHAPES = {
    "llama-3.2-1b": ("llama-3.2-1b", None),
    "kimi-linear-48b-a3b": ("kimi-linear-48b-a3b", 9),  # 1 dense + 8 MoE layers (6 KDA, 2 MLA), ~31 GB
    "kimi-k3-slice": ("kimi-k3", 4),  # 1 dense + 3 MoE layers (2 KDA, 1 MLA), MXFP4 experts, ~58 GB
}
PUBLIC_BEST = {"llama-3.2-1b": "H100 SXM: 0.973 ms/token, ~78% of bandwidth (Hazy megakernel); graphs+PDL 0.980 ms"}
ROWS = ("superop", "megakernel", "eager", "compiled")
EXECUTOR_ROWS = ("superop", "megakernel")
SPEC_GBPS = {"H100 80GB HBM3": 3350, "H100 SXM": 3350, "H100 PCIe": 2039, "H100 NVL": 3900, "H200": 4800}
CONVENTION = (
    "MBU = bytes read per step / step time ÷ copy bandwidth; "
    "copy bandwidth counts bytes read + written (2 × size / time)"
)


# ----------------------------------------------------------------------------- models


def build_model(cfg: ModelConfig, dtype, device, seed: int) -> CausalLM:
    """``cfg``'s model with ``nonstop synth``'s random weights; on a GPU drawn there (a host draw and copy of
    tens of GB takes minutes): the same distributions, other values."""
    from nonstop.weights.synth import random_state_dict

    on_gpu = torch.device(device).type == "cuda"
    return assemble_model(cfg, random_state_dict(cfg, dtype, device, seed, draw_on_device=on_gpu))


def prefix_model(model: CausalLM, n: int) -> CausalLM:
    """The first ``n`` layers of ``model`` (embedding, final norm and head included), sharing its tensors."""
    cfg = model.cfg.with_num_layers(n)
    with torch.device("meta"):
        small = CausalLM(cfg)
    names = set(small.state_dict())
    small.load_state_dict({k: v for k, v in model.state_dict().items() if k in names}, strict=True, assign=True)
    return small.eval().requires_grad_(False)


def shape_config(name: str, layers: int | None, tiny: bool) -> ModelConfig:
    preset, default_layers = SHAPES[name]
    cfg = ModelConfig.preset(preset)
    if tiny:
        from nonstop.program.twin import narrow_twin

        cfg = narrow_twin(cfg)
    n = layers or default_layers
    return cfg.with_num_layers(min(n, cfg.num_hidden_layers)) if n else cfg


def full_depth(name: str) -> int:
    return ModelConfig.preset(SHAPES[name][0]).num_hidden_layers


# ----------------------------------------------------------------------------- measuring


def profiled_launches(step, device) -> dict | None:
    """Kernels (and memcpy / memset) that the profiler sees in one call of ``step`` on a GPU."""
    if torch.device(device).type != "cuda":
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    out = {"kernels": 0, "memcpy": 0, "memset": 0, "graph_launches": 0, "launch_calls": 0}
    for evt in prof.events():
        name = evt.name
        if getattr(evt, "device_type", None) == DeviceType.CUDA:
            kind = "memcpy" if "memcpy" in name.lower() else "memset" if "memset" in name.lower() else "kernels"
            out[kind] += 1
        elif name in ("cudaGraphLaunch", "cuGraphLaunch"):
            out["graph_launches"] += 1
        elif re.fullmatch(r"cu(da)?LaunchKernel(Ex(C)?)?(_v2)?", name):
            out["launch_calls"] += 1
    return out


def counted_launches(step, device) -> dict:
    from nonstop.runtime.launch_count import LaunchCounter

    counter = LaunchCounter(device)
    with counter:
        step()
    return {k: v for k, v in counter.summary().items() if k in ("launches", "triton", "torch", "host_syncs")}


# ----------------------------------------------------------------------------- one shape


def prefilled(model: CausalLM, context: int, device, *, capacity: int, gen=None) -> tuple[ModelCache, torch.Tensor]:
    """A batch-1 cache (room for ``capacity`` tokens) holding a random ``context``-token prompt prefilled
    by the reference model, and the prompt's last logits [1, vocab]."""
    cfg = model.cfg
    prompt = torch.randint(0, cfg.vocab_size, (1, context), generator=gen).to(device)
    cache = ModelCache(cfg, 1, capacity=capacity, dtype=model.embed_tokens.weight.dtype, device=device)
    batch = cache.batch([0], context)
    logits = model(prompt, cache, batch, last_only=True)
    cache.advance(batch)
    return cache, logits


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max|got - want| / max|want| in fp32, the error every check here reports; NaN in ``got`` counts as inf."""
    got, want = got.float(), want.float()
    return float(((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).nan_to_num(float("inf")))


FLOOR_FACTOR = 2.0  # kernels may be off fp32 by at most this times what bf16 PyTorch itself is off it


def fp32_truth(model: CausalLM) -> CausalLM:
    """The reference with its floating-point weights upcast to fp32 (the same values) and its packed ones (MXFP4
    experts and their scales) shared, not copied: what a bf16 step's error is measured against when the fp32
    floor is on. It costs twice the reference's floating-point bytes: 21 GB beside the 58 GB of Kimi K3's 4-layer
    slice (10 GB of it bf16, the rest packed experts), 63 GB beside kimi-linear's 9-layer 31 GB."""
    return assemble_model(
        model.cfg, {k: v.float() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    )


def correctness(
    model, executor, cfg, dtype, device, context: int, steps: int, seed: int, truth=None
) -> tuple[dict, ModelCache]:
    """Greedy decode after a random prompt: superop vs the eager reference on copies of one cache.
    Returns the check and the superop's cache (context + steps tokens) for the timing.

    With ``truth`` (``fp32_truth(model)``), every step also runs in fp32 on its own cache of the same prompt
    and tokens, and the check reports the floor: how far bf16 PyTorch's logits are from fp32's (routing flips
    included: a random router's top-k sits between near-equal scores, bench/routing_sensitivity.py) and how
    far the kernels' are. The kernels pass if within ``tolerance`` of the bf16 reference, or no further from
    fp32 than ``FLOOR_FACTOR`` times the reference is."""
    gen = torch.Generator().manual_seed(seed)
    ref_cache, logits = prefilled(model, context, device, capacity=context + steps + 2, gen=gen)
    sup_cache = copy.deepcopy(ref_cache)
    if truth is not None:  # the same prompt: a generator of the same seed draws it again
        gen = torch.Generator().manual_seed(seed)
        true_cache, _ = prefilled(truth, context, device, capacity=context + steps + 2, gen=gen)
    token = logits.argmax(-1, keepdim=True)
    errors, floor, vs_fp32, agree, finite = [], [], [], 0, True
    for _ in range(steps):
        rb, sb = ref_cache.batch([0], 1), sup_cache.batch([0], 1)
        want = model(token, ref_cache, rb, last_only=True).float()
        got = executor.forward(token, sup_cache, sb, last_only=True).float()
        ref_cache.advance(rb)
        sup_cache.advance(sb)
        if truth is not None:
            tb = true_cache.batch([0], 1)
            true = truth(token, true_cache, tb, last_only=True).float()
            true_cache.advance(tb)
            floor.append(rel_err(want, true))
            vs_fp32.append(rel_err(got, true))
        finite &= bool(torch.isfinite(got).all())
        errors.append(rel_err(got, want))
        agree += int(got.argmax(-1).item() == want.argmax(-1).item())
        token = want.argmax(-1, keepdim=True)
    del ref_cache
    tol = 1e-3 if dtype == torch.float32 else 5e-2  # bf16 kernels vs bf16 torch: different rounding, near-ties may flip
    check = {
        "steps": steps,
        "max_rel_err": max(errors),
        "greedy_agreement": agree / steps,
        "finite": finite,
        "tolerance": tol,
        "ok": finite and max(errors) < tol,
    }
    if truth is not None:
        within = max(vs_fp32) <= FLOOR_FACTOR * max(floor)
        check.update(
            fp32_floor_rel_err=max(floor),
            max_rel_err_vs_fp32=max(vs_fp32),
            floor_factor=FLOOR_FACTOR,
            within_floor=within,
            ok=finite and (max(errors) < tol or within),
        )
    return check, sup_cache


def compiled_step(model, cache, ids, batch):
    """The reference under torch.compile(reduce-overhead); cache tensors marked static (they are
    mutated in place, which CUDA graphs allow only for static addresses). Dynamo's counters (process-wide)
    start again from zero, so ``dynamo_counters()`` counts this row's graphs and breaks alone."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    counters.clear()

    for layer in cache.layers:
        tensors = (
            list(layer.tensors.values())
            if hasattr(layer, "tensors")
            else [v for v in vars(layer).values() if isinstance(v, torch.Tensor)]
        )
        for t in tensors:
            torch._dynamo.mark_static_address(t)
    torch._dynamo.mark_static_address(cache.pages.table)
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
    return lambda: compiled(ids, cache, batch, last_only=True)


def dynamo_counters() -> dict:
    """Dynamo's graphs, graph breaks and CUDA-graph skips since the last ``compiled_step`` (``{}`` when unreadable)."""
    try:
        from torch._dynamo.utils import counters

        out = {
            "unique_graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
        }
        out.update({k: int(v) for k, v in counters["inductor"].items() if "cudagraph" in k})  # e.g. cudagraph_skips
        return out
    except Exception:  # noqa: BLE001 - informational only
        return {}


class Budget:
    def __init__(self, seconds: float):
        self.t0 = time.perf_counter()
        self.seconds = seconds

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.seconds - self.elapsed


def _failures(report: dict) -> int:
    """Shapes that failed, checks that failed or erred and timed rows that erred: a run with any is not clean
    (skipped rows and an fp32 floor without room are not failures)."""
    n = 0
    for shape in report["shapes"]:
        n += "error" in shape
        for sl in shape.get("slices", []):
            for key in ("check", "check_megakernel"):
                check = sl.get(key)
                n += isinstance(check, dict) and ("error" in check or check.get("ok") is False)
            n += sum("error" in r for t in sl.get("timings", []) for r in t["rows"])
    return n


def _skipped(report: dict) -> tuple[int, int]:
    """(shapes, timed rows) skipped for the time budget (``--budget-s``): such a run is partial, not failed."""
    shapes = sum("skipped" in shape for shape in report["shapes"])
    rows = sum(
        "skipped" in r
        for shape in report["shapes"]
        for sl in shape.get("slices", [])
        for t in sl.get("timings", [])
        for r in t["rows"]
    )
    return shapes, rows


def _status(report: dict) -> str:
    """ "complete"; or "partial: ..." when the time budget skipped shapes or rows; either with the failures."""
    shapes, rows = _skipped(report)
    status = f"partial: {shapes} shape(s) and {rows} row(s) skipped (time budget)" if shapes or rows else "complete"
    failed = _failures(report)
    return f"{status}, {failed} failure(s): see the shapes' checks and rows" if failed else status


def time_rows(
    model, executors: dict, program, cache, context: int, args, device, budget: Budget, label: str
) -> list[dict]:
    """Time each requested row decoding one token at position ``context`` of ``cache`` (not advanced);
    ``executors``: {row: executor or None} for the executor rows."""
    clock = Clock(device)
    cost = program.total_cost(rows=1, context=context)
    with torch.inference_mode():  # the check filled the cache in inference mode: reserving its next page writes it
        ids = torch.tensor([[1]], device=device)
        batch = cache.batch([0], 1)
    results = []
    for row in args.rows:
        entry = {"row": row, "label": label, "context": context}
        if budget.left() < args.reserve_s:
            entry["skipped"] = f"time budget ({budget.elapsed:.0f} s used of {budget.seconds:.0f})"
            results.append(entry)
            continue
        t0 = time.perf_counter()
        try:
            with torch.inference_mode():
                executor = executors.get(row)
                if row in EXECUTOR_ROWS:
                    if executor is None:
                        raise RuntimeError(args.executor_errors.get(row, f"{row} not built"))
                    step = lambda ex=executor: ex.forward(ids, cache, batch, last_only=True)  # noqa: E731
                elif row == "eager":
                    step = lambda: model(ids, cache, batch, last_only=True)  # noqa: E731
                else:
                    step = compiled_step(model, cache, ids, batch)
                timing = clock.time_steps(step, args.steps, args.warmup)
                entry.update(timing)
                entry["achieved_GBps"] = cost.bytes_read / timing["ms_per_token"] / 1e6
                entry["weight_GBps"] = cost.weight_bytes / timing["ms_per_token"] / 1e6
                entry["profiler"] = profiled_launches(step, device)
                if row in EXECUTOR_ROWS:
                    entry["launches_per_step"] = executor.stats["launches_per_step"]
                    entry["executor"] = {
                        k: executor.stats[k]
                        for k in (
                            "host_syncs_per_step",
                            "pdl_launches_per_step",
                            "graph_captures",
                            "graph_replays",
                            "eager_steps",
                            "graphs",
                            "pdl",
                        )
                    }
                    if row == "megakernel":
                        entry["schedule"] = {
                            shape: {
                                k: s[k] for k in ("tasks", "ops", "counters", "waits", "depth", "task_classes", "grid")
                            }
                            for shape, s in executor.stats["schedule"].items()
                        }
                elif not clock.cuda:
                    entry["launches_per_step"] = counted_launches(step, device)["launches"]
                if clock.cuda and entry.get("profiler"):
                    entry.setdefault(
                        "launches_per_step",
                        entry["profiler"]["kernels"] + entry["profiler"]["memcpy"] + entry["profiler"]["memset"],
                    )
                if row == "compiled":
                    entry["dynamo"] = dynamo_counters()
                out = step()
                entry["finite_logits"] = bool(torch.isfinite(out).all())
        except Exception as exc:  # noqa: BLE001 - a failing row is reported, the others still run
            entry["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        entry["wall_s"] = round(time.perf_counter() - t0, 1)
        results.append(entry)
        print(
            f"  [{budget.elapsed:5.0f}s] {label} {row}: "
            + (
                f"{entry['ms_per_token']:.4f} ms/token"
                if "ms_per_token" in entry
                else entry.get("error") or entry.get("skipped")
            ),
            flush=True,
        )
    return results


def make_executors(m, program, args) -> dict:
    """{row: executor or None} for the requested executor rows; build errors in ``args.executor_errors``."""
    from nonstop.runtime.superop import SuperOpExecutor

    executors, args.executor_errors = {}, {}
    for row in [r for r in EXECUTOR_ROWS if r in args.rows]:
        try:
            if row == "superop":
                executors[row] = SuperOpExecutor(m, use_kernels=args.kernels, program=program)
            else:
                from nonstop.runtime.megakernel import MegakernelExecutor

                executors[row] = MegakernelExecutor(m, program=program)
        except Exception as exc:  # noqa: BLE001
            executors[row], args.executor_errors[row] = None, f"{type(exc).__name__}: {exc}"
    return executors


def run_shape(name: str, args, device, dtype, budget: Budget, copy_gbps: float) -> dict:
    from nonstop.program.lower import lower

    cfg = shape_config(name, getattr(args, f"{name.replace('-', '_').replace('.', '_')}_layers", None), args.tiny)
    n_layers = cfg.num_hidden_layers
    result = {
        "shape": name,
        "preset": SHAPES[name][0],  # the model whose first ``layers`` layers a slice times (nonstop plan reads it)
        "layers_timed": n_layers,
        "full_layers": full_depth(name),
        "expert_format": cfg.moe.expert_format if cfg.moe else None,
        "public_best": PUBLIC_BEST.get(name),
    }
    print(f"[{budget.elapsed:5.0f}s] {name}: {n_layers} layers, building random weights on {device}", flush=True)
    model = build_model(cfg, dtype, device, args.seed)
    slices = [(n_layers, model)]
    if args.extrapolate and n_layers < result["full_layers"] and n_layers > 1:
        slices.append((1, prefix_model(model, 1)))
    result["slices"] = []
    for layers, m in slices:
        program = lower(m)
        executors = make_executors(m, program, args)
        entry = {
            "layers": layers,
            "weight_bytes_total": sum(t.numel() * t.element_size() for t in m.state_dict().values()),
            "ops": len(program.ops),
        }
        cache, truth = None, None
        if args.fp32_floor and dtype != torch.float32:
            try:
                truth = fp32_truth(m)
            except torch.OutOfMemoryError as exc:  # the check goes on against the bf16 reference alone
                entry["fp32_floor"] = {"error": f"no room for the fp32 copy: {exc}"[:500]}
                _release()
        with torch.inference_mode():
            for row, executor in executors.items():  # "check" (superop) and "check_megakernel"
                if executor is None:
                    continue
                key = "check" if row == "superop" else f"check_{row}"
                while True:
                    no_room = None
                    try:
                        entry[key], row_cache = correctness(
                            m, executor, m.cfg, dtype, device, args.context, args.check_steps, args.seed, truth
                        )
                        cache = cache if cache is not None else row_cache
                    except Exception as exc:  # noqa: BLE001
                        entry[key] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
                        if truth is not None and isinstance(exc, torch.OutOfMemoryError):
                            no_room = f"no room for the fp32 copy beside the check: {exc}"[:500]
                    if no_room is None:
                        break
                    # the fp32 copy took the room the check needed: drop it (out of the except block, whose
                    # traceback holds it) and check again against the bf16 reference alone
                    entry["fp32_floor"], truth = {"error": no_room}, None
                    _release()
            del truth
            _release()
            if cache is None:
                cache, _ = prefilled(m, args.context, device, capacity=args.context + 2)
        _release()
        contexts = [int(cache.lengths[0])] + ([args.long_context] if args.long_context else [])
        entry["timings"] = []
        for context in contexts:
            if context != contexts[0]:  # prefill the long context with the reference
                with torch.inference_mode():
                    cache, _ = prefilled(m, context, device, capacity=context + 2)
            cost = program.total_cost(rows=1, context=context)
            timing = {
                "context": context,
                "weight_bytes_per_token": cost.weight_bytes,
                "bytes_read_per_token": cost.bytes_read,
                "floor": decode_floor(cost.bytes_read, copy_gbps),
                "rows": time_rows(
                    m, executors, program, cache, context, args, device, budget, f"{name}[{layers}L ctx {context}]"
                ),
            }
            for row in timing["rows"]:
                if "achieved_GBps" in row:
                    row["mbu"] = row["achieved_GBps"] / copy_gbps
            entry["timings"].append(timing)
        result["slices"].append(entry)
        del executors, program, cache
        _release()
    if len(result["slices"]) == 2:
        result["extrapolation"] = extrapolate(result)
    del model, slices
    _release()
    return result


def extrapolate(result: dict) -> dict:
    """ms per MoE layer = (t_N - t_1) / (N - 1) per row and context; full depth t_1 + (L - 1) · per layer."""
    big, one = result["slices"]
    n, full = big["layers"], result["full_layers"]
    out = {
        "method": f"per layer = (t_{n} - t_1) / {n - 1}; full = t_1 + {full - 1} × per layer (bytes likewise)",
        "rows": [],
    }
    for tb, t1 in zip(big["timings"], one["timings"]):
        bytes_layer = (tb["bytes_read_per_token"] - t1["bytes_read_per_token"]) / (n - 1)
        full_bytes = t1["bytes_read_per_token"] + (full - 1) * bytes_layer
        for rb, r1 in zip(tb["rows"], t1["rows"]):
            if "ms_per_token" not in rb or "ms_per_token" not in r1:
                continue
            per_layer = (rb["ms_per_token"] - r1["ms_per_token"]) / (n - 1)
            full_ms = r1["ms_per_token"] + (full - 1) * per_layer
            out["rows"].append(
                {
                    "row": rb["row"],
                    "context": tb["context"],
                    "ms_per_layer": per_layer,
                    "bytes_per_layer": bytes_layer,
                    "full_ms_per_token": full_ms,
                    "full_bytes_per_token": full_bytes,
                    "full_achieved_GBps": full_bytes / full_ms / 1e6 if full_ms > 0 else None,
                }
            )
    return out


def _release():
    gc.collect()
    try:
        import torch._dynamo

        torch._dynamo.reset()
    except Exception:  # noqa: BLE001
        pass
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- the offline GPU check


def start_gpucheck(args, env: dict) -> list:
    """The offline GPU check of the shapes to time - the real widths even in a --tiny run (it reads no
    weights) at the timed layer counts - one background process per Triton (this one first)."""
    from nonstop.runtime import gpucheck

    shapes = []
    for name in args.shapes:
        cfg = shape_config(name, getattr(args, f"{name.replace('-', '_').replace('.', '_')}_layers", None), False)
        shapes.append((name, SHAPES[name][0], cfg.num_hidden_layers))
    gpu = "h200" if "H200" in (env.get("gpu") or "") else "h100"
    return [(path, gpucheck.start_check(shapes, gpu=gpu, triton_path=path)) for path in [None, *args.gpucheck_triton]]


def finish_gpucheck(started: list, timeout: float) -> list[dict]:
    from nonstop.runtime import gpucheck

    out = []
    for path, proc in started:
        try:
            result = gpucheck.finish_check(proc, timeout)
        except RuntimeError as exc:
            result = {"error": str(exc)[-2000:]}
        out.append({"triton_path": path, **result})
    return out


def gpucheck_tables(results: list[dict]) -> str:
    from nonstop.runtime import gpucheck

    parts = []
    for r in results:
        if "error" in r:
            parts.append(f"offline GPU check ({r['triton_path'] or 'this Triton'}): {r['error'][-300:]}")
            continue
        rows = [gpucheck.Row(**row) for row in r["rows"]]
        bad = sum(len(row.violations) for row in rows)
        parts.append(gpucheck.table(rows, r["triton"]) + f"\n{bad} violation(s) of the offline check (sm_90a)")
    return "\n\n".join(parts)


# ----------------------------------------------------------------------------- report


def spec_bandwidth(gpu: str | None) -> float | None:
    for key, gbps in SPEC_GBPS.items():
        if gpu and key in gpu:
            return gbps
    return None


def _line(shape: str, layers, context, row: str, ms=None, gbps=None, mbu=None, launches="", note: str = "") -> str:
    """One row of the table; a missing number prints as '-'."""
    num = lambda v, spec, width: f"{v:>{width}{spec}}" if v is not None else f"{'-':>{width}}"  # noqa: E731
    cells = (
        f"{shape:<22} {layers:>6} {context:>5} {row:<9} {num(ms, '.4f', 9)} {num(gbps, '.1f', 7)} {num(mbu, '.1%', 6)}"
    )
    return f"{cells} {str(launches):>8}  {note}"


def table(report: dict) -> str:
    head = f"{'shape':<22} {'layers':>6} {'ctx':>5} {'row':<9} {'ms/token':>9} {'GB/s':>7} {'MBU':>6} {'launches':>8}"
    lines = [head + "  note"]
    copy_gbps = report["bandwidth"]["copy_GBps"]
    for shape in report["shapes"]:
        name = shape["shape"]
        if "error" in shape or "skipped" in shape:  # lost whole (out of memory, the time budget): said, not dropped
            lines.append(
                _line(
                    name,
                    "-",
                    "-",
                    "-",
                    note=f"error: {shape['error'][:90]}" if "error" in shape else f"skipped: {shape['skipped']}",
                )
            )
        for sl in shape.get("slices", []):
            for i, t in enumerate(sl["timings"]):
                for r in t["rows"]:
                    check = sl.get("check" if r["row"] == "superop" else f"check_{r['row']}", {}) if i == 0 else {}
                    if "max_rel_err" in check:
                        note = f"check: rel err {check['max_rel_err']:.1e}, greedy {check['greedy_agreement']:.0%}"
                        if "fp32_floor_rel_err" in check:  # kernels vs fp32 beside bf16 torch vs fp32
                            vs, floor = check["max_rel_err_vs_fp32"], check["fp32_floor_rel_err"]
                            note += f", vs fp32 {vs:.1e} (floor {floor:.1e})"
                    else:
                        note = "check: " + check["error"][:60] if "error" in check else ""
                    if "ms_per_token" in r:
                        launches = r.get("launches_per_step", "?")
                        cells = (r["ms_per_token"], r["achieved_GBps"], r["mbu"], launches)
                        lines.append(_line(name, sl["layers"], t["context"], r["row"], *cells, note))
                    else:
                        why = (r.get("error") or r.get("skipped") or "")[:90]
                        lines.append(_line(name, sl["layers"], t["context"], r["row"], launches="-", note=why))
                fl = t.get("floor")
                if fl:
                    note = "the floor: bytes read per token at the copy bandwidth"
                    lines.append(
                        _line(
                            name,
                            sl["layers"],
                            t["context"],
                            "floor",
                            fl["floor_ms_per_token"],
                            fl["copy_GBps"],
                            1.0,
                            "",
                            note,
                        )
                    )
        for e in shape.get("extrapolation", {}).get("rows", []):
            gbps = e["full_achieved_GBps"]
            note = f"extrapolated, {e['ms_per_layer']:.4f} ms/layer"
            lines.append(
                _line(
                    name + " (full)",
                    shape["full_layers"],
                    e["context"],
                    e["row"],
                    e["full_ms_per_token"],
                    gbps or 0,
                    gbps / copy_gbps if gbps else 0,
                    "",
                    note,
                )
            )
        if shape.get("public_best"):
            lines.append(f"{'':<22} public best: {shape['public_best']}")
    bw = report["bandwidth"]
    lines.append(
        f"copy bandwidth {bw['copy_GBps']:.0f} GB/s (read + write), read-only sum {bw['read_sum_GBps']:.0f} GB/s"
        + (f", spec {report['spec_GBps']} GB/s" if report.get("spec_GBps") else "")
    )
    lines.append(CONVENTION)
    return "\n".join(lines)


def output_name(env: dict, tiny: bool, shapes: list[str]) -> str:
    """decode_<gpu>.json for all shapes, decode_<gpu>_<shape>.json for a subset (one call per shape)."""
    base = env.get("gpu") or f"cpu{'-tiny' if tiny else ''}"
    suffix = "" if list(shapes) == list(SHAPES) else "_" + "+".join(shapes)
    return "decode_" + re.sub(r"[^A-Za-z0-9+]+", "-", base + suffix).strip("-").lower() + ".json"


def write(report: dict, args) -> list[str]:
    name = output_name(report["environment"], args.tiny, args.shapes)
    paths = []
    if args.out:
        paths.append(Path(args.out))
    elif not args.tiny:
        paths.append(ROOT / "bench" / "results" / name)
    if os.environ.get("OUT"):
        paths.append(Path(os.environ["OUT"]) / name)
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return [str(p) for p in paths]


# ----------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    """The command line's options (``parse_args`` then settles the defaults that depend on the device)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--shapes",
        type=choice_list(SHAPES),
        default=",".join(SHAPES),
        help=f"comma-separated, from: {', '.join(SHAPES)}",
    )
    ap.add_argument(
        "--rows",
        type=choice_list(ROWS),
        default=None,
        help=f"comma-separated, from: {', '.join(ROWS)} (default: all on a GPU; superop,megakernel,eager on a CPU, "
        "the megakernel under Triton's interpreter)",
    )
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument(
        "--tiny",
        action="store_true",
        help="narrow twins of the shapes (same layers and kinds, tiny widths), fp32: a quick run of the whole script",
    )
    ap.add_argument(
        "--dry-run", action="store_true", help="= --device cpu --tiny with few steps (CI-like check of the script)"
    )
    ap.add_argument(
        "--kernels",
        dest="kernels",
        action="store_true",
        default=None,
        help="superop with Triton kernels (default on a GPU)",
    )
    ap.add_argument(
        "--twins", dest="kernels", action="store_false", help="superop with the plain-torch twins (default on a CPU)"
    )
    ap.add_argument(
        "--context",
        type=positive_int,
        default=128,
        help="tokens in the cache before the timed steps (short context; default 128)",
    )
    ap.add_argument(
        "--long-context", type=non_negative_int, default=0, help="also time at this context (e.g. 8192); 0: off"
    )
    ap.add_argument(
        "--steps", type=positive_int, default=300, help="timed steps per row (median; default 300, a --dry-run 5)"
    )
    ap.add_argument(
        "--warmup",
        type=non_negative_int,
        default=30,
        help="untimed steps per row first (compiles, captures; default 30)",
    )
    ap.add_argument(
        "--check-steps", type=positive_int, default=4, help="greedy steps of the correctness check (default 4)"
    )
    ap.add_argument(
        "--no-fp32-floor",
        dest="fp32_floor",
        action="store_false",
        help="skip the fp32 copy of the reference the bf16 check measures its floor against (twice the "
        "reference's floating-point bytes; packed experts are shared; on by default for bf16)",
    )
    ap.add_argument(
        "--llama-layers",
        dest="llama_3_2_1b_layers",
        type=positive_int,
        default=None,
        help="layers of llama-3.2-1b to time (default: all 16)",
    )
    ap.add_argument(
        "--kimi-linear-layers",
        dest="kimi_linear_48b_a3b_layers",
        type=positive_int,
        default=None,
        help=f"layers of the kimi-linear-48b-a3b slice (default {SHAPES['kimi-linear-48b-a3b'][1]})",
    )
    ap.add_argument(
        "--k3-layers",
        dest="kimi_k3_slice_layers",
        type=positive_int,
        default=None,
        help=f"layers of the kimi-k3 slice (default {SHAPES['kimi-k3-slice'][1]}; 2-4 fit 80 GB)",
    )
    ap.add_argument("--no-extrapolate", dest="extrapolate", action="store_false", help="do not time the 1-layer slices")
    ap.add_argument(
        "--copy-bytes", type=positive_int, default=1 << 30, help="size of the bandwidth copy (default 1 GiB)"
    )
    ap.add_argument(
        "--budget-s",
        type=non_negative_float,
        default=None,
        help="skip rows once this many seconds have passed minus --reserve-s "
        "(default on a GPU 540: one 10-minute call; else none)",
    )
    ap.add_argument(
        "--reserve-s", type=non_negative_float, default=45.0, help="seconds kept for a row still to start (default 45)"
    )
    ap.add_argument(
        "--threads", type=thread_count, default=None, help="torch CPU threads (default: torch's; a --dry-run uses 1)"
    )
    ap.add_argument(
        "--no-gpucheck",
        dest="gpucheck",
        action="store_false",
        help="skip the offline GPU check (run in the background while the GPU is timed)",
    )
    ap.add_argument(
        "--gpucheck-triton",
        action="append",
        default=[],
        metavar="DIR",
        help="also run the offline GPU check with the Triton installed in DIR (repeatable)",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights and check inputs (default 0)")
    ap.add_argument(
        "--out",
        type=out_file,
        default=None,
        help="JSON path (default bench/results/decode_<gpu>.json; a --tiny run writes only --out / $OUT)",
    )
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.dry_run:
        args.device, args.tiny = "cpu", True
        defaults = {"steps": 300, "warmup": 30, "context": 128, "copy_bytes": 1 << 30}
        for key, value in {"steps": 5, "warmup": 1, "context": 12, "copy_bytes": 1 << 24}.items():
            if getattr(args, key) == defaults[key]:
                setattr(args, key, value)
        args.threads = args.threads or 1
    missing = cuda_missing(args.device, cpu_hint="--dry-run (or --device cpu --tiny)")
    if missing:
        ap.error(missing)
    try:
        args.device = str(check_device(args.device))
    except ValueError as exc:
        ap.error(f"argument --device: {exc}")
    if args.kernels is None:
        args.kernels = args.device.startswith("cuda")
    if args.budget_s is None:
        args.budget_s = 540.0 if args.device.startswith("cuda") else math.inf
    cpu = not args.device.startswith("cuda")
    if args.rows is None:
        args.rows = ["superop", "megakernel", "eager"] if cpu else list(ROWS)
    if cpu and "megakernel" in args.rows:  # the megakernel has no twin mode: Triton's interpreter on a CPU
        interpret_triton(argv)
    return args


def interpret_triton(argv) -> None:
    """Run Triton's kernels in its CPU interpreter: set ``TRITON_INTERPRET=1``. The kernels read it when they are
    defined, on import, which the imports of a script (``script_args``) may have done already: a script run from
    the command line (``argv`` None) then starts again with it set; a caller passing ``argv`` sets it first."""
    if interpreting():
        return
    os.environ["TRITON_INTERPRET"] = "1"
    if argv is None and "triton" in sys.modules:
        os.execv(sys.executable, [sys.executable, *sys.argv])


def use_device(name) -> torch.device:
    """``name`` as a torch.device (``check_device``: a ValueError says why this machine cannot use it); a CUDA
    device with an index becomes torch's current one, as CUDA events, ``synchronize`` and ``empty_cache`` act
    on the current device."""
    device = check_device(name)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    return device


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = use_device(args.device)
    dtype = torch.float32 if args.tiny else torch.bfloat16
    budget = Budget(args.budget_s)
    env = environment(device)
    command = " ".join(
        [
            Path(sys.executable).name,
            *([sys.argv[0]] if argv is None else ["bench/decode.py"]),
            *(sys.argv[1:] if argv is None else argv),
        ]
    )
    report = {
        "bench": "decode",
        "command": command,
        "environment": env,
        "dtype": str(dtype),
        "batch": 1,
        "convention": CONVENTION,
        "status": "running",
        "shapes": [],
    }
    started = start_gpucheck(args, env) if args.gpucheck else []
    report["bandwidth"] = copy_bandwidth(device, args.copy_bytes, reps=20)
    report["spec_GBps"] = spec_bandwidth(env.get("gpu"))
    print(
        f"[{budget.elapsed:5.0f}s] copy bandwidth {report['bandwidth']['copy_GBps']:.0f} GB/s on "
        f"{env.get('gpu') or 'cpu'}",
        flush=True,
    )
    for name in args.shapes:
        if budget.left() < args.reserve_s:
            report["shapes"].append({"shape": name, "skipped": "time budget"})
            continue
        try:
            report["shapes"].append(run_shape(name, args, device, dtype, budget, report["bandwidth"]["copy_GBps"]))
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory: report it, go on
            report["shapes"].append({"shape": name, "error": f"{type(exc).__name__}: {exc}"[:2000]})
            _release()
        report["elapsed_s"] = round(budget.elapsed, 1)
        write(report, args)
    if started:
        print(f"[{budget.elapsed:5.0f}s] waiting for the offline GPU check", flush=True)
        report["gpucheck"] = finish_gpucheck(started, timeout=max(60.0, min(budget.left(), 3600.0)))
    failed = _failures(report)
    report["status"] = _status(report)
    report["elapsed_s"] = round(budget.elapsed, 1)
    paths = write(report, args)
    print()
    print(table(report))
    if started:
        print()
        print(gpucheck_tables(report["gpucheck"]))
    if not env.get("gpu"):
        print("(CPU run: timings say nothing about GPU speed)")
    for p in paths:
        print(f"wrote {p}")
    if report["status"].startswith("partial"):
        print(f"{report['status'].split(',')[0]}: raise --budget-s to time them", file=sys.stderr)
    if failed:
        print(f"{failed} failure(s): see the table's notes and the report's checks (exit status 1)", file=sys.stderr)
    return report


def cli() -> None:
    """``main()`` run as a command: exit status 1 when the report has failures (it says which: a check, a row, a
    shape lost)."""
    sys.exit(1 if _failures(main()) else 0)


if __name__ == "__main__":
    run(cli)
