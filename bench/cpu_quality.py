"""Quality of the CPU executor's weight formats on k3-nano: perplexity change and greedy agreement.

For each format (fp32, bf16, int8 per group of 128 columns, int8 per channel) the model's weights
are packed as the ``cpu`` executor packs them (``runtime/cpu/pack.py``), which also leaves the model
computing with exactly the values the packed weights represent. Then:
  * perplexity of nonstop/assets/heldout_sample.txt (whole-window forwards of --context tokens, the
    ``nonstop perplexity`` scorer) and its change relative to fp32,
  * greedy agreement with the fp32 reference: for --prompts held-out paragraphs (first --prompt-len
    tokens), --max-tokens greedy tokens through the executor (its program run eagerly: the compiled
    step computes the same), counting prompts with identical outputs and the mean identical prefix.
Writes bench/results/cpu_quality.json.

    python bench/cpu_quality.py [--prompts 16] [--max-tokens 32] [--context 512]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from script_args import MODEL_HELP, add_out_arg, positive_int, run

ROOT = Path(__file__).resolve().parent.parent
HELDOUT = ROOT / "nonstop" / "assets" / "heldout_sample.txt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="k3-nano", help=MODEL_HELP)
    ap.add_argument(
        "--prompts", type=positive_int, default=16, help="held-out prompts of the greedy check (default 16)"
    )
    ap.add_argument("--prompt-len", type=positive_int, default=24, help="tokens of each prompt (default 24)")
    ap.add_argument("--max-tokens", type=positive_int, default=32, help="greedy tokens per prompt (default 32)")
    ap.add_argument(
        "--context", type=positive_int, default=512, help="tokens per window of the perplexity (default 512)"
    )
    add_out_arg(ap, "cpu_quality.json")
    args = ap.parse_args()

    from nonstop import LLM, SamplingParams
    from nonstop.engine.perplexity import score_token_ids
    from nonstop.hostinfo import command_line, environment
    from nonstop.runtime.cpu import CPUExecutor

    text = HELDOUT.read_text()
    formats = {
        "fp32": ("float32", None),
        "bf16": ("bfloat16", None),
        "int8 g128": ("int8", 128),
        "int8 per-channel": ("int8", None),
    }
    rows, outputs = {}, {}
    for label, (fmt, group) in formats.items():
        llm = LLM(args.model, dtype="float32", backend="reference")
        llm.executor = CPUExecutor(llm.model, weights=fmt, compile=False, progress=False, int8_group=group or 0)
        ids = llm.tokenizer.encode(text)
        with torch.inference_mode():
            ppl = score_token_ids(llm.model, ids, context=args.context, batch_size=4).perplexity
        paragraphs = [p for p in text.split("\n") if len(p) > 200][: args.prompts]
        prompts = [llm.tokenizer.encode(p)[: args.prompt_len] for p in paragraphs]
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
        outputs[label] = [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling=params)]
        rows[label] = {"perplexity": round(ppl, 4), "tokens_scored": len(ids) - 1}
        print(f"{label}: perplexity {ppl:.4f}", file=sys.stderr, flush=True)
    base = rows["fp32"]["perplexity"]
    for label, row in rows.items():
        same = [a == b for a, b in zip(outputs[label], outputs["fp32"])]
        prefix = []
        for a, b in zip(outputs[label], outputs["fp32"]):
            n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
            prefix.append(n)
        row.update(
            perplexity_change_percent=round(100 * (row["perplexity"] / base - 1), 3),
            greedy_identical_prompts=f"{sum(same)}/{len(same)}",
            mean_identical_prefix_tokens=round(sum(prefix) / len(prefix), 2),
        )
    result = {
        "benchmark": "cpu_quality",
        "command": command_line(),
        "model": args.model,
        "heldout_text": str(HELDOUT.relative_to(ROOT)),
        "context": args.context,
        "greedy": {"prompts": args.prompts, "prompt_len": args.prompt_len, "max_tokens": args.max_tokens},
        "formats": rows,
        "machine": environment(),  # at the end: its load average is the one the run ended with
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'format':<18} {'perplexity':>10} {'change':>8} {'greedy identical':>17} {'mean prefix':>12}")
    for label, row in rows.items():
        print(
            f"{label:<18} {row['perplexity']:>10.4f} {row['perplexity_change_percent']:>7.3f}% "
            f"{row['greedy_identical_prompts']:>17} {row['mean_identical_prefix_tokens']:>12.2f}"
        )


if __name__ == "__main__":
    run(main)
