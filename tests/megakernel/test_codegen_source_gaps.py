"""``codegen.source``: loading generated source (one module per distinct source, never a stale file taken as
it is) and the constexpr test the task classes are built with."""

from __future__ import annotations

import inspect

import pytest

tl = pytest.importorskip("triton.language")

from nonstop.runtime.megakernel.codegen import source  # noqa: E402


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NONSTOP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(source, "_MODULES", {})
    return tmp_path


def test_distinct_sources_load_as_distinct_modules_and_a_source_loads_once(private_cache):
    """Two sources under one prefix are two modules (not the first one again); loading a source again
    returns the module already loaded (no second import and no second Triton compile)."""
    a = source.load_source("gaps", "VALUE = 1\n")
    b = source.load_source("gaps", "VALUE = 2\n")
    assert (a.VALUE, b.VALUE) == (1, 2) and a is not b
    assert source.load_source("gaps", "VALUE = 1\n") is a


def test_a_file_that_does_not_hold_the_source_is_rewritten(private_cache, monkeypatch):
    """Another process (or a tampering user) left different text under the module's file name: the next
    load (a fresh process: no module cached) must import the source it was given, not the file."""
    first = source.load_source("gaps", "VALUE = 'mine'\n")
    with open(first.__file__, "w") as f:
        f.write("VALUE = 'stale'\n")
    monkeypatch.setattr(source, "_MODULES", {})
    again = source.load_source("gaps", "VALUE = 'mine'\n")
    assert again.VALUE == "mine"
    with open(again.__file__) as f:
        assert f.read() == "VALUE = 'mine'\n"


def test_constexpr_parameters_are_recognised_in_every_annotation_form():
    """``tl.constexpr`` as an object, and as the strings ``from __future__ import annotations`` leaves
    (``tl.constexpr``, ``triton.language.constexpr``, ``constexpr``); other annotations are not."""

    anns = {
        "a": tl.constexpr,
        "b": "tl.constexpr",
        "c": "triton.language.constexpr",
        "d": "constexpr",
        "e": int,
        "f": inspect.Parameter.empty,
        "g": "int",
    }
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    got = {n: source.is_constexpr(inspect.Parameter(n, kind, annotation=a)) for n, a in anns.items()}
    assert got == {"a": True, "b": True, "c": True, "d": True, "e": False, "f": False, "g": False}
