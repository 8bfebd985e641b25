"""``nonstop chat``: an interactive conversation with a model through its chat template."""

from __future__ import annotations

import sys

from nonstop.commands.common import (
    add_model_args,
    add_sampling_args,
    check_utf8_args,
    llm_from_args,
    sampling_from_args,
    stream_text,
)

COMMANDS_HELP = "/reset clears the conversation, /exit or /quit (or end of input) quits"


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
    check_utf8_args({"--system": args.system, "--stop": args.stop})
    sampling_from_args(args)  # a bad flag fails before the model loads
    start = [{"role": "system", "content": args.system}] if args.system is not None else []  # "" is a message too
    setup = {}

    def before_load(llm) -> None:  # what no weights decide is refused before they load
        setup["params"] = _check_setup(args, llm, start)

    llm = llm_from_args(args, progress=True, max_batch=1, before_load=before_load)
    params = setup["params"]
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"nonstop chat with {llm.name} ({COMMANDS_HELP})", file=sys.stderr)
    messages = list(start)
    replies = failed = 0
    for text, problem in _read_lines(sys.stdin, prompt=interactive):
        if problem is not None:
            print(f"nonstop: {problem}: not sent", file=sys.stderr)
            failed += 1
            continue
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
            out = _reply(llm, messages, params, start)
        except ValueError as exc:  # too long for the context, a template that refuses the turn, ...
            messages.pop()
            print(f"nonstop: {exc}", file=sys.stderr)
            failed += 1
            continue
        replies += 1
        messages.append({"role": "assistant", "content": out.text})
        print(f"[{_turn_summary(out.metrics)}, {out.finish_reason}]", file=sys.stderr)
    if failed and not replies:
        print(f"nonstop: error: none of the {failed} message(s) got a reply", file=sys.stderr)
        return 2
    return 0


def _turn_summary(m: dict) -> str:
    """ "64 tokens, 450.2 tokens/s": a turn's tokens and decode speed; a turn whose decode prepared the step
    (the cpu backend, the first turn of a shape: compiling it or loading it from the cache) also says its
    speed without that, as generate does."""
    out = f"{m['generated_tokens']} tokens"
    if not m["decode_tokens_per_s"]:
        return out
    out += f", {m['decode_tokens_per_s']:.1f} tokens/s"
    compiling = float(m.get("decode_compiling_s", 0.0))
    decoding = m["decode_time_s"] - compiling
    if compiling > 0.05 and decoding > 0:
        out += f" ({(m['generated_tokens'] - 1) / decoding:.1f} without {compiling:.1f} s preparing the step)"
    return out


def _check_setup(args, llm, start: list[dict]):
    """The SamplingParams of every turn, after refusing what would fail every turn: a tokenizer that takes no
    text, no chat template or one that does not render a first message, max_tokens that leave no room in the
    context for the shortest turn."""
    from nonstop.engine.chat_template import NO_TEMPLATE, ChatTemplateError, chat_prompt

    tok = llm.tokenizer
    if not tok.accepts_text:
        if args.tokenizer == "ids":
            raise ValueError("chat reads and writes text, and --tokenizer ids takes token ids only: leave it out")
        raise ValueError(
            f"chat reads and writes text, and {llm.model_dir} has no tokenizer (tokenizer.json or "
            "tiktoken.model): add one, or use --tokenizer bytes (UTF-8 bytes as token ids)"
        )
    if not tok.chat_template:
        if args.chat_template:  # the file was read and holds nothing: the model's template is not the problem
            raise ChatTemplateError(f"--chat-template {args.chat_template} is empty: give a file holding a template")
        raise ChatTemplateError(NO_TEMPLATE)
    try:  # compiles the template and renders the shortest conversation
        shortest = len(chat_prompt(tok, start + [{"role": "user", "content": "Hi"}]))
    except ChatTemplateError as exc:
        where = f"--chat-template {args.chat_template}" if args.chat_template else "the checkpoint's chat template"
        raise ChatTemplateError(f"{where}: {exc}") from None
    params = sampling_from_args(args, llm.sampling_defaults())
    context = llm.cfg.max_position_embeddings
    if shortest + params.max_tokens > context:
        if args.max_tokens is not None:
            source = "--max-tokens"
        elif "max_tokens" in llm.sampling_defaults():
            source = "the checkpoint's generation_config.json max_new_tokens"
        else:
            source = "the default"
        room = context - shortest
        fix = (
            f"give --max-tokens {room} or fewer"
            if room >= 1
            else "not even one token fits after it: shorten the system prompt (--system) or the chat template"
        )
        raise ValueError(
            f"max_tokens {params.max_tokens} ({source}) leaves no room in the model's context of {context} tokens "
            f"for a turn (the shortest takes {shortest} prompt tokens): {fix}"
        )
    return params


def _reply(llm, messages: list[dict], params, start: list[dict]):
    """The streamed reply to ``messages`` (which begin with ``start``); a ValueError when the conversation does
    not fit the context (``_too_long``)."""
    from nonstop.engine.chat_template import chat_prompt

    ids = chat_prompt(llm.tokenizer, messages)
    try:
        llm.check_length(len(ids), params.max_tokens)
    except ValueError as exc:
        raise _too_long(llm, messages, params, start, exc) from None
    out = stream_text(llm, params, ids)
    print(flush=True)
    return out


def _too_long(llm, messages: list[dict], params, start: list[dict], exc: ValueError) -> ValueError:
    """The error for ``messages`` too long for the context (``exc``): "the conversation is too long" with the
    /reset hint where the last message fits after ``start`` alone (starting over helps), else "this message is
    too long" with the length of that message alone."""
    from nonstop.engine.chat_template import chat_prompt

    alone = start + messages[-1:]
    if len(messages) > len(alone):
        ids = chat_prompt(llm.tokenizer, alone)
        try:
            llm.check_length(len(ids), params.max_tokens)
        except ValueError as own:
            exc = own
        else:
            return ValueError(f"the conversation is too long: {exc} (/reset starts over)")
    return ValueError(f"this message is too long: {exc}")


def _read_lines(stream, prompt: bool):
    """(text, None) for each line of ``stream`` (without its line end), or (None, why) for a line that is not
    valid in the stream's encoding: the bytes are read and decoded line by line, so a bad line is only
    that line's problem. ``prompt``: write "> " on stderr before each read (a terminal), and a line end at
    the end of input."""
    raw = getattr(stream, "buffer", None)
    encoding = getattr(stream, "encoding", None) or "utf-8"
    number = 0
    while True:
        if prompt:
            print("> ", end="", file=sys.stderr, flush=True)
        line = raw.readline() if raw is not None else stream.readline()
        if not line:
            if prompt:  # end of input (Ctrl-D): the shell's prompt starts on a line of its own
                print(file=sys.stderr, flush=True)
            return
        number += 1
        if isinstance(line, str):  # a text stream: back to the bytes its decoder read (surrogateescape)
            try:
                line = line.encode(encoding, "surrogateescape")
            except UnicodeEncodeError as exc:
                yield (
                    None,
                    f"input line {number} holds a lone surrogate U+{ord(line[exc.start]):04X}: not valid Unicode",
                )
                continue
        try:
            text = line.decode(encoding)
        except UnicodeDecodeError as exc:
            byte, at = line[exc.start], exc.start + 1
            yield None, f"input line {number} is not valid {encoding} (byte 0x{byte:02x} at position {at})"
            continue
        yield text.rstrip("\r\n"), None
