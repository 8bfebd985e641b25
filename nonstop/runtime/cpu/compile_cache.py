"""Where the CPU executor keeps what it compiles, and how it tells the user while it compiles.

Everything lives under ``cache_dirs.cache_root()`` = $NONSTOP_CACHE_DIR, else $XDG_CACHE_HOME/nonstop,
else ~/.cache/nonstop: ``inductor/`` (torch.compile's kernels and graphs, unless TORCHINDUCTOR_CACHE_DIR
is already set) and ``ext/`` (the C++ GEMV kernels); both are ``cache_dirs.private_dir``s (only this user
may write them: they hold code nonstop loads). A later process finds them there, so a step shape compiles
once per machine and torch version; later runs only trace and load (``compiled_anew_since`` tells which).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from nonstop.cache_dirs import private_dir


def use_inductor_cache() -> Path:
    """Point torch.compile's on-disk cache at ``cache_root()/inductor`` unless the user chose one (torch
    writes its default, a per-user temp dir, into TORCHINDUCTOR_CACHE_DIR on first use: that one is ours
    to replace; inductor reads the variable each time it needs the directory). Ours is a
    ``private_dir``: torch loads the compiled code it holds."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or current == default_cache_dir():
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(private_dir("inductor"))
    path = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    path.mkdir(parents=True, exist_ok=True)
    return path


def compiled_anew_since(counts: tuple[int, int, int]) -> bool:
    """Whether torch.compile compiled anything since ``counts`` (``fx_graph_cache_counts()`` taken before):
    a graph missed or bypassed inductor's FX-graph cache, or none was looked up there (the cache is off).
    False means every graph since came from the on-disk cache (traced, not compiled)."""
    hits, misses, bypasses = (now - before for now, before in zip(fx_graph_cache_counts(), counts))
    return misses > 0 or bypasses > 0 or hits == 0


def fx_graph_cache_counts() -> tuple[int, int, int]:
    """(hits, misses, bypasses) of inductor's FX-graph cache so far in this process."""
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    return inductor["fxgraph_cache_hit"], inductor["fxgraph_cache_miss"], inductor["fxgraph_cache_bypass"]


@contextmanager
def announced(what: str, enabled: bool = True, every_s: float = 10.0):
    """Print ``what`` on stderr before the block, a line every ``every_s`` seconds while it runs, and
    the elapsed time after it, followed by `` (note)`` when the block set ``result["note"]``. Yields
    that dict ``result``, which receives ``seconds``."""
    result: dict = {}
    if not enabled:
        t0 = time.perf_counter()
        yield result
        result["seconds"] = time.perf_counter() - t0
        return
    print(f"nonstop cpu: {what} ...", file=sys.stderr, flush=True)
    done = threading.Event()
    t0 = time.perf_counter()

    def heartbeat():
        while not done.wait(every_s):
            print(f"nonstop cpu: ... still {what} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    thread = threading.Thread(target=heartbeat, daemon=True)
    thread.start()
    try:
        yield result
    finally:
        done.set()
        thread.join()
        result["seconds"] = time.perf_counter() - t0
        note = f" ({result['note']})" if result.get("note") else ""
        print(f"nonstop cpu: {what}: done in {result['seconds']:.1f} s{note}", file=sys.stderr, flush=True)
