"""``nonstop chat``: an interactive conversation with a model through its chat template."""

from __future__ import annotations

import sys

from nonstop.commands.common import add_model_args, add_sampling_args, llm_from_args, sampling_from_args

COMMANDS_HELP = "/reset clears the conversation, /exit (or end of input) quits"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "chat",
        help="chat with a model interactively (its chat template)",
        description="Read one user message per line from standard input, render the conversation with the model's "
        "chat template (the checkpoint's chat_template.jinja / tokenizer_config.json, or --chat-template FILE) and "
        f"print the reply on standard output as it is generated. {COMMANDS_HELP}. Works with piped input: "
        "`printf 'Hi\\n' | nonstop chat`. Sampling defaults come from the checkpoint's generation_config.json.",
    )
    add_model_args(p)
    add_sampling_args(p)
    p.add_argument("--system", default=None, help="a system message to start the conversation with")
    p.set_defaults(run=run)


def run(args) -> int:
    from nonstop.engine.chat_template import NO_TEMPLATE, ChatTemplateError, chat_prompt

    sampling_from_args(args)  # a bad flag fails before the model loads
    llm = llm_from_args(args, progress=True, max_batch=1)
    if not llm.tokenizer.chat_template:
        raise ChatTemplateError(NO_TEMPLATE)
    params = sampling_from_args(args, llm.generation.defaults)
    start = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"nonstop chat with {llm.name} ({COMMANDS_HELP})", file=sys.stderr)
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        text = line.rstrip("\r\n")
        if text.strip() in ("/exit", "/quit"):
            break
        if text.strip() == "/reset":
            messages = list(start)
            print("(conversation cleared)", file=sys.stderr)
            continue
        if not text.strip():
            continue
        messages.append({"role": "user", "content": text})
        try:
            ids = chat_prompt(llm.tokenizer, messages)
            out = llm.stream(None, params, prompt_ids=ids, on_text=lambda piece: print(piece, end="", flush=True))
        except ValueError as exc:  # too long for the context, a template that refuses the turn, ...
            messages.pop()
            print(f"nonstop: {exc} (/reset starts over)", file=sys.stderr)
            continue
        print(flush=True)
        messages.append({"role": "assistant", "content": out.text})
        m = out.metrics
        speed = f", {m['decode_tokens_per_s']:.1f} tokens/s" if m["decode_tokens_per_s"] else ""
        print(f"[{m['generated_tokens']} tokens{speed}, {out.finish_reason}]", file=sys.stderr)
    return 0
