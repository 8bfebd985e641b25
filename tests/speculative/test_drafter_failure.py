"""A drafter that raises for one request ends that request alone (``isolate_errors``), as a failed
verification or emission does; the other requests of the step decode on to plain decoding's tokens.
Without ``isolate_errors`` the drafter's exception reaches the caller."""

from __future__ import annotations

import pytest
import torch

from nonstop.engine.core import EngineCore
from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.speculative import SpeculativeConfig, SpeculativeDecoder
from nonstop.engine.speculative.drafter import Draft
from nonstop.engine.tokenizer import ByteTokenizer
from nonstop.runtime.executors import ReferenceExecutor
from tests.speculative.helpers import tiny_model


class FailsFor:
    """Proposes nothing, and raises for the requests named."""

    taps = ()

    def __init__(self, bad: set[str]):
        self.bad = bad

    def start(self, req) -> None:
        pass

    def observe(self, req, hidden) -> None:
        pass

    def propose(self, req, k: int) -> Draft:
        if req.request_id in self.bad:
            raise RuntimeError("drafter out of memory")
        return Draft.empty()


def _run(prompts: dict[str, list[int]], bad: set[str], isolate: bool) -> dict[str, Request]:
    model = tiny_model("llama")
    decoder = SpeculativeDecoder(SpeculativeConfig("ngram"), FailsFor(bad))
    core = EngineCore(
        model.cfg, ReferenceExecutor(model), ByteTokenizer(model.cfg.vocab_size), len(prompts), torch.float32, "cpu",
        isolate_errors=isolate, speculative_decoder=decoder,
    )  # fmt: skip
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    reqs = {name: Request(name, None, ids, params, frozenset()) for name, ids in prompts.items()}
    for r in reqs.values():
        core.admit(r)
    for _ in range(50):
        if not core.active:
            break
        core.step()
    return reqs


PROMPTS = {"good": [1, 2, 3], "bad": [4, 5], "also": [6, 7, 8, 9]}


def test_one_requests_drafter_failure_ends_only_that_request():
    plain = _run(PROMPTS, set(), isolate=True)
    got = _run(PROMPTS, {"bad"}, isolate=True)
    assert got["bad"].finish_reason == "error" and "drafter out of memory" in got["bad"].output().error
    for name in ("good", "also"):
        assert got[name].finish_reason == "length"
        assert got[name].output_ids == plain[name].output_ids and len(plain[name].output_ids) == 5


def test_every_drafter_failing_ends_every_request():
    got = _run(PROMPTS, set(PROMPTS), isolate=True)
    assert {r.finish_reason for r in got.values()} == {"error"}


def test_without_isolation_the_drafters_error_is_raised():
    with pytest.raises(RuntimeError, match="drafter out of memory"):
        _run(PROMPTS, {"bad"}, isolate=False)
