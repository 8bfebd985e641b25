"""CLI argument handling a mutation audit found unpinned: the bounds of the shared argument types, defaults
the help text states, and flags that must reach what they describe. Parsing only, or a command run with its
model loading replaced: no weights load here."""

from __future__ import annotations

import pytest

from nonstop.cli import build_parser, main
from nonstop.commands.common import spec_from_args


def _parse(argv):
    return build_parser().parse_args(argv)


def _parser_refuses(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        _parse(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    return err


# ------------------------------------------------------------------ bounds of the shared argument types


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["generate", "--max-tokens", "0"], "--max-tokens"),
        (["serve", "--max-batch", "0"], "--max-batch"),
        (["serve", "--prefill-chunk", "0"], "--prefill-chunk"),
        (["synth", "--preset", "k3-nano", "--out", "x", "--num-layers", "0"], "--num-layers"),
        (["generate", "--tp", "0"], "--tp"),
        (["perplexity", "f.txt", "--batch-size", "0"], "--batch-size"),
    ],
)
def test_zero_is_not_a_positive_count(argv, flag, capsys):
    """0 is not a positive integer: ``synth --num-layers 0`` would otherwise write the whole model (0 is
    falsy), ``serve --max-batch 0`` a server with no slot."""
    err = _parser_refuses(argv, capsys)
    assert f"argument {flag}" in err and "expected a positive integer, got 0" in err


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["synth", "--preset", "k3-nano", "--out", "x", "--shard-size", "0"], "--shard-size"),
        (["train", "--out", "x", "--lr", "0"], "--lr"),
        (["train", "--out", "x", "--minutes", "0"], "--minutes"),
    ],
)
def test_zero_is_not_a_positive_number(argv, flag, capsys):
    """A shard size of 0 GB, a peak learning rate of 0 or a budget of 0 minutes is no setting."""
    err = _parser_refuses(argv, capsys)
    assert f"argument {flag}" in err and "expected a positive finite number, got 0" in err


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**64 - 1])
def test_a_seed_takes_the_range_torch_takes(seed):
    """synth / train take any seed torch's manual_seed takes: [-2^63, 2^64)."""
    for argv in (["synth", "--preset", "k3-nano", "--out", "x"], ["train", "--out", "x"]):
        assert _parse([*argv, "--seed", str(seed)]).seed == seed


def test_a_seed_past_the_range_is_refused(capsys):
    err = _parser_refuses(["synth", "--preset", "k3-nano", "--out", "x", "--seed", str(2**64)], capsys)
    assert "a seed must lie in [-2^63, 2^64)" in err


# ------------------------------------------------------------------ defaults the help states


def test_speculative_decoding_drafts_four_tokens_by_default():
    """--num-draft-tokens' help: "default 4"."""
    args = _parse(["generate", "--speculative", "ngram"])
    assert spec_from_args(args) == {"method": "ngram", "num_tokens": 4}
    args = _parse(["generate", "--speculative", "dspark", "--num-draft-tokens", "0"])
    assert spec_from_args(args) == {"method": "dspark", "num_tokens": 0}


# ------------------------------------------------------------------ sampling flags reach SamplingParams


def test_sampling_flags_override_the_checkpoint_which_overrides_the_cli_defaults():
    """--help: a flag not given takes the checkpoint's generation_config.json, else 64 tokens / greedy."""
    from nonstop.commands.common import sampling_from_args

    bare = sampling_from_args(_parse(["generate"]))
    assert (bare.max_tokens, bare.temperature, bare.ignore_eos, bare.stop) == (64, 0.0, False, None)
    checkpoint = {"max_tokens": 100, "temperature": 0.7, "top_p": 0.9}
    taken = sampling_from_args(_parse(["generate"]), checkpoint)
    assert (taken.max_tokens, taken.temperature, taken.top_p) == (100, 0.7, 0.9)
    argv = ["generate", "-n", "5", "-t", "0.2", "--ignore-eos", "--stop", "a", "--stop", "b", "--seed", "7"]
    given = sampling_from_args(_parse(argv), checkpoint)
    assert (given.max_tokens, given.temperature, given.top_p, given.seed) == (5, 0.2, 0.9, 7)
    assert given.ignore_eos is True and list(given.stop) == ["a", "b"]


def test_the_model_flags_reach_the_llm(monkeypatch):
    """--no-preflight, --ignore-generation-config, --chat-template, --backend, --tokenizer, --dtype, --device
    and --threads are passed on, not dropped for their defaults."""
    import nonstop.threads
    from nonstop.commands.common import llm_from_args

    threads = []
    monkeypatch.setattr(nonstop.threads, "set_threads", threads.append)
    seen = {}

    def fake_llm(model, **kw):
        seen.update(kw, model=model)

    argv = ["chat", "-m", "some-dir", "--no-preflight", "--ignore-generation-config", "--chat-template", "t.jinja"]
    argv += ["--backend", "reference", "--tokenizer", "bytes", "--dtype", "bf16", "--device", "cpu", "--threads", "1"]
    llm_from_args(_parse(argv), cls=fake_llm, max_batch=1)
    assert threads == [1]
    assert seen == {
        "model": "some-dir",
        "dtype": "bf16",
        "device": "cpu",
        "tokenizer": "bytes",
        "preflight": False,
        "chat_template": "t.jinja",
        "generation_config": False,
        "backend": "reference",
        "max_batch": 1,
    }
    seen.clear()
    llm_from_args(_parse(["chat"]), cls=fake_llm)
    assert seen["preflight"] is True and seen["generation_config"] is True and "chat_template" not in seen


# ------------------------------------------------------------------ serve: flags reach the engine and server


@pytest.fixture
def serve_stubs(monkeypatch):
    """``nonstop serve`` with the model, the engine loop, the socket and the server replaced: what each was
    called with."""
    pytest.importorskip("uvicorn")
    import types

    import nonstop.commands.serve as serve_command
    import nonstop.server
    import nonstop.server.launch

    calls = {}

    def llm_from_args(args, cls=None, **kw):
        calls["llm"] = kw
        return types.SimpleNamespace(backend="reference")

    def build_context(llm, names, **kw):
        calls["context"] = dict(kw, names=names)
        return types.SimpleNamespace(served_names=names, limits=types.SimpleNamespace(max_len=kw["max_model_len"]))

    monkeypatch.setattr(serve_command, "llm_from_args", llm_from_args)
    monkeypatch.setattr(nonstop.server, "build_context", build_context)
    monkeypatch.setattr(nonstop.server, "serve", lambda ctx, host, port, level, sock=None: calls.update(port=port))
    monkeypatch.setattr(nonstop.server.launch, "bind_socket", lambda host, port: None)
    monkeypatch.delenv("NONSTOP_API_KEY", raising=False)
    return calls


def test_serve_passes_its_flags_on(serve_stubs, capsys):
    argv = ["serve", "--no-warmup", "--port", "8123", "--max-batch", "3", "--max-waiting", "5"]
    argv += ["--max-model-len", "300", "--prefill-chunk", "17", "--no-batch-invariant", "--max-prompts", "2"]
    argv += ["--api-key", "k", "--default-max-tokens", "299", "--served-model-name", "a", "--served-model-name", "b"]
    assert main(argv) == 0
    assert serve_stubs["llm"] == {
        "max_batch": 3,
        "progress": True,
        "prefill_chunk": 17,
        "batch_invariant": False,
        "speculative": None,
    }
    assert serve_stubs["context"] == {
        "names": ["a", "b"],
        "max_batch": 3,
        "max_waiting": 5,
        "max_model_len": 300,
        "max_prompts": 2,
        "api_key": "k",
        "default_max_tokens": 299,
    }
    assert serve_stubs["port"] == 8123
    assert "(API key required)" in capsys.readouterr().err


def test_serve_defaults_match_its_help(serve_stubs, monkeypatch):
    """--help: 16 slots, 256 waiting, chunks of 128, 16 prompts, batch-invariant, the --model value as the
    name, $NONSTOP_API_KEY as the key."""
    monkeypatch.setenv("NONSTOP_API_KEY", "from-env")
    assert main(["serve", "--no-warmup"]) == 0
    assert serve_stubs["llm"]["max_batch"] == 16 and serve_stubs["llm"]["prefill_chunk"] == 128
    assert serve_stubs["llm"]["batch_invariant"] is True
    context = serve_stubs["context"]
    assert (context["max_waiting"], context["max_prompts"], context["names"]) == (256, 16, ["k3-nano"])
    assert context["api_key"] == "from-env" and context["default_max_tokens"] is None


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--port", "65536"], "--port must be in 1..65535, got 65536"),
        (["--port", "0"], "--port must be in 1..65535, got 0"),
        (["--api-key", " "], "--api-key (or $NONSTOP_API_KEY) must not be empty"),
        (["--api-key", "clé"], "--api-key (or $NONSTOP_API_KEY) must be printable ASCII"),
        (["--max-model-len", "2049"], "--max-model-len 2049 exceeds the model's 2048 positions"),
        (["--max-model-len", "100", "--default-max-tokens", "100"], "--default-max-tokens 100 leaves no room"),
        (["--max-model-len", "1"], "a context of 1 tokens (--max-model-len) leaves no room for a prompt and one"),
    ],
)
def test_serve_refuses_bad_values_before_loading(serve_stubs, capsys, extra, message):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--no-warmup", *extra])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert "llm" not in serve_stubs


@pytest.mark.parametrize(
    "extra",
    [
        ["--max-model-len", "2048"],
        ["--max-model-len", "100", "--default-max-tokens", "99"],
        ["--max-model-len", "2"],
        ["--port", "1"],
    ],
)
def test_serve_takes_values_at_the_edge(serve_stubs, extra):
    """k3-nano has 2048 positions: a --max-model-len of all of them is allowed, and a default max_tokens one
    less than the context leaves a one-token prompt room."""
    assert main(["serve", "--no-warmup", *extra]) == 0


@pytest.mark.parametrize("text", ["", ",", " , "])
def test_prompt_ids_without_an_id_are_refused(text, capsys):
    """An empty --prompt-ids is no prompt: generate would otherwise complete its default prompt 'The'."""
    assert "give at least one token id" in _parser_refuses(["generate", "--prompt-ids", text], capsys)


# ------------------------------------------------------------------ the layout flags


@pytest.mark.parametrize("seconds", ["1", "86400", "120.5"])
def test_dist_timeout_takes_a_second_to_a_day(seconds):
    """docs/distributed.md: --dist-timeout is 1 s to a day (both ends included), default 120 (left unset
    until the ranks join, so that a --dist-timeout given without a layout can be refused)."""
    from nonstop.commands.layout_args import DIST_TIMEOUT_DEFAULT_S

    assert _parse(["generate", "--tp", "2", "--dist-timeout", seconds]).dist_timeout == float(seconds)
    assert _parse(["serve"]).dist_timeout is None and DIST_TIMEOUT_DEFAULT_S == 120.0


@pytest.mark.parametrize("seconds", ["0.5", "86401", "1e9"])
def test_dist_timeout_outside_a_second_to_a_day_is_refused(seconds, capsys):
    err = _parser_refuses(["generate", "--tp", "2", "--dist-timeout", seconds], capsys)
    assert "expected seconds from 1 to 86400 (a day)" in err


@pytest.mark.parametrize(
    "argv, layout",
    [
        ([], None),
        (["--tp", "1", "--ep", "1", "--world", "1"], None),
        (["--world", "2"], (1, 1, 2)),
        (["--ep", "2"], (1, 2, 2)),
        (["--tp", "2", "--ep", "4"], (2, 4, 4)),
    ],
)
def test_any_flag_above_one_asks_for_a_layout(argv, layout):
    """--world alone (data-parallel attention groups) is a layout as much as --tp or --ep."""
    from nonstop.commands.layout_args import layout_from_args, wants_layout

    args = _parse(["generate", *argv])
    assert wants_layout(args) is (layout is not None)
    if layout is not None:
        made = layout_from_args(args)
        assert (made.tp, made.ep, made.world) == layout


def _check_layout(argv, monkeypatch):
    """``check_before_start`` as the process the user started runs it, before any rank starts."""
    from nonstop.commands.layout_args import check_before_start, layout_from_args

    monkeypatch.delenv("RANK", raising=False)
    args = _parse(argv)
    check_before_start(args, layout_from_args(args))


def test_a_dspark_drafter_that_cannot_draft_is_refused_before_any_rank_starts(monkeypatch):
    """k3-nano's drafter drafts at most 7 tokens (--num-draft-tokens' help); rank 0 finding out only once
    loaded left the other ranks to report its end as their failure."""
    argv = ["generate", "--ep", "2", "--no-preflight", "--speculative", "dspark"]
    with pytest.raises(ValueError, match="7"):
        _check_layout([*argv, "--num-draft-tokens", "8", "Hi"], monkeypatch)
    _check_layout([*argv, "--num-draft-tokens", "7", "Hi"], monkeypatch)


def test_a_truncated_checkpoint_is_refused_before_any_rank_starts(tmp_path, monkeypatch):
    import shutil

    from nonstop.weights.errors import CheckpointError
    from nonstop.weights.resolve import ASSETS

    model = tmp_path / "k3"
    shutil.copytree(ASSETS / "k3-nano", model, ignore=shutil.ignore_patterns("dspark"))
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    with pytest.raises(CheckpointError, match="truncated"):
        _check_layout(["generate", "-m", str(model), "--ep", "2", "--no-preflight", "Hi"], monkeypatch)


# ------------------------------------------------------------------ synth: --num-layers / --dtype / --seed


def _synth(out, *extra) -> dict:
    """``nonstop synth`` of a one-layer k3-nano into ``out``: {tensor name: tensor}."""
    from safetensors.torch import load_file

    argv = ["synth", "--preset", "k3-nano", "--out", str(out), "--no-preflight", *extra]
    assert main(argv) == 0
    return {k: v for f in sorted(out.glob("*.safetensors")) for k, v in load_file(f).items()}


def test_synth_writes_the_layers_dtype_and_seed_it_is_given(tmp_path):
    import torch

    from nonstop.config import ModelConfig

    one = _synth(tmp_path / "a", "--num-layers", "1", "--dtype", "fp32", "--seed", "3")
    assert ModelConfig.from_file(tmp_path / "a").num_hidden_layers == 1
    assert not any(".layers.1." in k for k in one) and any(".layers.0." in k for k in one)
    floats = [v for v in one.values() if v.is_floating_point()]
    assert floats and all(v.dtype == torch.float32 for v in floats)
    again = _synth(tmp_path / "b", "--num-layers", "1", "--dtype", "fp32", "--seed", "3")
    other = _synth(tmp_path / "c", "--num-layers", "1", "--dtype", "fp32", "--seed", "4")
    assert all(torch.equal(one[k], again[k]) for k in one)
    assert any(not torch.equal(one[k], other[k]) for k in one if one[k].is_floating_point())
    half = _synth(tmp_path / "d", "--num-layers", "1")  # the default: bfloat16 (--help); KDA's A_log stays fp32
    assert all(v.dtype == torch.bfloat16 for k, v in half.items() if k.endswith(".weight"))


# ------------------------------------------------------------------ generate


def test_generate_refuses_a_text_prompt_and_prompt_ids_together(monkeypatch, capsys):
    import nonstop.commands.generate as generate

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(generate, "llm_from_args", refuse)
    with pytest.raises(SystemExit) as e:
        main(["generate", "--prompt-ids", "1,2", "Hello"])
    assert e.value.code == 2 and "give a text prompt or --prompt-ids, not both" in capsys.readouterr().err


def test_generate_without_a_prompt_completes_the(monkeypatch):
    """generate's help: "default, when none is given: 'The'"."""
    import types

    import nonstop.commands.generate as generate

    class Asked(Exception):
        pass

    def make_request(prompt, prompt_ids, params, request_id=None):
        raise Asked(prompt, prompt_ids)

    llm = types.SimpleNamespace(generation=types.SimpleNamespace(defaults={}), make_request=make_request)
    llm.sampling_defaults = dict

    def llm_from_args(*args, before_load, **kw):  # the request is checked before the weights load
        before_load(llm)
        return llm

    monkeypatch.setattr(generate, "llm_from_args", llm_from_args)
    with pytest.raises(Asked) as asked:
        generate.run(_parse(["generate"]))
    assert asked.value.args == ("The", None)
    with pytest.raises(Asked) as asked:
        generate.run(_parse(["generate", "Once", "upon"]))
    assert asked.value.args == ("Once upon", None)


# ------------------------------------------------------------------ info and perplexity


def test_info_groups_consecutive_layers_into_ranges():
    import types

    from nonstop.commands.info import layer_table

    cfg = types.SimpleNamespace(
        attn_types=["kda", "kda", "kda", "mla", "kda", "kda", "kda", "mla"],
        mlp_types=["dense", "moe", "moe", "moe", "moe", "moe", "moe", "moe"],
    )
    assert layer_table(cfg) == [
        ("kda", "dense", 1, "0"),
        ("kda", "moe", 5, "1-2, 4-6"),
        ("mla", "moe", 2, "3, 7"),
    ]


def test_info_counts_bytes_in_the_dtype_asked_for(capsys):
    """--dtype float32 weighs every weight twice what bfloat16 does (4 bytes against 2)."""
    import re

    scale = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}

    def weights(dtype: str) -> float:
        assert main(["info", "--dtype", dtype]) == 0
        line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("weights"))
        number, unit = re.match(r"weights\s+([\d.]+)([KMG]?)B", line).groups()
        return float(number) * scale[unit]

    assert weights("float32") / weights("bfloat16") == pytest.approx(2, rel=0.01)


def test_perplexity_window_may_take_every_position():
    """--context up to the model's max_position_embeddings (inclusive); default 512 or fewer."""
    from nonstop.commands.perplexity import scoring_context

    assert scoring_context(2048, 2048) == 2048
    assert scoring_context(None, 2048) == 512 and scoring_context(None, 100) == 100
    with pytest.raises(ValueError, match="--context 2049 exceeds the model's 2048 positions"):
        scoring_context(2049, 2048)


@pytest.mark.parametrize("vocab, bytes_offered", [(255, False), (256, True), (6144, True)])
def test_perplexity_offers_byte_tokens_only_where_every_byte_is_an_id(vocab, bytes_offered):
    """A vocabulary of 256 ids holds every byte value (0..255): --tokenizer bytes works there."""
    from nonstop.commands.perplexity import no_tokenizer_message

    assert ("give --tokenizer bytes" in no_tokenizer_message("m", vocab)) is bytes_offered


# ------------------------------------------------------------------ train: the flags reach TrainConfig


def test_train_passes_its_settings_on(tmp_path, monkeypatch):
    """Each setting reaches the trainer; a --min-lr equal to --lr (a constant rate) is no error."""
    import nonstop.train.run

    seen = {}
    monkeypatch.setattr(nonstop.train.run, "run_training", lambda *a, **k: seen.update(tc=a[3], samples=k["samples"]))
    argv = ["train", "--out", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "t"), "--minutes", "2"]
    argv += ["--threads", "1", "--batch-size", "3", "--seq-len", "40", "--lr", "0.01", "--min-lr", "0.01"]
    argv += ["--warmup-steps", "5", "--weight-decay", "0.25", "--bias-update-rate", "0.5", "--max-steps", "9"]
    argv += ["--eval-every", "7", "--log-every", "6", "--seed", "-2", "--no-samples"]
    assert main(argv) == 0
    tc = seen["tc"]
    got = (tc.minutes, tc.threads, tc.batch_size, tc.seq_len, tc.lr, tc.min_lr, tc.warmup_steps, tc.weight_decay)
    assert got == (2.0, 1, 3, 40, 0.01, 0.01, 5, 0.25)
    got = (tc.bias_update_rate, tc.max_steps, tc.eval_every_s, tc.log_every_s, tc.seed, seen["samples"])
    assert got == (0.5, 9, 7.0, 6.0, -2, False)


# ------------------------------------------------------------------ errors: which are the user's


@pytest.mark.parametrize(
    "error",
    [IsADirectoryError("x: is a directory"), NotADirectoryError("x"), PermissionError("x"), FileExistsError("x")],
)
def test_file_errors_are_the_users_one_line_exit_2(error, capsys):
    from nonstop.commands.errors import user_errors

    with pytest.raises(SystemExit) as e, user_errors():
        raise error
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == f"nonstop: error: {error}\n"
