"""``nonstop plan`` end to end: fit / no fit, layout search, --json, measurements, clear errors."""

from __future__ import annotations

import json

import pytest

from nonstop.cli import main
from nonstop.plan.chips import get_chip
from nonstop.plan.predict import USABLE_HBM


def test_k3_does_not_fit_8_h200_and_says_why(capsys):
    assert main(["plan", "-m", "kimi-k3", "--chip", "h200", "--chips", "8"]) == 0
    out = capsys.readouterr().out
    assert "none fits" in out and "does not fit" in out
    offers = get_chip("h200").rank_hbm_bytes * USABLE_HBM / 1e9
    assert "GB per rank" in out and f"offers {offers:.1f} GB" in out  # what it needs against what an H200 offers
    assert "KDA state" in out and "attention cache" in out  # K3 holds both


def test_why_not_names_only_what_the_model_holds(capsys):
    """K2 (MLA only) has no KDA state to name; its attention cache is named."""
    assert main(["plan", "-m", "kimi-k2", "--chip", "h100", "--chips", "8"]) == 0
    out = capsys.readouterr().out
    assert "does not fit" in out and "attention cache" in out and "KDA" not in out.split("step time")[0]


def test_k3_fits_16_h200_and_the_search_ranks_layouts(capsys):
    assert main(["plan", "-m", "kimi-k3", "--chip", "h200", "--chips", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("ms_per_token", "tokens_per_s_per_user", "tokens_per_s_total", "fits", "bytes_per_chip", "bound"):
        assert key in out
    assert out["fits"] and out["bytes_per_chip"] <= out["capacity_per_chip"] < out["hbm_per_chip"]
    assert out["hbm_per_chip"] > 141e9  # an H200 sold as 141 GB holds 143771 MiB
    fitting = [c for c in out["layouts"] if c["fits"]]
    assert len(fitting) >= 2 and fitting[0]["ms_per_token"] == pytest.approx(out["ms_per_token"])
    assert [c["ms_per_token"] for c in fitting] == sorted(c["ms_per_token"] for c in fitting)
    assert any(not c["fits"] for c in out["layouts"])


def test_explicit_layout_json_with_speculation(capsys):
    argv = ["plan", "-m", "kimi-k3", "--chip", "b300", "--chips", "8", "--tp", "8", "--spec-accept", "3", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["spec"] == {"accept": 3.0, "drafts": 7, "verify_rows": 8}
    assert out["ms_per_token"] == pytest.approx(out["step_ms"] / 3)
    assert {c["kind"] for c in out["collectives"]} >= {"all_reduce"}
    # the drafter takes memory too: K3's stand-in DSpark drafter's bf16 weights and its own cache of the one
    # sequence (the published drafter's 5 layers x keys and values of 16 heads of 64 over its 2,048-position
    # window: the default 4,096-token context is cut to the window), both split over the 8 ranks
    from nonstop.config import ModelConfig
    from nonstop.plan.draft import draft_shape

    drafter = draft_shape(ModelConfig.preset("kimi-k3"), None, 7)
    cache = 5 * 2 * 16 * 64 * 2 * 2048
    assert out["context"] == 4096
    assert out["bytes_per_chip_detail"]["draft"] == pytest.approx((drafter.params * 2 + cache) / 8)
    assert drafter.params > 1e9  # billions of parameters: not a rounding error in a fit
    assert main(argv[:-3] + ["--json"]) == 0  # the same layout without speculation
    plain = json.loads(capsys.readouterr().out)
    assert "draft" not in plain["bytes_per_chip_detail"]
    assert out["bytes_per_chip"] == pytest.approx(plain["bytes_per_chip"] + out["bytes_per_chip_detail"]["draft"])


def test_cpu_plan_sits_beside_nonstop_measurements(capsys):
    assert main(["plan", "-m", "k3-nano", "--chip", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "eager executor" in out and "bench/results/spec_decode_cpu_k3-nano.json" in out
    assert main(["plan", "--chip", "cpu", "--measured", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert any(r["source"] == "cpu_decode.json" for r in rows)
    assert all(r["predicted_ms_per_token"] > 0 and r["measured_ms_per_token"] > 0 for r in rows)


def test_no_measurement_on_a_gpu_is_said_plainly(capsys, tmp_path, monkeypatch):
    from nonstop.plan import measured

    monkeypatch.setattr(measured, "RESULTS_DIR", tmp_path)  # no result at all
    assert main(["plan", "-m", "k3-nano", "--chip", "h100", "--chips", "1"]) == 0
    assert "no nonstop measurement of k3-nano on h100 in bench/results (none on h100 at all" in capsys.readouterr().out
    superop_row = {"row": "superop", "ms_per_token": 2.0}
    (tmp_path / "decode_nvidia-h100.json").write_text(  # a run of another model on that chip
        json.dumps(
            {
                "environment": {"gpu": "NVIDIA H100 80GB HBM3"},
                "shapes": [
                    {
                        "shape": "llama-3.2-1b",
                        "preset": "llama-3.2-1b",
                        "full_layers": 16,
                        "slices": [{"layers": 16, "timings": [{"context": 9, "rows": [superop_row]}]}],
                    }
                ],
            }
        )
    )
    assert main(["plan", "-m", "k3-nano", "--chip", "h100", "--chips", "1"]) == 0
    assert "(--measured lists the 1 run(s) on h100: other models" in capsys.readouterr().out
    assert main(["plan", "--chip", "h100", "--measured", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["run"].startswith("llama-3.2-1b, superop") and row["measured_ms_per_token"] == 2.0


def test_list_chips(capsys):
    assert main(["plan", "--list-chips"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("h100", "gb300", "mi355x", "tpu-v7", "cpu"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--chip", "h900", "--chips", "8"], "unknown chip 'h900'"),
        (["-m", "kimi-k3", "--chip", "h200", "--chips", "8", "--tp", "3"], "does not divide"),
        (["-m", "kimi-k3", "--chip", "h200", "--chips", "8", "--tp", "5", "--dp", "1"], "ranks"),
        (["-m", "kimi-k3", "--chip", "h200", "--chips", "8", "--tp", "8", "--spec-accept", "9"], "spec-accept"),
        (
            ["-m", "kimi-k3", "--chip", "h200", "--chips", "8", "--tp", "8", "--experts", "int3"],
            "--experts 'int3': unknown routed expert format",
        ),
        (["-m", "kimi-k3"], "give --chip"),
        (["-m", "kimi-k3", "--chip", "gb200", "--chips", "16", "--pp", "3"], "--pp 3 does not divide"),
        (["-m", "kimi-k3", "--chip", "gb200", "--chips", "16", "--pp", "2", "--tp", "16"], "a pipeline stage"),
        (["-m", "k3-nano", "--chip", "gb200", "--chips", "16", "--pp", "16"], "exceeds the"),
        (["-m", "kimi-k3", "--chip", "gb200", "--chips", "16", "--tp", "16", "--dcp", "3"], "--dcp 3 must divide"),
        (
            ["-m", "llama-3.2-1b", "--chip", "h100", "--chips", "16", "--tp", "16", "--dcp", "4"],
            "kept 2x: --dcp at most 2",
        ),
        (["-m", "llama-3.2-1b", "--chip", "h100", "--chips", "1", "--experts", "fp8"], "has no routed experts"),
        (["-m", "kimi-k3", "--chip", "h200", "--chips", "99999999", "--tp", "1"], "the planner models up to"),
        (["-m", "kimi-k3", "--chip", "b300", "--chips", "8", "--tp", "8", "--input-len", "5"], "go together"),
        (
            [
                "-m",
                "kimi-k3",
                "--chip",
                "b300",
                "--chips",
                "8",
                "--input-len",
                "5",
                "--output-len",
                "3",
                "--context",
                "4",
            ],
            "not both",
        ),
        (["-m", "kimi-k3", "--chip", "tpu7x", "--chips", str(2**19 + 1)], "1,048,578 ranks"),
        (
            ["-m", "kimi-k3", "--chip", "b300", "--chips", "8", "--context", str(2**20 + 1)],
            "1,048,577 tokens exceeds kimi-k3's 1,048,576 positions",
        ),
        (
            ["-m", "llama-3.2-1b", "--chip", "h200", "--chips", "1", "--input-len", "130000", "--output-len", "1073"],
            "131,073 tokens exceeds llama-3.2-1b's 131,072 positions",
        ),
    ],
)
def test_bad_input_is_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_int4_experts_by_flag_or_by_checkpoint_config(capsys):
    """``--experts int4`` on K2's shapes prices what the K2 Thinking config (bundled, found by its short
    name) declares; ``int4`` is its own format, no longer an alias of MXFP4."""
    base = ["--chip", "h200", "--chips", "8", "--tp", "8", "--batch", "4", "--json"]
    runs = {}
    for name, argv in {
        "thinking": ["plan", "-m", "kimi-k2-thinking", *base],
        "flag": ["plan", "-m", "kimi-k2", "--weights", "bf16", "--experts", "int4", *base],
        "mxfp4": ["plan", "-m", "kimi-k2", "--weights", "bf16", "--experts", "mxfp4", *base],
    }.items():
        assert main(argv) == 0
        runs[name] = json.loads(capsys.readouterr().out)
    assert runs["thinking"]["precision"]["experts"] == "int4"
    assert runs["thinking"]["bytes_per_chip"] == pytest.approx(runs["flag"]["bytes_per_chip"], rel=1e-3)
    assert runs["thinking"]["ms_per_token"] == pytest.approx(runs["flag"]["ms_per_token"], rel=1e-3)
    assert runs["flag"]["bytes_per_chip"] > runs["mxfp4"]["bytes_per_chip"] * 1.02  # 4.5 against 4.25 bits


def test_released_model_names_map_to_the_shapes_they_share(capsys):
    base = ["--chip", "B200", "--chips", "8", "--tp", "8", "--batch", "2", "--json"]
    ms = {}
    names = ("kimi-k2.5", "kimi-k2-thinking", "Kimi-K2-Instruct", "kimi-k2", "kimi-k2-0905", "deepseek-r1")
    for name in (*names, "deepseek-ai/DeepSeek-V3.1"):
        assert main(["plan", "-m", name, *base]) == 0
        ms[name] = json.loads(capsys.readouterr().out)["ms_per_token"]
    assert ms["kimi-k2.5"] == ms["kimi-k2-thinking"] and ms["Kimi-K2-Instruct"] == ms["kimi-k2"] == ms["kimi-k2-0905"]
    assert ms["deepseek-ai/DeepSeek-V3.1"] == ms["deepseek-r1"]  # V3.1 extends V3's base: same shapes, fp8
    assert ms["kimi-k2.5"] != ms["kimi-k2"]  # int4 experts and bf16 attention against fp8 everywhere
    assert ms["deepseek-r1"] != ms["kimi-k2"]


def test_the_context_defaults_within_the_models_positions_and_reaches_the_limit(capsys):
    """k3-nano has 2,048 positions: the 4,096-token default context shrinks to them, and a sequence of
    exactly the limit is planned."""
    runs = []
    for extra in ([], ["--input-len", "2000", "--output-len", "48"]):
        assert main(["plan", "-m", "k3-nano", "--chip", "h200", "--chips", "1", "--tp", "1", *extra, "--json"]) == 0
        runs.append(json.loads(capsys.readouterr().out))
    assert runs[0]["context"] == 2048 and runs[0]["fits"]
    assert runs[1]["context"] == 2000 + 48 // 2


def test_pipeline_layout_in_json(capsys):
    argv = ["plan", "-m", "kimi-k3", "--chip", "gb200", "--chips", "16", "--tp", "8", "--pp", "2", "--batch", "8"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layout"] == {"tp": 8, "dp": 1, "ep": 1, "pp": 2, "dcp": 1, "ranks": 16, "devices_per_chip": 1}
    assert any(c["kind"] == "send" for c in out["collectives"]) and out["fits"]


def test_a_negative_context_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "-m", "kimi-k3", "--chip", "b300", "--chips", "8", "--context", "-3"])
    assert e.value.code == 2
    assert "--context: expected a non-negative integer, got -3" in capsys.readouterr().err


def test_serving_benchmark_spellings_plan_the_same_deployment(capsys):
    """vLLM-style layout names, --concurrency and a benchmark's input / output lengths (mean context while
    decoding = input + output / 2) give the same plan as the planner's own flags."""
    runs = {}
    for name, argv in {
        "planner": ["--tp", "4", "--dp", "2", "--ep", "8", "--batch", "12", "--context", "3000"],
        "serving": [
            "--tensor-parallel-size",
            "4",
            "--data-parallel-size",
            "2",
            "--expert-parallel-size",
            "8",
            "--concurrency",
            "12",
            "--input-len",
            "2501",
            "--output-len",
            "999",
        ],
    }.items():
        assert main(["plan", "-m", "kimi-k3", "--chip", "b200", "--chips", "8", *argv, "--json"]) == 0
        runs[name] = json.loads(capsys.readouterr().out)
    assert runs["serving"]["context"] == 2501 + 999 // 2 == runs["planner"]["context"]
    assert runs["serving"]["layout"] == runs["planner"]["layout"]
    assert runs["serving"]["ms_per_token"] == runs["planner"]["ms_per_token"]


def test_vllm_and_sglang_layout_spellings_mean_their_engines_layouts(capsys):
    """vLLM's --enable-expert-parallel spreads the experts over tp x dp ranks; SGLang's --enable-dp-attention
    reads --tp as the stage's ranks split into --dp attention groups (its --tp 8 --dp 8 is 8 ranks)."""

    def layout(*flags):
        assert main(["plan", "-m", "kimi-k2", "--chip", "h200", "--chips", "8", "--batch", "8", *flags, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        return out["layout"]["tp"], out["layout"]["dp"], out["layout"]["ep"], out["ms_per_token"]

    assert layout("--tp", "8", "--enable-expert-parallel") == layout("--tp", "8", "--ep", "8")
    assert layout("--tp", "4", "--dp", "2", "--enable-expert-parallel")[:3] == (4, 2, 8)
    sglang = layout("--tp-size", "8", "--dp-size", "8", "--enable-dp-attention", "--ep-size", "8")
    assert sglang == layout("--tp", "1", "--dp", "8", "--ep", "8") and sglang[:3] == (1, 8, 8)
    assert layout("--tp", "8", "--dp", "2", "--enable-dp-attention")[:3] == (4, 2, 1)  # experts TP over the 8


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--enable-dp-attention"], "--enable-dp-attention needs --dp"),
        (["--tp", "8", "--dp", "8", "--ep", "4", "--enable-expert-parallel"], "over all 64 ranks; --ep 4"),
    ],
)
def test_layout_spellings_that_contradict_are_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "-m", "kimi-k2", "--chip", "h200", "--chips", "64", *flags])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_batch_split_unevenly_over_attention_groups_is_said(capsys):
    base = ["plan", "-m", "kimi-k2", "--chip", "h200", "--chips", "8", "--tp", "2", "--dp", "4"]
    assert main([*base, "--batch", "9"]) == 0
    assert "9 sequences over 4 attention groups: the fullest holds 3" in capsys.readouterr().out
    assert main([*base, "--batch", "8"]) == 0
    assert "attention groups: the fullest" not in capsys.readouterr().out


def test_the_drafters_cache_grows_with_the_context_up_to_its_window_and_is_read_each_step():
    """A DSpark drafter attends (and caches) only its last 2,048 context positions: its memory grows with the
    context and then stops, per sequence; its step reads that cache besides its weights."""
    from nonstop.config import ModelConfig
    from nonstop.plan.layout import Layout
    from nonstop.plan.predict import Spec, predict
    from nonstop.plan.workload import build_workload

    k3 = build_workload(ModelConfig.preset("kimi-k3"), "kimi-k3")
    chip, layout, spec = get_chip("b300"), Layout(8), Spec(3.0, 7)

    def draft(batch, context):
        p = predict(k3, chip, layout, batch, context, spec)
        return p.resident["draft"], p.time.draft_ms

    (m_1k, t_1k), (m_2k, t_2k), (m_9k, t_9k) = draft(5, 1024), draft(5, 2048), draft(5, 9000)
    per_token = 5 * 5 * 2 * 16 * 64 * 2 / 8  # 5 sequences, split over 8 ranks
    assert m_2k - m_1k == pytest.approx(1024 * per_token)
    assert m_9k == pytest.approx(m_2k)
    assert t_1k < t_2k == pytest.approx(t_9k)
    assert draft(10, 2048)[0] - m_2k == pytest.approx(2048 * per_token)
