"""The ``bench/`` scripts as a user meets them with a bad value: one ``error`` line and exit status 2, never a
traceback, and nothing written to the directory it runs in (each script run as a user runs it, in a process
of its own: a few seconds each)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nonstop.dist.launch import free_port
from tests.bench_script import BENCH_DIR

NO_MODEL = "neither a checkpoint directory nor a known name"
CASES = [  # (script, arguments, what the error line says)
    ("op_check.py", ["--dry-run", "--shapes", "foo"], "argument --shapes: unknown 'foo'"),
    ("dist_link.py", ["--worlds", "abc"], "argument --worlds"),
    ("dist_link.py", ["--worlds", "1"], "argument --worlds: expected comma-separated integers >= 2"),
    ("dist_link.py", ["--reps", "0"], "argument --reps"),
    ("dist_decode.py", ["--worlds", "x"], "argument --worlds"),
    ("dist_decode.py", ["--model", "nosuch"], NO_MODEL),
    ("dist_decode.py", ["--batches", "0"], "argument --batches"),
    ("dist_decode.py", ["--exchanges", "bogus"], "argument --exchanges: unknown 'bogus'"),
    ("serve_load.py", ["--url", "http://127.0.0.1:{port}"], "is not reachable"),
    ("tune.py", ["--models", "nosuch"], NO_MODEL),
    ("tune.py", ["--rows", "x"], "argument --rows"),
    ("tune.py", ["--kinds", "bogus"], "argument --kinds: unknown 'bogus'"),
    ("cpu_busy.py", ["--model", "nosuch"], NO_MODEL),
    ("cpu_direct_call.py", ["--model", "nosuch"], NO_MODEL),
    ("cpu_attention_ab.py", ["--checkpoint", "/nonexistent"], NO_MODEL),
    ("spec_decode.py", ["--model", "nosuch"], NO_MODEL),
    ("cpu_quality.py", ["--model", "nosuch"], NO_MODEL),
    ("k3_nano_sampling.py", ["--model", "nosuch"], NO_MODEL),
    ("cpu_decode.py", ["--threads", "0"], "argument --threads"),
    ("cpu_gemv.py", ["--threads", "0"], "argument --threads"),
    ("cpu_gemv_ab.py", ["--base", "HEAD", "--threads", "0"], "argument --threads"),
    ("cpu_peers.py", ["--threads", "0"], "argument --threads"),
    ("spec_decode.py", ["--threads", "0"], "argument --threads"),
    ("k3_nano_sampling.py", ["--threads", "0"], "argument --threads"),
    ("spec_decode.py", ["--num-tokens", "x"], "argument --num-tokens"),
    ("spec_decode.py", ["--methods", "bogus"], "argument --methods: unknown 'bogus'"),
    ("cpu_decode.py", ["--prompt-len", "0"], "argument --prompt-len"),
    *[  # a results path that is a folder: refused before the run, not after it (the results were lost)
        (script, ["--out", "."], "argument --out: . is a directory: give a file path")
        for script in ("decode.py", "spec_decode.py", "serve_load.py", "dist_decode.py", "dist_link.py", "tune.py")
    ],
    ("op_check.py", ["--dry-run", "--out-dir", "/dev/null"], "argument --out-dir: /dev/null is a file: give a folder"),
    ("op_check.py", ["--dry-run", "--context", "0"], "argument --context: expected a positive integer"),
    ("op_check.py", ["--dry-run", "--llama-layers", "0"], "argument --llama-layers: expected a positive integer"),
    ("op_check.py", ["--dry-run", "--k3-layers", "-1"], "argument --k3-layers: expected a positive integer"),
    ("op_check.py", ["--dry-run", "--tol", "-1"], "argument --tol: expected a non-negative finite number"),
]


@pytest.mark.parametrize(("script", "argv", "message"), CASES, ids=[f"{c[0]} {' '.join(c[1])}" for c in CASES])
def test_a_bad_value_is_one_error_line(script, argv, message, tmp_path):
    argv = [a.format(port=free_port()) for a in argv]  # a port nothing listens on
    run = subprocess.run(
        [sys.executable, str(BENCH_DIR / script), *argv],
        cwd=tmp_path,  # nothing may be written here either
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in run.stderr.splitlines() if "error:" in line]
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert len(errors) == 1 and message in errors[0], run.stderr[-3000:]
    assert not list(tmp_path.iterdir())
