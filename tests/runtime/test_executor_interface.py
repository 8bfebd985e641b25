"""Every backend declares and implements ``runtime.interface.Executor``, and the engine reads only that
interface: ``batch_invariant`` decides whether rows share a forward, ``max_rows`` how speculative
verification groups its rows, ``forward_hidden`` what a drafter reads."""

from __future__ import annotations

import inspect

import pytest
import torch

from nonstop.engine.sampling import SamplingParams
from nonstop.runtime.executors import BACKENDS, ReferenceExecutor
from nonstop.runtime.interface import Executor
from tests.speculative.helpers import ScriptedDrafter, generate, tiny_model

MEMBERS = ("forward", "forward_hidden")


def backend_classes() -> dict:
    from nonstop.engine.distributed import ClusterExecutor
    from nonstop.runtime.cpu import CPUExecutor
    from nonstop.runtime.megakernel import MegakernelExecutor
    from nonstop.runtime.superop import SuperOpExecutor

    classes = {
        "reference": ReferenceExecutor,
        "superop": SuperOpExecutor,
        "megakernel": MegakernelExecutor,
        "cpu": CPUExecutor,
        "cpu-bf16": CPUExecutor,  # the cpu backend with 16-bit weights
        "cpu-int8": CPUExecutor,
    }
    assert set(classes) == set(BACKENDS), "a backend was registered without being checked here"
    return {**classes, "cluster": ClusterExecutor}  # the multi-rank engine's executor (rank 0)


def test_every_backend_declares_and_implements_the_interface():
    stub = {name: getattr(Executor, name) for name in MEMBERS}
    for name, cls in backend_classes().items():
        assert Executor in inspect.getmro(cls), name  # declared, not only duck-typed
        assert name == "cluster" or name == cls.name or name.startswith(cls.name + "-"), name
        for member in MEMBERS:  # implemented, not the protocol's empty body
            assert getattr(cls, member) is not stub[member], (name, member)
            want = list(inspect.signature(stub[member]).parameters)
            assert list(inspect.signature(getattr(cls, member)).parameters)[: len(want)] == want, (name, member)


def test_instances_satisfy_the_protocol():
    from nonstop.runtime.superop import SuperOpExecutor

    model = tiny_model("llama")
    ref, prog = ReferenceExecutor(model), SuperOpExecutor(model, use_kernels=False)
    for ex in (ref, prog):
        assert isinstance(ex, Executor) and isinstance(ex.stats, dict)
    assert ref.batch_invariant is False and ref.max_rows is None
    assert prog.max_rows == prog.program.max_rows


class Recording(ReferenceExecutor):
    """The reference executor with declared properties, recording the rows of every cached forward."""

    def __init__(self, model, batch_invariant: bool = False, max_rows: int | None = None):
        super().__init__(model)
        self.batch_invariant, self.max_rows = batch_invariant, max_rows
        self.shapes: list[tuple[int, int]] = []
        self.verify_rows: list[int] = []  # rows of each verification forward (keep_states)

    def forward(self, input_ids, cache, batch, last_only=False):
        self.shapes.append(tuple(input_ids.shape))
        if batch is not None and batch.keep_states:
            self.verify_rows.append(input_ids.numel())
        return super().forward(input_ids, cache, batch, last_only)


PROMPTS = [[3, 4, 5], [6, 7], [8, 9, 10, 11]]
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def test_a_batch_invariant_executor_is_given_whole_batches():
    model = tiny_model("llama")
    split, whole = Recording(model), Recording(model, batch_invariant=True)
    want = generate(model, split, PROMPTS, GREEDY, batch_invariant=True)
    got = generate(model, whole, PROMPTS, GREEDY, batch_invariant=True)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    decode_rows = lambda shapes: max(b for b, t in shapes if t == 1)  # noqa: E731
    assert decode_rows(split.shapes) == 1 and decode_rows(whole.shapes) == len(PROMPTS)


def test_verification_groups_fit_the_executors_max_rows():
    model = tiny_model("llama")
    truth = {str(i): o.token_ids for i, o in enumerate(generate(model, Recording(model), PROMPTS, GREEDY))}
    for max_rows, k in ((None, 3), (8, 3), (4, 3), (3, 1)):
        ex = Recording(model, max_rows=max_rows)
        drafter = ScriptedDrafter(truth, right=2, vocab=model.cfg.vocab_size)
        out = generate(model, ex, PROMPTS, GREEDY, drafter, num_tokens=k, batch_invariant=False)
        assert {str(i): o.token_ids for i, o in enumerate(out)} == truth
        assert ex.verify_rows, ex.shapes
        if max_rows is None:  # no limit: every running request in one forward
            assert max(ex.verify_rows) == len(PROMPTS) * (k + 1)
        else:
            assert max(ex.verify_rows) <= max(k + 1, max_rows)


def test_forward_hidden_matches_forward():
    model = tiny_model("kimi_k3")
    ex = ReferenceExecutor(model)
    from nonstop.cache.state import ModelCache

    ids = torch.tensor([[5, 6, 7]])
    caches = [ModelCache(model.cfg, 1, capacity=8) for _ in range(2)]
    b0, b1 = caches[0].batch([0], 3), caches[1].batch([0], 3)
    logits, hidden = ex.forward_hidden(ids, caches[0], b0, (1, model.cfg.num_hidden_layers))
    assert torch.equal(logits, ex.forward(ids, caches[1], b1))
    assert set(hidden) == {1, model.cfg.num_hidden_layers}
    assert all(h.shape == (1, 3, model.cfg.hidden_size) for h in hidden.values())


DEVICE_SAMPLERS = ("superop", "megakernel")  # the backends with a device sampler (``sample_tokens``)


def test_device_sampling_is_part_of_the_interface():
    """``samples_on_device`` and ``sample_tokens`` are declared by the interface (default: no device sampler,
    ``sample_tokens`` refuses); the backends with a sampler override both, with the interface's signature."""
    from nonstop.runtime.superop import SuperOpExecutor

    default = Executor.sample_tokens
    want = list(inspect.signature(default).parameters)
    for name, cls in backend_classes().items():
        own = cls.sample_tokens is not default
        assert own == (name in DEVICE_SAMPLERS), name
        if own:
            assert list(inspect.signature(cls.sample_tokens).parameters) == want, name
            assert cls.samples_on_device is not Executor.samples_on_device, name
        else:
            assert cls.samples_on_device is False, name
    model = tiny_model("llama")
    ref = ReferenceExecutor(model)
    with pytest.raises(NotImplementedError, match="reference"):
        ref.sample_tokens(torch.tensor([[1]]), ref.new_cache(model.cfg, 1, torch.float32, "cpu", 4), [0], 1, [None])
    assert SuperOpExecutor(model, use_kernels=False).samples_on_device is False  # the twins have no sampler


class GreedyOnDevice(ReferenceExecutor):
    """The reference executor declaring a device sampler: greedy tokens, each step a cached forward."""

    samples_on_device = True

    def __init__(self, model):
        super().__init__(model)
        self.launches: list[int] = []  # n of every sample_tokens call

    def sample_tokens(self, input_ids, cache, slots, n, rows):
        self.launches.append(n)
        out, ids = [], input_ids
        for _ in range(n):
            batch = cache.batch(slots, 1)
            ids = self.forward(ids, cache, batch, last_only=True).argmax(-1, keepdim=True)
            cache.advance(batch)
            out.append(ids)
        return torch.cat(out, dim=1).cpu()


def test_the_engine_samples_on_the_device_when_the_executor_says_so():
    """The engine reads ``samples_on_device`` from the interface: an executor declaring it is asked for
    ``sample_tokens`` (several steps a launch) and its tokens are the ones emitted; one that does not is not."""
    model = tiny_model("llama")
    ex = GreedyOnDevice(model)
    got = generate(model, ex, PROMPTS, GREEDY)
    assert ex.launches and max(ex.launches) > 1
    assert [o.token_ids for o in got] == [o.token_ids for o in generate(model, Recording(model), PROMPTS, GREEDY)]
    ex.samples_on_device = False
    ex.launches.clear()
    generate(model, ex, PROMPTS, GREEDY)
    assert not ex.launches
