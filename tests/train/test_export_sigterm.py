"""`nonstop train` stopped by SIGTERM (timeout, Slurm, docker stop) while it writes its checkpoint: the staged
files are removed and the command ends with one line and status 143."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from nonstop.weights.write import STAGING_PREFIX
from tests.train.test_sweep_fixes import _argv, config  # noqa: F401  (config: the tiny K3 fixture)

ROOT = Path(__file__).resolve().parents[2]

# SIGTERM to the process itself as the checkpoint's weights are saved, then `nonstop train` with the argv given
DRIVER = """
import json, os, signal, sys
import safetensors.torch
from nonstop.cli import main

real = safetensors.torch.save_file

def save(tensors, path, metadata=None):
    real(tensors, path, metadata=metadata)  # the staged file is there: the cleanup has it to remove
    os.kill(os.getpid(), signal.SIGTERM)

safetensors.torch.save_file = save
sys.exit(main(json.loads(sys.argv[1])))
"""


def test_sigterm_while_train_writes_its_checkpoint_leaves_no_staging(corpus, config, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    argv = _argv(corpus, config, tmp_path, "--eval-every", "1e9", "--no-samples")
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(argv)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 143, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "nonstop: terminated", result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists() or not list(out.glob(f"{STAGING_PREFIX}*"))
    assert not (out / "model.safetensors").exists()
