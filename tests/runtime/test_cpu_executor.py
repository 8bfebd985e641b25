"""The ``cpu`` executor against the reference: greedy tokens at fp32 on every family's tiny config
(continuous batching: three requests of different lengths, so the decode batch shrinks 3 -> 1), the
calls it hands to the reference (prefill, verification, hidden states, scoring) and what they return,
and ``backend="auto"`` choosing it on a CPU.

The compiled step is checked on two families (compiling costs seconds per family); the same step
function run eagerly (``compile=False``) is checked on all of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nonstop.cache.state import ModelCache
from nonstop.engine.core import EngineCore
from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.speculative.config import SpeculativeConfig
from nonstop.engine.speculative.ngram import NgramDrafter
from nonstop.engine.speculative.step import SpeculativeDecoder
from nonstop.engine.tokenizer import ByteTokenizer
from nonstop.model.rows import row_exact
from nonstop.runtime.cpu import CPUExecutor
from nonstop.runtime.executors import ReferenceExecutor, make_executor, resolve_backend
from tests.runtime.helpers import greedy_tokens, tiny_model
from tests.tiny_configs import TINY_CONFIGS

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [[3, 4, 5, 6, 9], [7, 8], list(range(10, 23))]
MAX_TOKENS = [9, 4, 12]


def _reference_tokens(name: str) -> list[list[int]]:
    model = tiny_model(name)
    return greedy_tokens(model, ReferenceExecutor(model), PROMPTS, MAX_TOKENS)


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_eager_program_step_gives_the_reference_tokens(name):
    model = tiny_model(name)
    ex = CPUExecutor(model, compile=False, progress=False)
    assert greedy_tokens(model, ex, PROMPTS, MAX_TOKENS) == _reference_tokens(name)
    assert ex.stats["compiled_steps"] == max(MAX_TOKENS) - 1  # every (batched) decode step, none by the reference
    assert ex.stats["reference_reasons"] == {"prefill (T > 1)": len(PROMPTS)}


@pytest.mark.parametrize("name", ["llama", "kimi_k3"])
def test_compiled_step_gives_the_reference_tokens(name):
    model = tiny_model(name)
    ex = CPUExecutor(model, compile=True, progress=False)
    assert greedy_tokens(model, ex, PROMPTS, MAX_TOKENS) == _reference_tokens(name)
    assert ex.stats["compiled_steps"] == max(MAX_TOKENS) - 1
    assert set(ex.stats["compile_seconds"]) == {"batch B>1, context L>1", "batch 1, context L>1"}
    # the cache pools grow during the run (inside inference mode): the step is not compiled again for it
    assert ex.stats["recompiles"] == 0
    # each shape class's first step goes through torch.compile, every later one is a direct call
    assert ex.stats["direct_steps"] == ex.stats["compiled_steps"] - 2


def test_decode_logits_match_the_reference_and_cache_state_too():
    """One compiled-path step (eager) from a prefilled cache: logits and every cache tensor as the reference's."""
    model = tiny_model("kimi_k3")
    ex = CPUExecutor(model, compile=False, progress=False)
    caches = [ModelCache(model.cfg, 3, capacity=8, page_size=4) for _ in range(2)]
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
    for cache in caches:  # slots 2 and 0, prefilled by the reference
        batch = cache.batch([2, 0], 6)
        model(prompt, cache, batch)
        cache.advance(batch)
    ids = torch.tensor([[40], [41]])
    got, want = [], []
    for cache, fn, out in ((caches[0], ex.forward, got), (caches[1], model.forward, want)):
        batch = cache.batch([2, 0], 1)
        out.append(fn(ids, cache, batch, last_only=True))
        cache.advance(batch)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(caches[0].layers, caches[1].layers):
        tensors_a = getattr(
            a, "tensors", {"recurrent": getattr(a, "recurrent", None), "conv": getattr(a, "conv", None)}
        )
        tensors_b = getattr(
            b, "tensors", {"recurrent": getattr(b, "recurrent", None), "conv": getattr(b, "conv", None)}
        )
        for key in tensors_a:
            torch.testing.assert_close(tensors_a[key], tensors_b[key], rtol=1e-5, atol=1e-6)


def test_calls_the_compiled_step_does_not_cover_run_the_reference():
    model = tiny_model("kimi_k3")
    ex = CPUExecutor(model, compile=False, progress=False)
    ids = torch.tensor([[3, 4, 5, 6]])
    torch.testing.assert_close(ex.forward(ids, None, None), model(ids))  # scoring: the reference itself
    cache = ModelCache(model.cfg, 1, capacity=16)
    batch = cache.batch([0], 4)
    logits, hidden = ex.forward_hidden(ids, cache, batch, (0, 3))
    assert logits.shape == (1, 4, model.cfg.vocab_size) and set(hidden) == {0, 3}
    cache.advance(batch)
    with row_exact():
        batch = cache.batch([0], 2, keep_states=True)
        ex.forward(torch.tensor([[7, 8]]), cache, batch)
    assert ex.stats["reference_reasons"] == {
        "scoring without a cache": 1,
        "hidden states (drafter)": 1,
        "speculative verification (keep_states)": 1,
    }
    assert ex.stats["compiled_steps"] == 0


def test_speculative_decoding_through_the_cpu_executor_keeps_the_plain_tokens():
    model = tiny_model("kimi_k3")
    decoder = SpeculativeDecoder(SpeculativeConfig.parse({"method": "ngram", "num_tokens": 3}), NgramDrafter(3, 1))
    ex = CPUExecutor(model, compile=False, progress=False)
    core = EngineCore(
        model.cfg, ex, ByteTokenizer(model.cfg.vocab_size), 2, torch.float32, "cpu", speculative_decoder=decoder
    )
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    req = Request("0", None, prompt, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True), frozenset())
    core.add(req)
    while core.running:
        core.step()
    want = greedy_tokens(model, ReferenceExecutor(model), [prompt], [10])[0]
    assert req.output_ids == want
    assert ex.stats["reference_reasons"]["speculative verification (keep_states)"] >= 1


def test_auto_backend_is_cpu_on_a_cpu():
    assert resolve_backend("auto", "cpu") == "cpu"
    assert resolve_backend("auto", torch.device("cuda")) == "reference"
    assert resolve_backend("reference", "cpu") == "reference"
    model = tiny_model("llama")
    assert isinstance(make_executor("auto", model), CPUExecutor)
    assert make_executor("cpu-int8", model).weights == "int8"


def test_cpu_backend_refuses_other_devices_and_unknown_formats():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="unknown CPU weight format"):
        CPUExecutor(model, weights="int3")
    model.embed_tokens = torch.nn.Embedding(3, 4, device="meta")  # a non-CPU device without a GPU
    with pytest.raises(ValueError, match="runs on the CPU"):
        CPUExecutor(model)


def test_k3_nano_greedy_tokens_through_the_default_backend():
    """The bundled model, two prompts decoded together, through ``LLM``'s default backend on a CPU."""
    from nonstop import LLM, SamplingParams

    text = (ROOT / "nonstop" / "assets" / "heldout_sample.txt").read_text()
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outs = {}
    for backend in ("auto", "reference"):
        llm = LLM("k3-nano", backend=backend)
        prompts = [llm.tokenizer.encode(text[i : i + 120]) for i in (0, 900)]
        outs[backend] = [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling=params)]
        if backend == "auto":
            assert llm.backend == "cpu" and llm.executor.stats["compiled_steps"] == 11
    assert outs["auto"] == outs["reference"]


def test_cache_growth_while_decoding_does_not_recompile_the_step():
    """A lone request decodes past its slot's first pages: the pools grow inside the engine's inference mode,
    and the grown pool must be the same kind of tensor as the first (not an inference tensor where the first
    was a normal one) or the compiled step's guards fail and it compiles again."""
    from nonstop.cache.state import INITIAL_SLOT_TOKENS

    model = tiny_model("llama")
    ex = CPUExecutor(model, compile=True, progress=False)
    prompt, n = [[5, 6, 7]], [INITIAL_SLOT_TOKENS + 6]
    assert greedy_tokens(model, ex, prompt, n) == greedy_tokens(model, ReferenceExecutor(model), prompt, n)
    assert ex.stats["compiled_steps"] == n[0] - 1 and ex.stats["recompiles"] == 0
    assert ex.stats["direct_steps"] == n[0] - 2  # the page table widened too: no new graph for it


def test_guards_dropped_only_on_the_executors_fixed_arguments():
    """The compiled step keeps its guards on the inputs that change per step and drops those on the Program and
    the op table (fixed for an executor, which compiles its own copy of the step)."""
    from types import SimpleNamespace

    from nonstop.runtime.cpu.executor import unguarded_fixed_arguments

    names = ["program.ops[3].weights['w']", "table['mlp']", "ids", "read_rows", "tensors[3]['latent']", "programs"]
    keep = unguarded_fixed_arguments([SimpleNamespace(name=n) for n in names])
    assert keep == [False, False, True, True, True, True]
