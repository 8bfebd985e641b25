"""The verification child never outlives the verifying process: not after Ctrl-C (the child runs in its own
session, so the terminal's SIGINT does not reach it) and not after the verifier is killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# passes the static check, then spins for ever under the interpreter
HANGING = """
import triton
import triton.language as tl


@triton.jit
def _spin(out_ptr, N):
    acc = tl.zeros([16], dtype=tl.float32)
    for i in range(0, N):
        acc += 1.0
    tl.store(out_ptr + tl.arange(0, 16), acc, mask=tl.arange(0, 16) < 0)


def launch(op, env):
    _spin[(1,)](env.buf[op.writes[0]], 2000000000)
"""

# after Ctrl-C the verifying process stays alive a while: the child must be gone by then, not only once it exits
VERIFIER = """
import sys, time
from pathlib import Path
from nonstop.tune.verify import verify
from tests.tune.helpers import tiny_target
try:
    verify(Path(sys.argv[1]).read_text(), tiny_target("linear_residual"), timeout_s=600)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    time.sleep(60)
"""


def _state(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a live process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), fields[0]


def _alive(pid: int) -> bool:
    state = _state(pid)
    return state is not None and state[1] != "Z"


def _child_of(parent: int, deadline: float) -> int:
    """The pid of ``parent``'s verification child (``child.py``), once it runs."""
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and (_state(int(entry.name)) or (0,))[0] == parent:
                try:
                    cmdline = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if b"child.py" in cmdline:
                    return int(entry.name)
        time.sleep(0.2)
    raise AssertionError("the verification child never started")


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_the_child_goes_with_the_verifier(tmp_path, sig):
    kernel = tmp_path / "hang.py"
    kernel.write_text(HANGING)
    verifier = subprocess.Popen(
        [sys.executable, "-c", VERIFIER, str(kernel)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    child = None
    try:
        child = _child_of(verifier.pid, time.monotonic() + 180)
        time.sleep(2)  # into the spinning launch
        assert _alive(child)
        verifier.send_signal(sig)
        if sig == signal.SIGINT:
            assert verifier.stdout.readline() == b"interrupted\n"
            assert verifier.poll() is None
        assert _gone(child, 10), f"the verification child {child} outlived the verifier ({sig.name})"
    finally:
        if verifier.poll() is None:
            verifier.kill()
            verifier.wait()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)
