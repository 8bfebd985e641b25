"""Defects a black-box probe of the ``bench/`` scripts found (each test fails on the code it was written against):
serve_load's throughput counts stream chunks, not tokens; spec_decode calls "no drafts" an acceptance of 0;
cpu_peers takes --tokens 1 (a decode rate of 0 / 0 after minutes of compiling); tune.py checks --store only after
the tuning, losing the run."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.bench_script import BENCH_DIR, load_bench


def _script(script: str, *argv: str, cwd, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH_DIR / script), *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def _errors(run: subprocess.CompletedProcess) -> list[str]:
    return [line for line in run.stderr.splitlines() if "error:" in line]


# ----------------------------------------------------------------------------- serve_load


class _TwoTokenChunks(BaseHTTPRequestHandler):
    """An OpenAI-style server whose stream sends 2 tokens per chunk (as a speculative server sends its accepted
    block): 2 chunks, then usage completion_tokens = 4."""

    def log_message(self, *args):  # quiet
        pass

    def _send(self, body: bytes, kind: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(json.dumps({"data": [{"id": "fake"}]}).encode())
        elif self.path == "/metrics":
            self._send(b"nonstop_active_sequences 0\n", "text/plain")
        else:
            self._send(b"{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not body.get("stream"):
            self._send(json.dumps({"choices": [{"text": "ab"}], "usage": {"completion_tokens": 2}}).encode())
            return
        lines = [
            {"choices": [{"index": 0, "text": "ab", "finish_reason": None}]},
            {"choices": [{"index": 0, "text": "cd", "finish_reason": "length"}]},
            {"choices": [], "usage": {"completion_tokens": 4}},
        ]
        sse = "".join(f"data: {json.dumps(line)}\n\n" for line in lines) + "data: [DONE]\n\n"
        self._send(sse.encode(), "text/event-stream")


def test_serve_load_throughput_counts_tokens_not_stream_chunks(tmp_path):
    """DEFECT: ``output_tokens_per_s`` is the count of content chunks over the window, not of tokens. A server that
    sends several tokens in one chunk (``nonstop serve --speculative dspark`` sends each accepted block as one)
    is reported at a fraction of its rate: here 2 tokens a chunk, so half; on k3-nano with --speculative dspark, 1
    client, 5 s, 16 tokens a request: 29.0 tok/s reported while the 19 requests completed inside the window alone
    streamed 304 tokens (>= 60.8 tok/s). The tokens of requests completed in the window must all count."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _TwoTokenChunks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        out = tmp_path / "load.json"
        run = _script(
            "serve_load.py", "--url", url, "--clients", "1", "--duration", "1", "--out", str(out), cwd=tmp_path
        )
    finally:
        server.shutdown()
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert results["completed_requests"] > 0 and results["completed_output_tokens"] == 4 * results["completed_requests"]
    in_window = results["output_tokens_per_s"] * results["window_s"]
    assert in_window >= results["completed_output_tokens"] - 1e-6, results  # at most + the cancelled one's 4
    assert in_window <= results["completed_output_tokens"] + 4 * results["cancelled_at_deadline"] + 1e-6, results


# ----------------------------------------------------------------------------- spec_decode


def test_spec_decode_acceptance_of_no_drafts_is_not_zero():
    """DEFECT: ``draft_acceptance = accepted / max(drafted, 1)`` reports 0.0 when the drafter proposed nothing
    (n-gram on a held-out prompt with no repeat: ``spec_decode.py --prompts 1 --max-tokens 8 --num-tokens 2
    --repeats 1 --prompt-tokens 8`` lists ngram-k2 "drafted_tokens": 0, "draft_acceptance": 0.0, printed as
    0.00), as if every draft had been refused. 0 / 0 is undefined: null (JSON has no NaN), as the table's nan."""
    summarize = load_bench("spec_decode.py").summarize
    out = types.SimpleNamespace(
        token_ids=list(range(8)),
        metrics={"verify_steps": 7, "drafted_tokens": 0, "accepted_tokens": 0, "mean_accepted_length": 1.0},
    )
    row = summarize([out], [0.05])
    assert row["mean_accepted_length"] == 1.0 and row["drafted_tokens"] == 0
    assert row["draft_acceptance"] is None, row


# ----------------------------------------------------------------------------- cpu_peers


def test_cpu_peers_refuses_one_token_before_it_starts(tmp_path):
    """DEFECT: cpu_peers takes ``--tokens 1`` (``positive_int``), yet every rate it measures is (N - 1) / (time
    of the N-th token - time of the first): nonstop's metric is None for one token and transformers' worker
    divides 0 by 0 — after the checkpoint is written and every step compiled (minutes). cpu_attention_ab,
    cpu_busy and spec_decode refuse fewer than 2 tokens as they parse; so must cpu_peers (here with every peer
    skipped, which it refuses too, the --tokens error must come first: it is the argument's own check)."""
    run = _script(
        "cpu_peers.py",
        "--tokens",
        "1",
        "--skip",
        "transformers,llama.cpp,vllm",
        "--out",
        str(tmp_path / "p.json"),
        cwd=tmp_path,
    )
    errors = _errors(run)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert len(errors) == 1 and "--tokens" in errors[0], run.stderr[-3000:]
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------- tune


def test_tune_checks_its_store_before_it_tunes(tmp_path):
    """DEFECT: ``--store`` (where the winners go) is a bare Path, checked by nobody: a store that cannot be written
    is found only when the first winner is saved, after that op was verified (16 s in a --dry-run, hours on a
    GPU), as ``nonstop: error: [Errno 20] Not a directory: ...`` naming no option, and the results JSON is never
    written. --out is checked before any work (``script_args.out_file``); --store must be too."""
    (tmp_path / "a-file").write_text("x")
    run = _script(
        "tune.py",
        "--dry-run",
        "--models",
        "k3-nano",
        "--kinds",
        "lm_head",
        "--store",
        str(tmp_path / "a-file" / "tuning.json"),
        "--out",
        str(tmp_path / "tune.json"),
        cwd=tmp_path,
        timeout=300,
    )
    errors = _errors(run)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert len(errors) == 1 and "--store" in errors[0], run.stderr[-3000:]
    assert "r1c1" not in run.stderr  # refused before a candidate was verified
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


# ----------------------------------------------------------------------------- cpu_peers: which peers ran


def test_cpu_peers_says_which_peers_ran_and_why_the_others_did_not():
    """DEFECT (m8 D7): the JSON had no status: a run whose peer was skipped, absent, or failed to start had its
    rows simply missing. ``peer_status`` names each peer's fate; the result is "partial" unless all ran."""
    bench = load_bench("cpu_peers.py")

    def worker(ready: bool):
        return types.SimpleNamespace(ready={"ready": ready})

    args = types.SimpleNamespace(llama_python="/x/python", vllm_python=None)
    systems = {
        "transformers fp32": ("llama", "py", {"system": "transformers"}, 4.0, {}),
        "llama.cpp f32": ("llama", "py", {"system": "llama.cpp"}, 4.0, {}),
        "llama.cpp q8_0": ("llama", "py", {"system": "llama.cpp"}, 34 / 32, {}),  # f16's conversion failed
    }
    workers = {"transformers fp32": worker(False), "llama.cpp f32": worker(True), "llama.cpp q8_0": worker(True)}
    status = bench.peer_status(set(), args, systems, workers)
    assert status == {
        "transformers": "partial: transformers fp32 did not run",
        "llama.cpp": "partial: llama.cpp f16 did not run",
        "vllm": "not installed",
    }
    workers["transformers fp32"] = worker(True)
    systems["llama.cpp f16"] = ("llama", "py", {"system": "llama.cpp"}, 2.0, {})
    workers["llama.cpp f16"] = worker(True)
    status = bench.peer_status({"vllm"}, args, systems, workers)
    assert status == {"transformers": "ran", "llama.cpp": "ran", "vllm": "skipped (--skip)"}


# ----------------------------------------------------------------------------- cpu_gemv: the working set per format


def test_cpu_gemv_each_format_fills_the_working_set_in_its_own_bytes(tmp_path):
    """DEFECT (m8 D6): every format cycled the fp32 count of weights, so bf16 and int8 cycled a half and about a
    quarter of the working set and could time the cache (int8 above the copy bandwidth). 1 MB of 64 x 128
    weights by hand: fp32 4 B -> 1e6 // 32768 = 30 matrices, bf16 2 B -> 61, int8 1 + 4/128 B -> 1e6 // 8448 = 118."""
    out = tmp_path / "g.json"
    run = _script(
        "cpu_gemv.py", "--shapes", "64x128", "--working-set", "1", "--reps", "1", "--out", str(out), cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    cycled = {name: row[name]["weights_cycled"] for name in row if isinstance(row[name], dict)}
    assert cycled == {
        "torch fp32": 30,
        "tiled fp32 4K pages": 30,
        "tiled fp32": 30,
        "tiled bf16": 61,
        "tiled int8": 118,
    }
