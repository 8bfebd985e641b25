"""What a serving stack runs that nonstop.dist does not: expert parallelism over replicated tokens, an
attention block kept wider than the rest of a checkpoint, and a per-step host loop."""

from __future__ import annotations

import pytest

from nonstop.config import ModelConfig
from nonstop.plan.chips import get_chip
from nonstop.plan.layout import Layout, collectives, rank_ops, rank_workload, resident_bytes
from nonstop.plan.predict import predict
from nonstop.plan.timing import Constants
from nonstop.plan.workload import ATTENTION_KINDS, FORMAT_BYTES, Precision, build_workload
from nonstop.program.cost import STEP_MESSAGE_BYTES_PER_ROW, STEP_MESSAGE_HEADER_BYTES


@pytest.fixture(scope="module")
def nano():
    return build_workload(ModelConfig.preset("k3-nano"), "k3-nano")


def test_ep_over_the_tp_group_runs_no_all_to_all(nano):
    """dp 1, ep = tp: every rank holds every token, so the MoE combine is the output all-reduce (vLLM / SGLang
    without DP attention); ``sharding="engine"`` keeps nonstop.dist's dispatch / combine."""
    served, engine = Layout(2, 1, 2), Layout(2, 1, 2, "engine")
    assert served.tokens_replicated and not engine.tokens_replicated and not Layout(2, 2, 4).tokens_replicated
    kinds = {c.kind for c in collectives(rank_workload(nano, served), served, 4, 1)}
    assert "all_to_all" not in kinds and "all_reduce" in kinds
    assert "all_to_all" in {c.kind for c in collectives(rank_workload(nano, engine), engine, 4, 1)}
    labels = [c.label for c in collectives(rank_workload(nano, served), served, 4, 1)]
    assert any("routed latent sum" in label for label in labels)  # K3's latent sum is complete before its norm


def test_ep_over_replicated_tokens_streams_the_busiest_ranks_experts(nano):
    """Whole experts per rank: the step waits for the rank that holds the most touched experts, so it streams
    more expert bytes than experts split tp ways (every rank 1/tp of every touched expert)."""
    ep, tp = Layout(2, 1, 2), Layout(2, 1, 1)

    def expert_bytes(layout):
        ops = rank_ops(rank_workload(nano, layout), layout, 3, 64, 1)
        return sum(o.weight_bytes for o in ops if o.kind == "moe_ep")

    assert expert_bytes(ep) > expert_bytes(tp)


def test_attention_format_prices_only_the_attention_block():
    cfg = ModelConfig.preset("k3-nano")
    fp4 = build_workload(cfg, "n", Precision("nvfp4", "nvfp4", "bf16"))
    mixed = build_workload(cfg, "n", Precision("nvfp4", "nvfp4", "bf16", "bf16"))
    ratio = FORMAT_BYTES["bf16"] / FORMAT_BYTES["nvfp4"]
    changed = 0
    for a, b in zip(fp4.ops, mixed.ops):
        if b.kind in ("linear_residual", "mla_attn"):  # matrices only (o_proj, W_UV): the whole op re-priced
            assert b.weight_bytes / a.weight_bytes == pytest.approx(ratio) and b.dtype == "bf16"
            changed += 1
        elif b.kind in ATTENTION_KINDS:
            assert b.weight_bytes > a.weight_bytes and b.dtype == "bf16"
        else:
            assert b.weight_bytes == a.weight_bytes and b.dtype == a.dtype
    assert changed >= 4
    assert Precision.released(cfg, attention="bfloat16").of("mla_attn") == "bf16"


def test_host_loop_is_paid_per_step_by_host_driven_engines_only(nano):
    chip, consts = get_chip("h100"), Constants.load()
    none = consts.replace(step_overhead_us=0.0)
    for executor, paid in (("kernels", True), ("megakernel", False)):
        with_loop = predict(nano, chip, Layout(1), 1, 64, None, executor, consts).time
        without = predict(nano, chip, Layout(1), 1, 64, None, executor, none).time
        expected = consts.step_overhead_us * 1e-3 if paid else 0.0
        assert with_loop.total_ms - without.total_ms == pytest.approx(expected)
        assert with_loop.host_ms == pytest.approx(expected)


def test_dp_attention_with_experts_tp_over_the_world():
    """vLLM's DP > 1 without expert parallelism / SGLang's --enable-dp-attention without --ep: attention
    data-parallel, every expert split over all tp*dp ranks. A rank streams 1/world of each expert the
    whole deployment's rows touch (the same routed bytes as TP over the world at the same total batch),
    holds 1/world of the experts, and pays a dp all-gather of the expert inputs plus a world all-reduce."""
    k2 = build_workload(ModelConfig.preset("kimi-k2"), "kimi-k2")
    dp_attention, tp_world = Layout(2, 4, 1), Layout(8, 1, 1)
    assert dp_attention.moe_world_tp and dp_attention.expert_split == 8 and not dp_attention.expert_tp

    def routed_bytes(layout, batch):
        ops = rank_ops(rank_workload(k2, layout), layout, batch, 1024, 1)
        return sum(o.weight_bytes for o in ops if o.kind in ("moe_experts", "moe_ep"))

    assert routed_bytes(dp_attention, 8) == pytest.approx(routed_bytes(tp_world, 8), rel=1e-6)
    assert routed_bytes(dp_attention, 8) > routed_bytes(dp_attention, 4)  # rows of every group count
    experts = sum(o.expert.bytes_each * o.expert.num_experts for o in k2.moe_ops)
    held = resident_bytes(rank_workload(k2, dp_attention), dp_attention, 1, 0)["weights"]
    assert experts / 8 < held < experts / 8 + 0.05 * experts  # 1/8 of the experts + attention / 2
    colls = {c.kind: c for c in collectives(rank_workload(k2, dp_attention), dp_attention, 8, 1)}
    width = k2.cfg.hidden_size * 2  # bf16 rows
    moe_layers = len(k2.moe_ops)
    assert colls["all_gather"].ranks == 4 and colls["all_gather"].count == moe_layers
    assert colls["all_gather"].wire_bytes == pytest.approx(moe_layers * 3 * 2 * width)  # (dp-1) parts of 2 rows
    rank = rank_workload(k2, dp_attention)
    out_item = rank.program.buffers["moe_out"].torch_dtype(rank.program.dtype).itemsize  # the engine's sum dtype
    (summed,) = [c for c in collectives(rank, dp_attention, 8, 1) if c.ranks == 8 and c.kind == "all_reduce"]
    assert summed.count == moe_layers
    assert summed.wire_bytes == pytest.approx(moe_layers * 2 * 7 / 8 * 8 * k2.cfg.hidden_size * out_item)


def test_dp_attention_fits_where_replicated_experts_do_not():
    """Kimi K2 in fp8 (~1 TB) on 8 B200s, attention TP2 x DP4: the production meaning (experts over all 8
    ranks) fits, nonstop.dist's meaning (each attention group of 2 holds every expert) cannot."""
    k2 = build_workload(ModelConfig.preset("kimi-k2"), "kimi-k2")
    b200 = get_chip("b200")
    fits = predict(k2, b200, Layout(2, 4, 1), batch=8, context=1024)
    assert fits.fits and "experts TP8" in Layout(2, 4, 1).describe()
    engine = Layout(2, 4, 1, "engine")
    assert not engine.moe_world_tp
    assert resident_bytes(rank_workload(k2, engine), engine, 8, 1024)["weights"] > b200.rank_hbm_bytes


def test_pipeline_stages_hold_a_share_of_the_layers_and_add_their_sends():
    """PP: each of pp stages is the tp x dp layout with 1/pp of the layers. One user's token passes every
    stage in turn, so it takes the whole model's time at its micro-batch's rows (up to pp micro-batches in
    flight) plus pp - 1 sends; a rank of the fullest stage holds its share of what the single-stage layout
    holds."""
    k3 = build_workload(ModelConfig.preset("kimi-k3"), "kimi-k3")
    gb200 = get_chip("gb200")
    one, two = Layout(8, 1, 1), Layout(8, 1, 1, "production", 2)
    assert two.world == 16 and two.stage == one and "PP2" in two.describe()
    for batch, micro_batch in ((1, 1), (8, 4)):
        staged = predict(k3, gb200, two, batch=batch, context=2048)
        flat = predict(k3, gb200, one, batch=micro_batch, context=2048)
        sends = [c for c in staged.time.collectives if c.kind == "send"]
        assert len(sends) == 1 and sends[0].count == 1 and not sends[0].crosses_scale_out  # NVL72: one domain
        assert sends[0].wire_bytes == micro_batch * k3.cfg.hidden_size * 2
        gap = Constants.load().kernel_factor * gb200.launch_us * 1e-3  # the send is one more launch
        assert staged.time.total_ms == pytest.approx(flat.time.total_ms + sends[0].ms + gap)
        whole = predict(k3, gb200, one, batch=batch, context=2048)
        layers = k3.cfg.num_hidden_layers  # 93: stages of 47 and 46 layers; the fuller one must fit
        assert staged.bytes_per_rank == pytest.approx(whole.bytes_per_rank * (layers + 1) / 2 / layers)
        assert staged.tokens_per_s_total == pytest.approx(batch * 1e3 / staged.ms_per_token)


def test_pipeline_sends_cross_nodes_on_8_gpu_servers():
    k2 = build_workload(ModelConfig.preset("kimi-k2"), "kimi-k2")
    h800 = get_chip("h800")
    staged = predict(k2, h800, Layout(8, 1, 1, "production", 2), batch=1, context=1024)
    (send,) = [c for c in staged.time.collectives if c.kind == "send"]
    assert send.crosses_scale_out
    assert send.latency_ms == pytest.approx(Constants.load().hop_factor * h800.out_latency_us * 1e-3)


def test_decode_context_parallel_splits_the_cache_and_exchanges_per_attention_layer():
    """--dcp n: each rank of an attention group holds and reads 1/n of every sequence's cached tokens; every
    attention layer that keeps a cache adds an all-gather of queries and a reduce-scatter of partial outputs
    over the n ranks, sized from the heads a rank owns (K3: MLA in the latent space)."""
    cfg = ModelConfig.preset("kimi-k3")
    k3 = build_workload(cfg, "kimi-k3")
    plain, dcp = Layout(8), Layout(8, dcp=4)
    rank = rank_workload(k3, plain)
    batch, context = 5, 20000
    cache_plain = resident_bytes(rank, plain, batch, context)["cache"]
    assert resident_bytes(rank, dcp, batch, context)["cache"] == pytest.approx(cache_plain / 4)
    assert cache_plain == pytest.approx(batch * context * cfg.num_mla_layers * cfg.mla.cache_dim * 2)

    def traffic(layout, ctx):
        return sum(o.state_bytes for o in rank_ops(rank, layout, batch, ctx, 1))

    assert traffic(dcp, context) - traffic(dcp, 0) == pytest.approx((traffic(plain, context) - traffic(plain, 0)) / 4)
    extra = [c for c in collectives(rank, dcp, batch, 1) if c.label.endswith("(dcp)")]
    assert {c.kind for c in extra} == {"all_gather", "reduce_scatter"}
    assert all(c.count == cfg.num_mla_layers and c.ranks == 4 for c in extra)
    heads = cfg.mla.num_heads // 8
    gather = next(c for c in extra if c.kind == "all_gather")
    assert gather.wire_bytes == pytest.approx(cfg.num_mla_layers * 3 * batch * heads * cfg.mla.cache_dim * 2)
    assert not {c.label for c in collectives(rank, plain, batch, 1)} & {c.label for c in extra}


def test_decode_context_parallel_wins_at_long_context_and_must_divide_tp():
    k2 = build_workload(ModelConfig.preset("kimi-k2"), "kimi-k2")
    h200 = get_chip("h200")
    plain = predict(k2, h200, Layout(16), batch=64, context=32768)
    dcp = predict(k2, h200, Layout(16, dcp=8), batch=64, context=32768)
    assert dcp.time.state_ms < plain.time.state_ms / 4 and dcp.time.collectives_ms > plain.time.collectives_ms
    assert dcp.ms_per_token < plain.ms_per_token and dcp.fits and not plain.fits
    assert dcp.to_json()["layout"]["dcp"] == 8
    with pytest.raises(ValueError, match="--dcp 3 must divide --tp 8"):
        predict(k2, h200, Layout(8, dcp=3), batch=1, context=1024)


def test_decode_context_parallel_of_a_gqa_cache_splits_only_its_repeated_heads():
    """At TP t a GQA model with h KV heads keeps each head t/h times in an attention group (once when
    t <= h): DCP splits those copies' tokens, so a rank's cache never drops below cache / h."""
    cfg = ModelConfig.preset("llama-3.2-1b")
    llama = build_workload(cfg, "llama-3.2-1b")
    kv = cfg.gqa.num_kv_heads
    batch, context = 4, 8192
    whole = batch * context * cfg.num_hidden_layers * 2 * kv * cfg.gqa.head_dim * 2  # K and V, bf16
    tp = 2 * kv
    rank = rank_workload(llama, Layout(tp))
    per_rank = {d: resident_bytes(rank, Layout(tp, dcp=d), batch, context)["cache"] for d in (1, 2)}
    assert per_rank[1] == pytest.approx(whole / kv) and per_rank[2] == pytest.approx(whole / kv / 2)
    with pytest.raises(ValueError, match="kept 2x: --dcp at most 2"):
        predict(llama, get_chip("h100"), Layout(tp, dcp=4), batch=batch, context=context)


def test_step_inputs_stay_inside_an_attention_group_in_production():
    """vLLM / SGLang DP ranks schedule their own sequences: a step's inputs go to the group's tp ranks once,
    whatever the world; nonstop.dist's one controller broadcasts every group's rows to the world."""
    k2 = build_workload(ModelConfig.preset("kimi-k2"), "kimi-k2")
    batch = 64 * 16

    def inputs(layout):
        rank = rank_workload(k2, layout)
        return [c for c in collectives(rank, layout, batch, 1) if c.label.startswith(("step inputs", "logits to"))]

    for dp in (4, 16):
        (bcast,) = inputs(Layout(8, dp, 8 * dp))
        assert bcast.kind == "broadcast" and bcast.ranks == 8
        assert bcast.wire_bytes == STEP_MESSAGE_BYTES_PER_ROW * (batch // dp) + STEP_MESSAGE_HEADER_BYTES  # once
    assert inputs(Layout(1, 16, 16)) == []  # one rank a group: nothing to hand on
    engine = inputs(Layout(8, 4, 32, "engine"))
    assert any(c.kind == "broadcast" and c.ranks == 32 for c in engine)
