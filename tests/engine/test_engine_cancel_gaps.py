"""EngineLoop cancellation of a request that holds a slot: at the step boundary after ``cancel`` the request
leaves the batch and its slot is freed before the step runs, so it is never decoded (or prefilled) again and
its token list stays what its events delivered. The loop's rounds are driven by hand here (no engine
thread), over the scripted executor: every next token is ``(last + 1) % V``."""

from __future__ import annotations

import torch

from nonstop.config import ModelConfig
from nonstop.engine.core import EngineCore
from nonstop.engine.loop import EngineLoop
from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.tokenizer import ByteTokenizer
from tests.engine.scripted_executor import Scripted, V
from tests.engine.tiny_models import TINY_MODELS


def _loop(prefill_chunk=None) -> EngineLoop:
    cfg = ModelConfig.from_file(TINY_MODELS["k3"])
    return EngineLoop(EngineCore(cfg, Scripted(), ByteTokenizer(V), 1, torch.float32, "cpu", None, prefill_chunk))


def _queue(loop: EngineLoop, prompt: list[int], events: list) -> Request:
    """Queue a request the way ``submit`` does (the engine thread is not running: rounds are driven here)."""
    req = Request("r", None, prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), frozenset())
    loop._waiting.append((req, events.append))
    return req


def test_a_cancelled_running_request_is_not_decoded_again_and_frees_its_slot():
    """Two rounds give two tokens; after ``cancel`` the next round sends the ``abort`` event, frees the slot
    and runs no step: the request's tokens are exactly the two delivered (a request only marked stopped
    would stay in the batch and be decoded once more)."""
    loop = _loop()
    events: list = []
    req = _queue(loop, [5, 6, 7], events)
    loop._iterate()
    loop._iterate()
    assert req.output_ids == [8, 9]
    steps = loop.steps
    loop.cancel("r")
    loop._iterate()
    assert events[-1].finish_reason == "abort"
    assert [t for e in events for t in e.token_ids] == [8, 9] == req.output_ids
    assert loop.num_active == 0 and loop.core.free_slots == [0] and loop.steps == steps
    assert int(loop.core.cache.lengths[0]) == 0


def test_a_request_cancelled_during_chunked_prefill_frees_its_slot_at_once():
    """A 12-token prompt prefilled 4 tokens a round: cancelled after the first chunk, the next round ends it
    with ``abort`` and no output, and the slot is free right away (not after the rest of the prompt)."""
    loop = _loop(prefill_chunk=4)
    events: list = []
    req = _queue(loop, list(range(3, 15)), events)
    loop._iterate()
    assert req in loop.core.prefilling
    loop.cancel("r")
    loop._iterate()
    assert [(e.finish_reason, e.token_ids) for e in events] == [("abort", [])]
    assert req.output_ids == [] and loop.num_active == 0 and loop.core.free_slots == [0]
