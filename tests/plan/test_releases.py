"""Released model names (``nonstop/plan/releases.py``): publisher ids and short names reach the planner's
configs, and the formats a release stores price the same as the flags that spell them out."""

import json

import pytest

from nonstop.cli import main
from nonstop.plan.releases import RELEASES, find_release, model_ref, release_formats
from nonstop.weights.resolve import resolve_model

BASE = ["--chip", "b200", "--chips", "8", "--tp", "8", "--batch", "3", "--context", "1500", "--json"]


def _plan(capsys, *argv):
    assert main(["plan", *argv, *BASE]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("key", sorted(RELEASES))
def test_every_release_resolves_to_a_model_the_planner_reads(key):
    cfg, _ = resolve_model(model_ref(key))
    assert cfg.hidden_size > 0
    assert find_release(key.upper()) is find_release(key.split("/")[1]) is RELEASES[key]


@pytest.mark.parametrize(
    "release, flags",
    [
        ("nvidia/Kimi-K3-NVFP4", ["-m", "kimi-k3", "--experts", "nvfp4"]),
        ("nvidia/Kimi-K2.5-NVFP4", ["-m", "kimi-k2-thinking", "--experts", "nvfp4"]),
        ("amd/Kimi-K2.5-MXFP4", ["-m", "kimi-k2-thinking", "--experts", "mxfp4"]),
        (
            "nvidia/DeepSeek-R1-0528-FP4-V2",
            ["-m", "deepseek-v3", "--weights", "nvfp4", "--experts", "nvfp4", "--attention-weights", "bf16"],
        ),
        ("moonshotai/Kimi-K2-Instruct-0905", ["-m", "kimi-k2"]),
        ("deepseek-ai/DeepSeek-R1-0528", ["-m", "deepseek-v3"]),
    ],
)
def test_a_release_prices_as_its_formats_spelled_out(release, flags, capsys):
    by_name, by_flags = _plan(capsys, "-m", release), _plan(capsys, *flags)
    assert by_name["precision"] == by_flags["precision"]
    assert by_name["bytes_per_chip"] == by_flags["bytes_per_chip"]
    assert by_name["ms_per_token"] == by_flags["ms_per_token"]


def test_flags_override_a_release_and_quantised_releases_weigh_less(capsys):
    nvfp4 = _plan(capsys, "-m", "nvidia/DeepSeek-R1-0528-FP4-V2")
    fp8 = _plan(capsys, "-m", "nvidia/DeepSeek-R1-0528-FP4-V2", "--weights", "fp8", "--experts", "fp8")
    released = _plan(capsys, "-m", "deepseek-ai/DeepSeek-R1")
    assert nvfp4["precision"]["experts"] == "nvfp4" and fp8["precision"]["experts"] == "fp8"
    assert fp8["precision"]["attention"] == "bf16"  # the flags named only the MLPs' formats
    # the MLPs (~95% of the parameters) go from 8 bits (+ block scales) to 4.5; attention from 8 to 16 bits
    assert nvfp4["bytes_per_chip"] < 0.65 * released["bytes_per_chip"]
    assert released["bytes_per_chip"] < fp8["bytes_per_chip"]  # the same, but its attention kept in bf16


def test_a_directory_is_read_as_it_is(tmp_path):
    assert release_formats(str(tmp_path)) == {} and model_ref(str(tmp_path)) == str(tmp_path)
    assert release_formats("no-such-model") == {} and model_ref("no-such-model") == "no-such-model"


def test_an_unknown_model_lists_what_the_planner_knows(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "-m", "moonshotai/Kimi-K9", *BASE])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "'moonshotai/Kimi-K9'" in err and "kimi-k2.5-nvfp4" in err and "deepseek-v3" in err
