"""What the verification child does with its job (see ``child.py`` for how it is started).

It runs ONE candidate's ``launch`` on the states its parent prepared and returns raw observations;
it never sees the twin's answers, and the parent judges everything it returns (``judge.py``).

Per call: the state is rebuilt on fresh memory with guard bands (``state.unpack``) and ``launch(op, env)``
runs under a ``Recorder`` that notes every torch operator doing device work or reading values to the
host, attributed by the Python frames that issued it: the candidate's own code (a violation),
``nonstop.cache`` / ``nonstop.kernels`` (cache bookkeeping and trusted helpers: allowed) or any other
nonstop code (a violation: the model, the twins). Triton launches are counted. The env is the one the
``superop`` executor would give the launch on this device (``executor_env``: PDL where supported). After
the call: guard bands, the storages that must be unchanged (compared here with their packed bytes), the
bytes of the output storages, the tensor views by path, Python threads, the identity of the functions
timing relies on, and the two-phase counters (all back at zero).

When every call ran clean, the executor run (``exec_check.run_executor``): the built-in kernel's, then the
candidate's as the executor's stored winner; the parent compares both with the reference executor.

Timing (CUDA only, when every call ran clean; the plan is ``timing.TimingPlan``): one rebuilt state per
timed shape; before each launch one never-repeated pairing of a weight draw and an input draw is copied
in and the L2 cache is flushed; a CUDA event pair brackets each launch; one device-wide
synchronisation at the end. The outputs of a few random launches go back to the parent, which checks
them against the twin on the same pairing.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
import traceback
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from nonstop.runtime.cuda_graph import pdl_support
from nonstop.runtime.launch_count import HOST_METHODS, HOST_SYNC, HOST_UPLOADS, NO_LAUNCH, TritonRunPatch
from nonstop.runtime.superop import ExecEnv
from nonstop.runtime.tuned import plain_launch_args
from nonstop.tune.exec_check import run_executor
from nonstop.tune.state import Packed, named_tensors, unpack

NONSTOP = Path(__file__).resolve().parents[1]
TRUSTED = (str(NONSTOP / "cache") + os.sep, str(NONSTOP / "kernels") + os.sep)
HARNESS = str(NONSTOP / "tune") + os.sep
ZERO_FILLS = {"zeros", "zeros_like", "zero_", "new_zeros"}  # allocation of zeroed scratch: allowed anywhere


# ----------------------------------------------------------------------------- who runs an operator


def attribute(candidate_file: str) -> str:
    """ "candidate", "trusted" (nonstop.cache / nonstop.kernels) or the path of the nonstop file
    ("nonstop/model/norms.py") for the innermost frame of the candidate or of nonstop (outside this
    harness) on the current stack."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if name == candidate_file:
            return "candidate"
        if name.startswith(TRUSTED):
            return "trusted"
        if name.startswith(str(NONSTOP) + os.sep) and not name.startswith(HARNESS):
            return os.path.relpath(name, NONSTOP.parent)
        frame = frame.f_back
    return "candidate"  # nothing of ours on the stack: only the candidate can have started it


class Recorder(TorchDispatchMode):
    """While active: torch operators that do device work or bring values to the host, by who ran them
    (``violations``), and Triton launches (``triton``)."""

    def __init__(self, candidate_file: str):
        super().__init__()
        self.file = candidate_file
        self.violations: list[str] = []
        self.triton = 0
        self._in_triton = 0
        self._patch = TritonRunPatch(self._counting_run)
        self._host = _HostWatch(self)

    def note(self, what: str, host_read: bool = False) -> None:
        """Record ``what`` unless trusted code (nonstop.kernels / nonstop.cache) ran it; a ``host_read`` counts
        whoever runs it: the built-in launchers never read values (they are graph-captured), so one seen while
        a candidate runs is the candidate's, passed through a helper (``pow2(int(tensor))``)."""
        who = attribute(self.file)
        if (who != "trusted" or host_read) and len(self.violations) < 20:
            where = {"candidate": "the candidate", "trusted": "nonstop.kernels / nonstop.cache code it called"}
            self.violations.append(f"{what} run by {where.get(who, who)}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self._in_triton:
            return out
        name = func.overloadpacket.__name__
        if name in HOST_SYNC:
            self.note(f"torch.{name} (reads tensor values on the host)", host_read=True)
        elif not (func.is_view or name in NO_LAUNCH or name in ZERO_FILLS):
            self.note(f"torch operator aten.{name} (compute must be in Triton kernels)")
        return out

    def _counting_run(self, original):
        recorder = self

        def run(fn_self, *args, grid, warmup, **kwargs):
            if not warmup:
                recorder.triton += 1
            recorder._in_triton += 1
            try:
                return original(fn_self, *args, grid=grid, warmup=warmup, **kwargs)
            finally:
                recorder._in_triton -= 1

        return run

    def __enter__(self):
        self._patch.__enter__()
        self._host.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._host.__exit__(*exc)
            self._patch.__exit__(*exc)


class _HostWatch(TorchFunctionMode):
    """``tolist`` / ``numpy`` / ``cpu`` / printing a tensor (``str``, f-strings: every torch mode is off while it
    reads the values) and host-data uploads (``torch.tensor(list)``): host traffic."""

    def __init__(self, recorder: Recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = HOST_METHODS.get(func)
        if name is None and func in HOST_UPLOADS and args and not isinstance(args[0], torch.Tensor):
            name = HOST_UPLOADS[func]
        if name is not None and not self.recorder._in_triton:
            self.recorder.note(f"torch {name} (host data)", host_read=func in HOST_METHODS)
        return func(*args, **(kwargs or {}))


# ----------------------------------------------------------------------------- the sandbox's invariants


def identities() -> dict[str, int]:
    """ids of the functions and classes the harness and the timing rely on (a candidate must not patch them)."""
    import triton

    items = {
        "torch.cuda.synchronize": torch.cuda.synchronize,
        "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.Event.record": torch.cuda.Event.record,
        "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
        "torch.cuda.current_stream": torch.cuda.current_stream,
        "torch.cuda.set_stream": torch.cuda.set_stream,
        "torch.Tensor.copy_": torch.Tensor.copy_,
        "torch.Tensor.zero_": torch.Tensor.zero_,
        "torch.equal": torch.equal,
        "torch.empty": torch.empty,
        "time.perf_counter": time.perf_counter,
        "threading.Thread.start": threading.Thread.start,
        "triton.jit": triton.jit,
        "TorchDispatchMode.__enter__": TorchDispatchMode.__enter__,
    }
    for cls in _launch_classes():
        items[f"{cls.__name__}.run"] = cls.run
    return {k: id(v) for k, v in items.items()}


def _launch_classes() -> list:
    from nonstop.runtime.launch_count import _triton_launch_classes

    return _triton_launch_classes()


def python_threads() -> set[int]:
    return {t.ident for t in threading.enumerate()}


def dirty_counters() -> list[str]:
    """The two-phase counters (``kernels/launch.phase_counters``) not back at zero: every launch must leave
    them so (a counter that keeps a value across calls is state, e.g. a call count)."""
    from nonstop.kernels.launch import _WORKSPACES

    return sorted({key[0] for key, t in _WORKSPACES.items() if key[0].endswith(".phases") and bool(t.any())})


def executor_env(buf, cache, batch, device: torch.device) -> ExecEnv:
    """The env the ``superop`` executor would give the launch on ``device`` (PDL where it is supported)."""
    return ExecEnv(buf, cache, batch, pdl=pdl_support(device)[0])


def short_traceback(exc: BaseException, candidate_file: str) -> str:
    """The exception and the candidate's own lines of its traceback (what a proposer can act on)."""
    lines = [
        f"line {fs.lineno}: {fs.line}"
        for fs in traceback.extract_tb(exc.__traceback__)
        if fs.filename == candidate_file
    ]
    where = ("; ".join(lines[-3:]) + " -> ") if lines else ""
    return f"{where}{type(exc).__name__}: {exc}"[:1000]


def load_candidate(path: str):
    """Import the candidate file; returns its ``launch``."""
    spec = importlib.util.spec_from_file_location("nonstop_candidate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    plain_launch_args(module)
    launch = getattr(module, "launch", None)
    if not callable(launch):
        raise TypeError("the candidate defines no callable 'launch(op, env)'")
    return launch


# ----------------------------------------------------------------------------- one call


def _views(unpacked) -> dict[str, tuple]:
    out = {}
    for path, t in named_tensors(unpacked.state).items():
        where = unpacked.storage_of(t)
        sidx, offset = where if where is not None else (-1, t.storage_offset())
        out[path] = (sidx, offset, tuple(t.shape), tuple(t.stride()), str(t.dtype).removeprefix("torch."))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_call(
    launch,
    packed: Packed,
    outputs: list[int],
    device: torch.device,
    candidate_file: str,
    gen: torch.Generator,
    ids0: dict,
    threads0: set,
) -> dict:
    """One call on a fresh copy of ``packed``: what the parent needs to judge it."""
    unpacked = unpack(packed, device, gen)
    roots = unpacked.state
    env = executor_env(roots["buf"], roots["cache"], roots["batch"], device)
    recorder = Recorder(candidate_file)
    error = None
    t0 = time.perf_counter()
    try:
        with recorder:
            launch(roots["op"], env)
        _sync(device)
    except BaseException as exc:  # noqa: BLE001 - anything the candidate raises is its failure
        error = short_traceback(exc, candidate_file)
    wall = time.perf_counter() - t0
    rec: dict = {
        "error": error,
        "violations": list(recorder.violations),
        "triton_launches": recorder.triton,
        "wall_s": wall,
    }
    if error is not None and "CUDA" in error:
        return rec  # the context may be unusable
    rec["guards_broken"] = [i for i in range(len(packed.storages)) if not unpacked.guard_intact(i)]
    out = set(outputs)
    rec["modified"] = [
        i
        for i in range(len(packed.storages))
        if i not in out and not torch.equal(unpacked.body(i).cpu(), packed.storages[i])
    ]
    rec["outputs"] = {i: unpacked.body(i).cpu().clone() for i in sorted(out)}
    rec["views"] = _views(unpacked)
    rec["patched"] = sorted(k for k, v in identities().items() if ids0.get(k) != v)
    rec["new_threads"] = len(python_threads() - threads0)
    rec["dirty_counters"] = dirty_counters()
    return rec


def failed(rec: dict) -> bool:
    return bool(
        rec["error"]
        or rec["violations"]
        or rec.get("guards_broken")
        or rec.get("modified")
        or rec.get("patched")
        or rec.get("new_threads")
        or rec.get("dirty_counters")
    )


# ----------------------------------------------------------------------------- timing (CUDA)


def time_shape(launch, plan: dict, device: torch.device, candidate_file: str, gen: torch.Generator) -> dict:
    """CUDA-event times of one launch per (weight draw, input draw) pairing of ``plan`` (``timing.TimingPlan.job``):
    before each launch the pairing's bytes are copied into one rebuilt state and the L2 is flushed; the outputs
    of the ``checked`` launches are kept (device copies queued right after their end event)."""
    work = unpack(plan["base"], device, gen)
    roots = work.state
    env = executor_env(roots["buf"], roots["cache"], roots["batch"], device)
    weights = [{s: raw.to(device) for s, raw in w.items()} for w in plan["weights"]]
    inputs = [{s: raw.to(device) for s, raw in x.items()} for x in plan["inputs"]]
    sequence, checked, outputs = plan["sequence"], set(plan["checked"]), plan["outputs"]
    props = torch.cuda.get_device_properties(device)
    flush = torch.empty(
        max(256 << 20, 4 * int(getattr(props, "L2_cache_size", 64 << 20))), dtype=torch.uint8, device=device
    )
    starts = [torch.cuda.Event(enable_timing=True) for _ in sequence]
    ends = [torch.cuda.Event(enable_timing=True) for _ in sequence]
    kept: dict[int, dict] = {}
    recorder = Recorder(candidate_file)
    torch.cuda.synchronize(device)
    for i, (j, k) in enumerate(sequence):
        for s, raw in weights[j].items():
            work.body(s).copy_(raw)
        for s, raw in inputs[k].items():
            work.body(s).copy_(raw)
        flush.zero_()
        with recorder:  # around the launch only: the copies above are the harness's
            starts[i].record()
            launch(roots["op"], env)
            ends[i].record()
        if i in checked:
            kept[i] = {s: work.body(s).clone() for s in outputs}
    torch.cuda.synchronize(device)
    ms = [starts[i].elapsed_time(ends[i]) for i in range(plan["warmup"], len(sequence))]
    j, k = sequence[-1]
    last = {**weights[j], **inputs[k]}
    modified = [s for s, raw in last.items() if s not in outputs and not torch.equal(work.body(s), raw)]
    return {
        "ms": ms,
        "outputs": {i: {s: b.cpu() for s, b in o.items()} for i, o in kept.items()},
        "modified": modified,
        "guards_broken": [i for i in range(len(work.padded)) if not work.guard_intact(i)],
        "violations": list(recorder.violations),
        "triton_launches": recorder.triton,
    }


# ----------------------------------------------------------------------------- the executor run


def _executor_run(plan: dict, device, with_store: bool, candidate_file: str, ids0: dict, threads0: set) -> dict:
    """``exec_check.run_executor`` (the built-in kernel first, then the candidate as the stored winner)."""
    try:
        out = run_executor(plan, device, with_store)
    except BaseException as exc:  # noqa: BLE001 - the candidate's failure (or, without the store, the verifier's)
        return {"error": short_traceback(exc, candidate_file)}
    out["patched"] = sorted(k for k, v in identities().items() if ids0.get(k) != v)
    out["new_threads"] = len(python_threads() - threads0)
    return out


# ----------------------------------------------------------------------------- the job


def run_job(job: dict) -> dict:
    device = torch.device(job["device"])
    candidate_file = str(Path(job["candidate"]).resolve())
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(7), "little"))
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.cuda.set_per_process_memory_fraction(float(job.get("gpu_memory_fraction", 0.9)), device)
        torch.ones(1, device=device).add_(1)  # start the context and allocator before the baseline
        torch.cuda.synchronize(device)
    ids0 = identities()
    threads0 = python_threads()
    result: dict = {"import_error": None, "calls": [], "timing": {}, "patched_on_import": []}
    try:
        launch = load_candidate(candidate_file)
    except BaseException as exc:  # noqa: BLE001
        result["import_error"] = short_traceback(exc, candidate_file)
        return result
    result["patched_on_import"] = sorted(k for k, v in identities().items() if ids0.get(k) != v)
    result["threads_on_import"] = len(python_threads() - threads0)
    states: list[Packed] = job["states"]
    for call in job["calls"]:
        rec = run_call(
            launch, states[call["state"]], job["outputs"][call["state"]], device, candidate_file, gen, ids0, threads0
        )
        rec["state"] = call["state"]
        result["calls"].append(rec)
        if failed(rec):
            break  # the parent rejects on this call; the rest would only cost time
    clean = (
        not result["patched_on_import"]
        and len(result["calls"]) == len(job["calls"])
        and not any(failed(r) for r in result["calls"])
    )
    if clean and job.get("executor"):
        result["executor_builtin"] = _executor_run(job["executor"], device, False, candidate_file, ids0, threads0)
        result["executor"] = _executor_run(job["executor"], device, True, candidate_file, ids0, threads0)
        clean = "error" not in result["executor"]
    if clean and device.type == "cuda":
        for key, plan in job.get("timing", {}).items():
            try:
                result["timing"][key] = time_shape(launch, plan, device, candidate_file, gen)
            except BaseException as exc:  # noqa: BLE001
                result["timing"][key] = {"error": short_traceback(exc, candidate_file)}
    return result
