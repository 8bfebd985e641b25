"""The cheat corpus (``corpus/*.py``: each file says what it does, its kind and how it must be rejected),
the correct kernels written for the tests (``kernels/*.py``), and verification targets on tiny models."""

from __future__ import annotations

import contextlib
import functools
import re
import threading
from pathlib import Path

import torch

from nonstop.config import ModelConfig
from nonstop.tune.target import Target, make_target
from tests.tiny_configs import TINY_CONFIGS

HERE = Path(__file__).resolve().parent
CORPUS = sorted((HERE / "corpus").glob("[!_]*.py"))
CORRECT = sorted((HERE / "kernels").glob("[!_]*.py"))


def expectation(path: Path) -> tuple[str, str, str]:
    """(kind, stage "static" | "dynamic", a phrase the first reasons must contain) from the file's docstring."""
    text = path.read_text()
    kind = re.search(r"^kind: (\w+)", text, re.MULTILINE).group(1)
    stage, phrase = re.search(r"^expect: (\w+): (.+?)(?:\"\"\")?$", text, re.MULTILINE).groups()
    return kind, stage, phrase.strip()


@functools.cache
def tiny_target(kind: str, config: str = "llama", rows: tuple[int, ...] = (1, 3), dtype=torch.float32) -> Target:
    """``kind`` of a tiny odd-shaped model (its real widths are the tuned shapes), on the CPU."""
    return make_target(kind, f"tiny-{config}", ModelConfig.from_hf_dict(TINY_CONFIGS[config]), dtype, "cpu", list(rows))


@contextlib.contextmanager
def serving(server):
    """``server`` (an ``http.server`` server) answering on a daemon thread until the block ends; then shut down."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
