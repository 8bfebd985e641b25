"""Pipeline stages and decode context parallelism checked against hand arithmetic from Kimi K2's config:
the bytes a TP8 rank streams for one token through every stage at a micro-batch's rows, the step a
pipeline's token takes, the fullest stage's cache, and DCP's split cache reads and its query all-gather /
partial-output reduce-scatter."""

from __future__ import annotations

import math

import pytest

from nonstop.plan.chips import get_chip
from nonstop.plan.layout import Layout
from nonstop.plan.predict import predict
from nonstop.plan.timing import Constants
from nonstop.plan.validation import _workload

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
FP8, BF16 = 1, 2


@pytest.fixture(scope="module")
def kimi_k2():
    return _workload("kimi-k2")


def _hand_tp_rank_weight_bytes(cfg, tp: int, rows: int) -> float:
    """Bytes one rank of a TP group streams for one token of ``rows`` sequences through all layers, as
    vLLM / SGLang shard K2 (fp8 weights, bf16 router and LM head): the latent down-projections q_a and
    kv_a and the router are whole on every rank; q_b, kv_b, o_proj, the dense MLP, the shared expert, each
    routed expert touched and the LM head are split tp ways. Experts touched by ``rows`` independent
    top-k draws: E·(1 − (1 − k/E)^rows). Norms and block scales (< 0.1%) are left out."""
    m, moe, d = cfg.mla, cfg.moe, cfg.hidden_size
    q_a = d * m.q_lora_rank
    kv_a = d * (m.kv_lora_rank + m.qk_rope_head_dim)
    q_b = m.q_lora_rank * m.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
    kv_b = m.kv_lora_rank * m.num_heads * (m.qk_nope_head_dim + m.v_head_dim)
    o = m.num_heads * m.v_head_dim * d
    attention = FP8 * (q_a + kv_a + (q_b + kv_b + o) / tp)
    expert = 3 * d * moe.intermediate_size
    touched = moe.num_experts * (1 - (1 - moe.top_k / moe.num_experts) ** rows)
    moe_layer = BF16 * moe.num_experts * d + FP8 * expert * (moe.num_shared_experts + touched) / tp
    dense_layer = FP8 * 3 * d * cfg.intermediate_size / tp
    layers, dense = cfg.num_hidden_layers, 1  # first_k_dense_replace: 1
    lm_head = BF16 * cfg.vocab_size * d / tp
    return layers * attention + (layers - dense) * moe_layer + dense * dense_layer + lm_head


# ----------------------------------------------------------------------------- pipeline stages


@pytest.mark.parametrize(
    "pp, batch, rows",
    [
        (1, 2, 2),
        (2, 1, 1),  # one sequence: one micro-batch
        (2, 4, 2),  # two micro-batches of 2 in flight
        (2, 3, 2),  # ceil(3 / 2)
        (4, 8, 2),
        (4, 3, 1),  # three micro-batches of 1
    ],
)
def test_a_pipelined_token_streams_every_stage_at_its_micro_batch_rows(kimi_k2, pp, batch, rows):
    """With pp stages up to pp micro-batches are in flight: a token passes every stage once, at its
    micro-batch's ceil(batch / min(pp, batch)) rows, so its rank-bytes are the whole model's at those rows."""
    chip, consts = get_chip("h200"), Constants.load()
    p = predict(kimi_k2, chip, Layout(8, pp=pp), batch=batch, context=128)
    streamed = p.time.weights_ms * 1e-3 * chip.hbm_gbps * 1e9 * consts.eta_hbm
    assert streamed == pytest.approx(_hand_tp_rank_weight_bytes(kimi_k2.cfg, 8, rows), rel=2e-3)


def test_a_pipelined_step_serves_every_micro_batch(kimi_k2):
    """TP8 PP2, 4 sequences: per user one token a step, and the deployment batch / step tokens a second."""
    p = predict(kimi_k2, get_chip("h200"), Layout(8, pp=2), batch=4, context=128)
    assert p.ms_per_token == pytest.approx(p.time.total_ms)
    assert p.tokens_per_s_total == pytest.approx(4 / (p.time.total_ms * 1e-3))


def test_the_fullest_stage_holds_the_cache_of_its_layers(kimi_k2):
    """61 layers over 2 stages: the fullest holds 31, each a bf16 latent of kv_lora + rope per token (whole
    on every TP rank: MLA's cache is not split by heads)."""
    m = kimi_k2.cfg.mla
    batch, context = 4, 4096
    p = predict(kimi_k2, get_chip("h200"), Layout(8, pp=2), batch=batch, context=context)
    per_token = BF16 * (m.kv_lora_rank + m.qk_rope_head_dim)
    assert p.resident["cache"] == pytest.approx(math.ceil(61 / 2) * batch * context * per_token, rel=1e-6)


def test_the_pipeline_send_crosses_nodes_at_the_stage_boundary(kimi_k2):
    """TP8 PP2 on 8-GPU H200 nodes: stage 0 is node 0, stage 1 node 1; one send of the micro-batch's rows
    of bf16 hidden states per step, over the scale-out network."""
    p = predict(kimi_k2, get_chip("h200"), Layout(8, pp=2), batch=4, context=128)
    sends = [c for c in p.time.collectives if c.kind == "send"]
    assert len(sends) == 1 and sends[0].count == 1 and sends[0].crosses_scale_out
    assert sends[0].wire_bytes == 2 * kimi_k2.cfg.hidden_size * BF16


# ----------------------------------------------------------------------------- decode context parallelism


@pytest.mark.parametrize("dcp", [1, 2, 4, 8])
def test_decode_context_parallel_splits_the_cache_reads(kimi_k2, dcp):
    """TP8 DCPd: a rank reads 1/d of each sequence's cached latents (61 layers, (512 + 64) bf16 a token);
    what a step reads besides the cache (activations) does not depend on the context."""
    chip, consts = get_chip("h200"), Constants.load()
    m, batch, context = kimi_k2.cfg.mla, 8, 65536
    bps = chip.hbm_gbps * 1e9 * consts.eta_hbm

    def state_bytes(ctx):
        return predict(kimi_k2, chip, Layout(8, dcp=dcp), batch=batch, context=ctx).time.state_ms * 1e-3 * bps

    cache = 61 * BF16 * (m.kv_lora_rank + m.qk_rope_head_dim) * context * batch / dcp
    assert state_bytes(context) - state_bytes(0) == pytest.approx(cache, rel=1e-6)


@pytest.mark.parametrize("dcp", [2, 4, 8])
def test_decode_context_parallel_exchanges_queries_and_partial_outputs(kimi_k2, dcp):
    """Per MLA layer a rank of TP8 holds 64 / 8 heads. DCPd all-gathers the group's absorbed queries
    (kv_lora + rope bf16 per head): it sends its own (d − 1) times in a ring; then reduce-scatters the
    partial outputs over the d·8 heads (a kv_lora bf16 latent plus an fp32 log-sum-exp per head): it sends
    (d − 1) / d of them."""
    m, batch = kimi_k2.cfg.mla, 8
    heads = m.num_heads // 8
    p = predict(kimi_k2, get_chip("h200"), Layout(8, dcp=dcp), batch=batch, context=1024)
    by_label = {c.label: c for c in p.time.collectives if c.label.endswith("(dcp)")}
    gather = next(c for label, c in by_label.items() if label.startswith("queries"))
    scatter = next(c for label, c in by_label.items() if label.startswith("partial attention outputs"))
    assert gather.kind == "all_gather" and scatter.kind == "reduce_scatter"
    assert gather.ranks == scatter.ranks == dcp and gather.count == scatter.count == 61
    own_queries = batch * heads * BF16 * (m.kv_lora_rank + m.qk_rope_head_dim)
    assert gather.wire_bytes == pytest.approx(61 * (dcp - 1) * own_queries)
    partials = batch * dcp * heads * (BF16 * m.kv_lora_rank + 4)
    assert scatter.wire_bytes == pytest.approx(61 * (dcp - 1) / dcp * partials)
