"""The README's derived numbers, computed from their sources; the README quotes this script's output.

  op counts   super-ops vs eager aten ops of one decode step, as ``nonstop program`` counts them, for
              k3-nano and Kimi K3 (Kimi K3's eager ops are counted on its narrow twin: about a minute)
  floors      the bandwidth floor of each CPU benchmark in bench/results/: the copy bandwidth that run
              measured over the weight bytes per token of the current cost model (``program/footprint.py``)
  peers       one table row per ``bench/cpu_peers.py`` run in bench/results/ (oldest first): machine,
              Llama shape, copy bandwidth, nonstop over llama.cpp per precision, k3-nano's share of its floor
  versions    what the counts were taken with: Python, torch (its aten ops are the eager count), nonstop

    python bench/readme_numbers.py      # prints the README fragments, writes bench/results/readme_numbers.json
    python bench/readme_numbers.py --out /tmp/n.json    # the same, written elsewhere

``tests/test_readme_numbers.py`` recomputes the fast ones and checks that the README quotes them all.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch
from script_args import out_file, run  # bench/ is on sys.path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
OUT = RESULTS / "readme_numbers.json"
OP_COUNT_MODELS = {"k3-nano": "k3-nano", "kimi-k3": "Kimi K3"}  # model -> the README's name for it
FLOOR_RUNS = ("cpu_decode.json", "spec_decode_cpu_k3-nano.json")
PEER_RATIOS = tuple(
    f"nonstop cpu {ours} / llama.cpp {theirs}" for ours, theirs in (("fp32", "f32"), ("bf16", "f16"), ("int8", "q8_0"))
)
K3_NANO_CPU = "k3-nano nonstop cpu fp32"  # its default threads; a second row names its other thread count


def op_counts(model: str) -> dict:
    """{super_ops, eager_ops, counted_on} of ``model``'s batch-1 decode step (bf16, like ``nonstop program``)."""
    from nonstop.program.count import decode_program
    from nonstop.weights.resolve import resolve_model

    program, eager, counted_on = decode_program(resolve_model(model)[0], torch.bfloat16)
    return {"super_ops": len(program.ops), "eager_ops": eager, "counted_on": counted_on}


def super_ops(model: str) -> int:
    """Super-ops of ``model``'s decode step (lowered on the meta device: fast at any size)."""
    from nonstop.model.build import meta_model
    from nonstop.program.lower import lower
    from nonstop.weights.resolve import resolve_model

    return len(lower(meta_model(resolve_model(model)[0], torch.bfloat16)).ops)


def run_config(run: dict):
    """(ModelConfig, dtype) of the model a benchmark run measured."""
    from nonstop.config import ModelConfig
    from nonstop.weights.resolve import resolve_model

    model = run["model"]
    cfg = ModelConfig.from_hf_dict(model["hf_config"]) if isinstance(model, dict) else resolve_model(model)[0]
    return cfg, getattr(torch, run.get("dtype", "float32"))  # the CPU benchmarks' default dtype is fp32


def floor(name: str) -> dict:
    """The floor of the run ``bench/results/<name>``: its measured copy bandwidth (recovered at full precision
    from the floor and bytes it recorded) over the current cost model's weight bytes per token."""
    from nonstop.hostinfo import decode_floor
    from nonstop.program.footprint import model_footprint

    run = json.loads((RESULTS / name).read_text())
    recorded = run["bandwidth_floor"]
    copy_gbps = recorded["floor_tokens_per_s"] * recorded["bytes_per_token"] / 1e9
    cfg, dtype = run_config(run)
    return decode_floor(model_footprint(cfg, dtype).bytes_per_token, copy_gbps)


def _peer_row(path: Path, run: dict) -> str:
    machine = run.get("machine", {})
    cache = machine.get("last_level_cache_MB")
    cpu = machine.get("cpu", "?") + (f", {cache:.0f} MB L3" if cache else "")
    hf = run["llama"]["hf_config"]
    shape = f"{run['llama']['params'] / 1e6:.0f}M ({hf['hidden_size']} x {hf['num_hidden_layers']})"
    paired = run.get("nonstop_over_llama_cpp_paired", {})
    ratios = []
    for name in PEER_RATIOS:
        best = run.get("nonstop_over_llama_cpp", {}).get(name)
        median = paired.get(name, {}).get("median")
        ratios.append("-" if best is None else f"{best:.2f}x" + (f" ({median:.2f}x)" if median is not None else ""))
    k3 = run["k3_nano"]["systems"]
    other = next((n for n in k3 if n.startswith(K3_NANO_CPU + " ")), None)
    nano = f"{k3[K3_NANO_CPU]['percent_of_floor']:.1f}%" + (
        f" ({other[len(K3_NANO_CPU) + 1 :]}: {k3[other]['percent_of_floor']:.1f}%)" if other else ""
    )
    links = f"[json](bench/results/{path.name})"
    if path.with_suffix(".png").exists():
        links += f" [chart](bench/results/{path.with_suffix('.png').name})"
    cells = [run["time"][:10], cpu, shape, f"{run['copy_GBps_best']:.1f}", *ratios, nano, links]
    return "| " + " | ".join(cells) + " |"


def peer_rows() -> list[str]:
    """The README's table of ``bench/cpu_peers.py`` runs, one row per results file, oldest first."""
    runs = [(p, json.loads(p.read_text())) for p in RESULTS.glob("cpu_peers*.json")]
    return [_peer_row(p, run) for p, run in sorted(runs, key=lambda pr: pr[1]["time"])]


def fragments(numbers: dict) -> list[str]:
    """The README's text for ``numbers`` (as ``compute`` returns them)."""
    counts = numbers["op_counts"]
    ops = "; ".join(f"{OP_COUNT_MODELS[m]} {c['super_ops']} vs {c['eager_ops']:,}" for m, c in counts.items())
    cpu, spec = (numbers["floors"][name] for name in FLOOR_RUNS)
    return [
        ops,
        f"bandwidth floor {cpu['floor_tokens_per_s']:.0f} tok/s ({cpu['bytes_per_token'] / 1e6:.0f} MB/token "
        f"at a measured {cpu['copy_GBps']:.1f} GB/s)",
        f"(floor {spec['floor_tokens_per_s']:.0f} tok/s)",
        *numbers["peers"],
    ]


def versions() -> dict:
    """The versions the numbers depend on: torch's (its aten decompositions are what the eager ops count) and
    nonstop's (lowering and the cost model), with Python's."""
    import nonstop

    return {"python": platform.python_version(), "torch": torch.__version__, "nonstop": nonstop.__version__}


def compute() -> dict:
    return {
        "op_counts": {m: op_counts(m) for m in OP_COUNT_MODELS},
        "floors": {name: floor(name) for name in FLOOR_RUNS},
        "peers": peer_rows(),
        "versions": versions(),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description="Compute the README's derived numbers (op counts, bandwidth floors of the CPU runs in "
        "bench/results, the CPU peer table) from their sources, print the README fragments and write them as JSON."
    )
    ap.add_argument("--out", type=out_file, default=str(OUT), help=f"JSON path (default {OUT.relative_to(ROOT)})")
    args = ap.parse_args(argv)
    numbers = compute()
    args.out.write_text(json.dumps(numbers, indent=2) + "\n")
    for line in fragments(numbers):
        print(line)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    run(main)
