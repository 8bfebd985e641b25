"""The offline GPU check: every kernel a decode step launches, compiled for sm_90a as it would launch, read.

``check(cfg, rows)`` builds the model on the meta device (shapes only, no weights read), lowers it, and
records the launches of one decode step of ``rows`` sequences (the program's ops, device sampling and
``advance``) with the launch parameters an H100 gets (``platform.simulating``): block sizes, grids, warps,
``USE_PDL`` - the superop executor's launches. Each distinct launcher compile (launcher, constexprs,
argument types, options) and the step's megakernel (``megakernel.kernel.StepKernel``: its real tables and
launch options; the grid its registers and shared memory allow) are compiled with ``kernels.offline`` and
checked:
  * no register spills (a megakernel's row names the registers each task class touches, from its SASS, so
    a spill is traced to the class that takes the registers);
  * registers and shared memory let at least one CTA per SM run (and give the reported CTAs / SM);
  * an acquire orders every spin-wait of the PTX;
  * every loop that streams a weight does so with 16-byte loads (MXFP4 bytes included), and a side stream
    (MXFP4 scales) issues no more loads than its weight (one per thread and step, not one per element).
Must run without ``TRITON_INTERPRET`` (``run_check`` starts a clean process when needed, also for another
Triton installation: ``triton_path``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

PRESET_SHAPES = {"llama-3.2-1b": None, "kimi-linear-48b-a3b": 4, "kimi-k3": 4}  # preset -> layers checked


@dataclass
class Row:
    """One compiled kernel of a checked shape (``offline.KernelReport`` flattened for tables and JSON)."""

    shape: str
    kernel: str
    warps: int
    registers: int | None
    spill_bytes: int
    shared_bytes: int
    ctas_per_sm: int
    grid: int | None
    load_widths: str
    spins: int
    violations: list[str]
    classes: dict[str, int] | None = None  # the megakernel's task classes: label -> registers the class touches


def _meta_model(cfg, dtype):
    import torch

    from nonstop.model.stack import CausalLM

    with torch.device("meta"):
        return CausalLM(cfg).to(dtype)


def _step(cfg, program, rows: int, context: int):
    """An ``ExecEnv`` of one decode step of ``rows`` sequences at ``context`` cached tokens: buffers and cache
    on the CPU (the kernels only see their addresses), weights on the meta device."""

    from nonstop.cache.state import ModelCache
    from nonstop.runtime.cuda_graph import fit_pools
    from nonstop.runtime.superop import ExecEnv

    cache = ModelCache(cfg, rows, capacity=context + 2, dtype=program.dtype, device="cpu")
    slots = list(range(rows))
    cache.advance(cache.batch(slots, context))
    batch = cache.batch(slots, 1)
    fit_pools(cache)
    buf = program.allocate(rows, "cpu")
    return ExecEnv(buf, cache, batch, pdl=True)  # PDL on, as the superop executor launches on sm_90


def check(
    cfg,
    name: str,
    rows: int = 1,
    context: int = 4096,
    arch: int = 90,
    target=None,
    kinds=None,
    megakernel: bool = True,
    progress=None,
) -> list[Row]:
    """Rows of the check of ``cfg`` (see the module docstring); ``kinds`` limits the launchers checked (None: all)."""
    import torch

    from nonstop.kernels import offline, platform
    from nonstop.program.lower import lower
    from nonstop.runtime.megakernel import advance
    from nonstop.runtime.megakernel.codegen.record import record_ops
    from nonstop.runtime.megakernel.executor import megakernel_program
    from nonstop.runtime.megakernel.kernel import StepKernel, persistent_grid
    from nonstop.runtime.superop import kernel_table

    target = target or platform.H100
    say = progress or (lambda text: None)
    model = _meta_model(cfg, torch.bfloat16)
    program, extra = megakernel_program(lower(model), cfg.vocab_size)
    ops = [*program.ops, *extra]
    impl = dict(kernel_table(), advance=advance.launch)
    env = _step(cfg, program, rows, context)
    out: list[Row] = []
    with platform.simulating(target):
        launches = record_ops(ops, impl, env)
        seen = {}
        for op, op_launches in zip(ops, launches):
            if kinds is not None and op.kind not in kinds:
                continue
            for launch in op_launches:
                key = (
                    launch.name,
                    tuple(sorted((k, _fingerprint(v)) for k, v in launch.args.items())),
                    tuple(sorted(launch.options.items())),
                )
                if key in seen:
                    continue
                seen[key] = True
                t0 = time.perf_counter()
                kernel, names = offline.compile_launch(launch.kernel, launch.args, launch.options, arch)
                report = offline.inspect(
                    kernel,
                    names,
                    set(launch.weights),
                    f"{op.kind}:{launch.name}",
                    launch.grid,
                    target,
                    side=set(launch.side),
                    min_load_bytes=_min_load_bytes(op),
                )
                out.append(_row(name, report))
                say(f"  {report.name}: {report.registers} registers, {time.perf_counter() - t0:.1f} s")
        if megakernel:
            t0 = time.perf_counter()
            mk = StepKernel(program, ops, impl, env, "cpu", grid=1)
            args, options = mk.arguments(), mk.options
            kernel, names = offline.compile_launch(mk.kernel, args, options, arch)
            report = offline.inspect(
                kernel, names, {"*wptrs_ptr"}, f"megakernel ({len(mk.plan.classes)} task classes)", None, target
            )
            if report.ctas_per_sm >= 1:
                report.grid = persistent_grid(target, report.registers, report.shared_bytes, report.num_warps)
            out.append(_row(name, report, class_registers(kernel, mk.plan.classes, arch)))
            say(f"  {report.name}: {report.registers} registers, {time.perf_counter() - t0:.1f} s")
    return out


def _min_load_bytes(op) -> int:
    """The load width ``op``'s weights must reach: 16 bytes, but the embedding gathers one row per token, and a
    row narrower than a warp's 32 threads x 16 bytes (256 bf16) can only be read in ``row bytes / 32`` per
    thread (``dense.embed`` gives such a row one warp)."""
    table = op.weights.get("embed") if op.kind == "embed" else None
    if table is None:
        return 16
    widest = max(1, min(16, table.shape[-1] * table.element_size() // 32))
    return 1 << (widest.bit_length() - 1)  # loads are 1, 2, 4, 8 or 16 bytes wide


def _fingerprint(v):
    import torch

    if isinstance(v, torch.Tensor):
        return ("tensor", str(v.dtype), v.data_ptr() % 16 == 0)
    return repr(v)


def class_registers(kernel, classes, arch: int = 90) -> dict[str, int]:
    """{task class label: registers its function ``task_k`` touches} of a compiled megakernel, largest first
    (``offline.function_registers``; ptxas counts registers and spills for the whole kernel only)."""
    from nonstop.kernels import offline

    used = offline.function_registers(kernel.asm["cubin"], arch)
    out = {}
    for k, cls in enumerate(classes):
        regs = [n for f, n in used.items() if re.search(rf"_task_{k}_", f)]
        if regs:
            out[f"{cls.label} (task_{k})"] = max(regs)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _row(shape: str, r, classes: dict[str, int] | None = None) -> Row:
    violations = list(r.violations)
    if classes and r.spill_bytes:  # name the classes that take the registers
        heavy = ", ".join(f"{label} {n}" for label, n in list(classes.items())[:3])
        note = f" (registers of the largest task classes: {heavy})"
        violations = [v + note if "spills" in v else v for v in violations]
    return Row(
        shape,
        r.name,
        r.num_warps,
        r.registers,
        r.spill_bytes,
        r.shared_bytes,
        r.ctas_per_sm,
        r.grid,
        r.load_widths(),
        len(r.spins),
        violations,
        classes,
    )


def table(rows: list[Row], triton_version: str | None = None) -> str:
    """The report: kernel x shape: warps, registers, spills, shared memory, CTAs per SM, grid, weight load widths."""
    head = (
        f"{'shape':<22} {'kernel':<44} {'warps':>5} {'regs':>5} {'spill':>6} {'smem':>7} {'CTA/SM':>6} {'grid':>6}"
        "  loads (B)"
    )
    lines = ([f"Triton {triton_version}"] if triton_version else []) + [head]
    for r in rows:
        grid = "-" if r.grid is None else str(r.grid)
        mark = "  <- " + "; ".join(r.violations) if r.violations else ""
        lines.append(
            f"{r.shape:<22} {r.kernel[:44]:<44} {r.warps:>5} {r.registers or '?':>5} {r.spill_bytes:>6} "
            f"{r.shared_bytes:>7} {r.ctas_per_sm:>6} {grid:>6}  {r.load_widths}{mark}"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- running in a clean process


def run_check(
    shapes: list[tuple[str, object, int | None]],
    rows: int = 1,
    arch: int = 90,
    kinds=None,
    megakernel: bool = True,
    triton_path: str | None = None,
    timeout: float = 3600,
    progress: bool = False,
    gpu: str = "h100",
) -> dict:
    """{"triton": version, "rows": [Row as dict]} of ``check`` for ``shapes`` = [(name, preset name, checkpoint
    dir or HF config dict, layers)] on ``gpu`` (a key of ``platform.TARGETS``), in a fresh interpreter without
    ``TRITON_INTERPRET`` (with ``triton_path`` first on its path: another Triton installation)."""
    proc = start_check(shapes, rows, arch, kinds, megakernel, triton_path, progress, gpu)
    return finish_check(proc, timeout)


def start_check(shapes, rows=1, arch=90, kinds=None, megakernel=True, triton_path=None, progress=False, gpu="h100"):
    """``run_check`` started in the background (a ``subprocess.Popen``; ``finish_check`` collects it), e.g.
    while a benchmark times the GPU. The check is killed when the calling thread ends, however it ends
    (``dist.parent_watch``: Linux's parent-death signal follows the thread that started the child; call this
    from a thread that outlives the check, e.g. the main one): a stopped ``nonstop gpucheck`` leaves no compile
    running."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([p for p in (triton_path, root, env.get("PYTHONPATH")) if p])
    request = {"shapes": shapes, "rows": rows, "arch": arch, "kinds": kinds, "megakernel": megakernel}
    request.update(progress=progress, gpu=gpu, parent=os.getpid())  # the check ends with this process
    return subprocess.Popen(
        [sys.executable, "-m", "nonstop.runtime.gpucheck", json.dumps(request)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=None if progress else subprocess.PIPE,
        text=True,
    )


def triton_in(path: str) -> str:
    """The version of the Triton installed in directory ``path`` (``pip install --target path triton==X``), read
    by importing it in a fresh interpreter with ``path`` first on its path; ValueError (naming ``path``) when
    it does not import, or when the Triton that imports is not the one in ``path`` (a folder without a whole
    package lets the environment's own Triton through)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([p for p in (path, env.get("PYTHONPATH")) if p])
    probe = "import triton; print(triton.__version__); print(triton.__file__)"
    try:
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise ValueError(f"--triton {path}: importing triton from it took over 300 s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"--triton {path}: triton does not import from it ({last})")
    version, where = done.stdout.strip().splitlines()[-2:]
    if not os.path.realpath(where).startswith(os.path.join(os.path.realpath(path), "")):
        raise ValueError(
            f"--triton {path}: it holds no whole triton package (the triton that imports is {where}); "
            "install one with `pip install --target DIR --no-deps triton==X`"
        )
    return version


def finish_check(proc, timeout: float = 3600) -> dict:
    """The result of a ``start_check``; RuntimeError (with the check's last output) if it failed or timed out
    (it is then stopped)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RuntimeError(f"the offline GPU check did not finish in {timeout:.0f} s") from None
    except BaseException:  # Ctrl-C or an error of the caller: the check is not left compiling
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"the offline GPU check failed:\n{(err or '')[-4000:]}")
    return json.loads(out.strip().splitlines()[-1])


def config_of(model, layers: int | None):
    """The config of ``model`` (a preset name, a directory holding config.json, or an HF config dict), cut
    to its first ``layers`` layers when given (``ModelConfig.with_num_layers``: more layers than the model has
    is a ``ConfigError``, as in ``nonstop program`` and ``nonstop synth``)."""
    from nonstop.config import ModelConfig, preset_names

    if isinstance(model, dict):
        cfg = ModelConfig.from_hf_dict(model)
    elif os.path.isdir(model):
        cfg = ModelConfig.from_file(model)
    else:
        cfg = ModelConfig.preset(model) if model in preset_names() else None
    if cfg is None:
        raise ValueError(f"model {model!r} is neither a directory holding config.json nor a preset")
    return cfg.with_num_layers(layers) if layers else cfg


def _main(request: str) -> None:
    import triton

    from nonstop.kernels.platform import TARGETS, interpreting

    if interpreting():
        raise SystemExit("run the offline GPU check without TRITON_INTERPRET")
    req = json.loads(request)
    if req.get("parent"):
        from nonstop.dist.parent_watch import die_with_parent

        die_with_parent(req["parent"])
    progress = (lambda text: print(text, file=sys.stderr, flush=True)) if req["progress"] else None
    rows = []
    for name, model, layers in req["shapes"]:
        if progress:
            progress(f"{name} (Triton {triton.__version__}): compiling for sm_{req['arch']}a")
        rows += check(
            config_of(model, layers),
            name,
            req["rows"],
            arch=req["arch"],
            kinds=req["kinds"],
            megakernel=req["megakernel"],
            target=TARGETS[req.get("gpu", "h100")],
            progress=progress,
        )
    print(json.dumps({"triton": triton.__version__, "rows": [asdict(r) for r in rows]}))


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].startswith("{"):
        raise SystemExit("this is the child process of `nonstop gpucheck`; run `nonstop gpucheck --help`")
    _main(sys.argv[1])
