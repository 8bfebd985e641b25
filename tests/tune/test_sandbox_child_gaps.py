"""``sandbox.run_child`` with a stand-in child (a plain Python script in place of ``child.py``): how a child
that exits badly, hangs, prints much or writes an unreadable result is reported, and the box it runs in
(isolated mode, its own session, the minimal environment, the CPU-time and address-space limits)."""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from pathlib import Path

import pytest
import torch

from nonstop.tune import sandbox

CPU = torch.device("cpu")

# writes what it sees of its box to info.json in the job directory (its cwd), then runs the BODY lines
PROBE = """
import json, os, resource, sys
info = {
    "isolated": sys.flags.isolated,
    "sid_is_pid": os.getsid(0) == os.getpid(),
    "env": dict(os.environ),
    "cpu": resource.getrlimit(resource.RLIMIT_CPU),
    "as": resource.getrlimit(resource.RLIMIT_AS),
    "core": resource.getrlimit(resource.RLIMIT_CORE),
    "argv": sys.argv[1:],
}
with open("info.json", "w") as f:
    json.dump(info, f)
"""


def _run(tmp_path: Path, monkeypatch, body: str, timeout_s: float = 60, result=None, **kw) -> sandbox.ChildRun:
    """Run a stand-in child whose code is ``PROBE`` + ``body``; ``result`` (when given) is saved as the
    result.pt the child leaves behind (a stand-in child need not import torch)."""
    script = tmp_path / "standin_child.py"
    script.write_text(PROBE + body)
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    if result is not None:
        torch.save(result, jobdir / "result.pt")
    monkeypatch.setattr(sandbox, "CHILD", script)
    return sandbox.run_child(jobdir, CPU, timeout_s, **kw)


def _info(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "job" / "info.json").read_text())


def test_a_clean_exit_returns_the_result_as_plain_data(tmp_path, monkeypatch):
    """The result of a child that exits 0 must come back (catches a dropped load or a wrong exit check)."""
    run = _run(tmp_path, monkeypatch, "", result={"calls": [1, 2], "import_error": None})
    assert run.result == {"calls": [1, 2], "import_error": None}
    assert (run.returncode, run.timed_out) == (0, False)


def test_a_failing_child_gives_no_result_even_when_one_was_written(tmp_path, monkeypatch):
    """A child that exits non-zero did not finish: a result.pt it left (or an old one) must not be judged
    as if it had (catches dropping the exit-status check)."""
    run = _run(tmp_path, monkeypatch, "sys.stderr.write('boom: it broke\\n'); sys.exit(3)", result={"calls": []})
    assert run.result is None
    assert run.returncode == 3 and not run.timed_out
    assert run.stderr.strip().splitlines()[-1] == "boom: it broke"


def test_a_child_killed_by_a_signal_reports_it(tmp_path, monkeypatch):
    """A child that dies of a signal (a crash) has no result and a negative return code naming the signal."""
    run = _run(tmp_path, monkeypatch, "import signal; os.kill(os.getpid(), signal.SIGSEGV)", result={"calls": []})
    assert run.result is None and not run.timed_out
    assert run.returncode == -11 and run.ending() == "killed by signal SIGSEGV"


def test_an_unreadable_result_is_the_reason_in_one_line(tmp_path, monkeypatch):
    """A result.pt that is not a torch file is the candidate's failure, named as such in one line. It was a
    note appended to stderr, of which the verdict quoted the last line (torch.load's advice, several lines
    long) under "the verification process died (exit status 0)"."""
    run = _run(tmp_path, monkeypatch, "open('result.pt', 'wb').write(b'garbage, not a pickle')")
    assert run.result is None and run.returncode == 0
    assert run.problem.startswith("its result file is unreadable (") and "\n" not in run.problem


@pytest.mark.parametrize("saved", [[1, 2], {"something": 1}])
def test_a_result_that_is_no_verification_result_is_refused(tmp_path, monkeypatch, saved):
    """A loadable result.pt that is not the child's dict (a list, a dict without calls or import error) is
    not judged (``_judge`` read ``result["calls"]``: a KeyError / AttributeError traceback)."""
    run = _run(tmp_path, monkeypatch, "", result=saved)
    assert run.result is None
    assert run.problem == f"its result file holds no verification result (a {type(saved).__name__})"


def test_the_stderr_kept_is_its_end(tmp_path, monkeypatch):
    """A child printing much keeps the last 4000 characters: the final line (the exception) is what the
    verdict quotes (catches keeping the head instead)."""
    body = "sys.stderr.write('x' * 20000 + '\\nTheRealError: last line\\n'); sys.exit(1)"
    run = _run(tmp_path, monkeypatch, body)
    assert len(run.stderr) == 4000
    assert run.stderr.strip().splitlines()[-1] == "TheRealError: last line"


def test_garbage_bytes_on_stderr_are_decoded_not_raised(tmp_path, monkeypatch):
    """Bytes that are not UTF-8 on the child's stderr must not raise in the parent."""
    run = _run(tmp_path, monkeypatch, "sys.stderr.buffer.write(b'\\xff\\xfe bad \\x80\\n'); sys.exit(2)")
    assert run.returncode == 2 and "bad" in run.stderr


def test_a_hanging_child_and_its_process_group_are_killed(tmp_path, monkeypatch):
    """On timeout the whole process group goes, a grandchild included (catches killing only the child:
    a grandchild keeping stderr open makes the wait hang, or lives on)."""
    body = (
        "import subprocess, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "open('grandchild', 'w').write(str(p.pid))\n"
        "time.sleep(120)\n"
    )
    t0 = time.monotonic()
    run = _run(tmp_path, monkeypatch, body, timeout_s=3)
    assert time.monotonic() - t0 < 60
    assert run.timed_out and run.result is None
    pid = int((tmp_path / "job" / "grandchild").read_text())
    for _ in range(100):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            break
        if state == "Z":  # killed, waiting for its reaper
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"grandchild {pid} outlived the timeout")


def test_the_child_runs_isolated_in_its_own_session(tmp_path, monkeypatch):
    """``python -I`` (no PYTHON* variables, no user site) in a session of its own (so the group can be
    killed and the terminal's Ctrl-C does not reach it); argv is the job directory and the parent's pid."""
    _run(tmp_path, monkeypatch, "")
    info = _info(tmp_path)
    assert info["isolated"] == 1
    assert info["sid_is_pid"] is True
    assert info["argv"] == [str(tmp_path / "job"), str(os.getpid())]


def test_the_child_gets_only_the_minimal_environment(tmp_path, monkeypatch):
    """Nothing of the parent's environment but the pass-through list reaches the child, and on a CPU it runs
    the Triton interpreter (catches a dropped TRITON_INTERPRET or a leaked variable)."""
    monkeypatch.setenv("NONSTOP_SECRET_TOKEN", "do-not-leak")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    _run(tmp_path, monkeypatch, "")
    env = _info(tmp_path)["env"]
    assert "NONSTOP_SECRET_TOKEN" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "7"
    assert env["TRITON_INTERPRET"] == "1"
    assert env["HOME"] == env["TMPDIR"] == str(tmp_path / "job")
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "job" / "triton-cache")


def test_the_child_has_cpu_time_address_space_and_core_limits(tmp_path, monkeypatch):
    """RLIMIT_CPU is the timeout rounded up plus 5 s (hard 5 s above), RLIMIT_AS the memory given (CPU runs),
    no core dumps (catches a dropped or loosened limit)."""
    _run(tmp_path, monkeypatch, "", timeout_s=7.2, memory_bytes=6 << 30)
    info = _info(tmp_path)
    cpu = math.ceil(7.2) + 5
    assert info["cpu"] == [cpu, cpu + 5]
    assert info["as"] == [6 << 30, 6 << 30]
    assert info["core"] == [0, 0]


def test_no_address_space_limit_when_none_is_given(tmp_path, monkeypatch):
    """``memory_bytes=None`` leaves the address space as the parent has it."""
    _run(tmp_path, monkeypatch, "", memory_bytes=None)
    assert _info(tmp_path)["as"] == list(resource.getrlimit(resource.RLIMIT_AS))


def test_netns_off_means_no_network_namespace(tmp_path, monkeypatch):
    """``NONSTOP_TUNE_NETNS=0`` skips the unshare: the run must not claim a network namespace."""
    monkeypatch.setenv("NONSTOP_TUNE_NETNS", "0")
    run = _run(tmp_path, monkeypatch, "")
    assert run.network_namespace is False
    assert not (tmp_path / "job" / "netns").exists()


@pytest.mark.skipif(sys.platform != "linux", reason="unshare is Linux only")
def test_the_network_flag_says_whether_the_unshare_happened(tmp_path, monkeypatch):
    """``network_namespace`` is True exactly when the child is in a network namespace of its own (catches an
    inverted unshare result): its namespace differs from the parent's when the flag is set."""
    monkeypatch.delenv("NONSTOP_TUNE_NETNS", raising=False)
    run = _run(tmp_path, monkeypatch, "open('ns', 'w').write(os.readlink('/proc/self/ns/net'))")
    child_ns = (tmp_path / "job" / "ns").read_text()
    assert run.network_namespace == (child_ns != os.readlink("/proc/self/ns/net"))


@pytest.mark.parametrize(
    "run, reason",
    [
        (
            sandbox.ChildRun(None, 0, False, "torch says\nplease check the docs\n", False, "its result file is bad"),
            "the verification process exited, but its result file is bad",
        ),
        (
            sandbox.ChildRun(None, -9, False, "last words\n", False),
            "the verification process died (killed by signal SIGKILL): last words",
        ),
        (sandbox.ChildRun(None, 3, False, "", False), "the verification process died (exit status 3)"),
    ],
)
def test_the_verdict_names_how_the_child_ended(monkeypatch, run, reason):
    """``verify``'s reason for a child without a result: the result file's problem (a child that exited 0 did
    not die: it read "died (exit status 0)" and quoted the last line of torch.load's advice), the signal
    that killed it by name, or its exit status, with the last stderr line when there is one."""
    from nonstop.tune import verify as verify_module
    from tests.tune.helpers import tiny_target

    monkeypatch.setattr(verify_module, "run_child", lambda *a, **k: run)
    source = verify_module.builtin_source("linear_residual")
    verdict = verify_module.verify(source, tiny_target("linear_residual"), timeout_s=30)
    assert not verdict.accepted and verdict.reasons == [reason]
