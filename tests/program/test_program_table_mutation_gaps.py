"""``nonstop program``'s printed tables against hand arithmetic on k3-nano (d 256, vocab 6144, MoE of 8 experts
with a 128-wide latent and 128-wide experts): the per-op columns in their places, the total row, the headline,
the super-op count, and the rank view's weights per rank, collectives and all-to-all line."""

from __future__ import annotations

import pytest
import torch

from nonstop.cli import main


def _table(out: str) -> tuple[dict[str, list[str]], list[str]]:
    """({op name: [kind, weights, read, written, FLOPs, tiles]}, the total row's [weights, ..., tiles])."""
    rows, total = {}, None
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 7 and parts[0] != "op":
            rows[parts[0]] = parts[1:]
        elif len(parts) == 6 and parts[0] == "total":
            total = parts[1:]
    return rows, total


def test_one_layer_table_against_hand_arithmetic(capsys):
    assert main(["program", "--num-layers", "1", "--rows", "2", "--context", "10"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "decode program of k3-nano (kimi_k3, 1 layer, bfloat16), 2 row(s), context 10"
    rows, total = _table(out)
    # lm_head: 6144 x 256 bf16 = 3,145,728 B streamed; read adds 2 rows x 256 bf16 inputs (3,146,752); written:
    # 2 rows x 6144 fp32 logits = 49,152 B; FLOPs 2 x 6144 x 256 x 2 = 6,291,456; tiles 6144 / 64 = 96
    assert rows["lm_head"] == ["lm_head", "3.15M", "3.15M", "49.2K", "6.29M", "96"]
    # embed: 2 gathered rows of 256 bf16 (1024 B) read with their 2 int64 ids (+16 B), written as bf16
    assert rows["embed"] == ["embed", "1.02K", "1.04K", "1.02K", "0", "2"]
    # the total row: tiles add up over the rows; the byte and FLOP columns are the sums in their places
    assert int(total[4]) == sum(int(r[5]) for r in rows.values())
    from nonstop.commands.common import human
    from nonstop.program.count import decode_program
    from nonstop.weights.resolve import resolve_model

    cfg, _ = resolve_model("k3-nano")
    program, _, _ = decode_program(cfg.with_num_layers(1), torch.bfloat16)
    costs = [op.cost(2, 10) for op in program.ops]
    sums = [human(sum(getattr(c, f) for c in costs)) for f in ("weight_bytes", "bytes_read", "bytes_written", "flops")]
    assert total[:4] == sums
    assert out.splitlines()[-1].endswith(f"super-ops per step: {len(rows)}")


def test_rank_view_of_an_uneven_expert_split(capsys):
    """--ep 3: 8 experts as 3, 3, 2 on ranks 0, 1, 2; one expert is 3 x 128 x 128 bf16 = 98,304 B; the whole
    2-layer model 9,317,312 B (every rank holds all but the experts): 8,825,792 B with 3 experts, 8,727,488 B
    with 2, 26,379,072 B on the 3 ranks together."""
    assert main(["program", "--summary", "--ep", "3", "--rank", "2", "--num-layers", "2"]) == 0
    out = capsys.readouterr().out
    assert "weights per rank: 8.73MB - 8.83MB (rank 2: 8.73MB; all ranks 26.4MB)" in out
    assert "1 row(s) per attention group (3 tokens per step)" in out
    # rank 2 sends its row's logits to rank 0 (6144 fp32 = 24,576 B) after 2 dispatch + 2 combine exchanges
    send = next(line.split() for line in out.splitlines() if line.strip().startswith("send"))
    assert send[2:5] == ["1", "24.6KB", "logits"]
    assert "total: 5 launches" in out


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ([], "static on cuda (the engine picks it: "),
        (["--exchange", "static"], "static on cuda (--exchange: "),
        (["--exchange", "dynamic"], "dynamic on cuda (--exchange: "),
    ],
)
def test_rank_view_names_who_chose_the_exchange_and_the_other_mode(flags, said, capsys):
    """The default device is cuda; the line names the mode, who chose it, and the other mode's flag. 3 layers
    of k3-nano: 2 MoE layers, each a dispatch and a combine; --ep 2: 2 attention groups of 1 row, 2 tokens."""
    assert main(["program", "--summary", "--ep", "2", "--num-layers", "3", *flags]) == 0
    out = capsys.readouterr().out
    assert "1 row(s) per attention group (2 tokens per step)" in out
    assert "4 token exchanges (dispatch + combine: 2 per MoE layer x 2 MoE layers)" in out
    line = next(x for x in out.splitlines() if x.startswith("experts:"))
    assert said in line, line
    other = "dynamic" if said.startswith("static") else "static"
    assert line.endswith(f"--exchange {other} shows the other mode)"), line
