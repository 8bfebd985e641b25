"""Gaps in the server's startup (``build_context``, ``bind_socket``, ``serve``, the stop-signal handling) and
its HTTP surface (API key, OpenAI error types, Prometheus exposition) that the existing tests missed. Each
test names the defect it catches; expected values are hand-derived or follow the Prometheus text format."""

from __future__ import annotations

import math
import re
import signal
import socket
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from nonstop.server.app import ServingContext, create_app
from nonstop.server.launch import bind_socket, build_context
from nonstop.server.metrics import ServerMetrics
from nonstop.server.translate import Limits
from tests.server.test_server_mutation_gaps2 import ScriptedEngine, ScriptedLLM

uvicorn = pytest.importorskip("uvicorn")


def _fake_llm(context: int = 100):
    return SimpleNamespace(
        cfg=SimpleNamespace(max_position_embeddings=context),
        new_core=lambda slots, isolate_errors, max_len: SimpleNamespace(),
        generation=SimpleNamespace(defaults={}),
    )


def _ctx(api_key: str | None = None, engine=None) -> ServingContext:
    return ServingContext(
        llm=ScriptedLLM(),
        engine=engine or ScriptedEngine(),
        served_names=["m"],
        limits=Limits(max_len=64),
        api_key=api_key,
    )


# ------------------------------------------------------------------ build_context, bind_socket


def test_build_context_passes_the_body_limit_and_the_api_key():
    """Catches --max-body-bytes or --api-key dropped on the way from the flags to the app (a server started
    with a key would then answer everyone; a body limit would be the default whatever was asked)."""
    ctx = build_context(_fake_llm(), ["m"], max_body_bytes=123, api_key="s3cret")
    assert ctx.limits.max_body_bytes == 123
    assert ctx.api_key == "s3cret"
    client = TestClient(create_app(ctx, manage_engine=False))
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_bind_socket_lets_a_restart_reuse_the_port_at_once():
    """Catches SO_REUSEADDR not set on the pre-bound socket: a restarted server would fail with 'Address
    already in use' while the old connections sit in TIME_WAIT (uvicorn sets it on sockets it binds)."""
    sock = bind_socket("127.0.0.1", 0)
    try:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) != 0
        assert sock.type == socket.SOCK_STREAM and sock.family == socket.AF_INET
    finally:
        sock.close()


# ------------------------------------------------------------------ stop signals


def _signal_server(monkeypatch, repeat_s: float):
    import nonstop.server.launch as launch

    stops = []
    server = launch._server(SimpleNamespace(), SimpleNamespace(stop=lambda: stops.append(1)), repeat_s)
    return server, stops


def test_a_stop_signal_repeated_within_the_window_is_the_same_one(monkeypatch):
    """Catches the repeat window not applied: under a launcher one Ctrl-C arrives twice (direct and relayed)
    and uvicorn takes the second SIGINT as 'force quit', cutting the requests in flight."""
    server, _ = _signal_server(monkeypatch, 1.0)
    try:
        server.handle_exit(signal.SIGINT, None)
        assert server.should_exit and not server.force_exit
        server.handle_exit(signal.SIGINT, None)
        assert not server.force_exit
        assert server.timer is not None and server.timer.daemon  # never holds the process open
    finally:
        server.timer.cancel()


def test_without_a_window_a_second_ctrl_c_forces_the_quit(monkeypatch):
    """Catches every repeated signal swallowed (the window applied with none asked): a user's second Ctrl-C
    must still force uvicorn to quit."""
    server, _ = _signal_server(monkeypatch, 0.0)
    try:
        server.handle_exit(signal.SIGINT, None)
        server.handle_exit(signal.SIGINT, None)
        assert server.force_exit
    finally:
        server.timer.cancel()


def test_sigterm_exits_with_128_plus_the_signal_number():
    """Catches the SIGTERM handler's exit status changed: a supervisor expects 143 (128 + 15)."""
    import nonstop.server.launch as launch

    with pytest.raises(SystemExit) as e:
        launch._terminated(signal.SIGTERM, None)
    assert e.value.code == 143


class _FakeServer:
    """Stands in for the uvicorn server ``serve`` runs: records how it was made and run."""

    def __init__(self, config, engine, repeat_s, started=True):
        self.config, self.engine, self.repeat_s = config, engine, repeat_s
        self.started, self.timer, self.sockets, self.handler = started, None, "unset", None

    def run(self, sockets=None):
        self.sockets = sockets
        self.handler = signal.getsignal(signal.SIGTERM)


def _serve(monkeypatch, started=True, **kw):
    import nonstop.server.launch as launch

    made = []

    def fake(config, engine, repeat_s):
        made.append(_FakeServer(config, engine, repeat_s, started))
        return made[-1]

    monkeypatch.setattr(launch, "_server", fake)
    before = signal.getsignal(signal.SIGTERM)
    launch.serve(_ctx(), log_level="warning", **kw)
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back
    return made[0]


def test_serve_runs_on_the_pre_bound_socket_with_the_grace_and_the_sigterm_handler(monkeypatch):
    """Catches serve ignoring the socket bound before the model loaded, uvicorn's graceful-shutdown timeout
    (GRACE_S + 5) dropped, or SIGTERM not turned into an exit while the server runs."""
    import nonstop.server.launch as launch

    monkeypatch.delenv("RANK", raising=False)
    sock = bind_socket("127.0.0.1", 0)
    try:
        server = _serve(monkeypatch, sock=sock)
    finally:
        sock.close()
    assert server.sockets == [sock]
    assert server.config.timeout_graceful_shutdown == launch.GRACE_S + 5
    assert server.handler is launch._terminated
    assert server.repeat_s == 0.0  # a lone process: every signal counts
    assert _serve(monkeypatch).sockets is None  # without a socket uvicorn binds host:port itself


def test_serve_under_a_launcher_merges_a_relayed_signal(monkeypatch):
    """Catches the repeat window not chosen by RANK: under torchrun (RANK set) one Ctrl-C arrives twice."""
    monkeypatch.setenv("RANK", "0")
    assert _serve(monkeypatch).repeat_s == 1.0


def test_serve_says_so_when_the_server_never_started(monkeypatch):
    """Catches the not-started check inverted: a server that could not start would return as if it had
    served (exit 0), and one that served and stopped cleanly would be reported as a failure."""
    _serve(monkeypatch, started=True)  # no error
    with pytest.raises(ValueError, match="could not start on 127.0.0.1:8000"):
        _serve(monkeypatch, started=False)


# ------------------------------------------------------------------ API key


@pytest.mark.parametrize("header", ["Bearer k", "bearer k", "Bearer   k  "])
def test_the_key_opens_every_v1_route_and_nothing_else_does(header):
    """Catches a wrong key accepted (the scheme or the token check dropped) or the WWW-Authenticate header
    lost from the 401 (RFC 7235 requires it)."""
    client = TestClient(create_app(_ctx("k"), manage_engine=False))
    assert client.get("/v1/models", headers={"Authorization": header}).status_code == 200
    for bad in ("Bearer kk", "Basic k", "k", ""):
        r = client.get("/v1/models", headers={"Authorization": bad})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert client.get("/health").status_code == 200  # probes need no key


# ------------------------------------------------------------------ OpenAI error bodies


def test_error_types_follow_openais_for_each_status():
    """Catches a status mapped to the wrong error type (clients branch on ``error.type``): a malformed body
    is OpenAI's invalid_request_error with all four error fields, and so (as on OpenAI's API) are an
    unknown route and a wrong method, the latter with an Allow header."""
    client = TestClient(create_app(_ctx(), manage_engine=False))
    r = client.post("/v1/completions", content=b"{not json")
    assert r.status_code == 400
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert r.json()["error"]["type"] == "invalid_request_error"
    r = client.get("/v1/nothing")
    assert (r.status_code, r.json()["error"]["type"]) == (404, "invalid_request_error")
    r = client.delete("/v1/models")
    assert (r.status_code, r.json()["error"]["type"]) == (405, "invalid_request_error")
    assert "GET" in r.headers["allow"]


# ------------------------------------------------------------------ Prometheus text exposition

SAMPLE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*)\})? (\S+)$'
)


def _parse(text: str) -> dict[str, float]:
    """An independent reader of the text format: every line a HELP, a TYPE or a sample whose value parses
    as Go's ParseFloat would (+Inf, -Inf, NaN, decimals); the text ends with a newline."""
    assert text.endswith("\n")
    samples: dict[str, float] = {}
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        m = SAMPLE.match(line)
        assert m, line
        value = m.group(4)
        assert re.fullmatch(r"[+-]Inf|NaN|[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", value), line
        key = line.rpartition(" ")[0]
        assert key not in samples, f"duplicate sample {key}"
        samples[key] = float(value)
    return samples


def test_histogram_sum_and_count_add_up_every_observation():
    """Catches a histogram's _sum or _count keeping only the last observation, or its buckets not
    cumulative: rate(_sum)/rate(_count) is the mean every dashboard shows."""
    metrics = ServerMetrics(active=lambda: 2, waiting=lambda: 5)
    # (TTFT, decode time, generated tokens): TPOT = decode / (tokens - 1), latency = TTFT + decode
    runs = [(0.5, 1.0, 3), (0.25, 0.0, 1), (2.0, 0.03, 4)]
    for ttft, decode, n in runs:
        metrics.record_finished("length", 2, n, {"time_to_first_token_s": ttft, "decode_time_s": decode})
    s = _parse(metrics.render())
    t = "nonstop_time_to_first_token_seconds"
    assert s[f"{t}_count"] == 3 and math.isclose(s[f"{t}_sum"], 2.75)
    assert s[f'{t}_bucket{{le="0.25"}}'] == 1 and s[f'{t}_bucket{{le="0.5"}}'] == 2
    assert s[f'{t}_bucket{{le="2.5"}}'] == 3 and s[f'{t}_bucket{{le="+Inf"}}'] == 3
    lat = "nonstop_request_latency_seconds"
    assert s[f"{lat}_count"] == 3 and math.isclose(s[f"{lat}_sum"], 1.5 + 0.25 + 2.03)
    p = "nonstop_time_per_output_token_seconds"
    assert s[f"{p}_count"] == 2 and math.isclose(s[f"{p}_sum"], 0.5 + 0.01)
    assert s[f'{p}_bucket{{le="0.01"}}'] == 1 and s[f'{p}_bucket{{le="0.5"}}'] == 2
    assert s["nonstop_generation_tokens_total"] == 8 and s["nonstop_prompt_tokens_total"] == 6
    assert s["nonstop_active_sequences"] == 2 and s["nonstop_queue_depth"] == 5


def test_a_value_past_the_last_bound_lands_only_in_the_inf_bucket():
    """Catches the +Inf bucket dropped: a TTFT over 60 s would be in no bucket and _count would disagree with
    le="+Inf", which Prometheus' histogram_quantile needs to be equal."""
    metrics = ServerMetrics(active=lambda: 0, waiting=lambda: 0)
    metrics.record_finished("stop", 1, 1, {"time_to_first_token_s": 90.0, "decode_time_s": 0.0})
    s = _parse(metrics.render())
    t = "nonstop_time_to_first_token_seconds"
    assert s[f'{t}_bucket{{le="60"}}'] == 0 and s[f'{t}_bucket{{le="+Inf"}}'] == 1 == s[f"{t}_count"]


def test_the_scrape_is_valid_exposition_with_every_family_typed_once():
    """Catches a malformed scrape: a missing final newline, a sample that is not ``name{labels} value``, a
    family without its HELP/TYPE or typed twice (Prometheus rejects the whole scrape); the gauges reading the
    wrong engine count; a path that only starts like /v1/models counted as a model route."""
    client = TestClient(create_app(_ctx(engine=ScriptedEngine(active=3, waiting=4)), manage_engine=False))
    client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2})
    client.get("/v1/nothing")
    client.get("/v1/modelsx")
    r = client.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    s = _parse(r.text)
    types = re.findall(r"^# TYPE (\S+) (\S+)$", r.text, re.M)
    assert len(types) == len({name for name, _ in types}) == 9
    for key in s:
        family = re.sub(r"_(bucket|sum|count)$", "", key.partition("{")[0])
        assert family in {name for name, _ in types}, key
    assert s['nonstop_requests_total{endpoint="/v1/completions",status="200"}'] == 1
    assert s['nonstop_requests_total{endpoint="other",status="404"}'] == 2
    assert s["nonstop_active_sequences"] == 3 and s["nonstop_queue_depth"] == 4
