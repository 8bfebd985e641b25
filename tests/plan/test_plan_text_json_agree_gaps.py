"""``nonstop plan`` prints the same prediction two ways, as a report and with --json; nothing pinned that the
two say the same numbers (a report reading another field, or a unit slip in one of them, would pass)."""

from __future__ import annotations

import json
import re

import pytest

from nonstop.cli import main

ARGV = "plan -m kimi-k3 --chip b300 --chips 8 --tp 8 --batch 4 --input-len 1024 --output-len 256 --spec-accept 3"
ARGV = ARGV.split()


def _value(text: str, label: str) -> float:
    m = re.search(rf"^\s*{re.escape(label)}\s+([0-9.]+)", text, re.M)
    assert m, f"no {label!r} line in\n{text}"
    return float(m.group(1))


@pytest.fixture(scope="module")
def both():
    import contextlib
    import io

    outs = []
    for extra in ([], ["--json"]):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            assert main([*ARGV, *extra]) == 0
        outs.append(buf.getvalue())
    return outs[0], json.loads(outs[1])


def test_headline_figures_agree(both):
    """Catches the report and --json disagreeing on the headline: ms per step / token, tokens/s per user, in
    total and per chip, prefill and time to first token (report rounded to its printed digits)."""
    text, js = both
    assert _value(text, "ms per step") == pytest.approx(js["step_ms"], abs=6e-4)
    assert _value(text, "ms per token") == pytest.approx(js["ms_per_token"], abs=6e-4)
    assert _value(text, "tokens/s per user") == pytest.approx(js["tokens_per_s_per_user"], abs=0.06)
    assert _value(text, "tokens/s in total") == pytest.approx(js["tokens_per_s_total"], abs=0.06)
    per_chip = float(re.search(r"tokens/s in total.*\(([0-9.]+) per chip\)", text).group(1))
    assert per_chip == pytest.approx(js["tokens_per_s_per_chip"], abs=0.06)
    assert _value(text, "prefill, one prompt") == pytest.approx(js["prefill_ms"], abs=0.06)
    assert _value(text, "time to first token") == pytest.approx(js["ttft_ms"], abs=0.06)
    assert js["ms_per_token"] == pytest.approx(js["step_ms"] / js["spec"]["accept"])  # 3 tokens a step
    assert js["tokens_per_s_total"] == pytest.approx(js["batch"] * 1e3 / js["ms_per_token"])
    assert js["tokens_per_s_per_chip"] == pytest.approx(js["tokens_per_s_total"] / js["chips"])


def test_step_breakdown_agrees_and_adds_up(both):
    """Catches a breakdown line reading another term, or --json's breakdown_ms not adding up to step_ms: each
    line of "step time" equals its breakdown_ms entry (ms), and the entries sum to the step."""
    text, js = both
    b = js["breakdown_ms"]
    lines = {
        "weight streaming": b["weights"],
        "KV / KDA state reads": b["state_and_cache"],
        "expert fetch latency": b["expert_fetch"],
        "collectives": b["collectives"],
        "engine host loop per step": b["host"],
        "speculative draft": b["draft"],
    }
    for label, ms in lines.items():
        assert _value(text, label) == pytest.approx(ms, abs=6e-4), label
    launch = re.search(r"launch gaps \((\d+) kernels\)\s+([0-9.]+) ms", text)
    assert int(launch.group(1)) == js["kernels_per_step"]
    assert float(launch.group(2)) == pytest.approx(b["launch"], abs=6e-4)
    assert sum(b.values()) == pytest.approx(js["step_ms"], rel=1e-9)


def test_memory_and_collectives_agree(both):
    """Catches a unit slip between the report's GB and --json's bytes: the report's memory line is
    bytes_per_chip / 1e9, its split sums to bytes_per_chip, and the collectives' call count matches."""
    text, js = both
    m = re.search(r"memory per chip: ([0-9.]+) GB of ([0-9.]+) GB usable", text)
    assert float(m.group(1)) == pytest.approx(js["bytes_per_chip"] / 1e9, abs=0.6)
    assert float(m.group(2)) == pytest.approx(js["capacity_per_chip"] / 1e9, abs=0.6)
    assert sum(js["bytes_per_chip_detail"].values()) == pytest.approx(js["bytes_per_chip"])
    assert js["fits"] is (js["bytes_per_chip"] <= js["capacity_per_chip"]) and "-> fits" in text
    calls = int(re.search(r"collectives per step \((\d+) calls\)", text).group(1))
    assert calls == sum(c["count"] for c in js["collectives"])
    assert sum(c["latency_ms"] + c["bandwidth_ms"] for c in js["collectives"]) == pytest.approx(
        js["breakdown_ms"]["collectives"]
    )


def test_every_field_the_json_help_names_is_in_the_json(capsys):
    """``plan --help`` lists fields of --json's object: it named ``breakdown`` where the field is
    ``breakdown_ms``. Each name it gives must be a key of the object printed."""
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    listed = re.search(r"--json\s+print JSON: one object \(([^)]*)\)", help_text)
    assert listed, help_text
    names = [n.strip() for n in listed.group(1).replace("...", "").split(",") if n.strip()]
    assert len(names) >= 5, names
    assert main(ARGV + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [n for n in names if n not in data] == []
