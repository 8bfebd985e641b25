"""``torchrun ... -m nonstop generate --ep 2``: rank 0 prints the single-process tokens, and a layout that
cannot run fails in every rank with the launcher's own clear error, before any rank joins the group.

torchrun's rendezvous runs on a port the OS picks (``--standalone``: a c10d store on port 0), every run
has a deadline, and ``procs.launched`` kills the whole tree (torchrun's workers sit in sessions of their
own) whatever happens.
"""

from __future__ import annotations

import pytest
import torch

from tests.dist.procs import launched

GENERATE = ["-m", "nonstop", "generate", "--prompt-ids", "5,6,7", "-n", "4", "--temperature", "0", "--ids"]
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _run(argv: list[str], deadline: float = 240) -> tuple[int, str, str]:
    with launched(argv) as proc:
        out, err = proc.communicate(timeout=deadline)
    return proc.returncode, out, err


def _token_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("token ids:")]


def test_torchrun_rank0_prints_the_single_process_tokens():
    code, single, err = _run(GENERATE)
    assert code == 0, err
    code, multi, err = _run([*TORCHRUN, *GENERATE, "--ep", "2", "--dist-timeout", "30"])
    assert code == 0, err[-3000:]
    assert _token_lines(single) and _token_lines(multi) == _token_lines(single)  # once: only rank 0 prints


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where --device cuda cannot run")
def test_torchrun_ranks_refuse_an_impossible_layout_like_the_launcher():
    """Under torchrun nothing checked the layout before starting the ranks: each rank must (here: no
    CUDA; without the check the ranks failed inside the process group's setup with an internal error)."""
    flags = ["--ep", "2", "--device", "cuda", "--dist-timeout", "30"]
    code, _, err = _run([*GENERATE, *flags], deadline=120)
    errors = [line for line in err.splitlines() if line.startswith("nonstop: error:")]
    assert code == 2 and len(errors) == 1, err
    # The agent stops the other ranks once it sees one fail; polling every 15 s (not 0.1) lets the other rank
    # reach its own check first, so both ranks report; on a very busy host it may be stopped before it does.
    # A rank that skipped the check fails in the process group's setup within those 15 s: "internal error".
    code, _, err = _run([*TORCHRUN, "--monitor-interval", "15", *GENERATE, *flags], deadline=120)
    assert code != 0
    assert 1 <= err.count(errors[0]) <= 2, err[-3000:]  # the same line, from each rank that got that far
    assert "internal error" not in err, err[-3000:]  # (torchrun prints its own ChildFailedError traceback)
