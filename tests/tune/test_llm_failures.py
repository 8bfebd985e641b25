"""A bad reply from the LLM endpoint costs one candidate, not the tuning run, and what was verified is kept
in the store whatever ends the rounds (an endpoint that stops answering, an error)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer

import pytest

from nonstop.cli import main
from nonstop.tune.candidate import Candidate, RoundContext
from nonstop.tune.llm import LLMProposer
from nonstop.tune.loop import tune
from tests.tiny_configs import TINY_CONFIGS
from tests.tune.helpers import HERE, serving, tiny_target

CORRECT = (HERE / "kernels" / "linear_residual_rowloop.py").read_text()


def _completion(content) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}).encode()


# (reply body, declared Content-Length or None for the body's own, a phrase of the candidate's error)
BAD_REPLIES = {
    "cut short": (b'{"choices": [', 4000, "cut short"),
    "not utf-8": (b'{"choices": "\xff\xfe"}', None, "not UTF-8"),
    "not json": (b"<html>busy</html>", None, "not JSON"),
    "content not text": (_completion(5), None, "not text"),
}


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers["Content-Length"]))
        body, length = self.server.reply
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(length or len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint():
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), _Handler)) as server:
        yield server


@pytest.mark.parametrize("bad", sorted(BAD_REPLIES))
def test_a_bad_reply_is_one_candidate_not_produced(endpoint, bad):
    body, length, phrase = BAD_REPLIES[bad]
    endpoint.reply = (body, length)
    proposer = LLMProposer(f"http://127.0.0.1:{endpoint.server_address[1]}/v1", "x", api_key_env="", timeout_s=30)
    out = proposer.propose(RoundContext(1, 1, tiny_target("linear_residual"), [], {}, {}), 2)
    assert [c.id for c in out] == ["r1c1", "r1c2"]
    for c in out:
        assert c.source == "" and c.error and phrase in c.error, c.error
    assert proposer.stopped is None


class _OnceHandler(_Handler):
    def do_POST(self):  # noqa: N802
        self.server.socket.close()  # the endpoint goes away: every later request is refused
        super().do_POST()


def test_an_endpoint_that_stops_answering_ends_the_rounds_and_keeps_the_winner(tmp_path, capsys):
    server = HTTPServer(("127.0.0.1", 0), _OnceHandler)
    server.reply = (_completion(f"```python\n{CORRECT}```"), None)
    port = server.server_address[1]
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_CONFIGS["llama"]))
    store = tmp_path / "tuning.json"
    args = ["tune", "-m", str(model), "--op", "linear_residual", "--proposer", "llm", "--llm-model", "x"]
    args += ["--llm-base-url", f"http://127.0.0.1:{port}/v1", "--llm-api-key-env", ""]
    args += ["--rounds", "3", "--candidates", "2", "--rows", "1,3", "--device", "cpu", "--store", str(store)]
    try:
        rc = main(args + ["--timeout", "240"])
    finally:
        thread.join(timeout=10)
        server.server_close()
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "r1c1: accepted" in out and "r1c2: not produced (the endpoint stopped answering" in out, out
    assert "round 2/" not in out, out
    entries = json.loads(store.read_text())["entries"]["cpu"]["linear_residual"]
    assert sorted(k.split()[0] for k in entries) == ["B1xT1", "B3xT1"]
    assert all(e["candidate"] == "r1c1" for e in entries.values())


class _FailsInRoundTwo:
    """A proposer with the correct kernel in round 1 that fails in round 2."""

    name = "scripted"
    stopped = None

    def propose(self, context, n):
        if context.round > 1:
            raise RuntimeError("the proposer broke")
        return [Candidate("r1c1", CORRECT, self.name)]


def test_the_store_is_written_as_winners_come(tmp_path):
    store = tmp_path / "tuning.json"
    with pytest.raises(RuntimeError, match="the proposer broke"):
        tune(tiny_target("linear_residual"), _FailsInRoundTwo(), 2, 1, store, timeout_s=240, say=lambda _m: None)
    entries = json.loads(store.read_text())["entries"]["cpu"]["linear_residual"]
    assert sorted(k.split()[0] for k in entries) == ["B1xT1", "B3xT1"]
