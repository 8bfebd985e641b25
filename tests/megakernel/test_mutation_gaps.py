"""Gaps a mutation audit of the megakernel's host side found: argument checks of the executor's multi-step
entry points (before anything is recorded or launched), the integer type generated code gives a scalar,
and the weight slice a task's prefetch requests."""

from __future__ import annotations

import pytest
import torch

from nonstop.cache.state import ModelCache
from nonstop.runtime.device_sampling import SampleRow
from tests.runtime.helpers import tiny_model

pytest.importorskip("triton")

from nonstop.runtime.megakernel import advance  # noqa: E402
from nonstop.runtime.megakernel.codegen.source import int_type  # noqa: E402
from nonstop.runtime.megakernel.executor import MegakernelExecutor  # noqa: E402


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def _cache(model, slots: int = 1) -> ModelCache:
    return ModelCache(model.cfg, slots, capacity=8, dtype=torch.float32, device="cpu", page_size=4)


@pytest.mark.parametrize("n", [0, -1, advance.LOG + 1])
def test_decode_steps_refuses_a_step_count_outside_the_token_log(llama, n):
    """n steps a launch must fit the token log (1..LOG); 0 or a negative count is an error, not an empty launch."""
    ex = MegakernelExecutor(llama, graphs=False)
    cache = _cache(llama)
    with pytest.raises(ValueError, match=f"1..{advance.LOG} steps per launch"):
        ex.decode_steps(cache, [0], n)
    assert int(cache.lengths[0]) == 0  # nothing reserved or advanced


@pytest.mark.parametrize("n", [0, advance.LOG + 1])
def test_sample_tokens_refuses_a_step_count_outside_the_token_log(llama, n):
    ex = MegakernelExecutor(llama, graphs=False)
    cache = _cache(llama)
    with pytest.raises(ValueError, match=f"1..{advance.LOG} steps per launch, got {n}"):
        ex.sample_tokens(torch.tensor([[5]]), cache, [0], n, [SampleRow()])
    assert int(cache.lengths[0]) == 0


def test_decode_from_the_device_needs_a_first_step_of_the_shape(llama):
    """``decode_next`` / ``decode_steps`` continue from what the previous launch of the shape left on the
    device: before any step of that shape there is nothing to continue from (a clear error, no launch)."""
    ex = MegakernelExecutor(llama, graphs=False)
    cache = _cache(llama)
    with pytest.raises(ValueError, match="no step of shape 1x1 ran yet"):
        ex.decode_next(cache, cache.batch([0], 1))
    with pytest.raises(ValueError, match="no step of shape 1x1 ran yet"):
        ex.decode_steps(_cache(llama), [0], 2)
    assert not ex._kernels


def test_decode_from_the_device_continues_only_the_sequences_of_the_previous_step(llama):
    """The kernel reads the shape's static slots: a device step for another slot would write slot 0's
    cache while the host advances slot 1. It is refused before any page is reserved or launch made."""
    ex = MegakernelExecutor(llama, graphs=False)
    cache = _cache(llama, slots=2)
    prompt = torch.tensor([[3, 5, 7]])
    for slot in (0, 1):
        batch = cache.batch([slot], 3)
        ex.forward(prompt, cache, batch)
        cache.advance(batch)
    first = cache.batch([0], 1)
    ex.forward(torch.tensor([[9]]), cache, first)
    cache.advance(first)
    lengths = cache.lengths.clone()
    with pytest.raises(ValueError, match=r"\(slots \[0\]\), not slots \[1\]"):
        ex.decode_next(cache, cache.batch([1], 1))
    with pytest.raises(ValueError, match=r"\(slots \[0\]\), not slots \[1\]"):
        ex.decode_steps(cache, [1], 2)
    assert torch.equal(cache.lengths, lengths)
    assert ex.decode_next(cache, cache.batch([0], 1)).shape == (1, 1)  # its own sequence continues


def test_int_type_holds_every_value_of_the_class():
    """A scalar baked as int32 must hold every instance's value: int32 is [-2^31, 2^31 - 1]."""
    assert int_type([0, 2**31 - 1, -(2**31)]) == "tl.int32"
    assert int_type([2**31]) == "tl.int64"
    assert int_type([5, -(2**31) - 1]) == "tl.int64"
    assert int_type([]) == "tl.int32"


def test_a_step_after_the_pool_grew_writes_the_new_pool(llama):
    """The kernel of a shape is built once; when the cache pool grows (reallocated) its recorded addresses
    are refreshed: the step's K/V rows land in the cache's current pool (a later reference step over that
    cache sees them) and the pointer table holds the current pool addresses."""
    from nonstop.runtime.cuda_graph import token_caches

    caches = [ModelCache(llama.cfg, 1, capacity=2, dtype=torch.float32, device="cpu", page_size=2) for _ in "ab"]
    for c in caches:  # prefill position 0
        b = c.batch([0], 1)
        llama(torch.tensor([[7]]), c, b)
        c.advance(b)
    ref, cache = caches
    ex = MegakernelExecutor(llama, graphs=False)
    ids = torch.tensor([[9]])
    for position in (1, 2):  # position 2 needs a second page: the pool is reallocated
        before = [t.data_ptr() for layer in token_caches(cache) for t in layer.tensors.values()]
        wb, gb = ref.batch([0], 1), cache.batch([0], 1)
        assert int(gb.start[0]) == position
        want, got = llama(ids, ref, wb), ex.forward(ids, cache, gb)
        ref.advance(wb)
        cache.advance(gb)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        ids = want[:, -1:].argmax(-1)
    after = [t.data_ptr() for layer in token_caches(cache) for t in layer.tensors.values()]
    assert not set(after) & set(before), "the pool did not move: the test needs a reallocation"
    (mk,) = ex._kernels.values()
    assert set(after) <= set(mk.plan.ptrs.flatten().tolist())
    # a reference step over each cache: the megakernel's K/V of position 2 must be in the cache's pool
    wb, gb = ref.batch([0], 1), cache.batch([0], 1)
    torch.testing.assert_close(llama(ids, cache, gb), llama(ids, ref, wb), rtol=1e-4, atol=1e-5)


def test_persistent_steps_chain_each_counter_even_without_a_conflict():
    """An op r whose two tiles only read an input nothing writes (y) conflicts with nothing, not even its own
    previous step; still step e+1's increments of its counter must follow step e's (else a step-e waiter
    could be released by step e+1's tiles): ``assemble`` adds that wait and the validator (rule 6) accepts."""
    from nonstop.runtime.megakernel import validate
    from nonstop.runtime.megakernel.tasks import Access, BufferInfo, Region
    from nonstop.runtime.megakernel.tiling.waits import assemble
    from tests.megakernel.mutations import _op

    bufs = [BufferInfo("x", 1, 4), BufferInfo("y", 1, 4)]
    ops = [
        _op("f", (Region(0, 0, 1, 0, 4, Access.WRITE),)),
        _op("r", (Region(1, 0, 1, 0, 2, Access.READ),), (Region(1, 0, 1, 2, 4, Access.READ),)),
    ]
    s = assemble(bufs, ops, persistent=True)
    validate(s)
    for t in s.tasks:  # each task waits for all of the previous step's tiles of its own counter
        per_step = s.counters[t.counter].per_step
        assert (t.counter, 0, per_step) in [(w.counter, w.base, w.per_step) for w in t.waits], t.waits


def test_prefetch_table_requests_each_tasks_own_first_weight_slice():
    """Row i of the prefetch table is (address, bytes) of task i's first static slice of a contiguous weight (rows
    start..stop of its weight: start * row bytes into the tensor), at most PREFETCH_LINES lines; a task whose
    weights are all dynamic (the routed expert, the token's embedding row: unknown before the task runs)
    requests nothing."""
    from nonstop.runtime.megakernel.kernel import PREFETCH_LINES, StepKernel
    from nonstop.runtime.superop import ExecEnv
    from tests.megakernel.kernel_steps import kernel_step

    ks = kernel_step("deepseek_v3", B=2, T=1)
    ex = ks.executor
    step = ex.static_step(2, 1)
    mk = StepKernel(ex.program, ks.ops, ex.impl, ExecEnv(step.buf, ks.steps.cache, step.batch), "cpu")
    s, table = mk.schedule, mk.prefetch.tolist()
    seen = {"slice": 0, "dynamic": 0}
    for i, t in enumerate(s.tasks):
        weights = ks.ops[s.ops[t.op].program_op].weights
        static = [
            w
            for w in t.weights
            if not w.dynamic
            and w.dim in (0, -1)
            and weights.get(w.role) is not None
            and weights[w.role].is_contiguous()
        ]
        if not static:
            assert table[i] == [0, 0], s.task_name(i)
            seen["dynamic"] += any(w.dynamic for w in t.weights)
            continue
        w, tensor = static[0], weights[static[0].role]
        if w.dim == -1:
            want = (tensor.data_ptr(), tensor.numel() * tensor.element_size())
        else:
            row = tensor[0].numel() * tensor.element_size()
            want = (tensor.data_ptr() + w.start * row, (w.stop - w.start) * row)
            seen["slice"] += w.start > 0
        assert table[i] == [want[0], min(want[1], PREFETCH_LINES * 128)], s.task_name(i)
    assert seen["slice"] and seen["dynamic"]  # GEMV tiles past the first rows, routed experts


def test_a_wider_page_table_that_retiles_attention_builds_a_new_kernel(llama, monkeypatch):
    """Split-KV attention sizes its splits to the page table's width: when the table widens so that the
    launch now has more split tiles, the recorded schedule no longer matches (``refresh`` is False) and the
    executor builds (and validates) a new kernel - the logits stay the reference's."""
    import nonstop.kernels.gqa as gqa

    choose = gqa.choose_split  # splits of 16 keys: one split for a table of two 8-token pages, two once it widens to 4
    monkeypatch.setattr(gqa, "choose_split", lambda cb, pps, bs, dev, st, **k: choose(cb, pps, bs, dev, 16, **k))
    ref, cache = (ModelCache(llama.cfg, 1, capacity=8, dtype=torch.float32, device="cpu", page_size=8) for _ in "ab")
    prompt = torch.arange(3, 18).view(1, 15)
    for c in (ref, cache):  # positions 0..14 prefilled by the model
        b = c.batch([0], 15)
        llama(prompt, c, b)
        c.advance(b)
    ex = MegakernelExecutor(llama, graphs=False)
    ids, kernels = torch.tensor([[9]]), []
    for _ in range(2):  # position 15; position 16 needs a third page: the table widens to 4 pages
        wb, gb = ref.batch([0], 1), cache.batch([0], 1)
        want, got = llama(ids, ref, wb), ex.forward(ids, cache, gb)
        ref.advance(wb)
        cache.advance(gb)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        ids = want[:, -1:].argmax(-1)
        (mk,) = ex._kernels.values()
        kernels.append(mk)

    def split_tiles(mk):
        return sum(1 for t in mk.schedule.tasks if mk.schedule.ops[t.op].kind == "gqa_attn" and t.stage == 0)

    assert kernels[1] is not kernels[0]
    assert split_tiles(kernels[1]) == 2 * split_tiles(kernels[0]) > 0


def test_a_workspace_grown_by_another_shape_is_refreshed_in_the_kernel(llama, monkeypatch):
    """Kernel workspaces (split-KV partials) are process-wide and grow for a wider step: the kernel of a
    shape recorded before the growth must move to the new workspace (its signature covers the workspaces),
    not keep the freed one's address."""
    import nonstop.kernels.launch as launch

    monkeypatch.setattr(launch, "_WORKSPACES", {})  # start small whatever ran before in this process
    ref, cache = (ModelCache(llama.cfg, 1, capacity=16, dtype=torch.float32, device="cpu", page_size=4) for _ in "ab")
    ex = MegakernelExecutor(llama, graphs=False)
    ids = torch.tensor([[9]])
    for T in (1, 3, 1):  # the 1x3 step needs larger partials than the 1x1 kernel recorded
        wb, gb = ref.batch([0], T), cache.batch([0], T)
        x = torch.cat([ids, torch.arange(5, 4 + T).view(1, T - 1)], 1)
        want, got = llama(x, ref, wb), ex.forward(x, cache, gb)
        ref.advance(wb)
        cache.advance(gb)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        ids = want[:, -1:].argmax(-1)
    mk = ex._kernels[id(ex.static_step(1, 1))]
    scratch = {t.data_ptr() for (name, *_), t in launch._WORKSPACES.items() if name.startswith("gqa_attn.")}
    assert scratch and scratch <= set(mk.plan.ptrs.flatten().tolist())


def test_alignment_hints_only_where_every_instance_is_aligned():
    """``tl.multiple_of(..., 16)`` tells the GPU compiler a value is divisible by 16 (it may vectorise on it):
    the generated source may say so only of pointers whose address, and per-instance integers whose value, is
    a multiple of 16 in every instance of the class. kimi_linear has per-instance integers that are not."""
    import re

    from nonstop.runtime.megakernel.kernel import StepKernel
    from nonstop.runtime.superop import ExecEnv
    from tests.megakernel.kernel_steps import kernel_step

    ks = kernel_step("kimi_linear", B=2, T=1)
    ex = ks.executor
    step = ex.static_step(2, 1)
    mk = StepKernel(ex.program, ks.ops, ex.impl, ExecEnv(step.buf, ks.steps.cache, step.batch), "cpu")
    p = mk.plan
    hinted = set(re.findall(r"(a\d+_\w+) = tl\.multiple_of\(", mk.source))
    tables = {"ptr": p.ptrs, "wptr": p.wptrs, "int": p.ints}
    unaligned = 0
    for k, cls in enumerate(p.classes):
        for param in cls.params:
            if param.kind not in tables or param.uniform or param.name == "USE_PDL":
                continue
            values = tables[param.kind][cls.instances, param.slot]
            aligned = bool((values % 16 == 0).all())
            unaligned += not aligned
            assert (f"a{k}_{param.name}" in hinted) == aligned, (cls.label, param.name, values.tolist())
    assert unaligned  # the case that matters is present
