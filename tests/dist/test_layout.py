"""Layouts, expert placement, a rank's parameter parts and the shape-only costs of a rank's Program
(no process group anywhere in this file)."""

from __future__ import annotations

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.dist import ExpertPlacement, Layout, LayoutError
from nonstop.dist.load import take_shard
from nonstop.dist.model import rank_weight_bytes
from nonstop.dist.program import rank_step
from nonstop.dist.shard import local_config, rank_shards
from nonstop.program.footprint import model_footprint
from nonstop.weights.synth import random_state_dict
from tests.tiny_configs import DEEPSEEK, KIMI_K3, KIMI_K3_MXFP4, LLAMA

NANO = ModelConfig.from_file("nonstop/assets/k3-nano")


def test_layout_sizes_and_groups():
    lay = Layout.make(tp=2, ep=4)
    assert (lay.world, lay.dp, lay.expert_groups) == (4, 2, 1)
    assert lay.tp_groups() == [(0, 1), (2, 3)] and lay.ep_groups() == [(0, 1, 2, 3)]
    assert [lay.tp_rank(r) for r in range(4)] == [0, 1, 0, 1] and lay.dp_index(3) == 1 and lay.leader(1) == 2
    lay = Layout.make(tp=4, ep=2)
    assert lay.ep_groups() == [(0, 1), (2, 3)] and lay.tp_group(2) == (0, 1, 2, 3) and lay.dp == 1
    assert Layout.make(tp=2, ep=2, world=6).dp == 3
    with pytest.raises(LayoutError, match="--ep 4 does not divide the world size 6"):
        Layout.make(tp=3, ep=4, world=6)
    with pytest.raises(LayoutError, match="--tp"):
        Layout.make(tp=0)


def test_even_and_uneven_placement_routes_every_pair():
    p = ExpertPlacement.even(7, 3)
    assert p.slots == ((0, 1, 2), (3, 4), (5, 6))
    ids = torch.arange(7).repeat(5)
    dest, local = p.route(ids, source=1)
    for e, d, i in zip(ids.tolist(), dest.tolist(), local.tolist()):
        assert p.slots[d][i] == e
    assert set(dest[(ids == 3) | (ids == 4)].tolist()) == {1}  # held by the source: stays local


def test_redundant_replicas_spread_and_rebalance_lowers_the_peak():
    load = torch.tensor([100.0, 5, 5, 5, 5, 5, 60, 5])
    even = ExpertPlacement.even(8, 4)
    bal = ExpertPlacement.rebalanced(load, 4, redundant=2)
    assert bal.physical == 10 and len(bal.replicas(0)) == 2 and len(bal.replicas(6)) == 2

    def peak(p):
        per = [0.0] * p.ranks
        for e in range(8):
            reps = p.replicas(e)
            for r, _ in reps:
                per[r] += float(load[e]) / len(reps)
        return max(per)

    assert peak(bal) < peak(even)
    dest, local = bal.route(torch.zeros(8, dtype=torch.long), source=3)  # a hot expert from a rank without it
    assert len(set(dest.tolist())) == 2
    for d, i in zip(dest.tolist(), local.tolist()):
        assert bal.slots[d][i] == 0
    with pytest.raises(ValueError, match="on no rank"):
        ExpertPlacement(3, ((0,), (1,)))


@pytest.mark.parametrize("raw,tp,ep", [(KIMI_K3_MXFP4, 3, 4), (DEEPSEEK, 3, 2), ("nano", 2, 4), ("nano", 4, 8)])
def test_rank_parts_put_back_together_give_the_whole_model(raw, tp, ep):
    cfg = NANO if raw == "nano" else ModelConfig.from_hf_dict(raw)
    lay = Layout.make(tp, ep, world=max(tp, ep) if max(tp, ep) % min(tp, ep) == 0 else tp * ep)
    full = random_state_dict(cfg, torch.float32, seed=3)
    parts = {
        r: {s.spec.param: (s, take_shard(full[s.spec.param], s)) for s in rank_shards(cfg, lay, r)}
        for r in range(lay.world)
    }
    for name, whole in full.items():
        shard0 = parts[0][name][0]
        if shard0.experts is not None:  # every expert held once in an expert group (no redundancy)
            got = torch.cat([parts[r][name][1] for r in lay.ep_groups()[0]])
            torch.testing.assert_close(got, whole, rtol=0, atol=0)
        elif shard0.dim is not None:
            got = torch.cat([parts[r][name][1] for r in lay.tp_group(0)], dim=shard0.dim)
            torch.testing.assert_close(got.narrow(shard0.dim, 0, whole.shape[shard0.dim]), whole, rtol=0, atol=0)
        else:
            for r in range(lay.world):
                assert torch.equal(parts[r][name][1], whole)


def test_heads_that_do_not_divide_name_the_field():
    with pytest.raises(LayoutError, match=r"linear_attn_config.num_heads \(KDA heads\) = 3"):
        local_config(ModelConfig.from_hf_dict(KIMI_K3), Layout.make(tp=2), 0)
    llama = ModelConfig.from_hf_dict({**LLAMA, "num_attention_heads": 4, "num_key_value_heads": 2})
    with pytest.raises(LayoutError, match="num_attention_heads = 5"):
        local_config(ModelConfig.from_hf_dict(LLAMA), Layout.make(tp=2), 0)
    assert local_config(llama, Layout.make(tp=4), 3).gqa.num_kv_heads == 1  # kv heads replicated
    assert local_config(llama, Layout.make(tp=2), 1).gqa.num_kv_heads == 1


def test_rank_weights_are_the_share_of_the_checkpoint():
    total = model_footprint(NANO, torch.bfloat16).weight_bytes
    assert rank_weight_bytes(NANO, Layout.make()) == [total]
    per_rank = rank_weight_bytes(NANO, Layout.make(tp=1, ep=8))
    experts = sum(s.numel * 2 for s in rank_shards(NANO, Layout.make(), 0) if s.experts is not None)
    assert sum(per_rank) == 8 * (total - experts) + experts  # non-expert weights replicated, experts once
    tp4 = rank_weight_bytes(NANO, Layout.make(tp=4, ep=4))
    assert max(tp4) < total / 2.5  # heads, MLP, vocab and experts split; norms, router, latent replicated


def test_k3_program_has_two_token_all_to_alls_per_moe_layer():
    cfg = ModelConfig.preset("kimi-k3").with_num_layers(6)
    step = rank_step(cfg, Layout.make(tp=8, ep=64), rows=1)
    moe_layers = cfg.mlp_types.count("moe")
    assert step.token_all_to_alls == 2 * moe_layers
    assert step.launches("all_to_all", ("dispatch (expert inputs)", "combine (expert outputs)")) == 2 * moe_layers
    assert (
        step.launches("all_reduce") == 2 * cfg.num_hidden_layers + 1
    )  # after attention, after the FFN, after the embedding
    by_purpose = {c.purpose: c for c in step.collectives}
    # rank 0 routes the group's one row: top-k pairs a layer of latent-wide bf16 rows, minus those whose
    # expert it holds itself (14 of 896)
    pairs = cfg.moe.top_k * (1 - 14 / 896)
    assert by_purpose["dispatch (expert inputs)"].wire_bytes == pytest.approx(
        moe_layers * pairs * cfg.moe.latent_size * 2
    )
    assert by_purpose["partial sums of o_proj"].wire_bytes == pytest.approx(
        cfg.num_hidden_layers * 2 * 7 / 8 * cfg.hidden_size * 2
    )
    assert by_purpose["logits (vocabulary parts)"].wire_bytes == 0  # rank 0 receives the vocabulary parts
    # the average rank: 1/8 of a row's pairs each way, all-reduces, the vocabulary part of 7 ranks in 8,
    # rank 0's broadcast and 7 of 8 groups' logits back to rank 0, over the 8 tokens of the step
    a2a = 2 * moe_layers * pairs / 8 * cfg.moe.latent_size * 2 + moe_layers * 63 * 14 * 4
    all_reduce = (2 * cfg.num_hidden_layers + 1) * 2 * 7 / 8 * cfg.hidden_size * 2
    gather = 7 / 8 * cfg.vocab_size / 8 * 4
    engine = (63 * (24 * 8 + 256) + 7 * cfg.vocab_size * 4) / 64
    assert step.wire_bytes_per_token == pytest.approx((a2a + all_reduce + gather + engine) / 8, rel=1e-6)


def test_rank_state_and_cache_are_the_group_share():
    whole = model_footprint(NANO, torch.bfloat16)
    step = rank_step(NANO, Layout.make(tp=4, ep=4), rows=2)
    assert step.state_bytes_per_sequence * 4 == whole.state_bytes_per_sequence  # KDA heads split 4 ways
    assert step.cache_bytes_per_token == whole.cache_bytes_per_token  # the MLA latent is cached whole on each rank


def test_program_command_prints_the_layout(capsys):
    from nonstop.cli import main

    assert main(["program", "-m", "k3-nano", "--tp", "2", "--ep", "4", "--summary"]) == 0
    out = capsys.readouterr().out
    moe_layers = NANO.mlp_types.count("moe")
    assert f"all-to-alls per step: {2 * moe_layers} token exchanges" in out
    assert "weights per rank:" in out and "bytes on the wire per token per rank:" in out and "moe_ep" in out


def test_program_command_names_the_moe_layers_without_expert_parallelism(capsys):
    """Under --tp alone the step has no token exchange, and the summary says why, with the model's MoE layers
    (it said "2 per MoE layer x 0 MoE layers"); one token per step is one token."""
    from nonstop.cli import main

    assert main(["program", "-m", "k3-nano", "--tp", "2", "--summary"]) == 0
    out = capsys.readouterr().out
    moe_layers = NANO.mlp_types.count("moe")
    assert f"all-to-alls per step: none (--ep 1: every rank holds every expert of the {moe_layers} MoE" in out
    assert "/ 1 token per step)" in out


def test_program_command_refuses_rank_flags_of_a_one_rank_layout(capsys):
    """--world 1 --rank 0 is no layout to describe a rank of: the error says a layout of several ranks (it told
    the user to give --world, which they had)."""
    from nonstop.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["program", "-m", "k3-nano", "--world", "1", "--rank", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "layout of several ranks: give --tp, --ep or --world above 1" in err


def test_megakernel_is_refused_under_a_layout():
    from nonstop.runtime.distributed import check_backend

    with pytest.raises(ValueError, match="megakernel.*one device.*4 ranks.*reference or superop"):
        check_backend("megakernel", torch.device("cpu"), 4)


@pytest.mark.parametrize("backend", ["cpu", "cpu-bf16", "cpu-int8"])
def test_a_single_process_backend_is_named_as_such_under_a_layout(backend):
    """It was "unknown backend 'cpu'", though --help lists it."""
    from nonstop.runtime.distributed import check_backend

    with pytest.raises(ValueError, match=f"backend '{backend}' runs the whole model in a single process.*2 ranks"):
        check_backend(backend, torch.device("cpu"), 2)


class _Drawn(Exception):
    pass


def test_every_rank_draws_random_weights_with_rank_0s_seed(monkeypatch):
    """A follower built with its own seed (the documented recipe leaves it at 0) drew other weights than rank 0
    (DistributedLLM(seed=5)) for a preset, silently; build_worker now takes rank 0's seed on every rank."""
    from types import SimpleNamespace

    import nonstop.dist.load as load
    from nonstop.engine.distributed import build_worker

    told = []

    def from_rank_0(obj, what=None):
        told.append((obj, what))
        return 5

    def drawn(cfg, layout, rank, dtype, device, seed, only=None):
        raise _Drawn(seed)

    monkeypatch.setattr(load, "random_rank_state", drawn)
    comm = SimpleNamespace(layout=Layout.make(1, 2), rank=1, device=torch.device("cpu"), broadcast_object=from_rank_0)
    with pytest.raises(_Drawn) as drew:
        build_worker(comm, KIMI_K3, None, torch.float32, seed=0)
    assert drew.value.args == (5,) and told == [(0, "agreeing on the random weights' seed with rank 0")]
