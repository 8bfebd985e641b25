"""Request bookkeeping (stop tokens, end-of-sequence text, finish reasons, time to first token) and the device
decode step's host side (``engine/device_decode``: which requests sample on the device, how many steps a
launch runs, where tokens past a request's end go), on a fake core and executor: no kernels, no model.

Every expected value comes from the definition (the docstrings' contract, hand arithmetic), not from the code.
"""

from __future__ import annotations

import pytest
import torch

from nonstop.engine import device_decode
from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.tokenizer import ByteTokenizer
from nonstop.runtime.device_sampling import SampleRow, fill_sample_rows, philox_key

TOK = ByteTokenizer(256)
A, B, C, D = (ord(c) for c in "ABCD")


def _request(prompt=(1,), eos=(), rid="r", **params) -> Request:
    params = {"temperature": 0, **params}
    return Request(rid, None, list(prompt), SamplingParams(**params), frozenset(eos))


def _feed(req: Request, tokens) -> str:
    text = ""
    for t in tokens:
        text += req.append(t, TOK)
        if req.finished:
            break
    return text


# ------------------------------------------------------------------ Request


def test_a_stop_token_id_ends_the_request_and_its_text_is_not_shown():
    req = _request(max_tokens=10, stop_token_ids=[C])
    streamed = _feed(req, [A, B, C, D])
    assert req.finish_reason == "stop" and req.output_ids == [A, B, C]
    assert req.text == "AB" and streamed == "AB"


def test_the_end_of_sequence_token_ends_without_its_text():
    req = _request(eos=[B], max_tokens=10)
    assert _feed(req, [A, B, C]) == "A"
    assert req.finish_reason == "stop" and req.output_ids == [A, B] and req.text == "A"


def test_a_stop_token_id_ends_the_request_even_with_ignore_eos():
    req = _request(eos=[B], max_tokens=10, ignore_eos=True, stop_token_ids=[D])
    assert _feed(req, [A, B, C, D, A]) == "ABC"
    assert req.finish_reason == "stop" and req.output_ids == [A, B, C, D]


def test_stopping_a_finished_request_keeps_its_finish_reason():
    req = _request(max_tokens=2)
    _feed(req, [A, B])
    assert req.finish_reason == "length"
    ended = req.finished_at
    req.stop("abort")
    assert req.finish_reason == "length" and req.finished_at == ended
    running = _request(max_tokens=5)
    _feed(running, [A])
    running.stop("abort")
    assert running.finish_reason == "abort" and running.finished_at is not None


def test_time_to_first_token_is_taken_at_the_first_token():
    req = _request(max_tokens=10)
    req.append(A, TOK)
    first = req.first_token_at
    for t in (B, C, D):
        req.append(t, TOK)
    assert req.first_token_at == first
    assert req.output().metrics["time_to_first_token_s"] == pytest.approx(first - req.arrival)


# ------------------------------------------------------------------ SampleRow / fill_sample_rows


def test_a_sample_row_carries_the_requests_parameters():
    params = SamplingParams(temperature=0.75, top_k=5, top_p=0.5, seed=-3)
    assert SampleRow.of(params) == SampleRow(0.75, 5, 0.5, -3)
    assert SampleRow.of(SamplingParams(temperature=1.0, seed=2**64 - 1)).seed == -1


def _buffers(rows: int) -> dict:
    return {
        "sample_temperature": torch.zeros(rows),
        "sample_top_k": torch.zeros(rows, dtype=torch.int64),
        "sample_top_p": torch.zeros(rows),
        "sample_seed": torch.zeros(rows, dtype=torch.int64),
        "sample_offset": torch.zeros(rows, dtype=torch.int64),
    }


def test_fill_sample_rows_writes_each_row_and_refuses_a_position_count_that_differs():
    buf = _buffers(4)
    rows = [SampleRow(0.5, 3, 0.25, 7), SampleRow(2.0, -1, 1.0, philox_key(2**63))]
    fill_sample_rows(buf, rows, torch.tensor([11, 40]))
    assert buf["sample_temperature"].tolist() == [0.5, 2.0, 0.0, 0.0]
    assert buf["sample_top_k"].tolist() == [3, -1, 0, 0]
    assert buf["sample_top_p"].tolist() == [0.25, 1.0, 0.0, 0.0]
    assert buf["sample_seed"].tolist() == [7, -(2**63), 0, 0]
    assert buf["sample_offset"].tolist() == [11, 40, 0, 0]
    for positions in ([1], [1, 2, 3]):
        with pytest.raises(ValueError):
            fill_sample_rows(_buffers(4), rows, torch.tensor(positions))


# ------------------------------------------------------------------ device_decode on a fake core


class _Executor:
    """Samples on the device: row r's k-th token of a launch is the next of ``script[slot]``."""

    samples_on_device = True

    def __init__(self, script: dict[int, list[int]], max_rows: int = 8):
        self.script = {slot: list(tokens) for slot, tokens in script.items()}
        self.max_rows = max_rows
        self.calls = []

    def sample_tokens(self, ids, cache, slots, n, rows):
        self.calls.append((ids[:, 0].tolist(), list(slots), n, rows))
        out = []
        for slot in slots:
            out.append(self.script[slot][:n])
            del self.script[slot][:n]
        return torch.tensor(out, dtype=torch.long)


class _Core:
    speculative_decoder = None
    device = "cpu"
    cache = None
    tokenizer = TOK

    def __init__(self, executor, prefilling=()):
        self.executor = executor
        self.prefilling = list(prefilling)
        self.finished, self.failed = [], []

    def row_groups(self, reqs, limit=None):
        return [reqs[i : i + limit] for i in range(0, len(reqs), limit)]

    def finish(self, req):
        self.finished.append(req)

    def fail(self, reqs, exc):
        raise exc


def _running(max_tokens: int, slot: int, generated=(A,), **params) -> Request:
    req = _request(max_tokens=max_tokens, rid=f"r{slot}", **params)
    req.slot = slot
    for t in generated:
        req.append(t, TOK)
    return req


@pytest.mark.parametrize(
    "params, on_device",
    [
        ({}, True),
        ({"temperature": 0.8, "top_k": 4, "top_p": 0.9, "seed": 1}, True),
        ({"temperature": 0.8, "min_p": 0.1}, False),
        ({"logprobs": 0}, False),
        ({"repetition_penalty": 1.1}, False),
        ({"presence_penalty": 0.5}, False),
        ({"frequency_penalty": -0.5}, False),
    ],
)
def test_device_can_sample_only_temperature_top_k_top_p_and_the_seed(params, on_device):
    assert device_decode.device_can_sample(SamplingParams(**params)) is on_device


def test_steps_per_launch_is_one_while_prompts_wait_else_what_every_request_may_still_generate():
    reqs = [_running(20, 0), _running(5, 1, generated=(A, B))]  # 19 and 3 tokens left
    assert device_decode.steps_per_launch(_Core(_Executor({})), reqs) == 3
    assert device_decode.steps_per_launch(_Core(_Executor({})), [_running(100, 0)]) == device_decode.STEPS_PER_LAUNCH
    assert device_decode.steps_per_launch(_Core(_Executor({}), prefilling=[object()]), reqs) == 1


def test_no_device_step_for_a_speculative_core_a_host_executor_or_a_host_only_request():
    reqs = [_running(10, 0)]
    core = _Core(_Executor({0: [B] * 8}))
    core.speculative_decoder = object()
    assert device_decode.decode(core, reqs) is None
    host = _Executor({0: [B] * 8})
    host.samples_on_device = False
    assert device_decode.decode(_Core(host), reqs) is None
    mixed = [_running(10, 0), _running(10, 1, min_p=0.5, temperature=1.0)]
    assert device_decode.decode(_Core(_Executor({0: [B] * 8, 1: [B] * 8})), mixed) is None
    assert device_decode.decode(_Core(_Executor({})), []) is None


def test_tokens_past_a_stop_are_dropped_and_the_request_is_finished_once():
    stops = _running(20, 0, stop_token_ids=[D])
    runs = _running(20, 1)
    ex = _Executor({0: [B, C, D, A, A, A, A, A], 1: [B, C, B, C, B, C, B, C]})
    core = _Core(ex)
    out = device_decode.decode(core, [stops, runs])
    assert [n for _, _, n, _ in ex.calls] == [8]
    assert ex.calls[0][0] == [A, A]  # each row continues from its last token
    assert stops.output_ids == [A, B, C, D] and stops.finish_reason == "stop"
    assert runs.output_ids == [A, B, C, B, C, B, C, B, C] and not runs.finished
    assert core.finished == [stops]
    assert out == [(stops, "BC"), (runs, "BCBCBCBC")]


def test_a_launch_never_runs_past_max_tokens():
    req = _running(4, 0)  # 3 tokens left
    ex = _Executor({0: [B, C, D, A, A, A, A, A]})
    core = _Core(ex)
    device_decode.decode(core, [req])
    assert ex.calls[0][2] == 3
    assert req.output_ids == [A, B, C, D] and req.finish_reason == "length" and core.finished == [req]


def test_more_requests_than_max_rows_launch_in_groups_in_order():
    reqs = [_running(3, s, generated=(ord("a") + s,), temperature=1.0, seed=s) for s in range(5)]
    ex = _Executor({s: [B, C] for s in range(5)}, max_rows=2)
    out = device_decode.decode(_Core(ex), reqs)
    assert [slots for _, slots, _, _ in ex.calls] == [[0, 1], [2, 3], [4]]
    assert [ids for ids, _, _, _ in ex.calls] == [[ord("a"), ord("b")], [ord("c"), ord("d")], [ord("e")]]
    assert [r.seed for _, _, _, rows in ex.calls for r in rows] == [0, 1, 2, 3, 4]
    assert [r for r, _ in out] == reqs and all(r.output_ids == [ord("a") + i, B, C] for i, r in enumerate(reqs))
