"""``spawn``: start the ranks of a layout on this host (torch.multiprocessing, "spawn" start method).

Each child gets the environment torchrun would give it (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT on a free port), its share of the CPU threads, and runs ``fn(*args)``. ``spawn`` returns
when every rank has ended with status 0. When one ends otherwise, the others get ``grace`` seconds to
end by themselves (a rank that has died closes its connections: the others notice at once and say so),
then the launcher stops them (SIGTERM and SIGCONT, ``grace`` seconds more, SIGKILL: a stopped rank
ends too) and ``RankExited`` names the first rank that failed. With ``relay`` rank 0 gets
``LAUNCHER_STOP`` (SIGUSR1) instead of SIGTERM, which it would take for a stop of the user's: it ends at
once, quietly, with status 1 (the failing rank has said why, or the launcher names it); the other ranks get
it too (its default action ends them), as they take SIGTERM for word that a stop is coming.

Stopping (``relay=True``, the CLI's launcher): SIGINT or SIGTERM to the launcher goes to rank 0 alone,
which stops as a single process would (a server drains its requests) and tells the other ranks to stop;
the others are only told that a stop is coming (SIGINT or SIGTERM: ``stopping()``), so that a rank 0
leaving mid-step is no error to them, and a SIGTERM to the whole process group (a service manager's stop)
leaves them serving rank 0 while it drains. Rank 0 gets ``stop_wait`` seconds to stop, and after rank 0 has ended well
the others get as long; a second signal to the launcher stops every rank at once. Ctrl-C in a terminal
reaches every rank as well as the launcher: rank 0 takes a stop signal repeated within ``REPEAT_S`` for
the same one. In rank 0 SIGTERM raises ``Terminated``. Without ``relay`` a stop signal stops every rank at once.

The ranks start with the stop signals blocked (a child inherits its parent's signal mask across exec):
one that comes while a rank is still starting (Python's start-up, unpickling its function) waits, pending,
until the rank has set its handlers and unblocks it; delivered earlier it would kill the rank there with a
KeyboardInterrupt traceback. Nothing ignores them (an ignored signal is lost for good: the launcher would
never learn of a stop that came while it was starting the ranks). A rank 0 stopped that early ends at once
without running ``fn`` (it has nothing to undo), as a single process stopped in its start-up does: one
line ("nonstop: interrupted") and status 130 (143 after SIGTERM). A stop that reaches the launcher
before it knows its ranks is relayed as soon as it does.

A launcher that dies without stopping them (SIGKILL, a crash) takes its ranks with it: each rank calls
``die_with_parent`` first thing (``parent_watch.py``), so no rank outlives it.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing.connection
import multiprocessing.resource_tracker
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch.multiprocessing as mp

from nonstop.dist.parent_watch import die_with_parent
from nonstop.stops import Terminated, print_line, stop_status

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
LAUNCHER_STOP = signal.SIGUSR1  # the launcher stopping rank 0 itself, after another rank failed: no stop of the user's
REPEAT_S = 1.0  # a stop signal rank 0 gets again within this many seconds is the same stop (terminal + launcher)
REPORTS_ENV = "NONSTOP_RANK_REPORTS"  # the file where the ranks of one launch note the errors they printed
_LEFT = "left for the launcher\t"  # marks a line a rank did not print (``leave_failure``)
_stopping = threading.Event()
_last_stop = [float("-inf")]


class RankExited(RuntimeError):
    """A rank ended with a status other than 0 (``code``: its exit status, negative for a signal, None
    when it did not end); ``codes``: every rank's exit status."""

    def __init__(self, rank: int, code: int | None, message: str = "", codes: list | None = None):
        self.rank, self.code, self.codes = rank, code, list(codes or [])
        self.left: str | None = None  # a rank's failure line for the launcher to print (``left_failure``)
        super().__init__(message or f"rank {rank} {exit_description(code)}")


def exit_description(code: int | None) -> str:
    """'exited with code 3', 'was killed by SIGKILL', 'did not end'."""
    if code is None:
        return "did not end"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_threads(world: int) -> int:
    """CPU threads per rank when ``world`` ranks share this host."""
    return max(1, (os.cpu_count() or 1) // world)


def stopping() -> bool:
    """In a rank other than 0: whether a stop is coming (a SIGINT came), so a failing collective is rank 0
    leaving, not an error."""
    return _stopping.is_set()


def mark_stopping(signum, frame) -> None:
    """The SIGINT handler of a rank other than 0: note that a stop is coming (``stopping``)."""
    _stopping.set()


def _rank0_stop(signum, frame) -> None:
    now = time.monotonic()
    if now - _last_stop[0] < REPEAT_S:
        return  # the same Ctrl-C, from the terminal and relayed by the launcher
    _last_stop[0] = now
    _stopping.set()  # rank 0 knows it too: a collective that fails as the others stop is no error
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated


def _stopped_by_launcher(signum, frame) -> None:
    """Rank 0's ``LAUNCHER_STOP`` handler: another rank failed and the launcher stops this one; it ends at
    once (what it printed flushed), saying nothing, with status 1."""
    with contextlib.suppress(Exception):  # a flush interrupted inside a write of the same stream: skipped
        sys.stdout.flush()
    os._exit(1)


def first_report(line: str) -> bool:
    """In a rank of a launch: True if no rank of this launch has printed ``line`` yet (it is noted as
    printed); False for a copy, which the caller leaves out. True outside a launch."""
    path = os.environ.get(REPORTS_ENV)
    if not path:
        return True
    import fcntl

    try:
        with open(path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            if line + "\n" in fh.read():
                return False
            fh.write(line + "\n")
            return True
    except OSError:
        return True


def leave_failure(line: str) -> bool:
    """In a rank of a launch: leave ``line`` (a collective that failed: the other side ended, hung or
    failed) for the launcher to print once the launch has ended, instead of printing it. Ranks failing
    together would each print one, and a rank killed by a signal is named only by the launcher, which sees
    every rank's end (``RankExited.left``). Noted only when no rank has noted anything yet: a failure after
    a printed error is its consequence. True in a launch; False outside one (the caller prints it)."""
    path = os.environ.get(REPORTS_ENV)
    if not path:
        return False
    import fcntl

    try:
        with open(path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            if not fh.read(1):
                fh.write(_LEFT + line + "\n")
        return True
    except OSError:
        return False


def report_failure(line: str) -> None:
    """A rank's failed-collective line: left to the launcher in a launch of ours (``leave_failure``), else
    (torchrun) printed."""
    if not leave_failure(line):
        print_line(line)


def left_failure(path: str) -> str | None:
    """The line a rank left in the reports file ``path`` (``leave_failure``), unless a rank printed an
    error of its own (the cause, already on stderr)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    if lines and all(line.startswith(_LEFT) for line in lines):
        return lines[0].removeprefix(_LEFT)
    return None


def _entry(index: int, fn, world: int, port: int, threads: int, env: dict, args: tuple, launcher: int, relay: bool):
    die_with_parent(launcher)
    try:
        if relay and index == 0:  # rank 0 stops as a single process would (SIGTERM too)
            for sig in STOP_SIGNALS:
                signal.signal(sig, _rank0_stop)
            signal.signal(LAUNCHER_STOP, _stopped_by_launcher)
        else:  # the others wait for rank 0's word (relayed), or stop at once
            signal.signal(signal.SIGINT, mark_stopping if relay else signal.default_int_handler)
            # relayed, a SIGTERM to the whole group (a service manager's stop) must not end them under rank 0
            # still draining its requests: the launcher stops them with LAUNCHER_STOP (default action: end)
            signal.signal(signal.SIGTERM, mark_stopping if relay else signal.SIG_DFL)
        # a stop that came while this rank started (blocked by ``_children_start_blocked``) arrives here: in
        # rank 0 it raises, and the rank ends before it began
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
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
    except (KeyboardInterrupt, Terminated) as exc:
        if not relay:  # the launcher stops every rank and says so
            return
        word, code = stop_status(exc)  # rank 0 stopped as it started: as a single process would be
        print(f"nonstop: {word}", file=sys.stderr, flush=True)
        os._exit(code)
    fn(*args)
    _end_rank()


def _end_rank() -> None:
    """End a rank whose ``fn`` returned: its ``atexit`` hooks, its output flushed, then ``os._exit(0)``. The
    interpreter's own teardown, with gloo's threads still running after the group was left, aborted a rank
    now and then ("terminate called without an active exception": bench/dist_decode.py, 1 run in 2 under
    load), and waits for ever on a thread that does not end."""
    atexit._run_exitfuncs()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)


@contextlib.contextmanager
def _children_start_blocked():
    """The processes started inside begin with the stop signals blocked, until they unblock them (``_entry``).
    Only this thread blocks them: a stop that comes meanwhile still reaches this process's handler, through
    another thread or once the block ends."""
    # the resource tracker, started with the first process, unblocks these signals in this thread after it
    # has started: started now, it leaves the block alone
    multiprocessing.resource_tracker.ensure_running()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def spawn(
    fn,
    world: int,
    args: tuple = (),
    threads: int | None = None,
    env: dict | None = None,
    grace: float = 2.0,
    timeout: float | None = None,
    relay: bool = False,
    stop_wait: float = 30.0,
) -> None:
    """Run ``fn(*args)`` in ``world`` processes forming one process group of this host (see the module
    docstring). ``timeout``: stop every rank and raise RankExited(-1) after that many seconds. A stop
    signal is raised from here (KeyboardInterrupt for SIGINT, ``Terminated`` for SIGTERM) when it had to
    stop every rank (a second signal; rank 0 not ended within ``stop_wait``). Relayed to a rank 0 that
    stopped by itself, it is that rank's exit status instead: ``spawn`` returns after status 0 (a server
    that drained its requests) and raises RankExited with rank 0's status otherwise (130 / 143: rank 0
    said so)."""
    with tempfile.NamedTemporaryFile(prefix="nonstop-reports-") as reports:
        env = {REPORTS_ENV: reports.name, **(env or {})}
        launch = _Launch(grace, stop_wait, relay)
        main = threading.current_thread() is threading.main_thread()
        previous = {sig: signal.signal(sig, launch.on_signal) for sig in STOP_SIGNALS} if main else {}
        try:
            port, per_rank = free_port(), threads or rank_threads(world)
            before = set(multiprocessing.active_children())
            try:
                with _children_start_blocked() if main else contextlib.nullcontext():
                    ctx = mp.start_processes(
                        _entry,
                        args=(fn, world, port, per_rank, env, args, os.getpid(), relay),
                        nprocs=world,
                        join=False,
                        start_method="spawn",
                    )
            except BaseException:  # a rank that could not start (no memory to fork): stop those that did
                _stop([p for p in multiprocessing.active_children() if p not in before], 0.0)
                raise
            launch.start(ctx)
            try:
                launch.watch(timeout)
            except RankExited as exc:
                exc.left = left_failure(reports.name)
                raise
        finally:
            _stop(launch.procs, grace, others=_follower_stop(relay))
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class _Launch:
    """The launcher's side of ``spawn``: waits for the ranks, relays stop signals, names the first failure."""

    def __init__(self, grace: float, stop_wait: float, relay: bool):
        self.grace, self.stop_wait, self.relay = grace, stop_wait, relay
        self.ctx = None
        self.procs: list = []
        self.codes: list[int | None] = []  # exit statuses, as the ranks end by themselves
        self.failed: int | None = None  # the first rank seen ending with a status other than 0
        self.signal: int | None = None  # the first stop signal
        self.forced = False  # stop every rank now
        self.due: list[float] = []  # when to stop the ranks: a failure + grace; a signal or rank 0's end + stop_wait

    def start(self, ctx) -> None:
        self.ctx, self.procs, self.codes = ctx, ctx.processes, [None] * len(ctx.processes)
        if self.signal is not None and not self.forced:  # it came while the ranks were being started
            self._relay()

    def on_signal(self, signum, frame) -> None:
        if self.signal is not None or not self.relay:  # a second signal, or no relaying: stop every rank now
            self.signal, self.forced = self.signal or signum, True
            return
        self.signal = signum
        self.due.append(time.monotonic() + self.stop_wait)
        self._relay()

    def _relay(self) -> None:
        """The stop signal to rank 0, SIGINT ("a stop is coming") to the others."""
        signum = self.signal
        for i, p in enumerate(self.procs):
            if self.codes[i] is None:
                with contextlib.suppress(OSError):
                    os.kill(p.pid, signum if i == 0 else signal.SIGINT)

    def watch(self, timeout: float | None) -> None:
        """Wait until every rank has ended, or a stop is due; raise what ``spawn`` says."""
        deadline = float("inf") if timeout is None else time.monotonic() + timeout
        while None in self.codes and not self.forced and time.monotonic() < min([deadline, *self.due]):
            live = {p.sentinel: i for i, p in enumerate(self.procs) if self.codes[i] is None}
            ended = [live[s] for s in multiprocessing.connection.wait(list(live), 0.2)]
            for i in ended:
                self.procs[i].join()
            # among ranks seen ending together, one a signal killed is the likely cause
            for i in sorted(ended, key=lambda i: self.procs[i].exitcode >= 0):
                self.codes[i] = self.procs[i].exitcode
                # after a stop signal only rank 0's end says how the launch ended: the others may have been
                # stopped by the same signal (SIGTERM to the whole group, as a service manager sends)
                stopping = self.signal is not None
                if self.failed is None and self.codes[i] != 0 and (i == 0 or not stopping):
                    self.failed = i
                if (i == 0 and stopping) or (self.codes[i] != 0 and not stopping):
                    # the others get grace seconds to end by themselves (after a stop signal they only
                    # wait for rank 0's word: a rank 0 stopped as it started never gives it)
                    self.due.append(time.monotonic() + self.grace)
                elif i == 0 and self.relay:  # rank 0 has told them to stop
                    self.due.append(time.monotonic() + self.stop_wait)
        # after a failure (no stop signal) rank 0 must not take the launcher's stop for the user's
        rank0 = LAUNCHER_STOP if self.relay and self.signal is None else signal.SIGTERM
        _stop(self.procs, 0.0 if self.forced else self.grace, rank0, _follower_stop(self.relay))
        codes = [c if c is not None else p.exitcode for c, p in zip(self.codes, self.procs)]
        if self.failed is not None and not self.forced:
            raise RankExited(self.failed, codes[self.failed], self._message(self.failed), codes)
        if self.signal is not None:
            if self.forced or self.codes[0] is None:
                if not self.forced:
                    name = signal.Signals(self.signal).name
                    print(f"nonstop: rank 0 did not stop within {self.stop_wait:g} s of {name}", file=sys.stderr)
                raise KeyboardInterrupt if self.signal == signal.SIGINT else Terminated
            return  # rank 0 stopped as it does alone, with status 0 (a server drained); a status of its own raised
        if None in self.codes and self.relay and self.codes[0] == 0:
            late = self.codes.index(None)
            raise RankExited(late, None, f"rank {late} did not end within {self.stop_wait:g} s of rank 0", codes)
        if None in self.codes:
            raise RankExited(-1, None, f"the ranks did not finish within {timeout:g} s", codes)

    def _message(self, index: int) -> str:
        """'rank 1 exited with code 3', or the traceback of an exception ``fn`` raised there."""
        error_file = self.ctx.error_files[index]
        if os.access(error_file, os.R_OK):
            import pickle

            with open(error_file, "rb") as fh:
                return f"rank {index} failed:\n{pickle.load(fh)}"
        return f"rank {index} {exit_description(self.codes[index])}"


def _follower_stop(relay: bool) -> int:
    """The signal the launcher ends a rank other than 0 with: LAUNCHER_STOP when stops are relayed (such a
    rank takes SIGTERM as word that a stop is coming, from a SIGTERM to the whole process group), else
    SIGTERM."""
    return LAUNCHER_STOP if relay else signal.SIGTERM


def _stop(processes, grace: float, first: int = signal.SIGTERM, others: int = signal.SIGTERM) -> None:
    """``first`` to the first process and ``others`` to the rest (SIGTERM, or LAUNCHER_STOP for relayed
    followers), and SIGCONT, so a stopped process ends too, to every live process, then SIGKILL those still
    alive ``grace`` seconds later (at once with grace 0)."""
    live = [p for p in processes if p.exitcode is None]
    for p in live:
        sig = first if p is processes[0] else others
        with contextlib.suppress(OSError):
            os.kill(p.pid, sig if grace > 0 else signal.SIGKILL)
            os.kill(p.pid, signal.SIGCONT)
    end = time.monotonic() + grace
    for p in live:
        p.join(max(0.0, end - time.monotonic()))
        if p.exitcode is None:
            with contextlib.suppress(OSError):
                os.kill(p.pid, signal.SIGKILL)
            p.join(5.0)
