"""Gaps a mutation audit of the runtime glue found: the superop executor's PDL switch and its CUDA-graph
fallbacks (a capture that fails: PDL off first, then the shape runs eagerly), which eager steps settle the
launch count, the static step of a speculative (keep_states) shape, PDL support decided from the device's
compute capability (stubbed: no GPU needed), the device sampler's row checks and seeds from a generator."""

from __future__ import annotations

import warnings

import pytest
import torch

from nonstop.cache.state import ModelCache
from nonstop.engine.sampling import SamplingParams
from nonstop.runtime import cuda_graph
from nonstop.runtime import superop as superop_module
from nonstop.runtime.cuda_graph import PDL_ENV, CapturedStep
from nonstop.runtime.device_sampling import SampleRow
from nonstop.runtime.superop import SuperOpExecutor
from tests.runtime.helpers import tiny_model


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def _kinds(model) -> set[str]:
    return {op.kind for op in SuperOpExecutor(model, use_kernels=False).program.ops}


def _torch_table(model, extra_on_call: int | None = None, sync: bool = False) -> dict:
    """A kernel table of plain torch launches: each op zeroes its first output (one launch); the ``embed``
    launch also runs one more operator on its ``extra_on_call``-th call only (one-time work) and, with
    ``sync``, reads a value on the host (one host sync)."""
    calls = {"embed": 0}

    def launch(op, env):
        env.buf[op.writes[0]].zero_()
        if op.kind == "embed":
            calls["embed"] += 1
            if calls["embed"] == extra_on_call:
                env.buf[op.writes[0]].add_(0.0)
            if sync:
                int(env.batch.start[0])

    return {kind: launch for kind in _kinds(model)}


def _step(ex, model, cache, B=1):
    batch = cache.batch(list(range(B)), 1)
    out = ex.forward(torch.full((B, 1), 3), cache, batch)
    cache.advance(batch)
    return out


# ----------------------------------------------------------------------------- PDL switch


@pytest.mark.parametrize(
    "pdl,on,reason", [("auto", True, "on: sm_90"), (True, True, "on: sm_90"), (False, False, "off: off")]
)
def test_the_pdl_argument_decides_on_a_device_that_supports_it(llama, monkeypatch, pdl, on, reason):
    """Where PDL is supported (stubbed), pdl=False still turns it off, and stats say why."""
    monkeypatch.setattr(superop_module, "pdl_support", lambda device: (True, "sm_90"))
    ex = SuperOpExecutor(llama, kernels=_torch_table(llama), graphs=False, pdl=pdl)
    assert ex.pdl is on and ex.stats["pdl"] == reason
    env = superop_module.ExecEnv({}, None, None, pdl=ex.pdl)
    assert env.launch_kwargs == ({"launch_pdl": True} if on else {})


def test_the_twins_never_use_pdl_even_where_supported(llama, monkeypatch):
    monkeypatch.setattr(superop_module, "pdl_support", lambda device: (True, "sm_90"))
    ex = SuperOpExecutor(llama, use_kernels=False, pdl=True)
    assert ex.pdl is False and ex.stats["pdl"] == "off: twins"


@pytest.mark.parametrize(
    "capability,env,usable,phrase",
    [((9, 0), None, True, "sm_90"), ((8, 9), None, False, "compute capability 8.9"), ((9, 0), "0", False, "=0")],
)
def test_pdl_support_follows_the_compute_capability(monkeypatch, capability, env, usable, phrase):
    """sm_90+ with a Triton that has launch_pdl (this one: 3.4+); sm_89 not; NONSTOP_PDL=0 turns it off."""
    pytest.importorskip("triton")
    monkeypatch.setattr(cuda_graph, "interpreting", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    if env is None:
        monkeypatch.delenv(PDL_ENV, raising=False)
    else:
        monkeypatch.setenv(PDL_ENV, env)
    got, why = cuda_graph.pdl_support("cuda")
    assert got is usable and phrase in why


# ----------------------------------------------------------------------------- CUDA-graph fallbacks


def test_a_failed_capture_turns_pdl_off_first_then_runs_the_shape_eagerly(llama, monkeypatch):
    """The first failure retries without PDL (the graph stays on); the second turns the shape's graph off for
    good: no more capture attempts, every step eager, the logits those of the reference."""
    attempts = []

    def failing_capture(self, fn, signature):
        attempts.append(1)
        self.release()
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(CapturedStep, "capture", failing_capture)
    ex = SuperOpExecutor(llama, use_kernels=False, graphs="emulate")
    ex.pdl = True  # as on a Hopper GPU
    cache, ref_cache = ModelCache(llama.cfg, 1, capacity=8), ModelCache(llama.cfg, 1, capacity=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            got = _step(ex, llama, cache)
            batch = ref_cache.batch([0], 1)
            want = llama(torch.full((1, 1), 3), ref_cache, batch)
            ref_cache.advance(batch)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            if i == 0:
                assert ex.pdl is False and ex.stats["pdl"].startswith("off: capture failed: RuntimeError")
                assert ex.static_step(1, 1).graph_off is None and ex.stats["graphs"].startswith("emulated")
    assert len(attempts) == 2
    assert ex.static_step(1, 1).graph_off.startswith("capture failed")
    assert ex.stats["graphs"].startswith("off for 1x1: capture failed")
    assert ex.stats["graph_captures"] == 0 and ex.stats["graph_replays"] == 0 and ex.stats["eager_steps"] == 4
    assert sum("CUDA graph capture failed" in str(w.message) for w in caught) == 2


def test_a_speculative_shape_has_its_own_static_step(llama):
    """Verification steps (keep_states) of a B x T shape a decode step also has get their own buffers and a
    batch that keeps states: a graph captured for one must not replay the other."""
    ex = SuperOpExecutor(llama, use_kernels=False, graphs="emulate")
    plain = ex.static_step(1, 2)
    spec = ex.static_step(1, 2, keep_states=True)
    assert spec is not plain and spec.batch.keep_states and not plain.batch.keep_states
    assert spec.name == "1x2+states" and plain.name == "1x2"


# ----------------------------------------------------------------------------- launch counts


@pytest.mark.parametrize("extra_on_call", [1, 2])
def test_the_launch_count_leaves_out_one_time_work(llama, extra_on_call):
    """Eager steps of a shape are counted until two counts agree: an operator run once (on the first or the
    second step) is not part of launches_per_step (one launch per op)."""
    ex = SuperOpExecutor(llama, kernels=_torch_table(llama, extra_on_call), graphs=False)
    cache = ModelCache(llama.cfg, 1, capacity=8)
    for _ in range(4):
        _step(ex, llama, cache)
    assert ex.stats["launches_per_step"] == len(ex.program.ops)


def test_stats_publish_the_host_syncs_of_a_step(llama):
    """One host read per step (in the one embed op): host_syncs_per_step is 1, attributed to embed."""
    ex = SuperOpExecutor(llama, kernels=_torch_table(llama, sync=True), graphs=False)
    cache = ModelCache(llama.cfg, 1, capacity=8)
    _step(ex, llama, cache)
    assert ex.stats["host_syncs_per_step"] == 1 and ex.stats["pdl_launches_per_step"] == 0
    assert ex.stats["launches"]["1x1"]["host_syncs_by_kind"] == {"embed": 1}


# ----------------------------------------------------------------------------- device sampling


def test_sample_tokens_takes_one_sampling_row_per_sequence(llama):
    """Two rows for one sequence is an error before anything runs (nothing reserved or advanced)."""
    ex = SuperOpExecutor(llama, graphs=False)
    cache = ModelCache(llama.cfg, 1, capacity=8)
    with pytest.raises(ValueError, match="1 sampling rows"):
        ex.sample_tokens(torch.tensor([[5]]), cache, [0], 1, [SampleRow(), SampleRow()])
    assert int(cache.lengths[0]) == 0 and "sampling_calls" not in ex.stats


def test_sample_rows_limit_is_max_rows_inclusive(llama):
    ex = SuperOpExecutor(llama, use_kernels=False)
    ex.check_sample_rows(ex.max_rows)  # exactly max_rows sequences: one call
    with pytest.raises(ValueError, match=f"at most max_rows = {ex.max_rows} sequences a call, got {ex.max_rows + 1}"):
        ex.check_sample_rows(ex.max_rows + 1)


def test_unseeded_rows_drawn_from_a_generator_are_reproducible():
    """A request without a seed takes its key from the given generator: the same generator state gives the
    same key, another state another key (a key from the process's random state would ignore it)."""
    params = SamplingParams(temperature=1.0)

    def key(seed: int) -> int:
        return SampleRow.of(params, torch.Generator().manual_seed(seed)).seed

    assert key(11) == key(11) and key(12) == key(12)
    assert len({key(s) for s in range(8)}) == 8
    assert all(0 <= key(s) < 2**63 for s in range(8))


def test_hidden_states_of_exactly_max_rows_rows_come_from_the_program(llama):
    """``forward_hidden`` follows ``forward``'s rule: max_rows rows run the program, one more the reference;
    both give the reference model's logits and final residual stream."""
    ex = SuperOpExecutor(llama, use_kernels=False)
    L, R = llama.cfg.num_hidden_layers, ex.max_rows
    for rows, counter in ((R, "program_steps"), (R + 1, "reference_steps")):
        cache, ref_cache = ModelCache(llama.cfg, 1, capacity=2 * R + 2), ModelCache(llama.cfg, 1, capacity=2 * R + 2)
        ids = torch.arange(rows).view(1, rows) % llama.cfg.vocab_size
        before = dict(ex.stats)
        logits, taps = ex.forward_hidden(ids, cache, cache.batch([0], rows), (L,))
        want_logits, want_taps = llama.forward_hidden(ids, ref_cache, ref_cache.batch([0], rows), (L,))
        assert ex.stats[counter] == before[counter] + 1
        torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(taps[L], want_taps[L], rtol=1e-5, atol=1e-5)
