"""``nonstop generate``: complete a prompt (text or token ids), streaming the text, and report tokens/s."""

from __future__ import annotations

import dataclasses
import sys
import time

from nonstop.commands.common import (
    add_model_args,
    add_sampling_args,
    add_spec_args,
    check_utf8_args,
    llm_from_args,
    parse_token_ids,
    sampling_from_args,
    spec_from_args,
    stream_text,
)
from nonstop.commands.layout_args import add_layout_args, llm_class


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="generate a completion for a prompt",
        description="Generate text from a prompt with the chosen model (default: the bundled k3-nano). Prints the "
        "prompt, then the completion as it is generated, then a line with the token count and decode speed on "
        "stderr. Sampling defaults come from the checkpoint's generation_config.json (flags override them).",
    )
    p.add_argument(
        "prompt",
        nargs="*",
        help="prompt text (several words are joined with spaces); default, when none is given: 'The'",
    )
    p.add_argument("--prompt-ids", type=parse_token_ids, help="prompt as token ids, e.g. '1,15,27' (instead of text)")
    add_model_args(p)
    add_sampling_args(p, chat=False)  # a plain completion: no chat template
    p.add_argument("--ids", action="store_true", help="also print the generated token ids")
    add_spec_args(p)
    add_layout_args(p)
    p.set_defaults(run=run)


def run(args) -> int:
    if args.prompt and args.prompt_ids:
        raise ValueError("give a text prompt or --prompt-ids, not both")
    check_utf8_args({"the prompt": " ".join(args.prompt), "--stop": args.stop})
    t0 = time.perf_counter()
    speculative = spec_from_args(args)
    flags = sampling_from_args(args)  # a bad flag fails before the model loads
    if speculative and flags.penalized:  # the engine's refusal (LLM.make_request), before loading
        raise ValueError(
            f"--speculative {args.speculative}: repetition, presence and frequency penalties are not supported "
            "with speculative decoding (leave those flags out)"
        )
    # "The" only when no prompt is given: an empty one ("") is the engine's to refuse, as the API's
    prompt = None if args.prompt_ids else " ".join(args.prompt) if args.prompt else "The"
    setup = {}

    def before_load(llm) -> None:  # config, tokenizer and defaults known, weights not loaded: refuse early
        setup["params"] = _checked_params(args, llm, prompt)

    # under --tp / --ep llm_class starts or joins the ranks (nonstop.dist); only rank 0 goes on
    llm = llm_from_args(
        args, cls=llm_class(args), progress=True, max_batch=1, speculative=speculative, before_load=before_load
    )
    load_s = time.perf_counter() - t0
    params = setup["params"]
    request = llm.make_request(prompt, args.prompt_ids, params)
    ids = request.prompt_ids
    print(llm.tokenizer.decode(ids) if args.prompt_ids else prompt, end="", flush=True)

    before = _compiling_s(llm)
    out = stream_text(llm, params, ids)  # the ids checked and echoed above
    compiling, anew = (now - then for now, then in zip(_compiling_s(llm), before))
    print(flush=True)
    if args.ids or not llm.tokenizer.accepts_text:
        print("token ids:", " ".join(map(str, out.token_ids)))
    print(
        f"[{llm.name} | {llm.backend} | {str(llm.dtype).replace('torch.', '')} | load {load_s:.1f}s] "
        f"{_timing(out.metrics, compiling, args.speculative, from_cache=anew <= 0.05)} ({out.finish_reason})",
        file=sys.stderr,
    )
    return 0


def _checked_params(args, llm, prompt: str | None):
    """The request's SamplingParams, after every check a request meets before it runs (a prompt id outside
    the vocabulary, an empty prompt, prompt + max_tokens beyond the context): the checkpoint's defaults
    (under speculative decoding without its repetition penalty, said on stderr, unless --repetition-penalty
    replaces it anyway) under the flags; a default max_tokens cut to the room the context leaves."""
    given = args.repetition_penalty is not None
    params = sampling_from_args(args, llm.generation.defaults if given else llm.sampling_defaults())
    request = llm.make_request(prompt, args.prompt_ids, params, request_id="check")
    if args.max_tokens is None:  # a default max_tokens is cut to the room the context leaves, as the server's
        params = _fit_default_max_tokens(params, len(request.prompt_ids), llm.cfg.max_position_embeddings)
    llm.check_length(len(request.prompt_ids), params.max_tokens)
    return params


def _timing(m: dict, compiling: float, speculative: str | None, from_cache: bool = False) -> str:
    """The metrics line: tokens, time to first token and decode speed. ``compiling``: seconds the executor
    spent preparing its step during the request (a first run of the ``cpu`` backend): compiling it, or with
    ``from_cache`` only tracing it and loading its compiled code from the on-disk cache. The part before the
    first token is said with the time to first token, the part within the decode interval
    (``decode_compiling_s``) with the decode speed, which is also given without it."""
    in_decode = min(float(m.get("decode_compiling_s", 0.0)), compiling)
    before_first = compiling - in_decode
    if from_cache:
        said_first, said_decode = "loading the compiled step from the cache", "loading the compiled step"
    else:
        said_first, said_decode = "compiling the step, cached for later runs", "compiling, cached for later runs"
    first = f"{m['time_to_first_token_s'] * 1000:.0f} ms"
    if before_first > 0.05:
        first += f" (incl. {before_first:.1f} s {said_first})"
        said_decode = said_decode.replace("cached for later runs", "also cached")
    speed = f"{m['decode_tokens_per_s']:.1f} tokens/s" if m["decode_tokens_per_s"] else "n/a tokens/s"
    if in_decode > 0.05 and m["decode_tokens_per_s"]:
        steps, decoding = m["generated_tokens"] - 1, m["decode_time_s"] - in_decode
        after = f"{steps / decoding:.1f} tokens/s without it" if decoding > 0 else "n/a without it"
        speed += f" (incl. {in_decode:.1f} s {said_decode}; {after})"
    spec = ""
    if m.get("verify_steps"):
        spec = (
            f", {speculative} drafts: {m['accepted_tokens']}/{m['drafted_tokens']} accepted, "
            f"{m['mean_accepted_length']:.2f} tokens/step"
        )
    return (
        f"{m['generated_tokens']} tokens, prompt {m['prompt_tokens']} tokens, first token {first}, decode {speed}{spec}"
    )


def _fit_default_max_tokens(params, prompt_tokens: int, context: int):
    """``params`` with a default max_tokens (not given by --max-tokens) cut to the ``context - prompt_tokens``
    tokens the context has room for, saying so on stderr; unchanged when it fits or there is no room at all
    (``LLM.check_length`` refuses that)."""
    room = context - prompt_tokens
    if not 1 <= room < params.max_tokens:
        return params
    print(
        f"nonstop: max_tokens {params.max_tokens} cut to {room}: the prompt's {prompt_tokens} tokens leave room for "
        f"{room} in the model's context of {context}",
        file=sys.stderr,
    )
    return dataclasses.replace(params, max_tokens=room)


def _compiling_s(llm) -> tuple[float, float]:
    """(seconds the executor has spent preparing its step so far, the part that compiled rather than loaded
    from the cache): the ``cpu`` backend's torch.compile; (0, 0) for other backends. An executor that does not
    say what it loaded (no ``compiled_anew_s``) compiled all of it."""
    stats = getattr(getattr(llm, "executor", None), "stats", {})
    compiling = float(stats.get("compiling_s", 0.0))
    return compiling, float(stats.get("compiled_anew_s", compiling))
