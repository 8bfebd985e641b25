"""CPU decode speed: nonstop's reference engine vs transformers' generate on the same checkpoint.

Both run in this process, batch 1, the same dtype and thread count, greedy, on a random-weight
checkpoint written by ``nonstop synth`` (default: a kimi_linear model with hidden 512, 8 layers,
16 experts). Decode tokens/s = (N - 1) / (time(N new tokens) - time(1 new token)), so prefill and the
first token are excluded for both; median of --repeats runs (a line per run on stderr). Writes JSON to
bench/results/.

    python bench/cpu_decode.py [--tokens 128] [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

for _name in ("fla", "causal_conv1d"):  # keep transformers' kimi_linear on its torch path (fla's kernels need a GPU)
    sys.modules[_name] = None

import torch  # noqa: E402
from script_args import add_out_arg, positive_int, run, thread_count  # noqa: E402

from nonstop.threads import set_threads  # noqa: E402

KIMI_LINEAR_512 = {
    "model_type": "kimi_linear",
    "vocab_size": 32000,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "kv_lora_rank": 128,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "q_lora_rank": None,
    "mla_use_nope": True,
    "num_experts": 16,
    "num_experts_per_token": 2,
    "num_shared_experts": 1,
    "moe_intermediate_size": 256,
    "moe_router_activation_func": "sigmoid",
    "moe_renormalize": True,
    "routed_scaling_factor": 2.446,
    "num_expert_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "rms_norm_eps": 1e-5,
    "linear_attn_config": {
        "head_dim": 64,
        "num_heads": 8,
        "short_conv_kernel_size": 4,
        "kda_layers": [1, 2, 3, 5, 6, 7],
        "full_attn_layers": [4, 8],
    },
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


MIN_TOKENS = 16  # decode steps a timed run needs before its difference with the one-token run means anything


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--tokens", type=int, default=128, help=f"new tokens per timed generation, >= {MIN_TOKENS} (default 128)"
    )
    ap.add_argument("--prompt-len", type=positive_int, default=32, help="prompt tokens (random ids; default 32)")
    ap.add_argument("--threads", type=thread_count, default=2, help="torch threads of both engines (default 2)")
    ap.add_argument(
        "--repeats", type=positive_int, default=3, help="timed runs per engine; the median counts (default 3)"
    )
    ap.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="weights and compute (default float32)"
    )
    add_out_arg(ap, "cpu_decode.json")
    args = ap.parse_args()
    if args.tokens < MIN_TOKENS:
        # decode speed is the difference of two runs: a few steps drown in the noise (3 tokens gave -478 tok/s)
        ap.error(f"--tokens must be >= {MIN_TOKENS}")
    set_threads(args.threads)
    dtype = getattr(torch, args.dtype)

    import transformers

    from nonstop import LLM, SamplingParams
    from nonstop.config import ModelConfig
    from nonstop.hostinfo import command_line, copy_bandwidth, decode_floor, environment, timed
    from nonstop.program.footprint import model_footprint
    from nonstop.weights.synth import write_checkpoint

    cfg = ModelConfig.from_hf_dict(KIMI_LINEAR_512)
    say = partial(print, file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        say(f"writing a random {cfg.family} checkpoint and loading it in both engines ...")
        path = write_checkpoint(cfg, Path(tmp) / "m", seed=0, dtype=dtype)
        llm = LLM(path, dtype=args.dtype, backend="reference")  # the row is labelled nonstop_reference
        ref = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, experts_implementation="eager"
        ).eval()
        prompt = torch.randint(
            3, cfg.vocab_size, (args.prompt_len,), generator=torch.Generator().manual_seed(0)
        ).tolist()

        def ours(n):
            return llm.generate(
                prompt_token_ids=[prompt], sampling=SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
            )[0].token_ids

        def theirs(n):
            with torch.no_grad():
                out = ref.generate(
                    torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
                )
            return out[0, len(prompt) :].tolist()

        say(f"greedy check: {args.tokens} tokens from each engine ...")
        same = ours(args.tokens) == theirs(args.tokens)
        say(f"greedy outputs identical: {same}")
        rows = {}
        for name, generate in (("nonstop_reference", ours), ("transformers_generate", theirs)):
            rates = []
            for r in range(args.repeats):
                t1 = timed(partial(generate, 1))
                tn = timed(partial(generate, args.tokens))
                rates.append((args.tokens - 1) / (tn - t1))
                say(f"{name} run {r + 1}/{args.repeats}: {rates[-1]:.1f} decode tok/s")
            rows[name] = {"decode_tokens_per_s": statistics.median(rates), "runs": rates}
    fp = model_footprint(cfg, dtype)
    floor = decode_floor(fp.bytes_per_token, copy_bandwidth()["copy_GBps"])
    result = {
        "benchmark": "cpu_decode",
        "command": command_line(),
        "model": {
            "family": cfg.family,
            "hf_config": KIMI_LINEAR_512,
            "active_params": fp.active_params,
            "weight_bytes_per_token": fp.bytes_per_token,
        },
        "batch": 1,
        "dtype": args.dtype,
        "threads": args.threads,
        "new_tokens": args.tokens,
        "prompt_len": args.prompt_len,
        "greedy_outputs_identical": same,
        "results": rows,
        "ratio_nonstop_over_transformers": rows["nonstop_reference"]["decode_tokens_per_s"]
        / rows["transformers_generate"]["decode_tokens_per_s"],
        "bandwidth_floor": floor,
        "machine": environment(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'engine':<24} {'decode tok/s':>12}")
    for name, row in rows.items():
        print(f"{name:<24} {row['decode_tokens_per_s']:>12.1f}")
    bw = fp.bytes_per_token * rows["nonstop_reference"]["decode_tokens_per_s"] / 1e9
    mb = fp.bytes_per_token / 1e6
    ratio = result["ratio_nonstop_over_transformers"]
    print(
        f"ratio nonstop/transformers: {ratio:.2f}x; greedy identical: {same}; "
        f"nonstop reads {mb:.1f} MB/token = {bw:.2f} GB/s"
    )
    print(
        f"bandwidth floor: {floor['floor_tokens_per_s']:.1f} tok/s "
        f"({mb:.1f} MB/token at a measured {floor['copy_GBps']:.1f} GB/s copy)"
    )


if __name__ == "__main__":
    run(main)
