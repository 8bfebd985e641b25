"""``nonstop program``'s tables against hand arithmetic on k3-nano (d 256, vocab 6144, 6 KDA layers of 4 heads,
2 MLA layers of 4 heads): --rows and --context reach the figures printed, a --summary row adds up its ops'
tiles, and the rank view takes the engine's defaults and refuses a rank outside the layout."""

from __future__ import annotations

import pytest

from nonstop.cli import main


def _summary_rows(out: str) -> dict[str, list[str]]:
    """{'lm_head ×1': [weights, read, written, FLOPs, tiles], ...} from a --summary table."""
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 7 and parts[1].startswith("×"):
            rows[f"{parts[0]} {parts[1]}"] = parts[2:]
    return rows


def test_rows_reach_the_printed_costs(capsys):
    assert main(["program", "--summary", "--rows", "3", "--context", "7"]) == 0
    rows = _summary_rows(capsys.readouterr().out)
    assert rows["lm_head ×1"][3] == "9.44M"  # 2 * 6144 * 256 * 3 = 9,437,184 FLOPs
    assert rows["embed ×1"][0] == "1.54K"  # 3 rows of 256 bf16 values = 1536 B
    assert rows["embed ×1"][4] == "3"  # one tile per row
    assert rows["kda_core ×6"][4] == "72"  # 6 layers x 3 sequences x 4 heads
    assert rows["lm_head ×1"][4] == "96"  # 6144 / 64


def test_rank_view_passes_the_context_on(capsys):
    """--tp 2: 2 of the 4 MLA heads per rank; context 300 + the new token = 301 keys = 2 splits of 256, plus one
    combine tile per head: 2 + 2 per layer, 2 MLA layers."""
    assert main(["program", "--summary", "--tp", "2", "--context", "300"]) == 0
    assert _summary_rows(capsys.readouterr().out)["mla_attn ×2"][4] == "8"


@pytest.mark.parametrize(("device", "chunks"), [("cpu", 1), ("cuda", 2)])
def test_rank_view_takes_the_engines_chunks_for_the_device(device, chunks, capsys):
    assert main(["program", "--summary", "--tp", "2", "--device", device]) == 0
    assert f"MoE exchange in {chunks} chunk(s)" in capsys.readouterr().out


def test_rank_outside_the_layout_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["program", "--summary", "--tp", "2", "--rank", "2"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err and "--rank must be in 0..1, got 2" in err, err
