"""Shared pieces of the speculative-decoding tests: tiny models, an engine run, scripted drafters."""

from __future__ import annotations

import torch

from nonstop.config import ModelConfig
from nonstop.engine.core import EngineCore
from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.speculative import SpeculativeConfig, SpeculativeDecoder
from nonstop.engine.speculative.drafter import Draft
from nonstop.engine.tokenizer import ByteTokenizer
from nonstop.model.build import random_model
from tests.tiny_configs import TINY_CONFIGS

_MODELS: dict = {}


def tiny_model(name: str, **changes):
    """A random fp32 model of a tiny config (``tests/tiny_configs``) or a preset (cached per process)."""
    key = (name, tuple(sorted(changes.items())))
    if key not in _MODELS:
        if name in TINY_CONFIGS:
            raw = dict(TINY_CONFIGS[name])
            if "text_config" in raw:
                raw["text_config"] = {**raw["text_config"], **changes}
            else:
                raw.update(changes)
            cfg = ModelConfig.from_hf_dict(raw)
        else:
            cfg = ModelConfig.preset(name)
        _MODELS[key] = random_model(cfg, torch.float32, seed=7)
    return _MODELS[key]


def generate(
    model,
    executor,
    prompts: list[list[int]],
    params: SamplingParams | list[SamplingParams],
    drafter=None,
    num_tokens: int = 4,
    batch_invariant: bool = True,
    num_slots: int | None = None,
    eos: frozenset = frozenset(),
):
    """Run prompts (token ids) through an EngineCore, speculative when ``drafter`` is given."""
    decoder = (
        SpeculativeDecoder(SpeculativeConfig("ngram", num_tokens=num_tokens), drafter) if drafter is not None else None
    )
    core = EngineCore(
        model.cfg,
        executor,
        ByteTokenizer(model.cfg.vocab_size),
        num_slots or len(prompts),
        torch.float32,
        "cpu",
        batch_invariant=batch_invariant,
        speculative_decoder=decoder,
    )
    plist = params if isinstance(params, list) else [params] * len(prompts)
    reqs = [Request(str(i), None, list(p), sp, eos) for i, (p, sp) in enumerate(zip(prompts, plist))]
    pending = list(reqs)
    while pending or core.active:
        while pending and core.has_free_slot:
            core.admit(pending.pop(0))
        core.step()
    return [r.output() for r in reqs]


class ScriptedDrafter:
    """Proposes tokens from a known continuation (the plain run's output) per request id:
    ``right`` correct tokens, then ``wrong`` ones (never the true token), k at most."""

    taps: tuple[int, ...] = ()

    def __init__(self, truth: dict[str, list[int]], right: int, vocab: int):
        self.truth, self.right, self.vocab = truth, right, vocab

    def start(self, req) -> None:
        pass

    def observe(self, req, hidden) -> None:
        pass

    def propose(self, req, k: int) -> Draft:
        truth = self.truth[req.request_id]
        done = len(req.output_ids)
        out = []
        for i in range(k):
            t = truth[done + i] if done + i < len(truth) else 0
            out.append(t if i < self.right else (t + 1) % self.vocab)
        return Draft(out)


class EmptyDrafter(ScriptedDrafter):
    def __init__(self):
        pass

    def propose(self, req, k: int) -> Draft:
        return Draft.empty()


def teacher_forced_logits(model, target, feats, anchor, n, prev):
    """A DSpark block's logits for one anchor: ``model`` over target features ``feats`` [W, F] (all valid) at
    positions n-W..n-1, anchored at ``anchor`` with previous token ``prev``, through ``target``'s embedding
    and LM head."""
    W = feats.shape[0]
    with torch.inference_mode():
        return model(
            feats[None],
            torch.ones(1, W, dtype=torch.bool),
            torch.arange(n - W, n)[None],
            torch.tensor([anchor]),
            torch.tensor([n]),
            torch.tensor([prev]),
            target.embed_tokens.weight,
            target.lm_head_weight,
        )[0]


def record_verify_rows(ex) -> list[int]:
    """Wrap ``ex.forward`` so that each verification forward (``keep_states``) appends its rows (B·T) to the
    returned list."""
    rows_seen: list[int] = []
    forward = ex.forward

    def recording(ids, cache, batch, *args, **kwargs):
        if batch.keep_states:
            rows_seen.append(ids.shape[0] * ids.shape[1])
        return forward(ids, cache, batch, *args, **kwargs)

    ex.forward = recording
    return rows_seen
