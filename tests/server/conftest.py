"""A real ``nonstop serve`` process on a free localhost port, over a tiny random K3 checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from nonstop.dist.launch import free_port
from tests.engine.tiny_models import TEST_CHAT_TEMPLATE, synth_checkpoint

MODEL_NAME = "tiny-k3"
MAX_MODEL_LEN = 256


@dataclass
class RunningServer:
    url: str
    process: subprocess.Popen
    log: Path

    @property
    def api(self) -> str:
        return self.url + "/v1"

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=self.api, api_key="unused", max_retries=0, timeout=60, **kw)

    def metric(self, sample: str) -> float:
        """A sample from /metrics: ``name{label="v"}`` exactly, or a bare name summed over its label sets."""
        total = 0.0
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            key, _, value = line.rpartition(" ")
            if key == sample or ("{" not in sample and key.startswith(sample + "{")):
                total += float(value)
        return total

    def wait_idle(self, timeout: float = 20.0) -> float:
        """Poll until no sequence holds a slot; returns the last reading."""
        deadline = time.monotonic() + timeout
        active = self.metric("nonstop_active_sequences")
        while active and time.monotonic() < deadline:
            time.sleep(0.05)
            active = self.metric("nonstop_active_sequences")
        return active

    def wait_metric(self, name: str, want: float, timeout: float = 10.0) -> float:
        """Poll until metric ``name`` reaches ``want``; returns the last reading. (The engine frees a slot,
        then tells the request's sink, which counts the finish: a poll right after ``wait_idle`` may fall
        between the two.)"""
        deadline = time.monotonic() + timeout
        value = self.metric(name)
        while value < want and time.monotonic() < deadline:
            time.sleep(0.05)
            value = self.metric(name)
        return value

    def healthy(self) -> bool:
        return httpx.get(self.url + "/health", timeout=10).status_code == 200


def start_server(model_dir: Path, log_dir: Path, *extra: str) -> RunningServer:
    port = free_port()
    log = log_dir / f"server-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "nonstop.cli",
        "serve",
        "--model",
        str(model_dir),
        "--served-model-name",
        MODEL_NAME,
        "--port",
        str(port),
        "--threads",
        "1",
        "--log-level",
        "warning",
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=Path(__file__).resolve().parents[2]
        )
    server = RunningServer(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if server.healthy():
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server did not come up:\n{log.read_text()}")


def stop_server(server: RunningServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(15)
    except subprocess.TimeoutExpired:
        server.process.kill()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return synth_checkpoint("k3", tmp_path_factory.mktemp("tiny-k3"), chat_template=TEST_CHAT_TEMPLATE)


@pytest.fixture(scope="session")
def server(model_dir, tmp_path_factory):
    """16 slots, 8-token prefill chunks, a 256-token context."""
    s = start_server(
        model_dir,
        tmp_path_factory.mktemp("logs"),
        "--max-batch",
        "16",
        "--prefill-chunk",
        "8",
        "--max-model-len",
        str(MAX_MODEL_LEN),
    )
    yield s
    stop_server(s)
