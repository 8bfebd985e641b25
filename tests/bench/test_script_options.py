"""The ``bench/`` scripts' command lines: every option explained in --help, and serve_load's bandwidth floor
taken from what the server runs (its dtype, backend, device) or said to be unknown."""

from __future__ import annotations

import argparse
import sys

import pytest

from tests.bench_script import load_bench

SCRIPTS = (
    "cpu_attention_ab.py",
    "cpu_busy.py",
    "cpu_decode.py",
    "cpu_direct_call.py",
    "cpu_gemv.py",
    "cpu_gemv_ab.py",
    "cpu_peers.py",
    "cpu_quality.py",
    "dist_decode.py",
    "dist_link.py",
    "k3_nano_sampling.py",
    "op_check.py",
    "routing_sensitivity.py",
    "serve_load.py",
    "spec_decode.py",
    "tune.py",
)


class _Parsed(Exception):
    """Raised in place of parsing: the parser a script built."""

    def __init__(self, parser):
        self.parser = parser


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_option_is_explained(script, monkeypatch):
    for name in ("fla", "causal_conv1d"):  # cpu_decode hides them from transformers when imported: restore after
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name))

    def parse_args(parser, args=None, namespace=None):
        raise _Parsed(parser)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    with pytest.raises(_Parsed) as got:
        load_bench(script).main()
    parser = got.value.parser
    unexplained = [a.option_strings or a.dest for a in parser._actions if not a.help]
    assert not unexplained, f"{script}: options without a help string: {unexplained}"
    text = parser.format_help()  # what --help prints (a stray % in a help string fails here)
    assert all(flag in text for a in parser._actions for flag in a.option_strings)


@pytest.fixture
def serve_load(monkeypatch):
    bench = load_bench("serve_load.py")
    monkeypatch.setattr(bench, "copy_bandwidth", lambda device="cpu": {"copy_GBps": 10.0})
    return bench


def test_the_serve_floor_counts_the_weights_the_server_reads(serve_load):
    """It once assumed fp32 weights whatever the server ran; now the backend's format and the dtype count."""
    import torch

    from nonstop.program.footprint import model_footprint
    from nonstop.weights.resolve import resolve_model

    fp32 = model_footprint(resolve_model("k3-nano")[0], torch.float32).bytes_per_token
    bf16 = model_footprint(resolve_model("k3-nano")[0], torch.bfloat16).bytes_per_token

    def floor(serve_args):
        return serve_load.stream_floor(serve_load.served_setup(serve_args))

    assert floor("--model k3-nano")["bytes_per_token"] == fp32  # auto on a CPU: the cpu backend, fp32 as loaded
    from nonstop.model.build import load_model
    from tests.runtime.test_cpu_streamed_weight_bytes import K3_NANO, _executor, _read_per_token

    for backend in ("cpu-bf16", "cpu-int8"):  # what the packed Program reads (router, norms, embedding row stay fp32)
        packed = _read_per_token(_executor(load_model(resolve_model("k3-nano")[0], K3_NANO), backend))
        assert floor(f"--model k3-nano --backend {backend}")["bytes_per_token"] == packed
    row = floor("--model k3-nano --backend reference --dtype bfloat16")
    assert row["bytes_per_token"] == bf16 and row["weights"] == "bfloat16 (backend reference)"
    assert row["copy_GBps"] == 10.0 and row["device"] == "cpu"
    assert "--url" in serve_load.stream_floor(None)["unknown"]  # nothing known of a server given by --url
    assert "ranks" in floor("--model k3-nano --tp 2")["unknown"]


def test_a_bad_serve_model_is_refused_before_the_server_starts(serve_load):
    from nonstop.config import ConfigError

    with pytest.raises(ConfigError, match="nosuch"):
        serve_load.served_setup("--model nosuch")
