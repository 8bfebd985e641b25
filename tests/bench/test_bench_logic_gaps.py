"""The bench scripts' own arithmetic, checked against hand-computed values: serve_load's per-request TTFT / TPOT
and its percentiles, dist_decode's wire traffic per token, spec_decode's accepted length and acceptance,
op_check's verdicts, and the comma-separated argument types of ``script_args``."""

from __future__ import annotations

import argparse
import asyncio
import json
import types

import httpx
import pytest

from tests.bench_script import load_bench

# ----------------------------------------------------------------------------- serve_load


def _request(lines: list[str], deadline: float = 1e9, chat: bool = False) -> dict:
    """serve_load.one_request over ``lines`` (one SSE line each) from a fake server, on a clock that ticks 1 s per
    read: the request is sent at t=0 and line i arrives at t=i+1."""
    bench = load_bench("serve_load.py")
    ticks = iter(range(1000))
    bench.time = types.SimpleNamespace(perf_counter=lambda: float(next(ticks)))
    body = ("\n".join(lines) + "\n").encode()
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
    stats = {"completed": 0, "cancelled": 0, "tokens": 0, "ttft": [], "tpot": [], "timeline": [], "errors": {}}

    async def go():
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            await bench.one_request(http, "/v1/completions", {}, deadline, stats)

    asyncio.run(go())
    return stats


def _data(obj) -> str:
    return "data: " + json.dumps(obj)


TOKEN = _data({"choices": [{"text": "a"}]})
ROLE = _data({"choices": [{"delta": {"role": "assistant"}}]})
CHAT_TOKEN = _data({"choices": [{"delta": {"content": "a"}}]})


def _usage(n: int) -> str:
    return _data({"choices": [], "usage": {"completion_tokens": n}})


def test_serve_load_ttft_and_tpot_of_one_request():
    """TTFT = first token - send, TPOT = (last - first token) / (tokens - 1): catches a TPOT over all the tokens,
    a first token taken as the last, a TTFT to the last token, and a request cancelled before its deadline."""
    stats = _request([TOKEN, TOKEN, TOKEN, TOKEN, _usage(4), "data: [DONE]"])  # tokens at t = 1, 2, 3, 4
    assert stats["completed"] == 1 and stats["cancelled"] == 0 and stats["tokens"] == 4
    assert stats["ttft"] == [1.0]
    assert stats["tpot"] == [1.0]  # (4 - 1) / (4 - 1)
    assert stats["timeline"] == [1.0, 2.0, 3.0, 4.0]


def test_serve_load_chat_role_chunk_is_not_a_token():
    """Chat's opening chunk carries the role, not a token: counting it moved the TTFT earlier and the TPOT."""
    stats = _request([ROLE, CHAT_TOKEN, CHAT_TOKEN, CHAT_TOKEN, _usage(3), "data: [DONE]"])  # tokens at 2, 3, 4
    assert stats["ttft"] == [2.0] and stats["tpot"] == [1.0] and stats["timeline"] == [2.0, 3.0, 4.0]


def test_serve_load_one_token_has_no_tpot():
    """A request of one token has a TTFT and no TPOT (there is no second token: no division by zero)."""
    stats = _request([TOKEN, _usage(1), "data: [DONE]"])
    assert stats["completed"] == 1 and stats["ttft"] == [1.0] and stats["tpot"] == []


def test_serve_load_a_request_past_the_deadline_is_cancelled():
    """Tokens up to the deadline count in the timeline; the request's latencies do not count."""
    stats = _request([TOKEN, TOKEN, TOKEN, TOKEN, _usage(4), "data: [DONE]"], deadline=2.5)
    assert stats["cancelled"] == 1 and stats["completed"] == 0
    assert stats["timeline"] == [1.0, 2.0] and stats["ttft"] == [] and stats["tpot"] == []


def test_serve_load_percentiles_by_hand():
    """1..101: the p-th percentile is 1 + p (inclusive method); catches an off-by-one index or the other method."""
    p = load_bench("serve_load.py").percentiles([float(v) for v in range(101, 0, -1)])
    assert (p["p50"], p["p90"], p["p99"], p["mean"], p["n"]) == (51.0, 91.0, 100.0, 51.0, 101)
    one = load_bench("serve_load.py").percentiles([0.25])
    assert one == {"p50": 0.25, "p90": 0.25, "p99": 0.25, "mean": 0.25, "n": 1}
    assert load_bench("serve_load.py").percentiles([])["p50"] is None


# ----------------------------------------------------------------------------- dist_decode


def test_dist_decode_window_traffic_by_hand():
    """Counts per step from rank 0 inside the window [start, end), bytes averaged over the ranks and divided by
    the tokens: catches a window one step too wide, bytes summed over ranks, and a dropped combine."""
    rank0 = [
        {"a2a_dispatch": (9, 900)},  # before the window
        {"a2a_dispatch": (2, 100), "a2a_combine": (2, 300), "a2a_sizes": (1, 8)},
        {"a2a_dispatch": (2, 100), "a2a_combine": (2, 300), "all_reduce": (1, 40)},
        {"a2a_dispatch": (5, 5000)},  # after it
    ]
    rank1 = [
        {"a2a_dispatch": (9, 999)},
        {"a2a_dispatch": (2, 200), "a2a_combine": (2, 200)},
        {"a2a_dispatch": (2, 200), "a2a_combine": (2, 200)},
        {"a2a_dispatch": (1, 7777)},
    ]
    got = load_bench("dist_decode.py").window_traffic([rank0, rank1], {"start": 1, "end": 3}, tokens=4)
    assert got["token_all_to_alls_per_step"] == 4.0  # (2 + 2 + 2 + 2) / 2 steps
    assert got["split_size_exchanges_per_step"] == 0.5 and got["all_reduces_per_step"] == 0.5
    assert got["wire_bytes_per_token_per_rank"] == 206.0  # (848 + 800) / 2 ranks / 4 tokens
    assert got["wire_bytes_by_kind_per_token_per_rank"] == {
        "a2a_combine": 125.0,
        "a2a_dispatch": 75.0,
        "a2a_sizes": 1.0,
        "all_reduce": 5.0,
    }


# ----------------------------------------------------------------------------- spec_decode


def _out(tokens: int, **metrics):
    return types.SimpleNamespace(token_ids=list(range(tokens)), metrics=metrics)


def test_spec_decode_summary_by_hand():
    """tau = decoded tokens (after the first) / verify steps, acceptance = accepted / drafted, tokens/s over the
    decode time: catches the first token counted, tau or acceptance inverted, tokens/s inverted."""
    summarize = load_bench("spec_decode.py").summarize
    spec = [
        _out(9, verify_steps=4, drafted_tokens=12, accepted_tokens=4, mean_accepted_length=2.0),
        _out(5, verify_steps=4, drafted_tokens=8, accepted_tokens=0, mean_accepted_length=1.0),
    ]
    row = summarize(spec, [2.0, 1.0])
    assert row["decode_tokens"] == 12 and row["decode_time_s"] == 3.0 and row["decode_tokens_per_s"] == 4.0
    assert row["mean_accepted_length"] == 1.5 and row["draft_acceptance"] == 0.2
    assert (row["drafted_tokens"], row["accepted_tokens"], row["verify_steps"]) == (20, 4, 8)
    assert row["per_prompt_mean_accepted_length"] == [2.0, 1.0]
    plain = summarize([_out(9), _out(5)], [2.0, 1.0])
    assert plain == {"decode_tokens": 12, "decode_time_s": 3.0, "decode_tokens_per_s": 4.0}


# ----------------------------------------------------------------------------- op_check


def test_op_check_verdicts_by_hand():
    """ops_summary counts over-tolerance and erred ops apart and names the first bad one; step_ok needs a run, finite
    logits and (with a tolerance) an error within it; failures counts bad ops and bad steps."""
    bench = load_bench("op_check.py")
    rows = [
        {"op": "a", "ok": True},
        {"op": "b", "ok": False, "nan": 0},
        {"op": "c", "ok": False, "error": "boom"},
    ]
    assert bench.ops_summary(rows) == "  3 ops, 1 over tolerance, 1 erred; first b"
    assert bench.step_ok({"rel_err": 0.5, "finite": True}, None)
    assert not bench.step_ok({"rel_err": 0.5, "finite": True}, 0.1)
    assert bench.step_ok({"rel_err": 0.05, "finite": True}, 0.1)
    assert not bench.step_ok({"rel_err": 0.0, "finite": False}, None)
    assert not bench.step_ok({"error": "x"}, None)
    report = {"ops": rows, "step": {"twins": {"ok": True}, "superop": {"ok": False}}}
    assert bench.failures(report) == 3


def test_op_check_dry_run_context_and_step_tolerance():
    """A --dry-run caps the context at 12 and flags a step past 1e-3 unless --step-tol says otherwise."""
    bench = load_bench("op_check.py")
    args = bench.parse_args(["--dry-run"])
    assert args.context == 12 and args.step_tol == 1e-3
    args = bench.parse_args(["--dry-run", "--context", "5", "--step-tol", "0.5"])
    assert args.context == 5 and args.step_tol == 0.5


# ----------------------------------------------------------------------------- script_args


def test_int_list_bounds_are_inclusive():
    """``int_list(lo, hi)`` takes lo and hi themselves and refuses lo - 1, hi + 1 and an empty list."""
    int_list = load_bench("script_args.py").int_list
    assert int_list(2)("2,4") == [2, 4]
    assert int_list(1, 7)("1,7") == [1, 7]
    assert int_list(1)("3,,5") == [3, 5]
    for parse, text in ((int_list(2), "1"), (int_list(1, 7), "8"), (int_list(1), ","), (int_list(1), "x")):
        with pytest.raises(argparse.ArgumentTypeError, match="expected comma-separated integers"):
            parse(text)


def test_choice_list_refuses_an_empty_list():
    """``--shapes ,`` was no shape at all (a run that measures nothing): it is refused as 'none given'."""
    choice_list = load_bench("script_args.py").choice_list(("a", "b"))
    assert choice_list(" b , a ") == ["b", "a"]
    with pytest.raises(argparse.ArgumentTypeError, match="none given"):
        choice_list(",")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown 'c'"):
        choice_list("a,c")


def test_a_short_decode_time_is_kept_to_the_microsecond():
    """A decode of 0.4 ms was stored as 0.0 s (rounded to 3 decimals) and the speedup computed from it divided
    by zero; the row keeps microseconds."""
    summarize = load_bench("spec_decode.py").summarize
    out = types.SimpleNamespace(token_ids=[1, 2, 3], metrics={})
    assert summarize([out], [0.0004])["decode_time_s"] == 0.0004


def test_dist_decode_gives_as_many_prompts_as_the_batch():
    """A batch larger than the held-out paragraphs (78 of over 200 characters) still gets B prompts: the
    paragraphs are taken again from the first (the row said batch B but ran 78 requests)."""
    prompts = load_bench("dist_decode.py").prompts
    tokenizer = types.SimpleNamespace(encode=lambda text, add_special_tokens=False: list(text.encode())[:40])
    got = prompts(tokenizer, 100, 16)
    assert len(got) == 100 and all(len(p) == 16 for p in got)
    assert got[78:] == got[:22] and got[0] != got[1]


@pytest.mark.parametrize(("backend", "fmt"), [("cpu", "float32"), ("cpu-bf16", "bfloat16"), ("cpu-int8", "int8")])
def test_the_floor_counts_the_weights_a_cpu_backend_packs(backend, fmt):
    """spec_decode's and serve_load's floor reads the weights in the format the backend keeps them (spec_decode
    counted fp32 for every backend: an int8 floor 3.9 times too high): what the packed Program streams, counted
    tensor by tensor in ``tests/runtime/test_cpu_streamed_weight_bytes.py``; here its order and labels."""
    import torch

    from nonstop.config import ModelConfig
    from nonstop.program.footprint import model_footprint
    from nonstop.runtime.executors import streamed_weight_bytes
    from tests.tiny_configs import LLAMA

    cfg = ModelConfig.from_hf_dict(LLAMA)
    got = {b: streamed_weight_bytes(cfg, torch.float32, b, "cpu") for b in ("cpu", "cpu-bf16", "cpu-int8")}
    assert got["cpu"][0] > got["cpu-bf16"][0] > got["cpu-int8"][0]
    assert got[backend][1] == f"{fmt} (backend {backend})"
    bf16 = model_footprint(cfg, torch.bfloat16).bytes_per_token
    assert streamed_weight_bytes(cfg, torch.bfloat16, "reference", "cpu") == (bf16, "bfloat16 (backend reference)")
