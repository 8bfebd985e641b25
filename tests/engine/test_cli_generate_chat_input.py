"""`nonstop generate` / `nonstop chat` on inputs at the edges: extreme penalties, prompt ids outside the
vocabulary, the compile-time report, speculative decoding under a checkpoint's penalty, chat setups that
cannot work (refused at startup, before the weights), undecodable input lines, --tokenizer ids."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nonstop import LLM, SamplingParams
from nonstop.cli import main
from nonstop.engine.sampling import InvalidSamplingParam, sample
from nonstop.model.sampling import penalize
from tests.engine.tiny_models import TEST_CHAT_TEMPLATE, synth_checkpoint

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny k3 checkpoint (byte tokenizer, 512-token context) with a chat template."""
    return synth_checkpoint("k3", tmp_path_factory.mktemp("tiny") / "m", chat_template=TEST_CHAT_TEMPLATE)


def _exit_code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


# ---------------------------------------------------------------- 1. penalties


@pytest.mark.parametrize(
    "flag, param",
    [
        ("--repetition-penalty=1e-300", "repetition_penalty"),
        ("--presence-penalty=-1e40", "presence_penalty"),
        ("--frequency-penalty=-1e308", "frequency_penalty"),
        ("--presence-penalty=2.5", "presence_penalty"),
    ],
)
def test_extreme_penalties_are_refused_before_the_model_loads(flag, param, capsys):
    code = _exit_code(["generate", "--backend", "reference", "-n", "4", "--seed", "1", flag, "The"])
    captured = capsys.readouterr()
    assert code == 2 and param in captured.err and "internal error" not in captured.err
    assert "loading" not in captured.err and captured.out == ""


def test_penalty_ranges_match_vllm():
    for v in (-2.0, 2.0, 0.7):
        SamplingParams(presence_penalty=v, frequency_penalty=v)
    for name in ("presence_penalty", "frequency_penalty"):
        with pytest.raises(InvalidSamplingParam, match=r"\[-2, 2\]"):
            SamplingParams(**{name: 2.01})
    SamplingParams(repetition_penalty=float(torch.finfo(torch.float32).tiny))
    with pytest.raises(InvalidSamplingParam):
        SamplingParams(repetition_penalty=1e-300)


def test_penalised_logits_stay_finite_and_sampleable():
    """The smallest repetition penalty accepted divides a logit of 30 past float32's range: held at its
    largest finite value, so the seen token wins and the sampler gets a distribution, not inf / NaN."""
    logits = torch.tensor([30.0, 1.0, -3.0, 0.0, 2.0])
    seen = torch.tensor([0, 2, 3])
    tiny = float(torch.finfo(torch.float32).tiny)
    out = penalize(logits, seen, seen, torch.ones(3), repetition=tiny, presence=-2.0, frequency=-2.0)
    assert torch.isfinite(out).all() and int(out.argmax()) == 0
    assert float(out[0]) == torch.finfo(torch.float32).max

    class History:
        def penalty_ids(self):
            return seen, seen, torch.ones(3)

    params = SamplingParams(temperature=1.0, repetition_penalty=tiny, presence_penalty=-2.0)
    assert sample(logits, params, torch.Generator().manual_seed(0), History()) == 0


# ---------------------------------------------------------------- 2. prompt ids, checks before the echo


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--prompt-ids=-1"], "token id -1 is outside the vocabulary"),
        (["--prompt-ids=7,99999"], "token id 99999 is outside the vocabulary"),
        (["-n", "5000", "The"], "exceeds the model's context"),
    ],
)
def test_bad_requests_are_clean_errors_before_the_prompt_is_echoed(argv, message, capsys):
    code = _exit_code(["generate", "--backend", "reference", "-n", "3", *argv])
    captured = capsys.readouterr()
    assert code == 2 and message in captured.err and "internal error" not in captured.err
    assert captured.out == ""  # nothing echoed, so no line left without its newline


# ---------------------------------------------------------------- 3. compile time in the timing line


def _simulate_compiling(monkeypatch, seconds_by_step: dict[int, float]):
    """Make the executor report compiling (as the cpu backend does) of ``seconds_by_step[i]`` in step i
    (step 0 prefills the prompt and gives the first token); a decode step's compiling also takes its time."""
    real_new_core = LLM.new_core

    def new_core(self, *args, **kw):
        core = real_new_core(self, *args, **kw)
        stats = self.executor.__dict__.setdefault("stats", {})
        stats.setdefault("compiling_s", 0.0)
        real_step, calls = core.step, [0]

        def step():
            seconds = seconds_by_step.get(calls[0], 0.0)
            calls[0] += 1
            stats["compiling_s"] += seconds
            if calls[0] > 1:
                time.sleep(seconds)
            return real_step()

        core.step = step
        return core

    monkeypatch.setattr(LLM, "new_core", new_core)


def test_compiling_before_the_first_token_is_not_taken_from_the_decode_speed(monkeypatch, capsys):
    _simulate_compiling(monkeypatch, {0: 50.0})
    argv = ["generate", "--backend", "reference", "-n", "6", "--temperature", "0", "--ignore-eos", "The"]
    assert main(argv) == 0
    line = capsys.readouterr().err.splitlines()[-1]
    first, decode = line.split("decode ")
    assert "(incl. 50.0 s compiling the step, cached for later runs)" in first, line
    assert "compiling" not in decode and "n/a" not in decode, line


def test_compiling_during_decode_is_reported_with_the_decode_speed(monkeypatch, capsys):
    _simulate_compiling(monkeypatch, {0: 40.0, 2: 0.4})
    argv = ["generate", "--backend", "reference", "-n", "6", "--temperature", "0", "--ignore-eos", "The"]
    assert main(argv) == 0
    line = capsys.readouterr().err.splitlines()[-1]
    first, decode = line.split("decode ")
    assert "(incl. 40.0 s compiling" in first, line
    assert "(incl. 0.4 s compiling, also cached;" in decode and "tokens/s without it" in decode, line


def test_decode_compiling_metric_counts_only_the_decode_interval(monkeypatch):
    _simulate_compiling(monkeypatch, {0: 7.0, 3: 0.01})
    llm = LLM(backend="reference")
    out = llm.generate(["The"], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))[0]
    assert out.metrics["decode_compiling_s"] == pytest.approx(0.01)


# ---------------------------------------------------------------- 4. speculative decoding


def test_speculative_generate_leaves_out_the_checkpoints_penalty(capsys):
    """k3-nano's generation_config.json sets repetition_penalty 1.1, which speculative decoding does not
    support: it is not applied (said once), and the run completes."""
    argv = ["generate", "--backend", "reference", "-n", "4", "--speculative", "ngram", "--temperature", "0", "The"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err.count("not applying the checkpoint's repetition_penalty 1.1") == 1 and "ngram drafts" in err


def test_speculative_with_a_penalty_flag_is_refused_before_loading(capsys):
    argv = ["generate", "--backend", "reference", "--speculative", "ngram", "--repetition-penalty", "1.3", "The"]
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert "not supported with speculative decoding" in err and "loading" not in err


def test_speculative_llm_default_sampling_works():
    llm = LLM(backend="reference", speculative={"method": "ngram", "num_tokens": 2})
    assert not llm.default_sampling().penalized
    assert len(llm.generate(["The"], SamplingParams(max_tokens=3, temperature=0))[0].token_ids) == 3
    with pytest.raises(ValueError, match="repetition_penalty 1.2"):
        llm.generate(["The"], SamplingParams(repetition_penalty=1.2))


def test_dspark_without_a_drafter_says_where_the_command_line_looks(tiny, capsys):
    argv = ["generate", "--model", str(tiny), "--backend", "reference", "--speculative", "dspark", "-n", "2"]
    assert _exit_code([*argv, "--prompt-ids", "1,2"]) == 2
    err = capsys.readouterr().err
    assert str(tiny / "dspark") in err and "command line looks only there" in err and "--speculative ngram" in err
    assert "loading" not in err


# ---------------------------------------------------------------- 5. chat setups refused at startup


def _no_weights(monkeypatch):
    """Fail the test if weights are read or built."""

    def refuse(*args, **kw):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr("nonstop.model.build.load_model", refuse)
    monkeypatch.setattr("nonstop.model.build.random_model", refuse)


def test_chat_template_that_does_not_parse_is_refused_before_the_weights(tmp_path, monkeypatch, capsys):
    model = synth_checkpoint("k3", tmp_path / "m", chat_template="{% for m in messages %}{{ m.content }")
    _no_weights(monkeypatch)
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\nHello\n"))
    assert _exit_code(["chat", "--model", str(model), "--backend", "reference", "-n", "3"]) == 2
    err = capsys.readouterr().err
    assert "the checkpoint's chat template" in err and "does not parse" in err and "/reset" not in err


def test_bad_chat_template_file_is_refused_at_startup(tiny, tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% if %}")
    _no_weights(monkeypatch)
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n"))
    code = _exit_code(["chat", "--model", str(tiny), "--backend", "reference", "--chat-template", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and f"--chat-template {bad}" in err and "/reset" not in err


def test_chat_without_a_template_is_refused_before_the_weights(tmp_path, monkeypatch, capsys):
    model = synth_checkpoint("k3", tmp_path / "plain")
    _no_weights(monkeypatch)
    assert _exit_code(["chat", "--model", str(model), "--backend", "reference"]) == 2
    assert "--chat-template" in capsys.readouterr().err


def test_chat_max_tokens_beyond_the_context_is_refused_at_startup(tiny, monkeypatch, capsys):
    _no_weights(monkeypatch)
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n"))
    assert _exit_code(["chat", "--model", str(tiny), "--backend", "reference", "-n", "600"]) == 2
    err = capsys.readouterr().err
    assert "context of 512 tokens" in err and "--max-tokens" in err and "/reset" not in err


def test_chat_with_tokenizer_ids_is_refused_at_startup(monkeypatch, capsys):
    _no_weights(monkeypatch)
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n"))
    assert _exit_code(["chat", "--backend", "reference", "-n", "3", "--tokenizer", "ids"]) == 2
    err = capsys.readouterr().err
    assert "--tokenizer ids" in err and "chat reads and writes text" in err and "/reset" not in err


def test_chat_reset_hint_only_where_starting_over_helps(tiny, monkeypatch, capsys):
    """A first message too long by itself: no /reset hint (and, every turn failing, a nonzero exit); a
    conversation grown too long: the hint."""
    long = "x" * 450
    monkeypatch.setattr("sys.stdin", io.StringIO(long + "\n"))
    argv = ["chat", "--model", str(tiny), "--backend", "reference", "-n", "100", "--temperature", "0"]
    assert _exit_code([*argv, "--ignore-eos"]) == 2
    err = capsys.readouterr().err
    assert "this message is too long" in err and "/reset" not in err and "none of the 1 message" in err

    half = "y" * 200
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{half}\n{half}\n"))
    assert _exit_code([*argv, "--ignore-eos"]) == 0  # the first turn got a reply
    err = capsys.readouterr().err
    assert "the conversation is too long" in err and "(/reset starts over)" in err


# ---------------------------------------------------------------- 6. chat input decoding


def _chat_subprocess(tiny, data: bytes, encoding: str | None):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONIOENCODING"}
    if encoding:
        env["PYTHONIOENCODING"] = encoding
    argv = [sys.executable, "-m", "nonstop.cli", "chat", "--model", str(tiny), "--backend", "reference"]
    argv += ["-n", "3", "--temperature", "0", "--ignore-eos"]
    return subprocess.run(argv, input=data, capture_output=True, timeout=300, cwd=REPO, env=env)


@pytest.mark.parametrize("encoding", ["utf-8:strict", None])
def test_chat_skips_an_undecodable_line_and_answers_the_others(tiny, encoding):
    done = _chat_subprocess(tiny, b"Hi\n\xff\nHello\n", encoding)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert err.count("[3 tokens") == 2, err  # "Hi" and "Hello" answered
    assert "input line 2 is not valid utf-8 (byte 0xff at position 1): not sent" in err
    assert "character" not in err and "UnicodeDecodeError" not in err and "/reset" not in err


def test_chat_text_stream_with_escaped_bytes_names_the_line(tiny, monkeypatch, capsys):
    """A text stdin decoded with surrogateescape (or any str source): the message is about the user's line."""
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n\udcff\n"))
    argv = ["chat", "--model", str(tiny), "--backend", "reference", "-n", "2", "--temperature", "0", "--ignore-eos"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "input line 2 is not valid utf-8 (byte 0xff" in err and "character" not in err


# ---------------------------------------------------------------- 7. --tokenizer ids warning


def test_tokenizer_ids_warning_says_the_user_chose_it(capsys):
    argv = ["generate", "--backend", "reference", "-n", "1", "--tokenizer", "ids", "--prompt-ids", "1,2"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "tokenizer 'ids' chosen (--tokenizer ids)" in err and "has no tokenizer" not in err
    with pytest.raises(SystemExit) as e:  # text with the ids tokenizer: the error names the choice too
        main(["generate", "--backend", "reference", "-n", "1", "--tokenizer", "ids", "hello"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "tokenizer 'ids' chosen" in err and "has no tokenizer" not in err


def test_checkpoint_without_tokenizer_warning_names_it(tiny, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in tiny.iterdir():
        if f.name not in ("tokenizer.json", "tiktoken.model"):
            (bare / f.name).write_bytes(f.read_bytes())
    LLM(bare, backend="reference")
    assert f"{bare} has no tokenizer" in capsys.readouterr().err


def test_the_server_under_speculative_decoding_leaves_out_the_checkpoints_penalty():
    """k3-nano's generation_config.json sets repetition_penalty 1.1, which speculative decoding refuses: a
    server request that names no penalty gets the checkpoint's other defaults without it (before, every such
    request was refused), and one that asks for a penalty is still a 400-class error naming it."""
    from nonstop.engine.llm import LLM
    from nonstop.server.errors import APIError
    from nonstop.server.protocol import CompletionBody
    from nonstop.server.translate import sampling_params

    llm = LLM("k3-nano", backend="reference", speculative={"method": "ngram"})
    assert llm.generation.defaults.get("repetition_penalty", 1.0) != 1.0  # the premise: the checkpoint sets one
    body = CompletionBody.model_validate({"model": "k3-nano", "prompt": "The list"})
    params = sampling_params(body, llm, 8, None)
    assert params.repetition_penalty == 1.0 and not params.penalized
    assert params.min_p == llm.generation.defaults["min_p"]  # the other defaults stay
    llm.generate(["The list"], sampling=params)  # admitted and run
    asked = CompletionBody.model_validate({"model": "k3-nano", "prompt": "x", "repetition_penalty": 1.3})
    with pytest.raises(APIError, match="repetition_penalty 1.3") as refused:
        sampling_params(asked, llm, 8, None)
    assert (refused.value.status, refused.value.param) == (400, "repetition_penalty")


def test_a_chat_turn_that_compiled_gives_its_speed_without_the_compile(monkeypatch, capsys):
    """chat's turn line folded the step's compile into tokens/s (1.9 tokens/s for a 30 s compile)."""
    import io

    _simulate_compiling(monkeypatch, {0: 0.0, 2: 0.4})
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"hi\n")))
    assert main(["chat", "--backend", "reference", "--max-tokens", "6", "--temperature", "0"]) == 0
    turn = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")][-1]
    assert "tokens/s (" in turn and "without 0.4 s preparing the step)" in turn, turn


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["-n", "600", "--prompt-ids", "1,2"],
            "prompt (2 tokens) + max_tokens (600) exceeds the model's context of 512",
        ),
        (["-n", "2", "--prompt-ids", "1,999"], "token id 999 is outside the vocabulary"),
        (["-n", "2", ""], "empty prompt"),
    ],
)
def test_generate_refuses_a_request_before_the_weights_load(tiny, monkeypatch, capsys, extra, message):
    """What the config and tokenizer decide (the context, the vocabulary, an empty prompt) is refused before
    any weight is read: a 1T-parameter checkpoint no longer loads for minutes to say the prompt is too long."""
    _no_weights(monkeypatch)
    assert _exit_code(["generate", "--model", str(tiny), "--backend", "reference", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "loading" not in err, err


def test_generate_cuts_a_default_max_tokens_before_the_weights_load(tiny, monkeypatch, capsys):
    """The default max_tokens cut to the context's room is said before loading, and the run uses it."""
    prompt = ",".join(["5"] * 510)
    assert main(["generate", "--model", str(tiny), "--backend", "reference", "--prompt-ids", prompt]) == 0
    err = capsys.readouterr().err
    assert err.index("2 in the model's context of 512") < err.index("loading"), err
    assert "2 tokens, prompt 510 tokens" in err, err
