"""An LLM endpoint's HTTP error whose body is cut short (Content-Length says more than arrives, as a proxy or
a crashing server sends): docs/tune.md says a reply that fails (an HTTP error, a body cut short) is one
candidate "not produced". Reading the error's body raised ``http.client.IncompleteRead`` out of the
``HTTPError`` handler in ``LLMProposer.ask``, past ``propose``, and ended ``nonstop tune`` with
"internal error ... (a bug)" and exit 1."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from nonstop.tune.candidate import RoundContext
from nonstop.tune.llm import LLMProposer
from tests.tune.helpers import serving, tiny_target


class _CutError(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(500)
        self.send_header("Content-Length", "1000")  # 4 bytes follow
        self.end_headers()
        self.wfile.write(b"boom")
        self.close_connection = True

    def log_message(self, *args):
        pass


def test_an_http_error_with_a_cut_body_is_one_candidate_not_produced():
    """Catches the error body's IncompleteRead escaping ``propose``: each request is one candidate not
    produced, its error naming HTTP 500, and the proposer carries on."""
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), _CutError)) as server:
        proposer = LLMProposer(
            f"http://127.0.0.1:{server.server_address[1]}/v1",
            "x",
            api_key_env="",
            timeout_s=30,
        )
        out = proposer.propose(RoundContext(1, 1, tiny_target("linear_residual"), [], {}, {}), 2)
    assert [c.id for c in out] == ["r1c1", "r1c2"]
    for c in out:
        assert c.source == "" and c.error and "500" in c.error, c.error
    assert proposer.stopped is None
