"""The superop executor's machinery, independent of the kernels: static buffers per step shape, exact
launch counting (Triton launches under the interpreter + torch operators), host-sync detection,
capture / replay / re-capture when the cache storage moves (emulated on a CPU, real on a GPU), PDL
switches, and the clear error while kernels are missing."""

from __future__ import annotations

import copy

import pytest
import torch

from nonstop.cache.state import ModelCache
from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from nonstop.program.reference import REFERENCE
from nonstop.runtime.cuda_graph import fit_pools, pdl_support, storage_signature
from nonstop.runtime.executors import ReferenceExecutor
from nonstop.runtime.superop import ExecEnv, SuperOpExecutor
from tests.runtime.helpers import greedy_tokens, skip_unless_kernels, tiny_model
from tests.tiny_configs import TINY_CONFIGS

triton = pytest.importorskip("triton")
tl = triton.language


@triton.jit
def _touch_kernel(x_ptr, n, BLOCK: tl.constexpr):
    """x[i] += 0 for i < n: a real launch that changes nothing."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 0, mask=mask)


def _fake_table(triton_launches: dict[str, int], torch_ops: int = 1, sync_kind: str | None = None) -> dict:
    """A kernel table whose launch for kind k makes triton_launches[k] Triton launches (plus one with an
    empty grid, which is no launch) and ``torch_ops`` torch operators (zero_ of its first output)."""

    def make(kind):
        def launch(op, env):
            out = env.buf[op.writes[0]]
            for _ in range(torch_ops):
                out.zero_()
            flat = env.buf["ids"]
            for _ in range(triton_launches[kind]):
                _touch_kernel[(1,)](flat, flat.numel(), BLOCK=16, **env.launch_kwargs)
            _touch_kernel[(0,)](flat, flat.numel(), BLOCK=16)
            if kind == sync_kind:
                int(env.batch.start.max())

        return launch

    return {kind: make(kind) for kind in triton_launches}


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def _decode_once(ex, model, B=2, T=1, cache=None):
    cfg = model.cfg
    cache = cache or ModelCache(cfg, B, capacity=8)
    batch = cache.batch(list(range(B)), T)
    out = ex.forward(torch.arange(B * T).view(B, T) % cfg.vocab_size, cache, batch)
    cache.advance(batch)
    return out, cache


def test_missing_kernels_raise_a_clear_error(llama):
    with pytest.raises(ValueError, match="no Triton kernel yet for: .*embed.*gqa_attn"):
        SuperOpExecutor(llama, kernels={})


def test_a_kda_conv_window_the_kernel_cannot_hold_is_refused_before_any_step():
    """short_conv_kernel_size 1 parses and runs on the torch backends, but kda_in_proj keeps a window of
    K-1 >= 1 tokens: the superop executor (and the megakernel, built on it) refuses the model up front with
    the reason, instead of an assertion in the first launch."""
    raw = copy.deepcopy(TINY_CONFIGS["kimi_linear"])
    raw.setdefault("linear_attn_config", {})["short_conv_kernel_size"] = 1
    model = random_model(ModelConfig.from_hf_dict(raw), torch.float32, seed=3)
    with pytest.raises(ValueError, match=r"kda_in_proj with short_conv_kernel_size 1 .*'reference' and 'cpu'"):
        SuperOpExecutor(model)
    tokens = greedy_tokens(model, ReferenceExecutor(model), max_tokens=[2, 2, 2])  # the torch path runs it
    assert [len(t) for t in tokens] == [2, 2, 2]
    SuperOpExecutor(tiny_model("kimi_linear"))  # the usual window of 4 is accepted


def test_static_buffers_are_allocated_once_per_shape(llama, monkeypatch):
    ex = SuperOpExecutor(llama, use_kernels=False)
    calls = []
    allocate = ex.program.allocate
    monkeypatch.setattr(ex.program, "allocate", lambda rows, device: calls.append(rows) or allocate(rows, device))
    _, cache = _decode_once(ex, llama)
    first = {k: v.data_ptr() for k, v in ex.static_step(2, 1).buf.items()}
    _decode_once(ex, llama, cache=cache)
    _decode_once(ex, llama, cache=cache)
    assert calls == [2]
    assert {k: v.data_ptr() for k, v in ex.static_step(2, 1).buf.items()} == first
    _decode_once(ex, llama, B=1, T=3)
    assert calls == [2, 3]


def test_launches_are_counted_exactly(llama):
    program_kinds = {op.kind for op in SuperOpExecutor(llama, use_kernels=False).program.ops}
    per_kind = {kind: 1 + i % 2 for i, kind in enumerate(sorted(program_kinds))}  # 1 or 2 launches
    ex = SuperOpExecutor(llama, kernels=_fake_table(per_kind, torch_ops=1))
    _decode_once(ex, llama)
    expected = sum(per_kind[op.kind] + 1 for op in ex.program.ops)
    assert ex.stats["launches_per_step"] == expected
    counted = ex.stats["launches"]["2x1"]
    assert counted["triton"] == sum(per_kind[op.kind] for op in ex.program.ops)
    assert counted["torch"] == len(ex.program.ops)
    assert counted["host_syncs"] == 0 and ex.stats["pdl_launches_per_step"] == 0
    assert sum(counted["by_kind"].values()) == expected


def test_twin_steps_count_their_torch_operators(llama):
    ex = SuperOpExecutor(llama, use_kernels=False)
    _decode_once(ex, llama)
    counted = ex.stats["launches"]["2x1"]
    assert counted["triton"] == 0 and counted["torch"] == ex.stats["launches_per_step"] > len(ex.program.ops)
    assert counted["host_syncs"] > 0  # the twins reserve pages on the host: not capturable


def test_host_syncs_are_attributed_to_their_op_kind(llama):
    kinds = {op.kind: 1 for op in SuperOpExecutor(llama, use_kernels=False).program.ops}
    ex = SuperOpExecutor(llama, kernels=_fake_table(kinds, sync_kind="gqa_attn"))
    _decode_once(ex, llama)
    syncs = ex.stats["launches"]["2x1"]["host_syncs_by_kind"]
    assert set(syncs) == {"gqa_attn"} and syncs["gqa_attn"] == llama.cfg.num_hidden_layers


def test_long_steps_and_scoring_go_to_the_reference(llama):
    ex = SuperOpExecutor(llama, use_kernels=False)
    cache = ModelCache(llama.cfg, 1, capacity=32)
    batch = cache.batch([0], 17)
    ex.forward(torch.zeros(1, 17, dtype=torch.long), cache, batch)
    ex.forward(torch.zeros(1, 5, dtype=torch.long), None, None)
    assert ex.stats["reference_steps"] == 2 and ex.stats["program_steps"] == 0


def test_returned_logits_survive_the_next_step(llama):
    ex = SuperOpExecutor(llama, use_kernels=False)
    first, cache = _decode_once(ex, llama)
    kept = first.clone()
    _decode_once(ex, llama, cache=cache)
    torch.testing.assert_close(first, kept, rtol=0, atol=0)


def test_storage_signature_follows_pool_reallocation(llama):
    cache = ModelCache(llama.cfg, 2, capacity=4, page_size=4)
    fit_pools(cache)
    sig = storage_signature(cache)
    cache.batch([0], 3)  # within the slot's first page: table contents change in place
    fit_pools(cache)
    assert storage_signature(cache) == sig
    cache.batch([0], 9)  # more pages than the table is wide and than the pool holds
    assert storage_signature(cache) != sig
    fit_pools(cache)
    assert storage_signature(cache) != sig


@pytest.mark.parametrize("name", ["llama", "kimi_k3"])
def test_emulated_graph_replay_gives_the_reference_tokens(name):
    """Capture / replay / re-capture logic with the twins: replay re-runs the captured launches on the
    static batch tensors, so stale slots/starts or a missed re-capture would change the tokens."""
    model = tiny_model(name)
    ex = SuperOpExecutor(model, use_kernels=False, graphs="emulate")
    assert greedy_tokens(model, ex) == greedy_tokens(model, ReferenceExecutor(model))
    assert ex.stats["graph_replays"] > 0
    assert ex.stats["graph_captures"] >= len(ex._steps)  # at least one capture per step shape


def test_emulated_replay_recaptures_when_the_pool_grows(llama):
    ex = SuperOpExecutor(llama, use_kernels=False, graphs="emulate")
    ref_cache, cache = (
        ModelCache(llama.cfg, 1, capacity=2, page_size=2),
        ModelCache(llama.cfg, 1, capacity=2, page_size=2),
    )
    ids = torch.tensor([[5]])
    for _ in range(7):
        want_batch, got_batch = ref_cache.batch([0], 1), cache.batch([0], 1)
        want = llama(ids, ref_cache, want_batch)
        got = ex.forward(ids, cache, got_batch)
        ref_cache.advance(want_batch)
        cache.advance(got_batch)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        ids = want[:, -1].argmax(-1, keepdim=True)
    assert ex.stats["graph_replays"] >= 1 and ex.stats["graph_captures"] >= 3


def test_pdl_is_off_without_a_hopper_gpu(llama):
    ex = SuperOpExecutor(llama, use_kernels=False)
    assert not ex.pdl and ex.stats["pdl"].startswith("off")
    if not torch.cuda.is_available():
        assert pdl_support("cpu")[0] is False
    env = ExecEnv({}, None, None)
    assert env.launch_kwargs == {} and ExecEnv({}, None, None, pdl=True).launch_kwargs == {"launch_pdl": True}


def test_twins_are_never_captured_by_default(llama):
    assert SuperOpExecutor(llama, use_kernels=False).graphs is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["llama", "kimi_k3"])
def test_cuda_graph_replay_gives_the_reference_tokens(name):
    model = tiny_model(name).cuda()
    skip_unless_kernels(model)
    ex = SuperOpExecutor(model)
    assert ex.graphs
    assert greedy_tokens(model, ex) == greedy_tokens(model, ReferenceExecutor(model))
    assert ex.stats["graph_replays"] > 0 and ex.stats["host_syncs_per_step"] == 0


def test_reference_table_covers_every_kind(llama):
    assert {op.kind for op in SuperOpExecutor(llama, use_kernels=False).program.ops} <= set(REFERENCE)


@triton.jit
def _pdl_producer(x_ptr, n, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    """x = x + 1, then let the dependent grid launch."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _pdl_consumer(x_ptr, y_ptr, n, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    """y = 2 x, after the producer's writes are visible."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, 2 * tl.load(x_ptr + offs, mask=mask), mask=mask)


@pytest.mark.skipif(
    not (torch.cuda.is_available() and pdl_support("cuda")[0]),
    reason="needs a GPU with programmatic dependent launch (sm_90+)",
)
def test_pdl_launches_in_a_captured_graph_keep_their_order():
    """The PDL pattern the kernel modules may use (wait before touching a predecessor's data), eagerly
    and captured in a CUDA graph: the dependent kernel sees its producer's writes."""
    from nonstop.runtime.cuda_graph import CapturedStep

    n, block = 1 << 20, 1024
    x = torch.zeros(n, device="cuda")
    y = torch.empty_like(x)
    grid = (triton.cdiv(n, block),)

    def step():
        _pdl_producer[grid](x, n, BLOCK=block, USE_PDL=True, launch_pdl=True)
        _pdl_consumer[grid](x, y, n, BLOCK=block, USE_PDL=True, launch_pdl=True)

    step()
    torch.cuda.synchronize()
    assert bool((y == 2).all())
    graph = CapturedStep(torch.cuda.graph_pool_handle())
    graph.capture(step, ())
    for i in range(2, 5):
        graph.replay()
        torch.cuda.synchronize()
        assert bool((y == 2 * i).all()), i
