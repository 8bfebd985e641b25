"""``nonstop tune --proposer llm`` against a scripted OpenAI-compatible endpoint started here on 127.0.0.1.

The endpoint answers, round after round: a file with a syntax error, wrong math (the bias forgotten), a
cheat (torch does the work), then a correct kernel. The loop must end with the correct kernel in the
tuning store (verified, untimed: no GPU) and every rejection's message must reach the next prompt."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nonstop.cli import main
from nonstop.tune.candidate import extract_code
from tests.tiny_configs import TINY_CONFIGS
from tests.tune.helpers import HERE, serving

REPLIES = [
    "Here is a fused kernel.\n```python\nimport triton\n\ndef launch(op, env)\n    pass\n```\n",
    "Dropping the bias saves a load:\n```python\n" + (HERE / "corpus" / "wrong_bias.py").read_text() + "```",
    "Let torch do it:\n```python\n" + (HERE / "corpus" / "torch_matmul.py").read_text() + "```",
    "Fixed, with fp32 accumulation:\n```python\n"
    + (HERE / "kernels" / "linear_residual_rowloop.py").read_text()
    + "```\nDone.",
]


class ScriptedEndpoint(ThreadingHTTPServer):
    """/v1/chat/completions answering REPLIES in turn; records every request."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.max_prompt = 0  # > 0: refuse longer prompts as over the context (HTTP 400)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's naming
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.server.max_prompt and len(body["messages"][-1]["content"]) > self.server.max_prompt:
            error = json.dumps(
                {"error": {"message": "maximum context length exceeded", "code": "context_length_exceeded"}}
            )
            self.send_response(400)
            self.send_header("Content-Length", str(len(error)))
            self.end_headers()
            self.wfile.write(error.encode())
            return
        with self.server.lock:
            self.server.requests.append({"body": body, "auth": self.headers.get("Authorization")})
            reply = REPLIES[min(len(self.server.requests), len(REPLIES)) - 1]
        data = json.dumps(
            {
                "id": "x",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint():
    with serving(ScriptedEndpoint()) as server:
        yield server


def test_scripted_llm_loop_keeps_the_correct_kernel(endpoint, tmp_path, capsys, monkeypatch):
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_CONFIGS["llama"]))
    store = tmp_path / "tuning.json"
    monkeypatch.setenv("SCRIPTED_KEY", "sk-test")
    rc = main(
        [
            "tune",
            "-m",
            str(model),
            "--op",
            "linear_residual",
            "--proposer",
            "llm",
            "--llm-base-url",
            endpoint.base_url,
            "--llm-model",
            "scripted",
            "--llm-api-key-env",
            "SCRIPTED_KEY",
            "--rounds",
            "4",
            "--candidates",
            "1",
            "--rows",
            "1,3",
            "--device",
            "cpu",
            "--store",
            str(store),
            "--timeout",
            "240",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert len(endpoint.requests) == 4 and all(r["auth"] == "Bearer sk-test" for r in endpoint.requests)
    prompts = [r["body"]["messages"][-1]["content"] for r in endpoint.requests]

    # each round's rejection, as printed, is in the next round's prompt
    lines = [line for line in out.splitlines() if line.strip().startswith("r") and ": rejected (" in line]
    assert [line.split(":")[0].strip() for line in lines] == ["r1c1", "r2c1", "r3c1"], out
    for n, (line, category) in enumerate(zip(lines, ["syntax error", "wrong result", "forbidden construct"])):
        assert f"rejected ({category})" in line
        message = line.split(": ", 2)[2][:100]
        assert message in prompts[n + 1], (message, prompts[n + 1][-3000:])
        assert message not in prompts[n]
    assert "r4c1: accepted (untimed)" in out
    assert (
        "def linear_residual(op, env)" in prompts[0] and "## The current kernel" in prompts[0]
    )  # twin and kernel sources

    data = json.loads(store.read_text())
    entries = data["entries"]["cpu"]["linear_residual"]
    assert sorted(k.split()[0] for k in entries) == ["B1xT1", "B3xT1"]
    want = hashlib.sha256(extract_code(REPLIES[3]).encode()).hexdigest()
    for entry in entries.values():
        assert entry["sha256"] == want and entry["proposer"] == "llm:scripted" and entry["round"] == 4
        assert entry["timed"] is False and entry["time_ms"] is None
        assert (store.parent / entry["kernel"]).read_text() == extract_code(REPLIES[3])
        assert entry["verification"]["master_seed"] is not None and len(entry["verification"]["cases"]) >= 5

    assert main(["tune", "--list", "--store", str(store)]) == 0
    listed = capsys.readouterr().out
    assert "linear_residual" in listed and "verified, untimed" in listed and "llm:scripted round 4" in listed


def test_unreachable_endpoint_is_one_clear_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "tune",
                "-m",
                "k3-nano",
                "--op",
                "linear_residual",
                "--proposer",
                "llm",
                "--llm-base-url",
                "http://127.0.0.1:9/v1",
                "--llm-model",
                "x",
                "--rounds",
                "1",
                "--candidates",
                "1",
                "--device",
                "cpu",
                "--no-store",
            ]
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "cannot reach http://127.0.0.1:9/v1/chat/completions" in err and "Traceback" not in err


def test_short_context_endpoint_gets_the_compact_prompt(endpoint):
    """An endpoint that refuses the full prompt as too long gets it without the current kernel's source."""
    from nonstop.tune.candidate import RoundContext
    from nonstop.tune.llm import LLMProposer
    from tests.tune.helpers import tiny_target

    endpoint.max_prompt = 6000
    proposer = LLMProposer(endpoint.base_url, "scripted", api_key_env="")
    (candidate,) = proposer.propose(RoundContext(1, 1, tiny_target("linear_residual"), [], {}, {}), 1)
    assert candidate.error is None and candidate.source == extract_code(REPLIES[0])
    assert (
        proposer.compact
        and "## The current kernel" not in proposer.prompts[-1]
        and "## The twin" in proposer.prompts[-1]
    )
    assert len(proposer.prompts[-1]) <= 6000 and endpoint.requests[0]["auth"] is None
