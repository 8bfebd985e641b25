"""Which default sampling keeps k3-nano from looping: greedy vs candidate generation configs.

For held-out prompts (the first ``--prompt-tokens`` tokens of paragraphs of
``nonstop/assets/heldout_sample.txt``, text the model was not trained on), each configuration generates
``--max-tokens`` tokens per prompt and seed (end-of-sequence ignored, so every run has the same length),
and we report per configuration, averaged over prompts and seeds:
  * distinct-n = distinct n-grams / n-grams of the generated tokens (n = 2 and 4): a loop repeats the
    same n-grams, so it scores low (a 10-token cycle: distinct-4 ~ 0.1); varied text scores near 1;
  * loop share = share of completions whose last half is a repetition of spans seen earlier
    (distinct-4 of the second half below 0.5);
  * mean NLL = the model's own mean negative log-likelihood of the tokens it generated (nats/token;
    lower = the text is likelier under the model; greedy is the lowest possible, noise raises it).
Writes JSON to bench/results/ with the machine, versions and the command.

    python bench/k3_nano_sampling.py [--prompts 16] [--max-tokens 96] [--seeds 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from script_args import MODEL_HELP, add_out_arg, positive_int, run, thread_count

from nonstop import LLM, SamplingParams
from nonstop.hostinfo import command_line, environment
from nonstop.threads import set_threads

HELDOUT = Path(__file__).resolve().parent.parent / "nonstop" / "assets" / "heldout_sample.txt"
CANDIDATES = {
    "greedy": dict(temperature=0.0),
    "t0.7 p0.9": dict(temperature=0.7, top_p=0.9),
    "t0.7 p0.9 rep1.1": dict(temperature=0.7, top_p=0.9, repetition_penalty=1.1),
    "t0.8 p0.95 rep1.1": dict(temperature=0.8, top_p=0.95, repetition_penalty=1.1),
    "t0.6 k40 rep1.15": dict(temperature=0.6, top_k=40, repetition_penalty=1.15),
    "t0.7 minp0.05 rep1.1": dict(temperature=0.7, min_p=0.05, repetition_penalty=1.1),
    "greedy rep1.2": dict(temperature=0.0, repetition_penalty=1.2),
}


def distinct(ids: list[int], n: int) -> float:
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def prompts(llm: LLM, count: int, length: int) -> list[list[int]]:
    paragraphs = [p for p in HELDOUT.read_text().split("\n") if len(p) > 300]
    return [llm.tokenizer.encode(p, add_special_tokens=False)[:length] for p in paragraphs[:count]]


def score(outs) -> dict:
    d2 = [distinct(o.token_ids, 2) for o in outs]
    d4 = [distinct(o.token_ids, 4) for o in outs]
    loops = [distinct(o.token_ids[len(o.token_ids) // 2 :], 4) < 0.5 for o in outs]
    nll = [-sum(row[t] for t, row in zip(o.token_ids, o.logprobs)) / len(o.token_ids) for o in outs]
    mean = lambda xs: round(sum(xs) / len(xs), 4)  # noqa: E731
    return {
        "distinct_2": mean(d2),
        "distinct_4": mean(d4),
        "loop_share": mean([float(x) for x in loops]),
        "mean_nll": mean(nll),
        "completions": len(outs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="k3-nano", help=MODEL_HELP)
    ap.add_argument("--prompts", type=positive_int, default=16, help="held-out prompts (default 16)")
    ap.add_argument("--prompt-tokens", type=positive_int, default=24, help="tokens of each prompt (default 24)")
    ap.add_argument("--max-tokens", type=positive_int, default=96, help="tokens generated per prompt (default 96)")
    ap.add_argument(
        "--seeds", type=positive_int, default=2, help="sampling seeds per prompt (greedy runs once; default 2)"
    )
    ap.add_argument("--threads", type=thread_count, default=2, help="torch threads (default 2)")
    add_out_arg(ap, "k3_nano_sampling.json")
    args = ap.parse_args()
    set_threads(args.threads)  # an explicit choice: the cpu executor keeps it (torch.set_num_threads alone it resets)
    llm = LLM(args.model, dtype="float32", max_batch=args.prompts, generation_config=False)
    ps = prompts(llm, args.prompts, args.prompt_tokens)
    rows = {}
    for name, fields in CANDIDATES.items():
        t0 = time.perf_counter()
        outs = []
        for seed in range(args.seeds if fields["temperature"] > 0 else 1):
            params = SamplingParams(
                max_tokens=args.max_tokens, ignore_eos=True, logprobs=0, seed=1000 * seed + 7, **fields
            )
            outs += llm.generate(prompt_token_ids=ps, sampling=params)
        rows[name] = {"params": fields, **score(outs), "seconds": round(time.perf_counter() - t0, 1)}
        print(f"{name:24s} {json.dumps(rows[name])}", file=sys.stderr, flush=True)
    result = {
        "what": "k3-nano: distinct-n / loop share / mean NLL of completions of held-out prompts, "
        "per sampling configuration",
        "command": command_line(),
        "threads": torch.get_num_threads(),  # --threads, as the runs used it
        "machine": environment(),  # versions, CPU, torch threads and the load average at the end
        "prompts": len(ps),
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "seeds": args.seeds,
        "results": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    run(main)
