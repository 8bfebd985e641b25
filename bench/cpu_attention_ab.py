"""Paired A/B of the ``cpu`` executor's one-token GQA attention: the C++ ``decode_attention`` kernel
(``runtime/cpu/attention.cpp``, the default) against the Program's plain twin compiled by inductor (keys
and values gathered from the pool into a copy, two batched GEMMs around a softmax loop).

Both executors live in this process on the same Llama checkpoint (default: the held-out shape of
``bench/cpu_peers.py``, written there if missing) and weight format; each pair decodes --tokens greedy
tokens with A then B (B then A on odd pairs) after a prompt of each --context length, so a VM whose speed
drifts affects both alike. Reported per context: each side's best and median decode tokens/s (the
engine's own per-token clock: prefill and first token excluded, so --tokens is at least 2), the median and
range of the paired ratios A/B, whether the tokens agree, and the bandwidth floor from the copy bandwidth
measured in the same run (the packed weights' bytes per token; the fp32 KV cache bytes a token reads at that
context, before the new tokens add theirs, are listed beside it). Every layer of the model must be GQA
attention (a model with MLA or KDA layers is refused before anything loads).

    python bench/cpu_attention_ab.py [--checkpoint DIR] [--weights int8] [--contexts 32 1000] [--pairs 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from script_args import add_out_arg, decode_tokens, positive_int, run, thread_count

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = {"float32": "cpu", "bfloat16": "cpu-bf16", "int8": "cpu-int8"}
HELD_OUT = {"hidden": 768, "layers": 12, "intermediate": 2048, "heads": 12, "kv_heads": 4, "vocab": 24576}


def check_gqa(model: str) -> None:
    """A ValueError unless every layer of ``model`` (as ``LLM`` resolves it) is GQA attention, the kind A/B'd."""
    from nonstop.weights.resolve import resolve_model

    kinds = sorted(set(resolve_model(model)[0].attn_types) - {"gqa"})
    if kinds:
        raise ValueError(
            f"{model} has {' and '.join(kinds)} attention layers: cpu_attention_ab.py compares GQA attention "
            "kernels, so give a model whose layers are all GQA (a Llama checkpoint)"
        )


def kv_bytes_at(cfg, context: int) -> int:
    """The fp32 KV cache bytes one decoded token reads at ``context`` positions (keys and values, every layer)."""
    return 2 * cfg.num_hidden_layers * cfg.gqa.num_kv_heads * cfg.gqa.head_dim * 4 * context


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=None, help="a Llama checkpoint (default: cpu_peers' held-out shape)")
    ap.add_argument(
        "--weights",
        default="int8",
        choices=["float32", "bfloat16", "int8"],
        help="weight format of both sides (the cpu, cpu-bf16, cpu-int8 backends; default int8)",
    )
    ap.add_argument("--contexts", type=positive_int, nargs="+", default=[32, 1000], help="prompt lengths")
    ap.add_argument(
        "--tokens", type=decode_tokens, default=64, help="new tokens per timed generation, >= 2 (default 64)"
    )
    ap.add_argument("--pairs", type=positive_int, default=8, help="A/B pairs per context (default 8)")
    ap.add_argument("--threads", type=thread_count, default=None, help="torch threads (default: the executor's choice)")
    add_out_arg(ap, "cpu_attention_ab.json")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))

    import torch

    from nonstop import LLM, SamplingParams
    from nonstop.hostinfo import copy_bandwidth, decode_floor, write_result
    from nonstop.program.lower import lower
    from nonstop.runtime.cpu.ops import CPU_KERNEL_OPS, CPU_OPS
    from nonstop.runtime.cpu.pack import packed_bytes
    from nonstop.threads import set_threads

    set_threads(args.threads)  # before the executors, which keep an explicit choice

    if args.checkpoint is None:
        from cpu_peers import default_checkpoint, make_llama_checkpoint

        shape = argparse.Namespace(**HELD_OUT)
        path = default_checkpoint(shape)
        make_llama_checkpoint(shape, path)
        args.checkpoint = str(path)
    check_gqa(args.checkpoint)
    sides = {}
    for side, table in (("kernel", CPU_KERNEL_OPS), ("twin", CPU_OPS)):
        llm = LLM(args.checkpoint, dtype="float32", backend=BACKENDS[args.weights])
        if llm.executor.table is not CPU_KERNEL_OPS:
            sys.exit(f"the C++ kernels are unavailable here: {llm.executor.stats['kernels']}")
        llm.executor.table = table  # before the first step: each executor compiles its own step
        sides[side] = llm
    cfg = sides["kernel"].cfg
    weight_bytes = int(packed_bytes(lower(sides["kernel"].model), args.weights))  # linear weights, read once a token
    copy = [copy_bandwidth()["copy_GBps"]]
    load = [os.getloadavg()]
    sampling = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
    results = []
    for context in args.contexts:
        prompt = [[5 + i % (cfg.vocab_size - 5) for i in range(context)]]
        tokens = {s: llm.generate(prompt_token_ids=prompt, sampling=sampling)[0].token_ids for s, llm in sides.items()}
        rates = {s: [] for s in sides}
        for pair in range(args.pairs):
            order = list(sides) if pair % 2 == 0 else list(sides)[::-1]
            for s in order:
                out = sides[s].generate(prompt_token_ids=prompt, sampling=sampling)[0]
                rates[s].append(out.metrics["decode_tokens_per_s"])
            print(f"context {context} pair {pair}: " + ", ".join(f"{s} {rates[s][-1]:.1f}" for s in sides), flush=True)
        ratios = [a / b for a, b in zip(rates["kernel"], rates["twin"])]
        row = {
            "context": context,
            "tokens": args.tokens,
            "same_tokens": tokens["kernel"] == tokens["twin"],
            **{
                f"{s}_tok_s": {"best": round(max(r), 1), "median": round(statistics.median(r), 1)}
                for s, r in rates.items()
            },
            "paired_ratio": {
                "median": round(statistics.median(ratios), 3),
                "min": round(min(ratios), 3),
                "max": round(max(ratios), 3),
            },
            "kv_bytes_per_token_at_context": kv_bytes_at(cfg, context),
        }
        results.append(row)
        print(
            f"context {context}: kernel/twin paired median {row['paired_ratio']['median']} "
            f"(range {row['paired_ratio']['min']}-{row['paired_ratio']['max']}), same tokens {row['same_tokens']}"
        )
        load.append(os.getloadavg())
    copy.append(copy_bandwidth()["copy_GBps"])
    result = write_result(
        args.out,
        "cpu_attention_ab",
        {
            "checkpoint": args.checkpoint,
            "weights": args.weights,
            "threads": torch.get_num_threads(),
            "pairs": args.pairs,
            "load_average": [[round(v, 2) for v in la] for la in load],
            "copy_GBps": [round(c, 2) for c in copy],
            "floor": decode_floor(weight_bytes, max(copy)),
            "contexts": results,
        },
    )
    print(f"weights floor {result['floor']['floor_ms_per_token']:.2f} ms/token at {max(copy):.1f} GB/s copy")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run(main)
