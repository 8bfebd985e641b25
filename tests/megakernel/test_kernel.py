"""The persistent megakernel (``backend="megakernel"``) under the Triton interpreter: the reference's
greedy tokens on every tiny family (B = 1 prefills of different lengths, then B = 2 decode) and on
the bundled k3-nano, exactly one launch per step, device sampling, counters that only grow across
steps, consecutive steps from the device (``decode_next``) and several steps in one launch
(``decode_steps``), ``forward_hidden``, RoPE heads split over several tiles, a schedule the validator
rejects stops the executor before any launch, and the generated kernel compiles for sm_90.

Every step runs with the step's activation buffers poisoned with NaN right before the launch, so a
task that reads what no earlier task of the step wrote shows up as wrong tokens."""

from __future__ import annotations

import pytest
import torch

from nonstop.runtime.executors import ReferenceExecutor, make_executor
from tests.runtime.helpers import greedy_tokens, tiny_model
from tests.tiny_configs import TINY_CONFIGS

pytest.importorskip("triton")

from nonstop.runtime.megakernel.executor import MegakernelExecutor  # noqa: E402
from nonstop.runtime.megakernel.tasks import ScheduleError  # noqa: E402

PROMPTS = [[3, 4, 5], [7, 8]]  # prefills of 3 and 2 rows (B = 1), then decode steps of B = 2
MAX_TOKENS = [2, 2]
KEEP = {"ids", "sample_temperature", "sample_top_k", "sample_top_p", "sample_seed", "sample_offset"}


class PoisonedMegakernel(MegakernelExecutor):
    """Fills every activation buffer (not the step's inputs) with NaN / -1 before each launch."""

    def _poison(self, env) -> None:
        for name, t in env.buf.items():
            if name not in KEEP:
                t.fill_(float("nan") if t.is_floating_point() else -1)

    def _launch_all(self, env) -> None:
        self._poison(env)
        super()._launch_all(env)

    def _launch_counted(self, env, step) -> dict:
        self._poison(env)
        return super()._launch_counted(env, step)


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_megakernel_gives_the_reference_tokens(name):
    model = tiny_model(name)
    ex = PoisonedMegakernel(model)
    assert greedy_tokens(model, ex, PROMPTS, MAX_TOKENS) == greedy_tokens(
        model, ReferenceExecutor(model), PROMPTS, MAX_TOKENS
    )
    assert ex.stats["program_steps"] == 3 and ex.stats["reference_steps"] == 0
    assert ex.stats["launches_per_step"] == 1
    assert all(c["launches"] == 1 and c["host_syncs"] == 0 for c in ex.stats["launches"].values())
    assert set(ex.stats["schedule"]) == {"1x3", "1x2", "2x1"}
    # the step sampled on the device: greedy next_ids = argmax of the step's logits
    step = ex.static_step(2, 1)
    assert torch.equal(step.buf["next_ids"], step.buf["logits"].argmax(-1))


def test_megakernel_llm_backend_on_k3_nano():
    from nonstop.engine.llm import LLM
    from nonstop.engine.sampling import SamplingParams

    prompts = ["The curses"]  # a prefill and a decode step (B = 2 runs on the tiny configs: the interpreter is slow)
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    want = [o.token_ids for o in LLM("k3-nano", dtype="float32").generate(prompts, params)]
    llm = LLM("k3-nano", dtype="float32", backend="megakernel")
    assert isinstance(llm.executor, MegakernelExecutor)
    assert [o.token_ids for o in llm.generate(prompts, params)] == want
    assert llm.executor.stats["program_steps"] > 0 and llm.executor.stats["launches_per_step"] == 1


def test_counters_grow_across_steps_and_the_queue_ends_each_launch_exactly():
    model = tiny_model("llama")
    ex = make_executor("megakernel", model)
    from nonstop.cache.state import ModelCache

    cache = ModelCache(model.cfg, 1, capacity=16, dtype=torch.float32, device="cpu", page_size=4)
    ids = torch.tensor([[5]])
    for n in range(1, 4):
        batch = cache.batch([0], 1)
        logits = ex.forward(ids, cache, batch)
        cache.advance(batch)
        ids = logits[:, -1].argmax(-1, keepdim=True)
        mk = next(iter(ex._kernels.values()))
        assert mk.ticket.item() == n * mk.num_tasks  # programs gave back the tickets they took past the end
        assert mk.state.tolist() == [n, 0]  # next step, programs exited (reset by the last one)
        per_step = torch.tensor([c.per_step for c in mk.schedule.counters])
        assert torch.equal(mk.counters, n * per_step)  # never reset: targets are epoch-based
        assert torch.equal(ex.next_ids(1).view(-1), ids.view(-1))


def test_a_rejected_schedule_stops_before_the_launch(monkeypatch):
    import nonstop.runtime.megakernel.kernel as kernel_module

    def reject(schedule):
        raise ScheduleError("#3 L0.o_proj/main[cols 0:32]: reads attn_out before its producer's counter")

    monkeypatch.setattr(kernel_module, "validate", reject)
    model = tiny_model("llama")
    ex = MegakernelExecutor(model)
    launched = []
    monkeypatch.setattr(kernel_module.StepKernel, "launch", lambda self, *a: launched.append(1))
    with pytest.raises(ScheduleError, match="megakernel schedule for 1x2 rows rejected.*reads attn_out"):
        greedy_tokens(model, ex, [[3, 4]], [1])
    assert not launched


@pytest.mark.parametrize("name", ["deepseek_v3"])
def test_consecutive_decode_steps_need_only_the_launch(name):
    """``decode_next``: the previous launch left its sampled tokens in ``ids`` and the next positions in
    ``start``; the host reserves pages and launches - the reference's greedy tokens for B = 2; then
    ``decode_steps``: two steps in one launch."""
    from nonstop.cache.state import ModelCache

    model = tiny_model(name)
    prompts = torch.tensor([[3, 4, 5], [9, 10, 11]])

    def prefill():
        cache = ModelCache(model.cfg, 2, capacity=16, dtype=torch.float32, device="cpu", page_size=4)
        batch = cache.batch([0, 1], 3)
        logits = model(prompts, cache, batch)
        cache.advance(batch)
        return cache, logits[:, -1:].argmax(-1)

    cache, ids = prefill()
    want = []
    for _ in range(4):
        batch = cache.batch([0, 1], 1)
        ids = model(ids, cache, batch)[:, -1:].argmax(-1)
        cache.advance(batch)
        want.append(ids)

    cache, ids = prefill()
    ex = MegakernelExecutor(model)
    batch = cache.batch([0, 1], 1)
    got = [ex.forward(ids, cache, batch)[:, -1:].argmax(-1)]  # host inputs once
    cache.advance(batch)
    batch = cache.batch([0, 1], 1)
    got.append(ex.decode_next(cache, batch).clone())
    cache.advance(batch)
    got.append(ex.decode_steps(cache, [0, 1], 2))  # two steps in one launch (persistent schedule)
    assert torch.equal(torch.cat(got, 1), torch.cat(want, 1))
    assert ex.stats["launches_per_step"] == 1 and ex.stats["launches_per_multi_step"] == 1
    mk = next(iter(ex._kernels.values()))
    assert mk.state[0].item() == 4 and mk.ticket.item() == 4 * mk.num_tasks


def test_heads_split_into_several_rope_tiles(monkeypatch):
    """gqa_qkv_rope tiles of BLOCK_P RoPE pairs (several per head, as on a GPU for head_dim 64+): the
    schedule tiles them the same way, the validator accepts it, tokens stay the reference's."""
    import nonstop.kernels.gqa as gqa

    monkeypatch.setattr(gqa, "PAIRS_PER_TILE", 2)  # head_dim 10: 5 pairs -> 3 tiles per head
    model = tiny_model("llama")
    ex = PoisonedMegakernel(model)
    assert greedy_tokens(model, ex, [[3, 4, 5]], [2]) == greedy_tokens(
        model, ReferenceExecutor(model), [[3, 4, 5]], [2]
    )
    assert ex.stats["schedule"]["1x3"]["kinds"]["gqa_qkv_rope"]["tasks"] == model.cfg.num_hidden_layers * 7 * 3


def test_generated_kernel_compiles_for_sm90(tmp_path):
    """The interpreter runs any Python; Triton's compiler is stricter (types merged across branches,
    pointer casts). The megakernel of an odd-shaped bf16 DeepSeek-V3 (MLA, grouped routing, shared experts)
    lowered for sm_90a as it launches (``nonstop gpucheck``'s path): it compiles, fits a CTA on an SM, does
    not spill, and every spin-wait acquires (its odd widths may not allow 16-byte weight loads)."""
    import json

    import triton.backends

    if "nvidia" not in triton.backends.backends:
        pytest.skip("triton has no NVIDIA backend here")
    from nonstop.runtime import gpucheck
    from tests.tiny_configs import DEEPSEEK

    (tmp_path / "config.json").write_text(json.dumps({**DEEPSEEK, "torch_dtype": "bfloat16"}))
    result = gpucheck.run_check([("tiny-deepseek", str(tmp_path), None)], kinds=[], megakernel=True, timeout=900)
    (mk,) = result["rows"]
    assert mk["kernel"].startswith("megakernel") and mk["registers"] <= 255 and mk["spill_bytes"] == 0
    assert mk["ctas_per_sm"] >= 1 and mk["spins"] >= 1
    assert not [v for v in mk["violations"] if "loads" not in v], mk["violations"]


def test_forward_hidden_reads_the_kept_residual_streams():
    """``forward_hidden`` (a drafter's taps) through the megakernel equals the reference's."""
    from nonstop.cache.state import ModelCache
    from nonstop.program.taps import available_taps

    model = tiny_model("kimi_k3")
    taps = available_taps(model.cfg)
    results = []
    for ex in (ReferenceExecutor(model), MegakernelExecutor(model)):
        cache = ModelCache(model.cfg, 1, capacity=16, dtype=torch.float32, device="cpu", page_size=4)
        batch = cache.batch([0], 1)
        results.append(ex.forward_hidden(torch.tensor([[5]]), cache, batch, taps))
    (ref_logits, ref_taps), (logits, got_taps) = results
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    for tap in taps:
        torch.testing.assert_close(got_taps[tap], ref_taps[tap], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["kimi_k3", "llama"])
def test_kernel_schedule_survives_adversarial_interleavings(name):
    """The interpreter runs the programs one after another; on a GPU they race. The schedule the kernel
    runs (persistent: steps back to back) goes through the protocol simulator's hazard hunt: stalled
    tickets, slow workers, out-of-order bias, with the shadow race detector."""
    from nonstop.cache.state import ModelCache
    from nonstop.runtime.cuda_graph import fit_pools
    from nonstop.runtime.megakernel.verify.simulate import hunt
    from nonstop.runtime.superop import ExecEnv

    model = tiny_model(name)
    ex = MegakernelExecutor(model, graphs=False)
    cache = ModelCache(model.cfg, 2, capacity=16, dtype=torch.float32, device="cpu", page_size=4)
    cache.batch([0, 1], 1)
    step = ex.static_step(2, 1)
    fit_pools(cache)
    s = ex.step_kernel(ExecEnv(step.buf, cache, step.batch)).schedule
    assert s.persistent
    found = hunt(s, steps=2, workers=16, tickets=range(0, 2 * s.num_tasks, 3), seeds=3)
    assert found is None, found.summary()


def test_cuda_graph_logic_replays_the_one_launch(monkeypatch):
    """The base class's CUDA-graph path (emulated on a CPU: capture records, replay re-runs): the
    megakernel step is captured once per shape and replayed, tokens unchanged (one decode step a launch:
    the engine's launches of several steps run eagerly)."""
    from nonstop.engine import device_decode

    monkeypatch.setattr(device_decode, "STEPS_PER_LAUNCH", 1)
    model = tiny_model("llama")
    ex = MegakernelExecutor(model, graphs="emulate")
    assert greedy_tokens(model, ex, [[3, 4], [5]], [3, 3]) == greedy_tokens(
        model, ReferenceExecutor(model), [[3, 4], [5]], [3, 3]
    )
    assert ex.stats["graph_captures"] >= 3 and ex.stats["graph_replays"] >= 1 and ex.stats["launches_per_step"] == 1


def test_speculative_verification_through_the_megakernel():
    """keep_states steps (T = k + 1 rows, KDA histories for rollback): drafts with one right token,
    verified by the megakernel, give plain greedy decoding's tokens."""
    from nonstop.engine.sampling import SamplingParams
    from tests.speculative.helpers import ScriptedDrafter, generate

    model = tiny_model("kimi_linear")
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    want = generate(model, ReferenceExecutor(model), [[3, 4, 5]], params)
    ex = MegakernelExecutor(model)
    got = generate(
        model, ex, [[3, 4, 5]], params, ScriptedDrafter({"0": want[0].token_ids}, 1, model.cfg.vocab_size), num_tokens=2
    )
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert got[0].metrics["accepted_tokens"] > 0 and any("+states" in shape for shape in ex.stats["launches"])


def test_a_kind_without_kernel_is_a_clear_error():
    from nonstop.kernels import KERNELS

    model = tiny_model("llama")
    table = {k: v for k, v in KERNELS.items() if k != "mlp"}
    with pytest.raises(ValueError, match="backend 'megakernel' has no Triton kernel yet for: mlp"):
        MegakernelExecutor(model, kernels=table)


def test_grid_fills_the_sms_or_refuses_a_kernel_that_cannot_be_co_resident():
    """``persistent_grid`` on a made-up device of 3 SMs with a quarter of an H100's registers and 48 KiB of
    shared memory: as many CTAs as fit on every SM, and a clear error (not a launch that would hang waiting
    for programs that never run) when the registers or the shared memory of one CTA exceed an SM's."""
    from dataclasses import replace

    from nonstop.kernels import platform
    from nonstop.runtime.megakernel.kernel import persistent_grid

    tiny = replace(platform.H100, name="tiny GPU", sms=3, regs_per_sm=16384, smem_per_sm=49152, smem_per_block=49152)
    assert persistent_grid(tiny, 32, 1024, 4) == 3 * 4  # 32 registers x 128 threads: 4 CTAs of 4 warps an SM
    assert persistent_grid(tiny, 64, 1024, 8) == 3  # one CTA of 8 warps an SM
    assert persistent_grid(tiny, 32, 20_000, 4) == 3 * 2  # two CTAs' shared memory an SM
    for registers, shared, warps, what in [(96, 0, 8, "96 registers x 256 threads"), (32, 60_000, 4, "60000 bytes")]:
        with pytest.raises(RuntimeError, match=f"cannot run on tiny GPU: .*{what}"):
            persistent_grid(tiny, registers, shared, warps)
    assert persistent_grid(platform.H100, 255, 49152, 8) == 132  # the K3 megakernel's: one CTA an SM
