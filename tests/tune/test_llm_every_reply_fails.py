"""``nonstop tune --proposer llm`` against an endpoint that fails every request (an overloaded server answering
HTTP 500 to each): no candidate is ever produced, so the run tried nothing. It used to print its report and
exit 0, which a script driving the tuner reads as success; it now ends with one error line and status 1.
An endpoint that fails only some requests still exits 0 (see test_llm_failures.py)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from nonstop.cli import main
from tests.tiny_configs import TINY_CONFIGS
from tests.tune.helpers import serving


class _Busy(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"error": {"message": "the server is overloaded"}}'
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.server.requests = getattr(self.server, "requests", 0) + 1

    def log_message(self, *args):
        pass


def test_a_run_in_which_every_reply_failed_exits_1_with_one_error_line(tmp_path, capsys):
    """Catches exit status 0 from a tuning run that produced no candidate at all."""
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_CONFIGS["llama"]))
    store = tmp_path / "tuning.json"
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), _Busy)) as server:
        args = ["tune", "-m", str(model), "--op", "linear_residual", "--proposer", "llm", "--llm-model", "x"]
        args += ["--llm-base-url", f"http://127.0.0.1:{server.server_address[1]}/v1", "--llm-api-key-env", ""]
        args += ["--rounds", "2", "--candidates", "2", "--rows", "1", "--device", "cpu", "--store", str(store)]
        rc = main(args)
        requests = server.requests
    captured = capsys.readouterr()
    assert requests == 4, captured.out  # every round ran: the failures are not taken as an unreachable endpoint
    assert rc == 1, captured.out
    errors = [line for line in captured.err.splitlines() if line.startswith("nonstop: error:")]
    assert len(errors) == 1 and "no candidate was produced" in errors[0], captured.err
    assert "HTTP 500" in errors[0] and "overloaded" in errors[0], errors[0]
    assert "4 not produced" in captured.out, captured.out
    assert not store.exists() or "linear_residual" not in store.read_text()
