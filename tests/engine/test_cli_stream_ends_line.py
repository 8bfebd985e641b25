"""`nonstop generate` / `nonstop chat` stream text without a line end; an error, a dead rank or Ctrl-C in the
middle of a stream printed its own line on stderr right after the partial text, so on a terminal it read
"The quick brownnonstop: error: ...". The streamed line is now ended before the error goes on."""

from __future__ import annotations

import pytest

from nonstop.cli import main
from nonstop.engine.llm import LLM
from tests.engine.tiny_models import TEST_CHAT_TEMPLATE, synth_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return synth_checkpoint("k3", tmp_path_factory.mktemp("tiny") / "m", chat_template=TEST_CHAT_TEMPLATE)


def _failing_stream(exc: BaseException):
    def stream(self, prompt, params, prompt_ids=None, on_text=None, **kw):
        on_text("partial")
        raise exc

    return stream


@pytest.mark.parametrize("exc, code", [(ValueError("a rank died"), 2), (KeyboardInterrupt(), 130)])
def test_generate_ends_the_streamed_line_before_the_error(tiny, monkeypatch, capsys, exc, code):
    """Catches the error line following the streamed text on the same line."""
    monkeypatch.setattr(LLM, "stream", _failing_stream(exc))
    with pytest.raises(SystemExit) as ended:
        main(["generate", "-m", str(tiny), "--backend", "reference", "-n", "4", "hello"])
    out = capsys.readouterr().out
    assert ended.value.code == code
    assert out == "hellopartial\n", out


def test_chat_ends_the_streamed_line_before_the_error(tiny, monkeypatch, capsys):
    """The same in `nonstop chat`: the reply's partial line is ended before the error."""
    monkeypatch.setattr(LLM, "stream", _failing_stream(ValueError("a rank died")))
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("hi\n"))
    rc = main(["chat", "-m", str(tiny), "--backend", "reference", "-n", "4"])
    captured = capsys.readouterr()
    assert rc != 0 and "nonstop: a rank died" in captured.err, captured.err
    assert captured.out == "partial\n", captured.out
