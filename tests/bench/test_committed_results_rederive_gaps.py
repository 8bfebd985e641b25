"""The committed ``bench/results/*.json`` re-derived by hand from their own raw fields: every floor is its bytes per
token over its copy bandwidth, every tokens/s its tokens over its time, every ratio the right way round, every best
and median the best and median of the runs it lists, every GB/s its bytes over its microseconds. A result whose
derived figures cannot be recomputed from what it records (a stale file, a formula changed after the run) fails."""

from __future__ import annotations

import json
import statistics

import pytest

from tests.bench_script import BENCH_DIR

RESULTS = BENCH_DIR / "results"


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _floors(obj, where=""):
    """Every {copy_GBps, bytes_per_token, floor_ms_per_token, floor_tokens_per_s} dict inside ``obj``."""
    if isinstance(obj, dict):
        if {"copy_GBps", "bytes_per_token", "floor_ms_per_token", "floor_tokens_per_s"} <= obj.keys():
            yield where, obj
        for key, value in obj.items():
            yield from _floors(value, f"{where}.{key}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _floors(value, f"{where}[{i}]")


FLOOR_FILES = sorted(p.name for p in RESULTS.glob("*.json") if any(_floors(json.loads(p.read_text()))))


@pytest.mark.parametrize("name", FLOOR_FILES)
def test_every_recorded_floor_is_its_bytes_over_its_copy_bandwidth(name):
    """floor ms = bytes / (GB/s x 1e9) x 1e3 and floor tokens/s = 1000 / floor ms, to the rounding of the
    recorded copy bandwidth (2 decimals): catches a floor in the wrong unit (GiB, us), inverted, or a copy
    bandwidth that is not the one the floor used."""
    found = list(_floors(_load(name)))
    assert found
    for where, f in found:
        copy = f["copy_GBps"]
        slack = 0.006 / copy + 1e-3  # the copy bandwidth is stored to 2 decimals, the floor to 3-4 digits
        ms = f["bytes_per_token"] / (copy * 1e9) * 1e3
        assert f["floor_ms_per_token"] == pytest.approx(ms, rel=slack, abs=5.1e-4), where  # 3 decimals at least
        assert f["floor_tokens_per_s"] == pytest.approx(1e3 / ms, rel=slack, abs=0.051), where


PEER_FILES = sorted(p.name for p in RESULTS.glob("cpu_peers*.json"))


@pytest.mark.parametrize("name", PEER_FILES)
def test_cpu_peers_rows_rederive_from_their_rounds(name):
    """tokens/s = the best round; floor = best copy GB/s / bytes per token; percent = tokens/s / floor; the ratio
    nonstop / llama.cpp from the two rows' tokens/s (> 1: nonstop faster), each round's ratio from the two rounds
    and its median: catches a ratio the wrong way round, a median of the wrong list, a floor at the worse copy."""
    run = _load(name)
    best_copy = run["copy_GBps_best"]
    assert best_copy == max(run["copy_GBps"])
    for group in ("llama", "k3_nano"):
        for system, row in run[group]["systems"].items():
            if "tokens_per_s" not in row:
                continue
            assert row["tokens_per_s"] == max(row["rounds"]), system
            floor = best_copy * 1e9 / row["bytes_per_token"]
            assert row["floor_tokens_per_s"] == pytest.approx(floor, rel=0.003, abs=0.06), system
            assert row["percent_of_floor"] == pytest.approx(100 * row["tokens_per_s"] / floor, abs=0.16), system
    systems = run["llama"]["systems"]
    for key, ratio in run["nonstop_over_llama_cpp"].items():
        ours, theirs = (systems[n] for n in key.split(" / "))
        assert ratio == pytest.approx(ours["tokens_per_s"] / theirs["tokens_per_s"], abs=0.0051), key
    for key, paired in run.get("nonstop_over_llama_cpp_paired", {}).items():
        ours, theirs = (systems[n] for n in key.split(" / "))
        per_round = [a / b for a, b in zip(ours["rounds"], theirs["rounds"])]
        assert paired["per_round"] == pytest.approx(per_round, abs=6e-4), key
        assert paired["median"] == pytest.approx(statistics.median(paired["per_round"]), abs=6e-4), key


def test_cpu_peers_bytes_per_token_follow_the_documented_formats():
    """fp32 4, bf16/f16 2, nonstop int8 1 + 4/128, llama.cpp q8_0 34/32 bytes per weight (cpu_peers' help): the
    rows of one run scale from the fp32 row by exactly those factors."""
    factors = {"fp32": 1.0, "f32": 1.0, "bf16": 0.5, "f16": 0.5, "int8": (1 + 4 / 128) / 4, "q8_0": 34 / 32 / 4}
    for name in PEER_FILES:
        systems = _load(name)["llama"]["systems"]
        fp32 = systems["nonstop reference fp32"]["bytes_per_token"]
        for system, row in systems.items():
            if "bytes_per_token" in row:
                fmt = system.split()[-1]
                assert row["bytes_per_token"] == pytest.approx(fp32 * factors[fmt], rel=1e-9), (name, system)


def test_cpu_gemv_rates_are_weight_bytes_over_microseconds():
    """GB/s = weight bytes / us / 1e3 (fp32 4 N K, bf16 2 N K, int8 N K + 4 N K / 128 scales) and the weights
    cycled fill the working set in MB of 1e6 bytes: catches GiB for GB, bits for bytes, scales left out."""
    run = _load("cpu_gemv.json")
    for row in run["rows"]:
        n, k = row["N"], row["K"]
        scales = 4 * n * (k // 128 if k % 128 == 0 else 1)
        weight_bytes = {
            "torch fp32": 4 * n * k,
            "tiled fp32 4K pages": 4 * n * k,
            "tiled fp32": 4 * n * k,
            "tiled bf16": 2 * n * k,
            "tiled int8": n * k + scales,
        }
        for way, nbytes in weight_bytes.items():
            assert row[way]["GBps"] == pytest.approx(nbytes / (row[way]["us"] * 1e3), abs=0.011), (n, k, way)
        if "weights_cycled" in row:  # runs before each format filled the working set in its own bytes: fp32's
            assert row["weights_cycled"] == max(1, int(run["working_set_MB"] * 1e6 // (4 * n * k)))
        for way, nbytes in weight_bytes.items():
            if "weights_cycled" in row[way]:
                assert row[way]["weights_cycled"] == max(1, int(run["working_set_MB"] * 1e6 // nbytes)), (n, k, way)


@pytest.mark.parametrize("name", sorted(p.name for p in RESULTS.glob("spec_decode_*.json")))
def test_spec_decode_modes_rederive(name):
    """tokens/s = tokens / time; tau = tokens / verify steps; acceptance = accepted / drafted; speedup = plain time /
    speculative time (> 1: faster); and every verify step emits its accepted drafts plus one token, so accepted +
    steps = decoded tokens: catches an inverted speedup, tau over drafted tokens, a first token counted."""
    for set_name, result in _load(name)["results"].items():
        plain = result["modes"]["plain"]
        assert plain["decode_tokens"] == result["prompts"] * (_load(name)["max_tokens"] - 1)
        for mode, row in result["modes"].items():
            where = (set_name, mode)
            rate = row["decode_tokens"] / row["decode_time_s"]  # older files: times summed from ms-rounded ones
            assert row["decode_tokens_per_s"] == pytest.approx(rate, rel=1e-3), where
            if mode == "plain":
                continue
            assert row["decode_tokens"] == plain["decode_tokens"], where
            assert row["accepted_tokens"] + row["verify_steps"] == row["decode_tokens"], where
            assert row["mean_accepted_length"] == pytest.approx(row["decode_tokens"] / row["verify_steps"], abs=6e-4)
            assert row["draft_acceptance"] == pytest.approx(row["accepted_tokens"] / row["drafted_tokens"], abs=6e-4)
            speedup = plain["decode_time_s"] / row["decode_time_s"]
            assert row["speedup_over_plain"] == pytest.approx(speedup, abs=2e-3), where


def test_cpu_busy_best_median_and_share_of_floor():
    """best = max and median = the median of the runs listed; busy percent of floor = busy median / floor."""
    run = _load("cpu_busy.json")
    floor = run["floor"]["floor_tokens_per_s"]
    for name, conf in run["configurations"].items():
        for when in ("quiet", "busy"):
            runs = conf["all_runs"][when]
            assert conf[f"{when}_tokens_per_s"]["best"] == max(runs), (name, when)
            assert conf[f"{when}_tokens_per_s"]["median"] == statistics.median(runs), (name, when)
        share = 100 * conf["busy_tokens_per_s"]["median"] / floor
        assert conf["busy_percent_of_floor"] == pytest.approx(share, abs=0.051), name


def test_cpu_decode_and_direct_call_derived_figures():
    """cpu_decode: each engine's figure is the median of its runs, the ratio nonstop / transformers; the bytes per
    token are 4 bytes a weight (fp32) of the active parameters plus one embedding row. cpu_direct_call: saved =
    through torch.compile - direct, at the min and at the median."""
    run = _load("cpu_decode.json")
    rows = run["results"]
    for row in rows.values():
        assert row["decode_tokens_per_s"] == statistics.median(row["runs"])
    ratio = rows["nonstop_reference"]["decode_tokens_per_s"] / rows["transformers_generate"]["decode_tokens_per_s"]
    assert run["ratio_nonstop_over_transformers"] == pytest.approx(ratio, rel=1e-12)
    hidden = run["model"]["hf_config"]["hidden_size"]
    assert run["model"]["weight_bytes_per_token"] == 4 * (run["model"]["active_params"] + hidden)
    assert run["bandwidth_floor"]["bytes_per_token"] == run["model"]["weight_bytes_per_token"]
    direct = _load("cpu_direct_call.json")
    calls = direct["per_call"]
    for stat in ("min_us", "median_us"):
        saved = calls["through torch.compile"][stat] - calls["direct"][stat]
        assert direct["saved_per_call_us"][stat] == pytest.approx(saved, abs=0.051)


def test_cpu_attention_ab_lists_kv_bytes_its_script_computes_now():
    """DEFECT (fails on the committed file): ``kv_bytes_per_token_at_context`` must be what ``kv_bytes_at`` gives
    for the recorded checkpoint and context (2 x layers x kv heads x head_dim x 4 bytes x context). The committed
    run predates the fix to "at the context" and still lists context + tokens / 2 positions: 1,572,864 bytes at
    context 32 (64 positions, twice the right 786,432) and 25,362,432 at 1,000 (1,032 positions; right: 24,576,000).
    Re-run ``bench/cpu_attention_ab.py`` (or correct the two figures) to fix."""
    import re

    run = _load("cpu_attention_ab.json")
    shape = dict(re.findall(r"([a-z]+)(\d+)", run["checkpoint"].rsplit("/", 1)[-1]))
    hidden, layers, heads, kv_heads = (int(shape[k]) for k in ("h", "l", "a", "kv"))
    per_position = 2 * layers * kv_heads * (hidden // heads) * 4  # the held-out shape: 24,576 bytes
    for row in run["contexts"]:
        assert row["kv_bytes_per_token_at_context"] == per_position * row["context"], row["context"]


def test_decode_gpu_rows_and_extrapolation_rederive():
    """decode.py's committed GPU runs: achieved GB/s = bytes read per token / ms, MBU = achieved / copy GB/s, the
    floor from the bytes read; the per-layer slope (t_N - t_1) / (N - 1) and the full depth t_1 + (L - 1) x slope."""
    for path in sorted(RESULTS.glob("decode_*.json")):
        run = json.loads(path.read_text())
        copy = run["bandwidth"]["copy_GBps"]
        for shape in run["shapes"]:
            timed = {}
            for sl in shape["slices"]:
                for t in sl["timings"]:
                    assert t["floor"]["bytes_per_token"] == t["bytes_read_per_token"]
                    for row in t["rows"]:
                        achieved = t["bytes_read_per_token"] / (row["ms_per_token"] * 1e6)
                        assert row["achieved_GBps"] == pytest.approx(achieved, rel=1e-6), (path.name, row["row"])
                        if "mbu" in row:
                            assert row["mbu"] == pytest.approx(achieved / copy, rel=1e-6)
                        assert row["p10_ms"] <= row["ms_per_token"] <= row["p90_ms"]
                        timed[(sl["layers"], row["row"])] = (row["ms_per_token"], t["bytes_read_per_token"])
            extra = shape.get("extrapolation")
            if not extra:
                continue
            n, full = shape["layers_timed"], shape["full_layers"]
            for row in extra["rows"]:
                (t_n, b_n), (t_1, b_1) = timed[(n, row["row"])], timed[(1, row["row"])]
                slope = (t_n - t_1) / (n - 1)
                assert row["ms_per_layer"] == pytest.approx(slope, rel=1e-9)
                assert row["full_ms_per_token"] == pytest.approx(t_1 + (full - 1) * slope, rel=1e-9)
                assert row["full_bytes_per_token"] == pytest.approx(b_1 + (full - 1) * (b_n - b_1) / (n - 1), rel=1e-9)
