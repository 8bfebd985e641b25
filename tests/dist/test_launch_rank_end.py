"""How a rank of ``nonstop.dist.spawn`` ends once its function returns: its ``atexit`` hooks run, its output
is flushed, and it ends there (``os._exit(0)``), as the CLI's ranks do. Left to the interpreter's teardown,
a rank with gloo's threads still running aborted now and then ("terminate called without an active
exception": bench/dist_decode.py, 1 run in 2), and one with a thread that never ends never ended."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from nonstop.dist.launch import spawn


def leaves_a_thread_and_a_hook(out_dir: str) -> None:
    """Starts a non-daemon thread that outlives the rank's function by a minute (as a native library's
    worker may), registers an atexit hook and prints without a newline (buffered)."""
    rank = os.environ["RANK"]
    threading.Thread(target=time.sleep, args=(60.0,), daemon=False).start()
    atexit.register(lambda: Path(out_dir, f"{rank}.hook").write_text("ran"))
    print(f"rank {rank} done", end="", file=sys.stdout)


@pytest.mark.timeout(120)
def test_a_rank_whose_function_returned_ends_at_once_after_its_exit_hooks(tmp_path, capfd):
    """Both ranks end within seconds of returning (the lingering thread kept the interpreter waiting until
    ``timeout`` stopped them: RankExited), each rank's atexit hook ran and its buffered output arrived."""
    t0 = time.monotonic()
    spawn(leaves_a_thread_and_a_hook, 2, (str(tmp_path),), timeout=40)
    assert time.monotonic() - t0 < 40
    assert sorted(p.name for p in tmp_path.glob("*.hook")) == ["0.hook", "1.hook"]
    out = capfd.readouterr().out
    assert "rank 0 done" in out and "rank 1 done" in out, out
