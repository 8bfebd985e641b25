"""Start the verification child in a box: a fresh ``python -I`` process with a wall-clock timeout, CPU-time,
address-space (CPU runs), file-size and core-dump limits, a minimal environment, its own session (the
whole process group is killed on timeout) and, where the kernel allows unprivileged user namespaces,
a network namespace of its own with no interfaces (``unshare(CLONE_NEWUSER | CLONE_NEWNET)``;
``NONSTOP_TUNE_NETNS=0`` skips it where a driver objects); the child also refuses sockets at the
Python level (``child.py``).

The child never outlives its parent: an interrupted wait (Ctrl-C: the child's own session gets no SIGINT)
kills its process group before the exception goes on, and the child arms ``die_with_parent`` with the
parent's pid (``child.py``), so a parent killed outright takes it along too.
"""

from __future__ import annotations

import ctypes
import math
import os
import resource
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

CHILD = Path(__file__).resolve().parent / "child.py"
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PASS_THROUGH = (
    "CUDA_VISIBLE_DEVICES",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "TRITON_PTXAS_PATH",
    "TRITON_CUOBJDUMP_PATH",
    "TRITON_NVDISASM_PATH",
    "TRITON_LIBCUDA_PATH",
)


@dataclass
class ChildRun:
    """How the child ended: ``result`` (its result.pt, loaded as plain data) or why there is none;
    ``problem``: what was wrong with the result file of a child that exited 0 (None when it was read)."""

    result: dict | None
    returncode: int | None
    timed_out: bool
    stderr: str
    network_namespace: bool
    problem: str | None = None

    def ending(self) -> str:
        """How the child ended, for a verdict: "exit status 3" or "killed by signal SIGSEGV"."""
        if self.returncode is not None and self.returncode < 0:
            try:
                return f"killed by signal {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"killed by signal {-self.returncode}"
        return f"exit status {self.returncode}"


def _unshare_network() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0
    except (OSError, AttributeError):
        return False


def _limits(cpu_seconds: int, address_space: int | None, flag_file: Path):
    def apply() -> None:  # runs in the child between fork and exec (single-threaded there)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 30, 8 << 30))
        if address_space:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        if os.environ.get("NONSTOP_TUNE_NETNS", "1") != "0" and _unshare_network():
            flag_file.write_text("1")

    return apply


def child_env(jobdir: Path, device: torch.device) -> dict[str, str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(jobdir),
        "TMPDIR": str(jobdir),
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "TRITON_CACHE_DIR": str(jobdir / "triton-cache"),
    }
    for name in PASS_THROUGH:
        if name in os.environ:
            env[name] = os.environ[name]
    if device.type != "cuda":
        env["TRITON_INTERPRET"] = "1"
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (its own session), if it is still there."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_child(jobdir: Path, device: torch.device, timeout_s: float, memory_bytes: int | None = 16 << 30) -> ChildRun:
    """Run ``child.py jobdir <this pid>``; returns its result (None when it died, timed out or wrote none).
    ``timeout_s`` must be a positive finite number of seconds (``ValueError`` before anything starts)."""
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"the verification timeout must be a positive finite number of seconds, got {timeout_s!r}")
    flag = jobdir / "netns"
    address_space = memory_bytes if device.type != "cuda" else None  # CUDA reserves far more address space than it uses
    proc = subprocess.Popen(
        [sys.executable, "-I", str(CHILD), str(jobdir), str(os.getpid())],
        cwd=jobdir,
        env=child_env(jobdir, device),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_limits(math.ceil(timeout_s) + 5, address_space, flag),
    )
    timed_out = False
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        _, err = proc.communicate()
    except BaseException:  # Ctrl-C (KeyboardInterrupt) or any other error while waiting: the child goes too
        _kill_group(proc)
        proc.wait()
        raise
    result = problem = None
    path = jobdir / "result.pt"
    if not timed_out and proc.returncode == 0 and path.exists():
        try:
            result = torch.load(path, weights_only=True)  # plain data only: nothing of the child's runs here
        except Exception as exc:  # noqa: BLE001 - a malformed result is the candidate's failure
            first = next(iter(str(exc).strip().splitlines()), "")  # torch.load's advice runs for lines
            problem = f"its result file is unreadable ({type(exc).__name__}: {first[:200]})"
        if result is not None and not (isinstance(result, dict) and ("calls" in result or "import_error" in result)):
            result, problem = None, f"its result file holds no verification result (a {type(result).__name__})"
    text = (err or b"").decode(errors="replace")
    return ChildRun(result, proc.returncode, timed_out, text[-4000:], flag.exists(), problem)
