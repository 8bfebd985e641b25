"""Decode steps that sample on the device, several per launch when no token needs the host in between.

With an executor that samples on the device (the interface's ``samples_on_device`` and ``sample_tokens``:
the megakernel, whose step ends with the ``sample`` op, and the superop executor with its kernels, which
launches the sampler after the step) the engine's decode step hands it every running request's last token
and sampling parameters (``runtime.device_sampling.SampleRow``: temperature, top-k, top-p, seed) and gets
token ids back instead of logits (requests asking for logprobs, min_p or penalties sample on the host). When no
prompt waits to be prefilled (it should join the batch at the next step) it runs up to
``STEPS_PER_LAUNCH`` steps in one launch (never more than a request may still generate), and applies
the tokens one by one afterwards: stop tokens, stop strings and max_tokens end a request exactly where
step-by-step decoding would, the tokens it sampled past its end are dropped (its slot is freed). Each
token's noise depends only on its request's seed and position, so the tokens are those of one step per
launch. A step of more than the executor's ``max_rows`` sequences runs as several launches of at most
``max_rows`` sequences each (the kernels' row limit), in request order.

``decode(core, reqs)`` returns the (request, new text) pairs of ``EngineCore.step``, or None when the
step is not for the device (the core then runs its host path: logits and ``sampling.sample``).
"""

from __future__ import annotations

import torch

STEPS_PER_LAUNCH = 8


def device_can_sample(params) -> bool:
    """Can the device sampler draw a request's tokens? It knows temperature, top-k, top-p and the seed;
    logprobs, min_p and the penalties (which read the request's past tokens) need the host."""
    return params.logprobs is None and params.min_p == 0 and not params.penalized


def wants_device(core, reqs) -> bool:
    """Does this decode step sample on the device?"""
    return (
        core.speculative_decoder is None
        and core.executor.samples_on_device
        and all(device_can_sample(r.params) for r in reqs)
    )


def steps_per_launch(core, reqs) -> int:
    """How many steps the next launch runs: 1 while prompts wait (they join at the next step), else up
    to ``STEPS_PER_LAUNCH`` and no more than any request may still generate."""
    if core.prefilling:
        return 1
    left = min(r.params.max_tokens - len(r.output_ids) for r in reqs)
    return max(1, min(STEPS_PER_LAUNCH, left))


def decode(core, reqs) -> list | None:
    """One engine decode step of ``reqs`` on the device (module docstring), or None."""
    if not reqs or not wants_device(core, reqs):
        return None
    from nonstop.runtime.device_sampling import SampleRow

    out = []
    n = steps_per_launch(core, reqs)
    for group in core.row_groups(reqs, core.executor.max_rows):  # sample_tokens takes at most max_rows rows
        ids = torch.tensor([[r.output_ids[-1]] for r in group], dtype=torch.long, device=core.device)
        rows = [SampleRow.of(r.params, r.generator) for r in group]
        try:
            tokens = core.executor.sample_tokens(ids, core.cache, [r.slot for r in group], n, rows)
        except Exception as exc:
            core.fail(group, exc)
            out += [(r, "") for r in group]
            continue
        for i, r in enumerate(group):
            out.append((r, _apply(core, r, tokens[i].tolist())))
    return out


def _apply(core, req, tokens: list[int]) -> str:
    """Append ``tokens`` to ``req`` until it finishes (the rest are dropped); frees its slot when done."""
    text = []
    try:
        for token in tokens:
            text.append(req.append(token, core.tokenizer))
            if req.finished:
                break
    except Exception as exc:
        core.fail([req], exc)
        return "".join(text)
    if req.finished:
        core.finish(req)
    return "".join(text)
