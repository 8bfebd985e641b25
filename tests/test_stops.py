"""A stop (Ctrl-C, SIGTERM raised as ``Terminated``) ends a command with "interrupted" / "terminated" and
130 / 143, also when an error it caused on its way out replaced it: a context manager whose exit fails as
the stop cuts through it (torch's mode stack said "trying to pop from empty mode stack" under a Ctrl-C to
a launch, which the CLI reported as an internal error, exit 1)."""

from __future__ import annotations

import pytest

from nonstop.commands.errors import user_errors
from nonstop.stops import Terminated, stop_behind


class FailsOnExit:
    """A context manager whose exit raises (as a half-entered torch mode does when a stop cuts through)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        raise RuntimeError("trying to pop from empty mode stack")


def _raised_through_exit(stop: BaseException) -> BaseException:
    try:
        with FailsOnExit():
            raise stop
    except BaseException as exc:  # noqa: BLE001 - the error that replaced the stop
        return exc


def test_the_stop_behind_an_error_it_caused_is_found():
    stop = KeyboardInterrupt()
    replaced = _raised_through_exit(stop)
    assert isinstance(replaced, RuntimeError) and stop_behind(replaced) is stop
    assert stop_behind(stop) is stop
    assert stop_behind(RuntimeError("a bug")) is None
    terminated = Terminated()
    assert stop_behind(_raised_through_exit(terminated)) is terminated


def test_a_context_cycle_ends():
    a, b = RuntimeError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert stop_behind(a) is None


@pytest.mark.parametrize(
    "stop, word, code", [(KeyboardInterrupt(), "interrupted", 130), (Terminated(), "terminated", 143)]
)
def test_user_errors_reports_the_stop_not_the_error_it_caused(stop, word, code, capsys):
    with pytest.raises(SystemExit) as e:
        with user_errors():
            with FailsOnExit():
                raise stop
    err = capsys.readouterr().err
    assert e.value.code == code and err == f"nonstop: {word}\n"


def test_an_error_of_its_own_is_still_a_bug(capsys, monkeypatch):
    monkeypatch.delenv("NONSTOP_DEBUG", raising=False)
    with pytest.raises(SystemExit) as e:
        with user_errors():
            raise RuntimeError("trying to pop from empty mode stack")
    assert e.value.code == 1 and "internal error: RuntimeError" in capsys.readouterr().err
