"""The README's Benchmarks table quotes bench/results/*.json: every figure below is re-derived from its JSON
(rounded as the table rounds it) and must appear in the README as written. tests/test_readme_numbers.py covers
only the op counts, two bandwidth floors and the cpu_peers rows; these rows had no check, so a re-run that
rewrote a JSON, or an edit of the table, could leave the two disagreeing unnoticed."""

from __future__ import annotations

import json
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _readme() -> str:
    return " ".join((ROOT / "README.md").read_text().split())


def _doc(name: str) -> str:
    return " ".join((ROOT / "docs" / name).read_text().split())


def _json(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


_HALF_UP = [False]


def r(value: float, digits: int = 0, sep: bool = False) -> str:
    """``value`` rounded to ``digits`` decimals, with thousands separators when ``sep``: as Python formats the
    float, or (``_HALF_UP``) its shortest decimal rounded half up. The table uses both (11.35 -> 11.3, 21.95 ->
    22.0)."""
    if _HALF_UP[0]:
        value = Decimal(repr(value)).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    return f"{value:,.{digits}f}" if sep else f"{value:.{digits}f}"


def e(value: float) -> str:
    """``value`` in the table's short scientific form: 2.8e-2."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _assert_quoted(text: str, build, source: str) -> None:
    """Every fragment ``build()`` makes must be in ``text``, under one rounding or the other."""
    variants = []
    for half_up in (False, True):
        _HALF_UP[0] = half_up
        try:
            variants.append(build())
        finally:
            _HALF_UP[0] = False
    missing = [a for a, b in zip(*variants) if a not in text and b not in text]
    assert not missing, f"{source}: the doc does not quote these figures of the JSON: {missing}"


def test_cpu_decode_row_quotes_its_json():
    """cpu_decode.py's row: nonstop vs transformers tok/s, their ratio, and the floor with its copy bandwidth."""
    d = _json("cpu_decode.json")
    res, floor = d["results"], d["bandwidth_floor"]
    ours, theirs = (
        res["nonstop_reference"]["decode_tokens_per_s"],
        res["transformers_generate"]["decode_tokens_per_s"],
    )
    assert d["greedy_outputs_identical"] is True
    _assert_quoted(
        _readme(),
        lambda: [
            f"{r(ours, 1)} vs {r(theirs, 1)} tok/s ({r(ours / theirs, 2)}x), greedy identical",
            f"bandwidth floor {r(floor['floor_tokens_per_s'])} tok/s ({r(floor['bytes_per_token'] / 1e6)} MB/token "
            f"at a measured {r(floor['copy_GBps'], 1)} GB/s)",
            f"{d['threads']} threads",
        ],
        "cpu_decode.json",
    )


def test_spec_decode_row_quotes_its_json():
    """spec_decode.py's row: plain tok/s and floor, then tau and speedup of n-gram and DSpark at k=4."""
    d = _json("spec_decode_cpu_k3-nano.json")
    modes = d["results"]["heldout"]["modes"]
    ngram, dspark = modes["ngram-k4"], modes["dspark-k4"]
    assert all(m.get("greedy_identical_to_plain", True) for m in modes.values())
    _assert_quoted(
        _readme(),
        lambda: [
            f"plain {r(modes['plain']['decode_tokens_per_s'], 1)} tok/s "
            f"(floor {r(d['bandwidth_floor']['floor_tokens_per_s'])} tok/s)",
            f"n-gram k=4: τ {r(ngram['mean_accepted_length'], 2)}, {r(ngram['speedup_over_plain'], 2)}x",
            f"DSpark k=4: τ {r(dspark['mean_accepted_length'], 2)}, {r(dspark['speedup_over_plain'], 2)}x",
            f"{d['max_tokens']} tokens",
        ],
        "spec_decode_cpu_k3-nano.json",
    )


def test_cpu_busy_row_and_backend_paragraph_quote_their_json():
    """cpu_busy.py's row (busy / quiet medians of the three thread choices, copy and floor) and the cpu backend's
    paragraph, which repeats the busy medians."""
    d = _json("cpu_busy.json")
    c = d["configurations"]
    default, every, one = c["default"], c["all cores"], c["one thread"]
    busy = {k: v["busy_tokens_per_s"] for k, v in c.items()}
    readme = _readme()
    _assert_quoted(
        readme,
        lambda: [
            f"copy {r(d['floor']['copy_GBps'], 1)} GB/s, floor {r(d['floor']['floor_tokens_per_s'], sep=True)} tok/s",
            f"the default ({default['threads']['busy']} thread) {r(busy['default']['median'])} tok/s median",
            f"every core {r(busy['all cores']['median'])} (best {r(busy['all cores']['best'])})",
            f"one thread {r(busy['one thread']['median'])}",
            f"{r(default['quiet_tokens_per_s']['median'])} vs {r(one['quiet_tokens_per_s']['median'])} at one thread",
            f"k3-nano decodes {r(busy['default']['median'])} tok/s this way against {r(busy['all cores']['median'])}",
        ],
        "cpu_busy.json",
    )
    assert every["threads"]["busy"] == d["physical_cores"] == 2


def test_cpu_quality_row_quotes_its_json():
    """cpu_quality.py's row: perplexity per weight format, its change and the greedy agreement counts."""
    f = _json("cpu_quality.json")["formats"]
    g128, chan = f["int8 g128"], f["int8 per-channel"]
    _assert_quoted(
        _readme(),
        lambda: [
            f"fp32 {f['fp32']['perplexity']:.4f}",
            f"int8 per 128 columns {g128['perplexity']:.4f} ({g128['perplexity_change_percent']:.3f}%), "
            f"{g128['greedy_identical_prompts']} prompts identical "
            f"(mean identical prefix {r(g128['mean_identical_prefix_tokens'])}/32)",
            f"int8 per channel {chan['perplexity']:.4f} ({chan['perplexity_change_percent']:.3f}%), "
            f"{chan['greedy_identical_prompts']}",
        ],
        "cpu_quality.json",
    )
    assert f["bf16"]["perplexity"] == f["fp32"]["perplexity"]  # "bf16 lossless"


def test_serve_load_row_quotes_its_json():
    """serve_load.py's row: output tok/s batch-invariant and batched, and the batched TPOT p50."""
    inv = _json("serve_load_k3-nano_8c.json")["results"]
    bat = _json("serve_load_k3-nano_8c_batched.json")["results"]
    _assert_quoted(
        _readme(),
        lambda: [
            f"{r(inv['output_tokens_per_s'])} tok/s (batch-invariant), {r(bat['output_tokens_per_s'])} tok/s batched "
            f"(TPOT p50 {r(bat['tpot_s']['p50'] * 1000)} ms)"
        ],
        "serve_load_*.json",
    )


def _rows(name: str) -> dict:
    return {(x["tp"], x["ep"], x["batch"], x["overlap"], x.get("exchange")): x for x in _json(name)["rows"]}


def test_dist_decode_row_quotes_its_json():
    """dist_decode.py's row: not-overlapped tok/s of EP2 / EP4 / TP2xEP4 at batch 1 and 8 against the single
    process, the bytes on the wire at batch 1 and the floor."""
    d = _json("dist_decode_cpu_k3-nano.json")
    rows = _rows("dist_decode_cpu_k3-nano.json")
    layouts = [(1, 2), (1, 4), (2, 4)]
    b1 = [rows[(tp, ep, 1, False, None)] for tp, ep in layouts]
    b8 = [rows[(tp, ep, 8, False, None)] for tp, ep in layouts]
    single = d["single_process"]
    assert all(x["greedy_identical_to_single_process"] for x in rows.values())
    _assert_quoted(
        _readme(),
        lambda: [
            f"batch 1: EP2 {r(b1[0]['tokens_per_s'], 1)}, EP4 {r(b1[1]['tokens_per_s'], 1)}, "
            f"TP2xEP4 {r(b1[2]['tokens_per_s'], 1)} vs single {r(single['1'], 1)}",
            f"batch 8: {' / '.join(r(x['tokens_per_s']) for x in b8)} vs {r(single['8'])}",
            " / ".join(r(x["wire_bytes_per_token_per_rank"] / 1000, 1) for x in b1) + " KB on the wire",
            f"floor {r(d['bandwidth_floor_single_device']['floor_tokens_per_s'])} tok/s",
        ],
        "dist_decode_cpu_k3-nano.json",
    )
    # "overlapped in 2 chunks: slower on CPU except EP2 batch 1"
    for (tp, ep, batch, overlap, _), x in rows.items():
        if overlap:
            plain = rows[(tp, ep, batch, False, None)]["tokens_per_s"]
            assert (x["tokens_per_s"] > plain) == ((tp, ep, batch) == (1, 2, 1)), (
                tp,
                ep,
                batch,
            )


def test_dist_exchange_row_and_distributed_doc_quote_their_json():
    """dist_decode.py --exchanges' row in the README and its figures in docs/distributed.md: static vs dynamic
    tok/s, bytes per token, the cost model's figure, and 'static faster in all 8 measured configurations'."""
    d = _json("dist_decode_cpu_k3-nano_exchange.json")
    rows = _rows("dist_decode_cpu_k3-nano_exchange.json")

    def tok(tp, b, ex):
        return r(rows[(tp, 4, b, False, ex)]["tokens_per_s"], 1)

    st8 = rows[(1, 4, 8, False, "static")]
    dy8 = rows[(1, 4, 8, False, "dynamic")]
    single = d["single_process"]
    _assert_quoted(
        _readme(),
        lambda: [
            f"EP4 {tok(1, 8, 'static')} static vs {tok(1, 8, 'dynamic')} dynamic tok/s, "
            f"TP2xEP4 {tok(2, 8, 'static')} vs {tok(2, 8, 'dynamic')} (single {r(single['8'])})",
            f"batch 1: {tok(1, 1, 'static')} vs {tok(1, 1, 'dynamic')}, {tok(2, 1, 'static')} vs "
            f"{tok(2, 1, 'dynamic')} (single {r(single['1'], 1)})",
            f"static sends {r(st8['wire_bytes_per_token_per_rank'] / 1000, 1)} vs "
            f"{r(dy8['wire_bytes_per_token_per_rank'] / 1000, 1)} KB per token per rank",
            f"floor {r(d['bandwidth_floor_single_device']['floor_tokens_per_s'])} tok/s",
        ],
        "dist_decode_cpu_k3-nano_exchange.json",
    )
    _assert_quoted(
        _doc("distributed.md"),
        lambda: [
            f"EP 4 batch 8: {tok(1, 8, 'static')} vs {tok(1, 8, 'dynamic')} tok/s, "
            f"single process {r(single['8'])} tok/s",
            f"{r(st8['wire_bytes_per_token_per_rank'], 1, sep=True)} measured against "
            f"{r(st8['predicted_wire_bytes_per_token_per_rank'], sep=True)} B predicted",
        ],
        "dist_decode_cpu_k3-nano_exchange.json",
    )
    pairs = {k[:4] for k in rows}
    assert len(pairs) == 8
    for key in pairs:
        assert rows[(*key, "static")]["tokens_per_s"] > rows[(*key, "dynamic")]["tokens_per_s"], key


def test_dist_link_row_quotes_its_json():
    """dist_link.py's row: the fitted latency and bandwidth per world size and the host's copy bandwidth."""
    d = _json("dist_link_cpu.json")
    w = {x["world"]: x for x in d["rows"]}
    _assert_quoted(
        _readme(),
        lambda: [
            f"world 2: {r(w[2]['latency_us'])} us, {r(w[2]['bandwidth_GBps'], 2)} GB/s; "
            f"world 4: {r(w[4]['latency_us'] / 1000, 2)} ms, {r(w[4]['bandwidth_GBps'], 2)} GB/s; "
            f"copy {r(d['peer_copy_bandwidth']['copy_GBps'], 1)} GB/s"
        ],
        "dist_link_cpu.json",
    )


def test_cpu_attention_ab_row_quotes_its_json():
    """cpu_attention_ab.py's row: best and median tok/s of kernel and twin, the paired ratios and the floor."""
    d = _json("cpu_attention_ab.json")
    short, long = d["contexts"]
    assert short["context"] == 32 and long["context"] == 1000 and short["same_tokens"] and long["same_tokens"]

    def ratio(c):
        p = c["paired_ratio"]
        return f"{r(p['median'], 2)}x ({r(p['min'], 2)}-{r(p['max'], 2)}"

    _assert_quoted(
        _readme(),
        lambda: [
            f"weights floor {r(d['floor']['floor_tokens_per_s'], 1)} tok/s",
            f"copy {r(d['floor']['copy_GBps'], 1)} GB/s",
            f"{r(short['kernel_tok_s']['best'], 1)} vs {r(short['twin_tok_s']['best'], 1)} tok/s best, paired median "
            + ratio(short),
            f"{r(long['kernel_tok_s']['best'], 1)} vs {r(long['twin_tok_s']['best'], 1)} best, "
            f"{r(long['kernel_tok_s']['median'], 1)} vs {r(long['twin_tok_s']['median'], 1)} median, paired median "
            + ratio(long),
        ],
        "cpu_attention_ab.json",
    )


def test_routing_sensitivity_row_quotes_its_json():
    """routing_sensitivity.py's row: changed top-k sets and logit distances under bf16 for both models."""
    text = _readme()
    for name, sets in (("kimi-k3", "top-16"), ("kimi-linear-48b-a3b", "top-8")):
        d = _json(f"routing_sensitivity_cpu_{name}.json")
        bf16 = next(x for x in d["rows"] if "noise" in x)
        frag = f"{bf16['changed_topk_sets']} of {d['router_calls_x_tokens']}"
        assert frag in text, (name, frag)
        assert f"{r(bf16['rel_err_free_routing'], 3)} (" in text, name
        assert f"({r(bf16['rel_err_routing_forced'], 3)}" in text, name
        assert sets in text


def _decode(name: str) -> tuple[dict, dict, dict]:
    """(ms per token by row, floor, the first slice) of a decode.py run's first timed slice."""
    first = _json(f"decode_nvidia-h200-{name}.json")["shapes"][0]["slices"][0]
    timing = first["timings"][0]
    return {row["row"]: row for row in timing["rows"]}, timing["floor"], first


def test_gpu_decode_row_quotes_its_json():
    """decode.py's H200 row: ms per token per row and model, the floors, copy bandwidth and logit checks."""
    llama, lf, lslice = _decode("llama-3-2-1b")
    k3, kf, kslice = _decode("kimi-k3-slice")
    kl, klf, klslice = _decode("kimi-linear-48b-a3b")

    def ms(row, digits=2):
        return r(row["ms_per_token"], digits)

    _assert_quoted(
        _readme(),
        lambda: [
            f"copy {r(lf['copy_GBps'], sep=True)} GB/s",
            f"llama-3.2-1b superop {ms(llama['superop'])} ({r(llama['superop']['mbu'] * 100)}% of the copy bandwidth; "
            f"floor {r(lf['floor_ms_per_token'], 3)}), megakernel {ms(llama['megakernel'])}, peers eager "
            f"{ms(llama['eager'], 1)} and torch.compile (reduce-overhead) {ms(llama['compiled'], 1)} "
            f"({llama['compiled']['dynamo']['graph_breaks']} graph breaks",
            f"superop {ms(k3['superop'])}, megakernel {ms(k3['megakernel'])}, eager {ms(k3['eager'], 1)}, "
            f"floor {r(kf['floor_ms_per_token'], 2)}",
            f"first 9 layers {ms(kl['superop'])} / {ms(kl['megakernel'])} / {ms(kl['eager'], 1)}, "
            f"floor {r(klf['floor_ms_per_token'], 3)}",
            f"llama {e(lslice['check']['max_rel_err'])}, greedy {r(lslice['check']['greedy_agreement'] * 100)}%",
            f"the MoE slices {r(kslice['check']['max_rel_err'], 2)} "
            f"(greedy {r(kslice['check']['greedy_agreement'] * 100)}%)"
            f" and {r(klslice['check']['max_rel_err'], 2)} ({r(klslice['check']['greedy_agreement'] * 100)}%)",
        ],
        "decode_nvidia-h200-*.json",
    )


def test_op_check_row_quotes_its_json():
    """op_check.py's row: op counts per model, every op within 1.2e-2 and no NaN, one step's errors."""
    counts = {}
    for name in ("llama-3.2-1b", "kimi-k3-slice", "kimi-linear-48b-a3b"):
        d = _json(f"op_check_nvidia-h200_{name}.json")
        assert max(o["rel_err"] for o in d["ops"]) <= 1.2e-2 and not any(o["nan"] for o in d["ops"]), name
        counts[name] = (len(d["ops"]), d["step"])
    (n_l, step_l), (n_k, step_k), (n_kl, step_kl) = counts.values()
    _assert_quoted(
        _readme(),
        lambda: [
            f"llama-3.2-1b {n_l} ops, K3's 4 layers {n_k}, kimi-linear's 9 layers {n_kl}",
            f"llama superop = megakernel {e(step_l['superop']['rel_err'])}",
            f"K3 superop {e(step_k['superop']['rel_err'])} (twins {e(step_k['twins']['rel_err'])})",
            f"kimi-linear superop {r(step_kl['superop']['rel_err'], 2)} (twins {step_kl['twins']['rel_err']:.1f})",
        ],
        "op_check_nvidia-h200_*.json",
    )
