"""Gaps a mutation audit of ``nonstop plan``'s speculative drafter, report and command line found. Expected
values are hand arithmetic from the module docstrings (draft.py: a DSpark step streams the drafter's weights,
the target's LM head and the Markov head's W2 once) and the model configs."""

from __future__ import annotations

import pytest

from nonstop.config import ModelConfig
from nonstop.plan.draft import draft_shape

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

MARKOV_RANK = 256  # the stand-in drafter's Markov head rank (draft.py)


@pytest.mark.parametrize("name", ["kimi-k3", "llama-3.2-1b"])
def test_a_draft_step_streams_the_drafter_and_the_targets_lm_head(name):
    """draft.py: one DSpark step streams the drafter's own weights (W2 among them) and the target's LM head
    [V, d] once, in bf16: 2 · (params + V·d) bytes; its FLOPs per slot are 2 per multiplied weight, the LM
    head's included and the Markov W2 [r, V] left out: 2 · (params − r·V + V·d). Catches the LM head left out
    of the streamed bytes and W2 counted in the FLOPs."""
    cfg = ModelConfig.preset(name)
    d = draft_shape(cfg, None, 7)
    head = cfg.vocab_size * cfg.hidden_size
    assert d.params > MARKOV_RANK * cfg.vocab_size
    assert d.weight_bytes == pytest.approx(2 * (d.params + head), rel=1e-12)
    assert d.flops_per_slot == pytest.approx(2 * (d.params - MARKOV_RANK * cfg.vocab_size + head), rel=1e-12)


def test_the_k3_stand_in_drafters_cache_by_hand():
    """The stand-in K3 drafter: 5 layers, 96 query heads of 64 sharing 16 key / value heads, a 2,048-position
    window: 5 · 2 · 16 · 64 · 2 B = 20,480 B a cached position, at most 2,048 positions a sequence."""
    d = draft_shape(ModelConfig.preset("kimi-k3"), None, 7)
    assert d.context_bytes_per_token == 5 * 2 * 16 * 64 * 2
    assert d.context_bytes(1000) == 1000 * 20480
    assert d.context_bytes(100_000) == 2048 * 20480


@pytest.fixture(scope="module")
def nano():
    from nonstop.plan.workload import build_workload

    return build_workload(ModelConfig.preset("k3-nano"), "k3-nano")


def _predict(workload, layout, batch, context, spec=None):
    from nonstop.plan.chips import get_chip
    from nonstop.plan.predict import predict

    return predict(workload, get_chip("h200"), layout, batch, context, spec)


def test_throughput_in_total_is_the_batch_times_a_users(nano):
    """predict.py: ms per token = step / A, tokens/s per user = 1000 / ms per token, in total = batch x per
    user (4 sequences, 2.5 tokens accepted a step). Catches the total not multiplied by the batch."""
    from nonstop.plan.layout import Layout
    from nonstop.plan.predict import Spec

    p = _predict(nano, Layout(), 4, 64, Spec(2.5, 3))
    assert p.ms_per_token == pytest.approx(p.time.total_ms / 2.5, rel=1e-12)
    assert p.tokens_per_s_per_user == pytest.approx(1000 * 2.5 / p.time.total_ms, rel=1e-12)
    assert p.tokens_per_s_total == pytest.approx(4 * 1000 * 2.5 / p.time.total_ms, rel=1e-12)
    assert p.to_json()["tokens_per_s_total"] == pytest.approx(p.tokens_per_s_total, rel=1e-12)


def test_the_python_api_refuses_no_drafts_and_a_negative_context(nano):
    """The planner's API refuses what the command line's parser refuses: 0 drafted tokens a step and a
    negative context, each with the one-line PlanError. Catches both checks weakened by one."""
    from nonstop.plan.layout import Layout
    from nonstop.plan.predict import Spec
    from nonstop.plan.workload import PlanError

    with pytest.raises(PlanError, match="--spec-draft must be >= 1, got 0"):
        Spec(1.0, 0)
    with pytest.raises(PlanError, match="--context >= 0"):
        _predict(nano, Layout(), 1, -1)


def test_k3_holds_its_kda_state_once_a_sequence():
    """kimi-k3.md / distributed.md: K3's KDA state is 449 MB a sequence; the cost model reads and writes it each
    step, but a rank holds it once: 2 sequences hold 2 x 449 MB. Catches the read + write counted as held."""
    from nonstop.plan.layout import Layout, resident_bytes
    from nonstop.plan.workload import build_workload

    k3 = build_workload(ModelConfig.preset("kimi-k3"), "kimi-k3")
    assert resident_bytes(k3, Layout(), 2, 0)["state"] == pytest.approx(2 * 449e6, rel=0.01)


def test_a_drafter_holds_the_cache_of_its_attention_groups_sequences(nano):
    """predict.py: the drafter's weights (bf16) and its cache of the rank's sequences, split like the target's
    heads: 4 sequences over 2 attention groups (TP1) hold 2 sequences' drafter cache each. Catches every
    sequence of the batch held on every rank."""
    from nonstop.plan.layout import Layout
    from nonstop.plan.predict import Spec

    d = draft_shape(nano.cfg, None, 3)
    p = _predict(nano, Layout(1, 2), 4, 100, Spec(2.0, 3))
    assert p.resident["draft"] == pytest.approx(d.params * 2 + 2 * d.context_bytes(100), rel=1e-12)


def test_the_drafters_cache_reads_split_over_tp(nano):
    """timing / predict: a memory-bound drafter streams its weights / tp and the rank's share of its cache
    (split by heads, / tp) each step, so the step time a longer context adds to the draft halves from TP1 to
    TP2. Catches the drafter's cache read in full on every tensor-parallel rank."""
    from nonstop.plan.layout import Layout
    from nonstop.plan.predict import Spec

    spec = Spec(2.0, 3)
    grow = {}
    for tp in (1, 2):
        short, long = (_predict(nano, Layout(tp), 1, ctx, spec).time.draft_ms for ctx in (16, 1024))
        grow[tp] = long - short
    assert grow[1] > 0
    assert grow[1] == pytest.approx(2 * grow[2], rel=1e-9)


def test_a_pipelined_step_sends_one_attention_groups_rows(nano):
    """TP1 DP2 PP2, 4 sequences: 2 micro-batches of 2 sequences, 1 in each attention group, so each send to
    the next stage carries 1 row of 256 bf16 activations = 512 B. Catches the micro-batch's rows of every
    attention group sent by one rank."""
    from nonstop.plan.layout import Layout

    p = _predict(nano, Layout(1, 2, 1, "production", 2), 4, 64)
    sends = [c for c in p.time.collectives if c.kind == "send"]
    assert sends and sum(c.count for c in sends) == 1
    assert sum(c.wire_bytes for c in sends) == 1 * 256 * 2


def test_one_micro_batch_holds_every_groups_sequence(nano):
    """TP1 DP2 PP2 with experts TP over the world: with 2 sequences each attention group holds 1, so one
    micro-batch carries both and the experts route 2 rows a step (more experts touched than 1 sequence's
    row). Catches the micro-batches counted over the whole batch rather than a group's sequences."""
    from nonstop.plan.layout import Layout

    lay = Layout(1, 2, 1, "production", 2)
    assert _predict(nano, lay, 2, 64).time.total_ms > _predict(nano, lay, 1, 64).time.total_ms


def test_the_report_prints_per_token_and_per_user_figures_not_per_step(nano):
    """report.py: with speculation (2.5 tokens accepted a step, 4 sequences) the report's "ms per token" is the
    step / 2.5 and "tokens/s per user" 1000 · 2.5 / step, "in total" 4 times that, each at its printed
    rounding. Catches the step time printed as ms per token and the total printed as a user's rate."""
    import re

    from nonstop.plan.layout import Layout
    from nonstop.plan.predict import Spec
    from nonstop.plan.report import describe

    p = _predict(nano, Layout(), 4, 64, Spec(2.5, 3))
    step = p.time.total_ms
    text = describe(p)

    def figure(label: str) -> str:
        return re.search(rf"^  {re.escape(label)}\s+(\S+)", text, re.M).group(1)

    assert figure("ms per step") == f"{step:.3f}"
    assert figure("ms per token") == f"{step / 2.5:.3f}"
    assert figure("tokens/s per user") == f"{1000 * 2.5 / step:.1f}"
    assert figure("tokens/s in total") == f"{4 * 1000 * 2.5 / step:.1f}"


def test_the_layout_table_shows_per_token_and_per_user_figures(nano):
    """report.py: the search table's ms/token and tok/s/user columns are per generated token and per user
    (with speculation: step / A and 1000 · A / step), tok/s total the batch's. Catches the step time or the
    total rate printed in the per-token and per-user columns."""
    from nonstop.plan.chips import get_chip
    from nonstop.plan.predict import Spec
    from nonstop.plan.report import layout_table
    from nonstop.plan.search import search

    cands = search(nano, get_chip("h200"), 1, batch=4, context=64, spec=Spec(2.5, 3))
    assert len(cands) == 1 and cands[0].fits
    step = cands[0].prediction.time.total_ms
    row = layout_table(cands, 1, get_chip("h200")).splitlines()[1].split()
    assert row[:4] == ["TP1", "1", f"{cands[0].bytes_per_rank / 1e9:.1f}", "yes"]
    assert row[4:7] == [f"{step / 2.5:.3f}", f"{1000 * 2.5 / step:.1f}", f"{4 * 1000 * 2.5 / step:.1f}"]


def test_a_zero_context_is_planned_at_zero_not_the_default(capsys):
    """``--context 0`` (a first decode step, nothing cached) is a valid request: the plan is at context 0 with no
    attention cache, not the 4,096-token default. Catches 0 taken as "not given"."""
    import json

    from nonstop.cli import main

    assert (
        main(["plan", "-m", "k3-nano", "--chip", "h200", "--chips", "1", "--tp", "1", "--context", "0", "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["context"] == 0 and out["bytes_per_chip_detail"]["cache"] == 0
