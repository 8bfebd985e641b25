"""Compile a generated megakernel for a GPU target on a machine without one (a check, not a launch).

The interpreter runs any Python: it does not catch what Triton's compiler rejects (e.g. a value whose
type differs between the branches of an ``if``). ``python -m nonstop.runtime.megakernel.gpu_compile
FILE [--arch 90]`` lowers FILE's ``megakernel`` through TTIR / TTGIR / LLVM / PTX to a cubin for
``sm_<arch>`` with the NVIDIA backend shipped in the triton wheel, and prints the stage sizes, the
shared memory, and the registers / spills ptxas reports. Must run without ``TRITON_INTERPRET`` (``compile_in_subprocess`` takes care of that).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

SIGNATURE = {
    "tasks_ptr": "*i32",
    "waits_ptr": "*i32",
    "prefetch_ptr": "*i64",
    "counters_ptr": "*i64",
    "ticket_ptr": "*i64",
    "state_ptr": "*i64",
    "sink_ptr": "*i32",
    "ptrs_ptr": "*i64",
    "ints_ptr": "*i64",
    "floats_ptr": "*fp32",
    "num_tasks": "i32",
    "num_steps": "i32",
    "NUM_FIELDS": "constexpr",
}


def compile_file(path: str, arch: int = 90, num_warps: int = 8) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    t0 = time.perf_counter()
    from nonstop.runtime.megakernel.kernel import NUM_FIELDS

    kernel = triton.compile(
        ASTSource(module.megakernel, SIGNATURE, constexprs={"NUM_FIELDS": NUM_FIELDS}),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": num_warps},
    )
    return {
        "arch": f"sm_{arch}",
        "seconds": round(time.perf_counter() - t0, 1),
        "shared_bytes": kernel.metadata.shared,
        "stages": {k: len(v) for k, v in kernel.asm.items() if isinstance(v, (str, bytes))},
        **ptxas_report(kernel.asm["ptx"], arch),
    }


def ptxas_report(ptx: str, arch: int) -> dict:
    """Registers and spills that ptxas (shipped with triton) reports for the kernel; {} if unavailable."""
    import re
    import tempfile

    import triton

    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        for name in ("ptxas-blackwell", "ptxas"):  # the newer one accepts the newer PTX versions
            exe = os.path.join(bin_dir, name)
            if not os.path.exists(exe):
                continue
            out = subprocess.run(
                [exe, f"-arch=sm_{arch}a" if arch >= 90 else f"-arch=sm_{arch}", "-v", f.name, "-o", os.devnull],
                capture_output=True,
                text=True,
            )
            text = out.stdout + out.stderr
            regs = re.search(r"Used (\d+) registers", text)
            spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
            if regs:
                return {
                    "registers": int(regs.group(1)),
                    "spill_store_bytes": int(spills.group(1)) if spills else None,
                    "spill_load_bytes": int(spills.group(2)) if spills else None,
                }
        return {}
    finally:
        os.unlink(f.name)


def compile_in_subprocess(path: str, arch: int = 90, timeout: float = 600) -> dict:
    """``compile_file`` in a fresh interpreter without TRITON_INTERPRET; raises with Triton's error."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    done = subprocess.run(
        [sys.executable, "-m", "nonstop.runtime.megakernel.gpu_compile", path, "--arch", str(arch)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"megakernel does not compile for sm_{arch}:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path")
    ap.add_argument("--arch", type=int, default=90)
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET"):
        raise SystemExit("run without TRITON_INTERPRET")
    print(json.dumps(compile_file(args.path, args.arch)))


if __name__ == "__main__":
    main()
