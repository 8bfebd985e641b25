"""``nonstop generate``: complete a prompt (text or token ids) and report tokens/s."""

from __future__ import annotations

import sys
import time

from nonstop.commands.common import add_model_args, add_spec_args, parse_token_ids, positive_int, spec_from_args
from nonstop.commands.layout_args import add_layout_args, llm_class


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate a completion for a prompt", description="Generate text from a prompt with the chosen model (default: the bundled k3-nano). Prints the prompt and its completion, then a line with the token count and decode speed on stderr.")
    p.add_argument("prompt", nargs="*", help="prompt text (several words are joined with spaces); default: 'The'")
    p.add_argument("--prompt-ids", type=parse_token_ids, help="prompt as token ids, e.g. '1,15,27' (instead of text)")
    add_model_args(p)
    p.add_argument("--max-tokens", "-n", type=positive_int, default=64, help="tokens to generate (default 64)")
    p.add_argument("--temperature", "-t", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1 = off)")
    p.add_argument("--top-k", type=int, default=-1, help="sample among the k most likely tokens (default -1 = off)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    p.add_argument("--ids", action="store_true", help="also print the generated token ids")
    add_spec_args(p)
    add_layout_args(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from nonstop.engine.sampling import SamplingParams

    if args.prompt and args.prompt_ids:
        raise ValueError("give a text prompt or --prompt-ids, not both")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed, stop=args.stop, ignore_eos=args.ignore_eos)
    t0 = time.perf_counter()
    LLM = llm_class(args)  # under --tp / --ep: starts or joins the ranks (nonstop.dist); only rank 0 goes on
    llm = LLM(args.model, dtype=args.dtype, device=args.device, backend=args.backend, progress=True, speculative=spec_from_args(args))
    load_s = time.perf_counter() - t0
    if args.prompt_ids:
        out = llm.generate(prompt_token_ids=[args.prompt_ids], sampling=params)[0]
        print(llm.tokenizer.decode(out.prompt_token_ids) + out.text)
    else:
        prompt = " ".join(args.prompt) or "The"
        out = llm.generate([prompt], sampling=params)[0]
        print(prompt + out.text)
    if args.ids:
        print("token ids:", " ".join(map(str, out.token_ids)))
    m = out.metrics
    speed = f"{m['decode_tokens_per_s']:.1f} tokens/s" if m["decode_tokens_per_s"] else "n/a tokens/s"
    spec = ""
    if m.get("verify_steps"):
        spec = f", {args.speculative} drafts: {m['accepted_tokens']}/{m['drafted_tokens']} accepted, {m['mean_accepted_length']:.2f} tokens/step"
    print(f"[{llm.name} | {llm.backend} | {str(llm.dtype).replace('torch.', '')} | load {load_s:.1f}s] {m['generated_tokens']} tokens, prompt {m['prompt_tokens']} tokens, first token {m['time_to_first_token_s'] * 1000:.0f} ms, decode {speed}{spec} ({out.finish_reason})", file=sys.stderr)
    return 0
