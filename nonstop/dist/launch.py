"""``spawn``: start the ranks of a layout on this host (torch.multiprocessing, "spawn" start method).

Each child gets the environment torchrun would give it (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT on a free port), its share of the CPU threads, and runs ``fn(*args)``. ``spawn`` returns
when every rank has ended; when one ends with an error the others are stopped (SIGTERM, then SIGKILL
after ``grace`` seconds) and ``RankExited`` names it. Ctrl-C (or SIGTERM to the launcher) stops every
rank. A launcher that dies without stopping them (SIGKILL, a crash) takes its ranks with it: each rank
calls ``die_with_parent`` first thing (``parent_watch.py``), so no rank outlives it.
"""

from __future__ import annotations

import os
import signal
import socket
import time

import torch.multiprocessing as mp

from nonstop.dist.parent_watch import die_with_parent


class RankExited(RuntimeError):
    def __init__(self, rank: int, code: int | None, message: str = ""):
        self.rank, self.code = rank, code
        super().__init__(message or f"rank {rank} exited with code {code}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_threads(world: int) -> int:
    """CPU threads per rank when ``world`` ranks share this host."""
    return max(1, (os.cpu_count() or 1) // world)


def _entry(index: int, fn, world: int, port: int, threads: int, env: dict, args: tuple, launcher: int) -> None:
    die_with_parent(launcher)
    os.environ.update(
        {
            "RANK": str(index),
            "LOCAL_RANK": str(index),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            **env,
        }
    )
    import torch

    torch.set_num_threads(threads)
    fn(*args)


def spawn(
    fn,
    world: int,
    args: tuple = (),
    threads: int | None = None,
    env: dict | None = None,
    grace: float = 5.0,
    timeout: float | None = None,
) -> None:
    """Run ``fn(*args)`` in ``world`` processes forming one process group of this host (see the module
    docstring). ``timeout``: stop every rank and raise RankExited(-1) after that many seconds."""
    port = free_port()
    previous = signal.signal(signal.SIGTERM, _interrupt) if _main_thread() else None
    ctx = mp.start_processes(
        _entry,
        args=(fn, world, port, threads or rank_threads(world), dict(env or {}), args, os.getpid()),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            try:
                if ctx.join(timeout=0.2, grace_period=grace):
                    return
            except mp.ProcessExitedException as exc:
                raise RankExited(exc.error_index, exc.exit_code) from None
            except mp.ProcessRaisedException as exc:
                raise RankExited(exc.error_index, 1, f"rank {exc.error_index} failed:\n{exc}") from None
            if deadline is not None and time.monotonic() > deadline:
                raise RankExited(-1, None, f"the ranks did not finish within {timeout:g} s")
    except BaseException:
        _stop(ctx.processes, grace)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM to the launcher: stop the ranks as Ctrl-C does


def _stop(processes, grace: float) -> None:
    for p in processes:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + grace
    for p in processes:
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join(1.0)
