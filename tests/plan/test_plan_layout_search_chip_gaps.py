"""Gaps a mutation audit of the planner's layout, search, chip catalogue and CLI checks found. Expected values
are hand arithmetic from the model configs (Kimi K3: 896 routed experts, top 16, each gate / up / down of
3,584 x 3,072 in MXFP4 = 4 bits + an E8M0 byte per 32; an fp32 score-correction bias of one value per expert;
k3-nano: 8 routed experts) and the chip entry a test writes itself."""

from __future__ import annotations

import json
from argparse import Namespace

import pytest

from nonstop.cli import main
from nonstop.commands.plan import _spec
from nonstop.config import ModelConfig
from nonstop.plan.chips import ChipError, chip_from_entry, get_chip, load_catalogue
from nonstop.plan.layout import Collective, Layout, RankOp, check_layout, rank_ops
from nonstop.plan.predict import Spec
from nonstop.plan.timing import Constants, collective_time, group_span, step_time
from nonstop.plan.workload import PlanError, build_workload
from tests.plan.made_up_chip import made_up_chip

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

K3_EXPERTS, K3_TOP_K = 896, 16
K3_EXPERT_PARAMS = 3 * 3584 * 3072
MXFP4 = 0.5 + 1 / 32


@pytest.fixture(scope="module")
def nano():
    return build_workload(ModelConfig.preset("k3-nano"), "k3-nano")


@pytest.fixture(scope="module")
def k3():
    return build_workload(ModelConfig.preset("kimi-k3"), "kimi-k3")


def test_ep_equal_to_the_routed_experts_is_a_layout(nano):
    """k3-nano has 8 routed experts: --ep 8 holds one expert a rank and is allowed, --ep 16 exceeds them.
    Catches the bound written ``ep >= num_experts`` (one expert a rank refused)."""
    assert nano.moe_ops[0].expert.num_experts == 8
    check_layout(nano, Layout(1, 8, 8))
    check_layout(nano, Layout(2, 4, 8))
    with pytest.raises(PlanError, match="--ep 16 exceeds the 8 routed experts"):
        check_layout(nano, Layout(1, 16, 16))


def test_a_moe_ops_own_weights_are_streamed_with_its_experts(k3):
    """K3's routed-expert op keeps one fp32 score-correction bias a expert (896 x 4 = 3,584 B) beside the
    experts. One decode row on one device touches top_k = 16 experts, each 3 x 3,584 x 3,072 params at
    4.25 bits, so the op streams 16 x 17,547,264 + 3,584 B. Catches the op's own weights dropped."""
    bytes_each = K3_EXPERT_PARAMS * MXFP4
    assert bytes_each == 17_547_264
    ops = {op.name: op for op in rank_ops(k3, Layout(1, 1, 1), batch=1, context=0, rows_per_seq=1)}
    moe = ops[k3.moe_ops[0].name]
    assert moe.expert_slices == pytest.approx(K3_TOP_K, rel=1e-9)
    assert moe.weight_bytes == pytest.approx(K3_TOP_K * bytes_each + K3_EXPERTS * 4, rel=0, abs=1e-3)


def test_a_group_that_spills_part_of_a_domain_spans_the_next_one():
    """A dp group of 3 ranks tp = 4 apart (TP4 DP3 on 12 ranks) on domains of 8 ranks: a domain holds
    8 // 4 = 2 of them, so the group spans ceil(3 / 2) = 2 domains: one scale-up and one scale-out hop,
    a third of the bytes over the scale-out link. Catches the domains counted as 3 // 2 = 1."""
    assert group_span(3, 4, 8) == (2, 2)
    assert group_span(5, 1, 4) == (4, 2)
    consts = Constants(1.0, 1.0, 1.0, 0.0, 1.0, 0.0)
    t = collective_time(Collective("all_gather", 3, 6e6, 1, "x", stride=4), made_up_chip(), consts)
    assert t.latency_ms == pytest.approx((2.0 * 1 + 10.0 * 1) * 1e-3)
    assert t.bandwidth_ms == pytest.approx(6e6 / 3 / 50e9 * 1e3)
    assert t.crosses_scale_out


@pytest.mark.parametrize(
    ("executor", "eager_ops", "kernels"),
    [("eager", 40, 40 + 5), ("kernels", None, 2 + 5), ("megakernel", None, 1)],
)
def test_every_collective_call_is_a_kernel_launch(executor, eager_ops, kernels):
    """Two ops and two collectives called 2 and 3 times a step: an eager step dispatches its 40 aten ops
    plus the 5 collective calls, a graph of kernels 2 + 5, a megakernel 1; each costs kernel_factor x
    launch_us (3 us here). Catches the eager executor's collective launches dropped."""
    ops = [RankOp("a", "linear", 1e6, 0.0, 1.0, "bf16"), RankOp("b", "linear", 1e6, 0.0, 1.0, "bf16")]
    colls = [Collective("all_reduce", 4, 1e3, 2, "x"), Collective("all_gather", 4, 1e3, 3, "y")]
    consts = Constants(1.0, 1.0, 1.0, 0.0, 1.0, 0.0)
    t = step_time(ops, colls, made_up_chip(), consts, executor=executor, eager_ops=eager_ops)
    assert t.kernels == kernels
    assert t.launch_ms == pytest.approx(kernels * 3.0 * 1e-3)


def test_spec_draft_takes_1_to_64_tokens_and_defaults_to_7():
    """--help: "tokens K drafted per step, 1 to 64 (default 7 with --spec-accept)". Catches the default
    changed and the cap written as a strict bound (64 refused)."""
    assert _spec(Namespace(spec_accept=2.0, spec_draft=None)) == Spec(2.0, 7)
    assert _spec(Namespace(spec_accept=2.0, spec_draft=64)) == Spec(2.0, 64)
    with pytest.raises(ValueError, match="--spec-draft 65: the planner models up to 64"):
        _spec(Namespace(spec_accept=2.0, spec_draft=65))


@pytest.mark.parametrize("path", ["hbm_gb", "launch_us"])
def test_a_json_true_is_no_figure(path):
    """JSON's true is a Python bool, an int subclass equal to 1: a chip of 1 GB of HBM (or a 1 us launch)
    would plan silently. Catches the bool check dropped from the figure test."""
    entry = json.loads(json.dumps(load_catalogue()["h200"]))
    entry[path] = True
    with pytest.raises(ChipError, match=f"{path} must be a positive finite number"):
        chip_from_entry("x", entry)


def test_a_chip_file_that_is_not_utf8_is_a_clear_error(tmp_path):
    """A chip file saved in another encoding (a Latin-1 byte 0xff): a one-line "not valid JSON" ChipError,
    not a UnicodeDecodeError traceback. Catches the decode error left out of the handled ones."""
    path = tmp_path / "chips.json"
    path.write_bytes(b'{"x1": {"name": "caf\xe9 \xff"}}')
    with pytest.raises(ChipError, match="not valid JSON"):
        get_chip("h200", path)


def test_a_layout_without_a_chip_count_is_a_one_line_error(capsys):
    """--tp 8 on a GPU with no --chips: the layout's ranks are unknown, so the plan must say to give --chips
    (a clear usage error, exit 2), not fail inside the layout with a traceback. Catches the check dropped."""
    with pytest.raises(SystemExit) as e:
        main(["plan", "-m", "k3-nano", "--chip", "h200", "--tp", "8"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "give --chips with a layout" in err and "Traceback" not in err
