"""Entry point of the verification child (``python -I child.py JOBDIR [PARENT_PID]``); the work is in ``child_run``.

Isolated mode ignores PYTHON* variables and the user site, so the repository root is put on the path
here. The network is blocked at the Python level once torch is imported, before any candidate code (the
parent also unshares the network namespace where the kernel allows it). First of all the child arms
``die_with_parent(PARENT_PID)`` (the sandbox passes it; a rerun by hand may leave it out): it ends when the
verifying process dies, however it dies.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _block_network() -> None:
    import socket

    def refused(*_a, **_k):
        raise PermissionError("network access is not allowed in verification")

    class RefusedSocket(socket.socket):
        def __init__(self, *_a, **_k):
            refused()

    socket.socket = RefusedSocket
    for name in ("create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo"):
        if hasattr(socket, name):
            setattr(socket, name, refused)


def main(jobdir: str, parent: int | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    if parent is not None:
        from nonstop.dist.parent_watch import die_with_parent

        die_with_parent(parent)
    import torch

    _block_network()

    torch.set_num_threads(1)
    from nonstop.tune.child_run import run_job

    job = torch.load(Path(jobdir) / "job.pt", weights_only=False)  # written by the trusted parent
    torch.save(run_job(job), Path(jobdir) / "result.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None))
