"""``nonstop serve`` refuses, before the model loads, what it could only fail on after: an address in use
or unknown, an empty host or served name, lengths beyond the model's."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("uvicorn")

from nonstop.cli import main  # noqa: E402
from nonstop.server.launch import bind_socket  # noqa: E402


@pytest.fixture
def busy_port():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    yield holder.getsockname()[1]
    holder.close()


@pytest.fixture
def no_loading(monkeypatch):
    """Loading the model fails the test: every refusal here must come first."""
    import nonstop.commands.serve as serve_command

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(serve_command, "llm_from_args", refuse)


def test_an_address_in_use_or_unknown_is_a_value_error(busy_port):
    with pytest.raises(ValueError, match=f"cannot listen on 127.0.0.1:{busy_port}: Address already in use"):
        bind_socket("127.0.0.1", busy_port)
    with pytest.raises(ValueError, match="cannot listen on 999.1.1.1:8000"):
        bind_socket("999.1.1.1", 8000)
    with pytest.raises(ValueError, match="--host is empty"):
        bind_socket("", 8000)
    free = bind_socket("127.0.0.1", 0)  # a free port binds, not yet listening
    try:
        assert free.getsockname()[0] == "127.0.0.1"
    finally:
        free.close()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--port", "{busy}"], "Address already in use"),
        (["--host", ""], "--host is empty"),
        (["--served-model-name", " "], "--served-model-name must not be empty"),
        (["--max-model-len", "99999"], "--max-model-len 99999 exceeds the model's 2048 positions"),
        (["--default-max-tokens", "2048"], "--default-max-tokens 2048 leaves no room for a prompt"),
        (["--max-model-len", "100", "--default-max-tokens", "100"], "in a context of 100 tokens"),
    ],
)
def test_serve_refuses_before_loading(busy_port, no_loading, capsys, extra, message):
    argv = ["serve", "--backend", "reference", "--no-warmup", *[a.format(busy=busy_port) for a in extra]]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err and "loaded" not in err


def test_draft_tokens_without_speculative_decoding_is_an_error(no_loading, capsys):
    """--num-draft-tokens alone did nothing, silently (generate and serve share the flag)."""
    with pytest.raises(SystemExit) as e:
        main(["serve", "--backend", "reference", "--num-draft-tokens", "3"])
    assert e.value.code == 2 and "--num-draft-tokens applies to speculative decoding" in capsys.readouterr().err
