"""Run the step shapes a server meets before it takes traffic.

An executor may prepare each step shape on its first use: the ``cpu`` executor compiles one program per
shape class (batch 1 or more, context 1 or more tokens; tens of seconds the first time on a machine,
seconds to load from its cache after), the Triton executors compile their kernels. Served cold, the
first requests wait behind that while ``/health`` already answers. ``warm_up`` runs, through the
server's own ``EngineCore``, a one-token and a two-token prompt alone and then two at a time, each
decoding a few tokens: every shape class (B = 1 and B > 1, L = 1 and L > 1) of prefill and decode. In a
context shorter than a prompt and its tokens (``--max-model-len`` of a few tokens) each request decodes what
fits, and a prompt with no room for one token is left out: warm-up must never ask for more than a client may.
"""

from __future__ import annotations

import time

from nonstop.engine.core import EngineCore
from nonstop.engine.sampling import SamplingParams

WARMUP_TOKENS = 3  # decoded per warm-up request: the context grows past its prompt


def warm_up(core: EngineCore, make_request) -> float:
    """Run the warm-up requests on ``core`` (its slots end free); ``make_request(prompt, ids, params)``
    makes an engine request (``LLM.make_request``). Returns the seconds it took."""
    t0 = time.perf_counter()
    width = min(2, len(core.free_slots))
    groups = [[[0]], [[0, 0]]]
    if width > 1:
        groups += [[[0]] * width, [[0, 0]] * width]
    for prompts in groups:
        for ids in prompts:
            room = min(WARMUP_TOKENS, core.max_len - len(ids))
            if room >= 1:
                params = SamplingParams(max_tokens=room, temperature=0.0, ignore_eos=True)
                core.admit(make_request(None, ids, params))
        while core.active:
            core.step()
    return time.perf_counter() - t0
