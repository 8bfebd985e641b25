"""Gaps in ``nonstop serve``'s flag checks found by a mutation sweep: values refused before the model loads,
with a one-line error (exit 2). Uses the ``serve_stubs`` fixture of ``test_cli_mutation_gaps``."""

from __future__ import annotations

import pytest

from nonstop.cli import main
from tests.test_cli_mutation_gaps import serve_stubs  # noqa: F401 (a fixture)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--api-key", "a\tb"], "--api-key (or $NONSTOP_API_KEY) must be printable ASCII"),
        (["--api-key", "a\nb"], "--api-key (or $NONSTOP_API_KEY) must be printable ASCII"),
        (["--api-key", "abc "], "--api-key (or $NONSTOP_API_KEY) must not start or end with a space"),
        (["--api-key", " abc"], "--api-key (or $NONSTOP_API_KEY) must not start or end with a space"),
        (["--served-model-name", " "], "--served-model-name must not be empty"),
        (["--served-model-name", "a", "--served-model-name", ""], "--served-model-name must not be empty"),
    ],
)
def test_serve_refuses_keys_and_names_that_cannot_work(serve_stubs, capsys, extra, message):  # noqa: F811
    """Catches the printable check dropped from --api-key (a tab or newline is ASCII but no HTTP header can
    carry it, so every client would fail authentication), a key with a leading or trailing space (HTTP strips
    the spaces around a header value and the server compared the stripped token with the padded key: every
    request got 401), and the blank --served-model-name check narrowed to the empty string (a name of spaces
    no client can be expected to send)."""
    with pytest.raises(SystemExit) as e:
        main(["serve", "--no-warmup", *extra])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert "llm" not in serve_stubs


def test_serve_takes_the_highest_port(serve_stubs):  # noqa: F811
    """Catches the port range cut one short: 65535 is a valid TCP port."""
    assert main(["serve", "--no-warmup", "--port", "65535"]) == 0
    assert serve_stubs["port"] == 65535
