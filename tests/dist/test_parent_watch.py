"""``die_with_parent``: a child ends soon after its parent is SIGKILLed, by prctl and by the watchdog thread
(the portable fallback), and at once when the parent is already gone. Processes: parent -> child, both in
a session ``procs.launched`` kills whatever happens."""

from __future__ import annotations

import os
import signal

import pytest

from tests.dist.procs import alive, gone_within, launched

PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True)
print(child.pid, child.stdout.readline().strip(), flush=True)
child.wait()
"""
CHILD = """
import os, sys, time
from nonstop.dist.parent_watch import die_with_parent
print(die_with_parent(os.getppid(), poll=0.1, prctl=sys.argv[1] == "prctl"), flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("how", ["prctl", "watchdog"])
def test_a_child_ends_when_its_parent_is_killed(how):
    with launched(["-c", PARENT, CHILD, how]) as parent:
        line = parent.stdout.readline().split()
        assert len(line) == 2, parent.communicate(timeout=10)
        child, armed = int(line[0]), line[1]
        parent.seen.add(child)
        assert armed == how and alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        assert not gone_within([child], 5), f"the child outlived its parent ({how})"


def test_a_parent_already_gone_ends_the_child_at_once():
    code = "from nonstop.dist.parent_watch import die_with_parent; die_with_parent(1); print('alive')"
    with launched(["-c", code]) as p:  # its parent is pytest, not pid 1: "the launcher" is gone
        out, _ = p.communicate(timeout=60)
    assert p.returncode == 1 and "alive" not in out
