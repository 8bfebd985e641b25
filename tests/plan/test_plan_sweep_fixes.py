"""Fixes from a sweep of ``nonstop plan``: a tied LM head held once, the embedding and LM head priced in bf16
beside quantised weights, --list-chips --json and its refusals, --measured refusing default-valued flags,
uncut measured runs, the attention-weight format in the report header, chip-file errors, chip names."""

from __future__ import annotations

import json

import pytest

from nonstop.cli import main
from nonstop.config import ModelConfig, preset_hf_dict
from nonstop.plan.chips import CATALOGUE, ChipError, chip_from_entry, get_chip
from nonstop.plan.layout import Layout, rank_workload, resident_bytes
from nonstop.plan.measured import Measurement
from nonstop.plan.report import measured_table
from nonstop.plan.workload import Precision, build_workload
from tests.tiny_configs import DEEPSEEK

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _run(capsys, *argv) -> str:
    assert main(["plan", *argv]) == 0
    return capsys.readouterr().out


def _refused(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        main(["plan", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("nonstop: error:")
    return err


# ----------------------------------------------------------------------------- a tied LM head


def _llama_params(tp: int = 1) -> int:
    """Llama 3.2 1B's parameters a rank of ``tp`` holds, counted from its config.json: the tied embedding
    once (vocabulary rows split tp ways), per layer q / k / v / o and gate / up / down (split tp ways) and
    two norms (whole), and the final norm."""
    c = preset_hf_dict("llama-3.2-1b")
    h, hd, layers = c["hidden_size"], c["head_dim"], c["num_hidden_layers"]
    attention = h * hd * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])
    mlp = 3 * h * c["intermediate_size"]
    return c["vocab_size"] * h // tp + layers * ((attention + mlp) // tp + 2 * h) + h


def _llama_bytes(tp: int = 1) -> int:
    """A rank's bf16 weights, plus each layer's rotary inverse frequencies (head_dim / 2 fp32 values) that
    the engine keeps beside them."""
    c = preset_hf_dict("llama-3.2-1b")
    return 2 * _llama_params(tp) + c["num_hidden_layers"] * c["head_dim"] // 2 * 4


@pytest.fixture(scope="module")
def llama():
    return build_workload(ModelConfig.preset("llama-3.2-1b"), "llama-3.2-1b")


def test_a_tied_head_is_held_once_and_streamed_every_step(llama):
    c = preset_hf_dict("llama-3.2-1b")
    assert c["tie_word_embeddings"]
    assert llama.total_weight_bytes() == _llama_bytes()  # 2.47 GB in bf16, as `nonstop info` says
    head = next(o for o in llama.ops if o.kind == "lm_head")
    assert head.weight_bytes == 2 * (c["vocab_size"] + 1) * c["hidden_size"]  # the table and the final norm
    assert llama.active_weight_bytes() == _llama_bytes()  # the head read once a step, the embedding gathered


def test_a_tied_head_is_held_once_by_every_rank(llama):
    layout = Layout(2)
    rank = rank_workload(llama, layout)
    assert resident_bytes(rank, layout, 1, 0)["weights"] == _llama_bytes(tp=2)


def test_the_cli_counts_a_tied_head_once(capsys):
    out = json.loads(_run(capsys, "-m", "llama-3.2-1b", "--chip", "h100", "--chips", "1", "--tp", "1", "--json"))
    assert out["bytes_per_chip_detail"]["weights"] == _llama_bytes()


def test_an_untied_head_is_held_beside_the_embedding():
    c = preset_hf_dict("llama-3.2-1b")
    untied = build_workload(ModelConfig.from_hf_dict({**c, "tie_word_embeddings": False}), "untied")
    assert untied.total_weight_bytes() == _llama_bytes() + 2 * c["vocab_size"] * c["hidden_size"]


# ----------------------------------------------------------------------------- embedding and head in bf16


def _fp8_deepseek(tmp_path) -> ModelConfig:
    raw = {**DEEPSEEK, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return ModelConfig.from_file(tmp_path)


@pytest.mark.parametrize(
    "precision",
    [None, Precision("nvfp4", "nvfp4", attention="bf16"), Precision("fp8", "bf16")],
    ids=["fp8-release", "nvfp4-export", "weights-fp8"],
)
def test_the_embedding_and_head_stay_bf16_beside_quantised_weights(tmp_path, precision):
    """DeepSeek's fp8 release and nvidia's NVFP4 export keep embed_tokens and lm_head in bf16."""
    cfg = _fp8_deepseek(tmp_path)
    w = build_workload(cfg, "dsv3", precision)
    assert w.precision.dense in ("fp8", "nvfp4")
    v, h = DEEPSEEK["vocab_size"], DEEPSEEK["hidden_size"]
    ops = {o.kind: o for o in w.ops}
    assert ops["embed"].held_bytes == 2 * v * h and ops["embed"].dtype == "bf16"
    assert ops["lm_head"].weight_bytes == 2 * v * h + 2 * h and ops["lm_head"].dtype == "bf16"  # + its norm


def test_fp32_weights_keep_the_embedding_and_head_in_fp32(llama):
    """A CPU plan's fp32 weights are fp32 everywhere (the measured runs hold the table in fp32)."""
    c = preset_hf_dict("llama-3.2-1b")
    fp32 = build_workload(ModelConfig.preset("llama-3.2-1b"), "llama", Precision("fp32", "fp32"))
    head = next(o for o in fp32.ops if o.kind == "lm_head")
    assert head.weight_bytes == 4 * c["vocab_size"] * c["hidden_size"] + 2 * c["hidden_size"]  # + its bf16 norm


# ----------------------------------------------------------------------------- --list-chips


def test_list_chips_json_is_one_object_of_the_catalogue(capsys):
    out = json.loads(_run(capsys, "--list-chips", "--json"))
    raw = json.loads(CATALOGUE.read_text())
    assert set(out) == {k for k in raw if not k.startswith("_")}
    assert out["h200"]["hbm_gb"] == raw["h200"]["hbm_gb"] and out["h200"]["tflops"] == raw["h200"]["tflops"]
    assert out["h200"]["sources"]["hbm_gb"] == raw["h200"]["sources"]["hbm_gb"]
    assert out["cpu"]["kind"] == "cpu"


def test_list_chips_refuses_the_flags_it_ignores(capsys):
    err = _refused(capsys, "--list-chips", "-m", "kimi-k3", "--chips", "4", "--chip", "h200")
    assert "--list-chips" in err and "-m" in err and "--chips" in err and "--chip," in err


# ----------------------------------------------------------------------------- --measured and defaults


@pytest.mark.parametrize(
    "flag, value", [("-m", "kimi-k3"), ("--batch", "1"), ("--top", "5"), ("--sharding", "production")]
)
def test_measured_refuses_an_ignored_flag_even_at_its_default(capsys, flag, value):
    err = _refused(capsys, "--chip", "h200", "--measured", flag, value)
    assert f"ignores {flag}:" in err


def test_the_defaults_still_apply_without_the_flags(capsys):
    header = _run(capsys, "--chip", "h200", "--chips", "16", "--tp", "16").splitlines()[:2]
    assert header[0].startswith("kimi-k3 on 16 x h200") and "production sharding" in header[0]
    assert header[1].startswith("batch 1 sequence(s)")


# ----------------------------------------------------------------------------- report text


def test_the_measured_table_keeps_every_digit_of_a_long_run_name():
    what = "kimi-linear-48b-a3b (9/27 layers), megakernel, batch 1, bf16, context 132"
    m = Measurement("decode_x.json", what, 1, "bfloat16", 3.26, 306.7, cpu="a CPU with a rather long name v4")
    table = measured_table([{"measurement": m, "predicted_ms_per_token": 0.70}])
    row = table.splitlines()[1]
    assert row.startswith(what + " ") and "a CPU with a rather long name v4 " in row


def test_the_header_names_the_attention_weight_format(capsys):
    out = _run(capsys, "-m", "amd/Kimi-K2-Thinking-MXFP4-AttnFP8", "--chip", "mi355x", "--chips", "8", "--tp", "8")
    assert "attention weights fp8" in out.splitlines()[1]
    out = _run(capsys, "-m", "kimi-k3", "--chip", "b300", "--chips", "8", "--tp", "8", "--attention-weights", "fp8")
    assert "attention weights fp8" in out.splitlines()[1]
    out = _run(capsys, "-m", "kimi-k3", "--chip", "b300", "--chips", "8", "--tp", "8")
    assert "attention weights" not in out.splitlines()[1]  # as the dense weights: nothing to add


def test_a_small_model_is_sized_in_mb_not_zero_gb(capsys):
    out = _run(capsys, "-m", "k3-nano", "--chip", "h100", "--chips", "1", "--tp", "1")
    memory = next(line for line in out.splitlines() if line.startswith("memory per chip"))
    assert " MB of " in memory and "0.0 GB" not in out


# ----------------------------------------------------------------------------- chips


def _entry(**change) -> dict:
    return {**json.loads(CATALOGUE.read_text())["h100"], **change}


def test_sources_must_be_an_object_not_a_string_naming_every_figure():
    every_path = " ".join(_entry()["sources"])  # a string holding every figure's path as a substring
    with pytest.raises(ChipError, match=r"chip 'x1': sources must be an object .* got a string"):
        chip_from_entry("x1", _entry(sources=every_path))


def test_a_bad_executor_in_a_chip_file_names_the_file_and_the_chip(tmp_path, capsys):
    path = tmp_path / "chips.json"
    path.write_text(json.dumps({"x1": _entry(executor="warp")}))
    with pytest.raises(ChipError, match=rf"chip file {path}: chip 'x1': executor must be one of kernels"):
        get_chip("x1", path)
    err = _refused(capsys, "--list-chips", "--chip-file", str(path))
    assert str(path) in err and "'warp'" in err


def test_nvl72_names_a_rack_not_an_hgx_board():
    with pytest.raises(ChipError, match="not an NVL72 rack; the B200 of an NVL72 rack is the catalogue's gb200"):
        get_chip("B200 NVL72")
    assert get_chip("GB200 NVL72").key == "gb200" and get_chip("gb300-nvl72").key == "gb300"


def test_an_unknown_chip_is_answered_with_the_nearest_name():
    with pytest.raises(ChipError, match=r"unknown chip 'h1000' \(did you mean h100\?\)"):
        get_chip("h1000")
    with pytest.raises(ChipError) as e:
        get_chip("zzz")
    assert "did you mean" not in str(e.value)


# ----------------------------------------------------------------------------- model names


def test_a_release_under_another_publisher_is_refused(capsys):
    err = _refused(capsys, "-m", "nvidia/kimi-k2.5", "--chip", "b200", "--chips", "8", "--tp", "8")
    assert "nvidia/kimi-k2.5 is not a release" in err and "moonshotai/kimi-k2.5" in err
    for name in ("moonshotai/Kimi-K2.5", "Kimi-K2.5"):
        out = json.loads(_run(capsys, "-m", name, "--chip", "b200", "--chips", "8", "--tp", "8", "--json"))
        assert out["precision"]["experts"] == "int4"
