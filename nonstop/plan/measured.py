"""nonstop's own measurements (``bench/results/*.json``) and this machine's figures for the ``cpu`` chip.

A measurement sits beside a prediction only when it was taken on the same chip (``cpu``: results
whose machine has no GPU; a GPU chip: results whose ``environment.gpu`` names it) and for the same
model. ``measurements(cfg, model_name, chip_key)`` returns them as plain rows: what was run (batch, dtype,
threads, executor), ms per token and tokens/s, and the file it came from.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parents[2] / "bench" / "results"


@dataclass(frozen=True)
class Measurement:
    source: str  # file name under bench/results
    what: str  # e.g. "reference executor, batch 1, fp32, 2 threads"
    batch: int
    dtype: str
    ms_per_token: float  # per user (decode time per generated token of one sequence)
    tokens_per_s_total: float
    threads: int | None = None
    spec_accept: float | None = None  # mean accepted length when speculative
    spec_draft: int | None = None
    model: str | None = None  # the model name, or None when ``hf_config`` describes it
    hf_config: dict | None = None
    executor: str = "eager"  # how the planner should price it (the reference executor runs eager torch ops)
    context: int = 64  # mean cached tokens during the measured decode
    copy_gbps: float | None = None  # the memory bandwidth the same run measured (CPU results)
    serial: int = 1  # steps run one after another per generated token of each user (batch-invariant server: clients)
    cpu: str | None = None  # the CPU the run was recorded on (CPU results), as ``hostinfo.cpu_name`` gives it
    engine_loop: bool = True  # False: a bare step timed on the device (no scheduler or sampling loop around it)


def load_results(results_dir: Path | None = None) -> list[tuple[str, dict]]:
    """(file name, data) of every JSON result in ``results_dir`` (default ``RESULTS_DIR``, read at call time)."""
    results_dir = results_dir or RESULTS_DIR
    out = []
    if not results_dir.is_dir():
        return out
    for path in sorted(results_dir.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # unreadable, not UTF-8, not JSON: no result of ours
            continue
        if isinstance(data, dict):
            out.append((path.name, data))
    return out


# ----------------------------------------------------------------------------- the cpu chip


def recorded_cpu(data: dict) -> str | None:
    """The CPU a result was recorded on (``machine`` or ``environment``: ``cpu``), None if it says none."""
    for key in ("machine", "environment"):
        cpu = (data.get(key) or {}).get("cpu")
        if cpu:
            return str(cpu)
    return None


@functools.lru_cache(maxsize=1)
def this_cpu() -> str:
    """This machine's CPU, named as the benchmarks record it (read once)."""
    from nonstop.hostinfo import cpu_name

    return cpu_name()


def recorded_copy_gbps(results_dir: Path | None = None) -> tuple[float, str] | None:
    """The newest copy bandwidth a CPU benchmark recorded on this machine's CPU (GB/s, read + written),
    with its file; results from another CPU say nothing about this one."""
    best = None
    here = this_cpu()
    for name, data in load_results(results_dir):
        floor = data.get("bandwidth_floor") or {}
        gbps = floor.get("copy_GBps")
        if gbps and not (data.get("environment") or {}).get("gpu") and recorded_cpu(data) == here:
            stamp = str(data.get("time", ""))
            if best is None or stamp > best[2]:
                best = (float(gbps), name, stamp)
    return None if best is None else (best[0], best[1])


@functools.lru_cache(maxsize=1)
def matmul_tflops() -> float:
    """fp32 matmul peak of this machine at the current thread count: one thread's best 512x512 product,
    timed in that thread's own CPU time (``time.thread_time``, so other processes sharing the cores do
    not make it look slow; wall-clock timing read 10x low beside a test run), times the threads."""
    import torch

    a, b = torch.randn(512, 512), torch.randn(512, 512)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a @ b  # first-call allocation and dispatch set-up
        best = float("inf")
        for _ in range(5):
            t0 = time.thread_time()
            a @ b
            best = min(best, time.thread_time() - t0)
    finally:
        torch.set_num_threads(threads)
    return 2 * 512**3 / max(best, 1e-9) / 1e12 * threads


@functools.lru_cache(maxsize=1)
def op_overhead_us() -> float:
    """What the eager executor pays per aten op on this machine, in microseconds: the CPU time of this
    process (``time.process_time``, so other processes sharing the cores do not inflate it) of one
    reference decode step of a narrow twin of the bundled model (its ops do almost no arithmetic), over
    the aten ops that step dispatches. This is the module code, dispatch and allocation around each op,
    which a tiny op timed alone leaves out (about 20% of it on this kind of machine)."""
    import torch

    from nonstop.config import ModelConfig
    from nonstop.model.build import random_model
    from nonstop.program.count import count_decode_ops
    from nonstop.program.twin import narrow_twin
    from nonstop.weights.resolve import DEFAULT_MODEL

    cfg = narrow_twin(ModelConfig.preset(DEFAULT_MODEL))
    model = random_model(cfg, torch.float32)
    ops = count_decode_ops(model).total
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ops this small run on one thread; idle pool threads would add CPU time
    try:
        best = _best_step_seconds(model, prompt=8, steps=12)
    finally:
        torch.set_num_threads(threads)
    return best / ops * 1e6


def _best_step_seconds(model, prompt: int, steps: int) -> float:
    """The least CPU time of ``steps`` batch-1 decode steps of ``model`` after a ``prompt``-token prefill."""
    import torch

    from nonstop.program.count import prefilled

    best = float("inf")
    with torch.inference_mode():
        cache, ids = prefilled(model, prompt, steps + 1)
        for _ in range(steps):
            step = cache.batch([0], 1)
            t0 = time.process_time()
            model(ids[:, -1:], cache, step, last_only=True)
            best = min(best, time.process_time() - t0)
            cache.advance(step)
    return best


def physical_memory_gb() -> float:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1e9
    except (ValueError, OSError, AttributeError):
        return 16.0


@functools.lru_cache(maxsize=1)
def _cpu_figures() -> tuple[float, float, float, float, str]:
    recorded = recorded_copy_gbps()
    if recorded is None:
        from nonstop.hostinfo import copy_bandwidth

        gbps, note = copy_bandwidth()["copy_GBps"], "measured now (no result of this CPU in bench/results)"
    else:
        gbps, note = recorded[0], f"bench/results/{recorded[1]}"
    return gbps, physical_memory_gb(), matmul_tflops(), op_overhead_us(), note


def cpu_entry(base: dict) -> dict:
    """The catalogue's ``cpu`` entry with this machine's measured figures filled in."""
    gbps, mem_gb, tflops, launch_us, note = _cpu_figures()
    entry = json.loads(json.dumps(base))
    entry.update(hbm_gb=round(mem_gb, 1), hbm_gbps=round(gbps, 2), launch_us=round(launch_us, 2))
    entry["tflops"] = {"bf16": tflops, "fp8": None, "fp4": None, "fp32": tflops}
    entry["sources"]["hbm_gbps"] = f"measured copy bandwidth (read + written), {note}"
    return entry


# ----------------------------------------------------------------------------- measurements


def _cpu_rows(name: str, data: dict) -> list[Measurement]:
    gbps = (data.get("bandwidth_floor") or {}).get("copy_GBps")
    return [dataclasses.replace(m, copy_gbps=gbps, cpu=recorded_cpu(data)) for m in _cpu_rows_of(name, data)]


def _cpu_rows_of(name: str, data: dict) -> list[Measurement]:
    rows = []
    kind = data.get("benchmark")
    threads = (data.get("machine") or {}).get("threads", data.get("threads"))
    if kind == "cpu_decode":
        res = data["results"]["nonstop_reference"]["decode_tokens_per_s"]
        what = f"reference executor, batch {data['batch']}, {data['dtype']}, {threads} threads"
        ctx = data.get("prompt_len", 32) + data.get("new_tokens", 64) // 2
        hf = (data.get("model") or {}).get("hf_config")
        rows.append(
            Measurement(
                name,
                what,
                data["batch"],
                data["dtype"],
                1e3 / res,
                res * data["batch"],
                threads,
                hf_config=hf,
                context=ctx,
            )
        )
    elif kind == "spec_decode":
        modes = data["results"]["heldout"]["modes"]
        ctx = max(data["results"]["heldout"].get("prompt_tokens", [48])) + data.get("max_tokens", 64) // 2
        for mode, row in modes.items():
            tps = row["decode_tokens_per_s"]
            if mode == "plain":
                what = f"{data.get('backend', 'reference')} executor, batch 1, fp32, {threads} thread(s)"
                rows.append(
                    Measurement(name, what, 1, "float32", 1e3 / tps, tps, threads, model=data["model"], context=ctx)
                )
            elif mode.startswith("dspark"):
                k, accept = int(mode.split("-k")[-1]), row["mean_accepted_length"]
                what = f"DSpark k={k}, batch 1, fp32, {threads} thread(s), accepted length {accept}"
                rows.append(
                    Measurement(
                        name, what, 1, "float32", 1e3 / tps, tps, threads, accept, k, data["model"], context=ctx
                    )
                )
    elif kind == "serve_load":
        res, load = data["results"], data["load"]
        tpot = (res.get("tpot_s") or {}).get("p50")
        if tpot:
            threads = (data.get("machine") or {}).get("server_threads")
            batched = "no-batch-invariant" in (data.get("server") or {}).get("serve_args", "")
            mode = "batched decode" if batched else "batch-invariant: one sequence per step"
            what = f"server, {load['clients']} clients ({mode}), {threads} thread(s), TPOT p50"
            ctx = load.get("prompt_chars", 200) // 4 + load.get("max_tokens", 64) // 2
            clients = load["clients"]
            batch, serial = (clients, 1) if batched else (1, clients)
            rows.append(
                Measurement(
                    name,
                    what,
                    batch,
                    "float32",
                    tpot * 1e3,
                    res["output_tokens_per_s"],
                    threads,
                    model=data["model"],
                    context=ctx,
                    serial=serial,
                )
            )
    return rows


def _gpu_rows(name: str, data: dict) -> list[Measurement]:
    """Batch-1 rows of ``bench/decode.py``: each timed slice (the preset's first ``layers`` layers, the
    whole model when that is all of them) as the model it is. A bare step timed on the device: no
    serving loop around it, so the planner prices no engine host loop for it."""
    from nonstop.config import ModelConfig

    rows = []
    for shape in data.get("shapes", []):
        preset = shape.get("preset", shape.get("shape"))
        for sl in shape.get("slices", []):
            layers, full = sl.get("layers"), shape.get("full_layers")
            whole = layers == full
            hf = None
            if not whole:
                try:
                    hf = ModelConfig.preset(preset).with_num_layers(layers).to_hf_dict()
                except (KeyError, ValueError, TypeError):  # a shape of another version: not comparable
                    continue
            model = preset if whole else f"{preset} ({layers}/{full} layers)"
            for timing in sl.get("timings", []):
                for row in timing.get("rows", []):
                    if "ms_per_token" in row and row.get("row") in ("superop", "megakernel"):
                        what = f"{model}, {row['row']}, batch 1, bf16, context {timing['context']}"
                        ms = row["ms_per_token"]
                        executor = "megakernel" if row["row"] == "megakernel" else "kernels"
                        rows.append(
                            Measurement(
                                name,
                                what,
                                1,
                                "bfloat16",
                                ms,
                                1e3 / ms,
                                model=preset if whole else None,
                                hf_config=hf,
                                executor=executor,
                                context=timing["context"],
                                engine_loop=False,
                            )
                        )
    return rows


def names_chip(gpu: str, chip_key: str) -> bool:
    """Whether the GPU name a result records (``environment.gpu``, e.g. "NVIDIA H100 80GB HBM3") is the catalogue
    chip ``chip_key``: some run of its words (split at spaces and dashes) spells the key without its dashes.
    "NVIDIA A 100-SXM4" is an a100 and "TPU v7" a tpu-v7, but "NVIDIA H200" is no h20 and "NVIDIA GB200" no b200."""
    words = [w for w in re.split(r"[\s\-_]+", gpu.lower()) if w]
    key = chip_key.lower().replace("-", "")
    return any("".join(words[i:j]) == key for i in range(len(words)) for j in range(i + 1, len(words) + 1))


def all_measurements(chip_key: str, results_dir: Path | None = None) -> list[Measurement]:
    """Every nonstop decode measurement in ``bench/results`` taken on this chip."""
    rows: list[Measurement] = []
    for name, data in load_results(results_dir):
        environment = data.get("environment")
        gpu = environment.get("gpu") if isinstance(environment, dict) else None
        try:
            if chip_key == "cpu" and not gpu:
                rows += _cpu_rows(name, data)
            elif isinstance(gpu, str) and names_chip(gpu, chip_key):
                rows += _gpu_rows(name, data)
        except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError):  # another format: skip the file
            continue
    if chip_key == "cpu":  # runs of this machine's CPU first: the cpu chip's figures are measured here
        here = this_cpu()
        rows.sort(key=lambda m: m.cpu != here)
    return rows


def same_model(m: Measurement, cfg, model_name: str) -> bool:
    if m.model is not None:
        return m.model == model_name
    if not isinstance(m.hf_config, dict):
        return False
    from nonstop.config import ModelConfig

    try:
        canonical = lambda hf: ModelConfig.from_hf_dict(hf).replace(hf={})  # noqa: E731 - both through config.json
        return canonical(m.hf_config) == canonical(cfg.to_hf_dict())  # (a slice keeps sub-configs it no longer uses)
    except Exception:  # noqa: BLE001 - a result file of another format
        return False


def measurements(cfg, model_name: str, chip_key: str, results_dir: Path | None = None) -> list[Measurement]:
    """nonstop's own decode measurements of this model on this chip (empty when there are none)."""
    return [m for m in all_measurements(chip_key, results_dir) if same_model(m, cfg, model_name)]
