"""The LLM API refuses malformed input up front, naming the argument (and the element) at fault: engine
sizes, token ids, prompts, sampling, dtype, chat messages, the model name and speculative options."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from nonstop import LLM, SamplingParams
from nonstop.engine.speculative.config import SpeculativeConfig
from nonstop.engine.speculative.ngram import NgramDrafter
from nonstop.weights.resolve import parse_dtype

GREEDY = SamplingParams(max_tokens=2, temperature=0)


@pytest.fixture(scope="module")
def llm():
    return LLM("k3-nano", backend="reference")


# ------------------------------------------------------------------ 1. max_batch / prefill_chunk


def test_max_batch_zero_is_refused_instead_of_hanging():
    """max_batch=0 made a core with no slot: generate admitted nothing and looped forever."""
    outcome = {}

    def run():
        try:
            LLM("k3-nano", backend="reference", max_batch=0).generate(["a", "b"], GREEDY)
            outcome["returned"] = True
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "LLM(max_batch=0).generate never returned"
    assert isinstance(outcome.get("error"), ValueError), outcome
    assert "max_batch must be an integer >= 1, got 0" in str(outcome["error"])


@pytest.mark.parametrize("value, error", [(-1, ValueError), (1.5, TypeError), ("4", TypeError), (None, TypeError)])
def test_max_batch_is_checked_at_construction(value, error):
    with pytest.raises(error, match="max_batch must be an integer >= 1"):
        LLM("k3-nano", backend="reference", max_batch=value)


@pytest.mark.parametrize("value, error", [(0, ValueError), (-2, ValueError), (1.5, TypeError), ("2", TypeError)])
def test_threads_are_checked_at_construction(value, error):
    with pytest.raises(error, match="threads must be an integer >= 1"):
        LLM("k3-nano", backend="reference", threads=value)


def test_threads_chosen_from_python_are_kept_by_the_cpu_backend(monkeypatch):
    """``LLM(threads=N)`` is the CLI's --threads: the cpu backend, which otherwise picks its own count for the
    process (fewer beside busy processes), keeps it."""
    import nonstop.threads

    monkeypatch.setattr(nonstop.threads, "_chosen", None)
    monkeypatch.setenv("NONSTOP_THREADS", "2")  # what the backend would pick without the argument
    before = torch.get_num_threads()
    try:
        assert LLM("k3-nano", backend="cpu").executor.threads == 2
        llm = LLM("k3-nano", backend="cpu", threads=1)
        assert torch.get_num_threads() == 1 and llm.executor.threads == 1
    finally:
        torch.set_num_threads(before)


def test_stop_strings_without_a_tokenizer_are_refused():
    """Token ids in, token ids out: no text for a stop string to match, so it could only run to max_tokens."""
    from nonstop.engine.sampling import InvalidSamplingParam

    llm = LLM("k3-nano", backend="reference", tokenizer="ids")
    with pytest.raises(InvalidSamplingParam, match="stop strings need a tokenizer") as caught:
        llm.generate(prompt_token_ids=[[434, 1087]], sampling=SamplingParams(max_tokens=3, stop=["x"]))
    assert caught.value.param == "stop"
    out = llm.generate(prompt_token_ids=[[434, 1087]], sampling=SamplingParams(max_tokens=3, stop_token_ids=[5]))
    assert len(out[0].token_ids) <= 3


@pytest.mark.parametrize("value, error", [(0, ValueError), (-3, ValueError), (1.5, TypeError), ("8", TypeError)])
def test_prefill_chunk_is_checked_at_construction(value, error):
    with pytest.raises(error, match="prefill_chunk must be an integer >= 1 or None"):
        LLM("k3-nano", backend="reference", prefill_chunk=value)


def test_integer_like_engine_sizes_are_accepted(llm):
    other = LLM("k3-nano", backend="reference", max_batch=np.int64(2), prefill_chunk=np.int32(3))
    assert type(other.max_batch) is int and other.max_batch == 2 and other.prefill_chunk == 3
    out = other.generate(["a", "b"], GREEDY)
    assert [o.token_ids for o in out] == [o.token_ids for o in llm.generate(["a", "b"], GREEDY)]


def test_a_core_without_slots_is_refused(llm):
    with pytest.raises(ValueError, match="num_slots must be an integer >= 1"):
        llm.new_core(0)


# ------------------------------------------------------------------ 2. prompt_token_ids and prompts


@pytest.mark.parametrize(
    "ids, where",
    [
        ([[1.7, 2.9]], r"prompt_token_ids\[0\]\[0\] is float 1\.7"),
        ([1.7, 2.9], r"prompt_token_ids\[0\] is float 1\.7"),
        (["12"], r"prompt_token_ids\[0\] is str '12'"),
        ([[True, 5]], r"prompt_token_ids\[0\]\[0\] is bool True"),
        ([296, False], r"prompt_token_ids\[1\] is bool False"),
        ([[296], 408], r"prompt_token_ids\[1\] must be a list of token ids"),
        ([296, [408]], r"prompt_token_ids\[1\] is list"),
        ("296", "prompt_token_ids must be a list of token ids .* got str"),
        (b"\x01\x02", "prompt_token_ids must be a list of token ids .* got bytes"),
        (296, "prompt_token_ids must be a list of token ids .* got int"),
        (np.array([1.0, 2.0]), "prompt_token_ids is an array of float64"),
        (torch.tensor([True, False]), "prompt_token_ids is an array of torch.bool"),
        (torch.tensor([[1.0, 2.0]]), r"prompt_token_ids\[0\] is an array of torch.float32"),
        (np.zeros((1, 1, 2), dtype=np.int64), "prompt_token_ids must be a 1-D .* or 2-D"),
        ([np.float32(3.0)], r"prompt_token_ids\[0\] is float32 np.float32\(3.0\)"),
        ([torch.tensor(3.0)], r"prompt_token_ids\[0\] is Tensor tensor\(3\.\)"),
        ([np.bool_(True)], r"prompt_token_ids\[0\] is bool"),
        ([torch.tensor(True)], r"prompt_token_ids\[0\] is Tensor tensor\(True\)"),
    ],
)
def test_token_ids_are_not_coerced(llm, ids, where):
    with pytest.raises(TypeError, match=where):
        llm.generate(prompt_token_ids=ids, sampling=GREEDY)


@pytest.mark.parametrize(
    "ids",
    [
        np.array([296, 408]),
        torch.tensor([296, 408]),
        [np.int64(296), np.int64(408)],
        [torch.tensor(296), torch.tensor(408)],
        (296, 408),
        [np.array([296, 408], dtype=np.int32)],
        np.array([[296, 408]], dtype=np.uint16),
        torch.tensor([[296, 408]]),
    ],
    ids=["np-1d", "torch-1d", "np-scalars", "torch-0d", "tuple", "list-of-np", "np-2d", "torch-2d"],
)
def test_integer_like_token_ids_are_accepted(llm, ids):
    want = llm.generate(prompt_token_ids=[296, 408], sampling=GREEDY)[0]
    (out,) = llm.generate(prompt_token_ids=ids, sampling=GREEDY)
    assert out.prompt_token_ids == [296, 408] and all(type(t) is int for t in out.prompt_token_ids)
    assert out.token_ids == want.token_ids


def test_several_prompts_as_a_2d_tensor(llm):
    out = llm.generate(prompt_token_ids=torch.tensor([[296, 408], [408, 296]]), sampling=GREEDY)
    assert [o.prompt_token_ids for o in out] == [[296, 408], [408, 296]]


def test_stream_checks_its_token_ids(llm):
    with pytest.raises(TypeError, match=r"prompt_ids\[0\] is float"):
        llm.stream(prompt_ids=[1.5], sampling=GREEDY)
    assert llm.stream(prompt_ids=np.array([296, 408]), sampling=GREEDY).prompt_token_ids == [296, 408]


@pytest.mark.parametrize(
    "prompts, message",
    [
        (123, "prompts must be a string or a list of strings, got int"),
        (b"abc", "prompts must be a string or a list of strings, got bytes"),
        (["a", 5], r"prompts\[1\] must be a string, got int"),
        ([b"a"], r"prompts\[0\] must be a string, got bytes"),
        ({"a": 1}, "prompts must be a string or a list of strings, got dict"),
    ],
)
def test_prompts_must_be_strings(llm, prompts, message):
    with pytest.raises(TypeError, match=message):
        llm.generate(prompts, GREEDY)


# ------------------------------------------------------------------ 3. sampling


def test_a_tuple_of_sampling_params_is_one_per_prompt(llm):
    three = SamplingParams(max_tokens=3, temperature=0)
    out = llm.generate(["a", "b"], sampling=(GREEDY, three))
    assert [len(o.token_ids) for o in out] == [2, 3]


@pytest.mark.parametrize(
    "sampling, message",
    [
        ({"max_tokens": 3}, "sampling must be a SamplingParams .* got dict"),
        ([None, GREEDY], r"sampling\[0\] must be a SamplingParams, got NoneType"),
        ((GREEDY, {"max_tokens": 3}), r"sampling\[1\] must be a SamplingParams, got dict"),
        (3, "sampling must be a SamplingParams .* got int"),
    ],
)
def test_sampling_must_be_sampling_params(llm, sampling, message):
    with pytest.raises(TypeError, match=message):
        llm.generate(["a", "b"], sampling=sampling)


def test_stream_and_chat_check_sampling(llm):
    """stream takes one SamplingParams: its refusal no longer offers "a list of them, one per prompt", which it
    refuses too (generate's, and chat's through it, does offer the list)."""
    for sampling in ({"max_tokens": 2}, [GREEDY]):
        with pytest.raises(TypeError, match="sampling must be a SamplingParams or None") as refused:
            llm.stream("a", sampling=sampling)
        assert "one per prompt" not in str(refused.value)
    with pytest.raises(TypeError, match=r"sampling must be a SamplingParams \(or a list of them, one per prompt\)"):
        llm.chat([{"role": "user", "content": "hi"}], {"max_tokens": 2})


# ------------------------------------------------------------------ 4. dtype


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.float64, ["x"], "float64", 16])
def test_unsupported_dtypes_are_refused(dtype):
    with pytest.raises(ValueError, match="unsupported dtype .*choose one of: float32, fp32, bfloat16, bf16, float16"):
        parse_dtype(dtype, "cpu")
    with pytest.raises(ValueError, match="unsupported dtype"):
        LLM("k3-nano", backend="reference", dtype=dtype)


@pytest.mark.parametrize(
    "dtype, want",
    [
        (None, torch.float32),
        ("auto", torch.float32),
        ("fp32", torch.float32),
        ("bf16", torch.bfloat16),
        ("float16", torch.float16),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
    ],
)
def test_supported_dtypes(dtype, want):
    assert parse_dtype(dtype, "cpu") is want


# ------------------------------------------------------------------ 5. chat messages


@pytest.mark.parametrize(
    "messages, error, message",
    [
        ("hi", TypeError, "messages must be a list of .* got str"),
        ({"role": "user", "content": "hi"}, TypeError, "messages must be a list of .* got dict"),
        ([], ValueError, "messages is empty"),
        (["hi"], TypeError, r"messages\[0\] must be a dict"),
        ([{"role": "user"}], ValueError, r"messages\[0\] \(user\) has no content"),
        ([{"content": "x"}], ValueError, r"messages\[0\] has no 'role'"),
        ([{"role": "wizard", "content": "x"}], ValueError, r"messages\[0\]\['role'\] must be one of system"),
        ([{"role": "user", "content": None}], ValueError, r"messages\[0\] \(user\) has no content"),
        (
            [{"role": "system", "content": "x"}, {"role": "user", "content": 5}],
            TypeError,
            r"messages\[1\]\['content'\] must be a string or a list of text parts, got int",
        ),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            ValueError,
            r"messages\[0\]\['content'\]\[0\] is a part of type 'image_url'",
        ),
        ([{"role": "user", "content": [{"text": "x"}]}], TypeError, r"messages\[0\]\['content'\]\[0\] must be a text"),
        ([{"role": "user", "content": "x", "colour": 1}], ValueError, r"messages\[0\] has unknown field\(s\) colour"),
        ([{"role": "user", "content": "x", "name": 3}], TypeError, r"messages\[0\]\['name'\] must be a string"),
        ([{"role": "assistant", "content": None}], ValueError, r"messages\[0\] \(assistant\) has no content"),
    ],
)
def test_malformed_chat_messages_are_refused(llm, messages, error, message):
    with pytest.raises(error, match=message):
        llm.chat(messages, GREEDY)


def test_chat_messages_the_server_accepts():
    """The roles and content shapes of the server's ChatMessage: text parts are joined, refusal and
    annotations dropped, and an assistant message with tool_calls may leave its content out."""
    from nonstop.engine.chat_template import check_messages  # new with the check: imported here

    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}], "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}], "refusal": None, "annotations": []},
        {"role": "tool", "content": "42", "tool_call_id": "1"},
    ]
    assert check_messages(messages) == [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "hello", "name": "ann"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]},
        {"role": "tool", "content": "42", "tool_call_id": "1"},
    ]


def test_chat_with_text_parts_is_the_chat_with_the_string(llm):
    parts = llm.chat([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], GREEDY)
    plain = llm.chat([{"role": "user", "content": "hi"}], GREEDY)
    assert parts.prompt_token_ids == plain.prompt_token_ids and parts.token_ids == plain.token_ids


# ------------------------------------------------------------------ 6. model


@pytest.mark.parametrize("model, error", [(None, TypeError), (5, TypeError), ("", ValueError), ("  ", ValueError)])
def test_model_must_name_a_model(model, error):
    with pytest.raises(error, match=r"model (must be|is empty)"):
        LLM(model, backend="reference")


# ------------------------------------------------------------------ 7. speculative options


@pytest.mark.parametrize(
    "options, message",
    [
        ({"method": "ngram", "ngram_max": "4"}, "speculative ngram_max must be an integer >= 1, got '4'"),
        ({"method": "ngram", "ngram_min": 1.5}, "speculative ngram_min must be an integer >= 1, got 1.5"),
        ({"method": "ngram", "ngram_min": True}, "speculative ngram_min must be an integer >= 1, got True"),
        ({"method": "ngram", "ngram_min": 0}, "speculative ngram_min must be an integer >= 1, got 0"),
        ({"method": "ngram", "ngram_min": 5, "ngram_max": 3}, "ngram_min <= ngram_max"),
        ({"method": "ngram", "num_tokens": "4"}, "speculative num_tokens must be an integer"),
        ({"method": ["ngram"]}, "speculative method must be one of"),
        ({"method": "dspark", "drafter": 7}, "speculative drafter must be a directory"),
    ],
)
def test_speculative_option_types(options, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.parse(options)


def test_speculative_options_are_checked_before_loading():
    with pytest.raises(ValueError, match="speculative ngram_max must be an integer"):
        LLM("k3-nano", backend="reference", speculative={"method": "ngram", "ngram_max": "4"})


def test_ngram_drafter_sizes_must_be_integers():
    with pytest.raises(TypeError, match="max_n must be an integer"):
        NgramDrafter("4", 2)


# ------------------------------------------------------------------ from a sweep of the Python API


def test_stream_refuses_n_above_one(llm):
    """stream gives one completion: n=3 silently gave one."""
    with pytest.raises(ValueError, match="stream gives one completion: n must be 1, got 3"):
        llm.stream("The", SamplingParams(max_tokens=2, n=3, seed=1))


@pytest.mark.parametrize("option", ["batch_invariant", "generation_config", "preflight", "progress"])
def test_flags_must_be_booleans(option):
    """batch_invariant="no" switched batch invariance on (a truthy string)."""
    with pytest.raises(TypeError, match=f"{option} must be True or False, got str 'no'"):
        LLM("k3-nano", backend="reference", **{option: "no"})


@pytest.mark.parametrize("option, value", [("batch_invariant", "no"), ("preflight", "yes"), ("seed", "x")])
def test_distributed_llm_checks_its_arguments_as_llm_does(option, value):
    """DistributedLLM took batch_invariant="no" as True, and a seed or flag of any type, where LLM refuses them;
    they are refused before its communicator is used (a stand-in for rank 0's here)."""
    from types import SimpleNamespace

    from nonstop.engine.distributed_llm import DistributedLLM

    with pytest.raises(TypeError, match=f"{option} must be"):
        DistributedLLM("k3-nano", comm=SimpleNamespace(rank=0), **{option: value})


def test_seed_must_be_an_integer():
    with pytest.raises(TypeError, match="seed must be an integer, got str 'x'"):
        LLM("kimi-k3", seed="x")  # refused before anything is built


def test_a_stop_token_id_outside_the_vocabulary_is_refused(llm):
    """It could never be generated: the request ran to max_tokens."""
    vocab = llm.cfg.vocab_size
    with pytest.raises(ValueError, match=rf"stop_token_ids: {vocab} is outside the vocabulary \(0..{vocab - 1}\)"):
        llm.generate("The", SamplingParams(max_tokens=2, stop_token_ids=[5, vocab]))


def test_the_prompt_at_fault_is_named_among_several(llm):
    with pytest.raises(ValueError, match="prompt 1: empty prompt"):
        llm.generate(["a", ""], GREEDY)
    with pytest.raises(ValueError, match="prompt 1: empty prompt"):
        llm.generate(prompt_token_ids=[[5], []], sampling=GREEDY)
    with pytest.raises(ValueError, match="^empty prompt"):  # one prompt: nothing to name
        llm.generate([""], GREEDY)


def test_a_sampling_list_of_the_wrong_length_is_refused_without_prompts_too(llm):
    with pytest.raises(ValueError, match="got 1 SamplingParams for 0 prompts"):
        llm.generate([], [GREEDY])
    assert llm.generate([], []) == []


def test_a_drafter_with_ngram_drafting_is_refused():
    """The n-gram drafter needs no model: a drafter directory beside it was ignored."""
    with pytest.raises(ValueError, match="drafter is a dspark option; method 'ngram'"):
        SpeculativeConfig.parse({"method": "ngram", "drafter": "/tmp"})


def test_numpy_numbers_are_taken_as_python_numbers():
    """As token ids are: np.int64(5) max_tokens was refused as 'not an integer'. Bools stay refused."""
    p = SamplingParams(max_tokens=np.int64(5), temperature=np.float32(0.5), stop_token_ids=[np.int32(3)])
    assert (p.max_tokens, p.temperature, p.stop_token_ids) == (5, 0.5, (3,))
    assert type(p.max_tokens) is int and type(p.temperature) is float and type(p.stop_token_ids[0]) is int
    assert p == SamplingParams(max_tokens=5, temperature=0.5, stop_token_ids=[3])
    with pytest.raises(ValueError, match="ignore_eos must be True or False"):
        SamplingParams(ignore_eos=np.bool_(True))
    with pytest.raises(ValueError, match="max_tokens must be an integer"):
        SamplingParams(max_tokens=np.float64(5.0))


def test_a_chat_template_may_be_given_as_its_text():
    """vLLM takes the text or a file; the text was read as a file name ('No such file')."""
    text = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    llm = LLM("k3-nano", backend="reference", chat_template=text)
    assert llm.tokenizer.chat_template == text
    out = llm.chat([{"role": "user", "content": "hello"}], GREEDY)
    assert out.prompt_token_ids == llm.tokenizer.encode("[user] hello\n")
