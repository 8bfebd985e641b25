"""The ``llm`` proposer against an endpoint that hangs: docs/tune.md promises that a reply that times out is one
candidate "not produced" and that an endpoint that never answers ends the run with one error line. The
request timeout (``LLMProposer(timeout_s=...)``, ``--llm-timeout-s``) was a socket timeout per read, so an
endpoint that trickled bytes was never timed out, and one that never answered cost every candidate of every
round a full timeout instead of ending the run."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nonstop.tune.candidate import RoundContext
from nonstop.tune.llm import EndpointError, LLMProposer
from tests.tune.helpers import tiny_target


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # the handlers below end on ``stop``; never wait for them at close


class _Trickle(BaseHTTPRequestHandler):
    """Answers 200 with a long body and sends one byte of it every 0.2 s until the test ends."""

    def do_POST(self):  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "1000000")
        self.end_headers()
        while not self.server.stop.is_set():
            try:
                self.wfile.write(b" ")
                self.wfile.flush()
            except OSError:
                return
            self.server.stop.wait(0.2)

    def log_message(self, *args):
        pass


class _Silent(_Trickle):
    """Reads the request and never answers."""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.stop.wait(60)


def _serve(handler):
    server = _Server(("127.0.0.1", 0), handler)
    server.stop = threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _close(server):
    server.stop.set()
    server.shutdown()
    server.server_close()


def _proposer(server) -> LLMProposer:
    """A proposer of ``server`` with a 1 s timeout."""
    return LLMProposer(f"http://127.0.0.1:{server.server_address[1]}/v1", "x", api_key_env="", timeout_s=1)


@pytest.mark.timeout(60)
def test_an_endpoint_that_trickles_bytes_is_timed_out():
    """Catches the request timeout being a per-read socket timeout: an endpoint that sends a byte every
    0.2 s keeps ``ask`` waiting for ever although ``timeout_s`` is 1 s (from the CLI: 600 s that never end).
    The request must end, with a reply or an error, within a few timeouts."""
    server = _serve(_Trickle)
    try:
        proposer = _proposer(server)
        done, errors = threading.Event(), []

        def ask():
            try:
                proposer.ask("system", "user")
            except Exception as exc:  # noqa: BLE001 - any error ends the request, which is all this test asks
                errors.append(exc)
            done.set()

        threading.Thread(target=ask, daemon=True).start()
        t0 = time.monotonic()
        ended = done.wait(10)
        assert ended, (
            f"the request to a trickling endpoint still runs after {time.monotonic() - t0:.0f} s (timeout 1 s)"
        )
        assert len(errors) == 1 and isinstance(errors[0], TimeoutError), errors
    finally:
        _close(server)


@pytest.mark.timeout(60)
def test_an_endpoint_that_never_answers_ends_the_run():
    """Catches a silent endpoint (connection accepted, no reply ever) costing every candidate a full timeout:
    docs/tune.md says an endpoint that never answers ends the run with one error line, and a proposer that
    has had no reply yet raises ``EndpointError`` for it (as for a refused connection). Each of the
    candidates waited out its timeout and became "not produced", so ``nonstop tune --proposer llm`` against a
    hung endpoint ran rounds x candidates x 600 s (2 hours at the defaults) and exited 0."""
    server = _serve(_Silent)
    try:
        proposer = _proposer(server)
        context = RoundContext(1, 1, tiny_target("linear_residual"), [], {}, {})
        with pytest.raises(EndpointError):
            proposer.propose(context, 3)
    finally:
        _close(server)


def test_the_timeout_flag_reaches_the_proposer_and_must_be_positive(capsys):
    """``--llm-timeout-s`` (nonstop tune and bench/tune.py) is the proposer's whole-reply timeout; 0 is refused."""
    import argparse

    from nonstop.commands.tune import add_proposer_args, llm_proposer

    parser = argparse.ArgumentParser()
    add_proposer_args(parser, rounds=1)
    base = ["--proposer", "llm", "--llm-base-url", "http://127.0.0.1:9/v1", "--llm-model", "m"]
    assert llm_proposer(parser.parse_args(base + ["--llm-timeout-s", "7.5"])).timeout_s == 7.5
    assert llm_proposer(parser.parse_args(base)).timeout_s == 600.0
    with pytest.raises(SystemExit) as e:
        parser.parse_args(base + ["--llm-timeout-s", "0"])
    assert e.value.code == 2 and "--llm-timeout-s" in capsys.readouterr().err
