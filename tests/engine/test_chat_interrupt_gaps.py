"""``nonstop chat`` stopped by Ctrl-C in the middle of a reply: the one line "nonstop: interrupted" and exit
status 130 (as every command stops), never a traceback or a hang; nothing pinned it for chat, whose reply is
printed from inside the engine's streaming callback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(150)
def test_ctrl_c_mid_reply_is_one_line_and_status_130():
    """Catches Ctrl-C during a streamed reply ending in a traceback, another status, or no exit at all: the
    reply has started (bytes on stdout) when SIGINT arrives."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), NONSTOP_DEBUG="")
    argv = [
        sys.executable,
        "-m",
        "nonstop",
        "chat",
        "--backend",
        "reference",
        "-n",
        "1500",
        "--ignore-eos",
    ]
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        proc.stdin.write(b"Tell me a long story\n")
        proc.stdin.flush()
        os.set_blocking(proc.stdout.fileno(), False)
        got, deadline = b"", time.monotonic() + 100
        while len(got) < 8 and time.monotonic() < deadline and proc.poll() is None:
            got += proc.stdout.read() or b""
            time.sleep(0.05)
        assert len(got) >= 8, f"no reply streamed (status {proc.poll()})"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.decode(errors="replace")
    assert proc.returncode == 130, text
    assert text.rstrip().endswith("nonstop: interrupted"), text
    assert "Traceback" not in text, text
