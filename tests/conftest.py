"""Shared fixtures: tiny odd-shaped configs of every family and transformers-made checkpoints.

transformers routes kimi_linear through fla's Triton kernels when fla is importable, and those do not
run on a CPU. It decides when its modeling module is imported, so we import that module once with
fla hidden, then un-hide fla so the tests can still use fla's pure-torch naive references.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# A tuning store in the user's cache would swap stored winners into the kernel tests (tests/tune set their own).
os.environ["NONSTOP_TUNING_STORE"] = "off"
# The default CPU backend ("cpu") compiles its step (seconds to minutes per model on 2 cores): tests
# run its program eagerly unless they ask for compile=True (tests/runtime/test_cpu_executor.py).
os.environ.setdefault("NONSTOP_CPU_COMPILE", "0")
# Triton kernels run under the interpreter on machines without a GPU; the flag is read when the
# kernels' decorators run, so it must be set before any test imports nonstop.kernels.
if not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

_hidden = {name: sys.modules.get(name, None) for name in ("fla", "causal_conv1d")}
for name in _hidden:
    sys.modules[name] = None
import transformers.models.kimi_linear.modeling_kimi_linear  # noqa: E402,F401

for name, module in _hidden.items():
    if module is None:
        del sys.modules[name]
    else:
        sys.modules[name] = module

import pytest  # noqa: E402
import torch  # noqa: E402

# Test models are tiny: one thread avoids thread-pool contention on small, shared machines (the cpu
# executor's own default for k3-nano is every physical core; NONSTOP_THREADS also reaches subprocesses).
torch.set_num_threads(1)
os.environ.setdefault("NONSTOP_THREADS", "1")

from tests.tiny_configs import TINY_CONFIGS, hf_model_from_dict  # noqa: E402


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
    """{name: (checkpoint dir, transformers model)} for every tiny transformers-backed config."""
    out = {}
    root = tmp_path_factory.mktemp("hf")
    for name, raw in TINY_CONFIGS.items():
        if name.startswith("kimi_k3"):
            continue
        torch.manual_seed(1234)
        model = hf_model_from_dict(raw)
        model.save_pretrained(root / name)
        out[name] = (root / name, model)
    return out


# Tables a test reports (the planner's validation tables): carried on the test's report, so that under
# pytest-xdist (the README's `-n auto`) they reach the controller, and printed in the run's summary.
_REPORTED_TABLES: list[tuple[str, str]] = []


@pytest.fixture
def report_table(record_property):
    """``report_table(text)``: print ``text`` in the summary at the end of the run, titled by the test's id."""
    return lambda text: record_property("report_table", text)


def pytest_runtest_logreport(report):
    if report.when == "call":
        _REPORTED_TABLES.extend((report.nodeid, v) for k, v in report.user_properties if k == "report_table")


def pytest_terminal_summary(terminalreporter):
    for nodeid, text in _REPORTED_TABLES:
        terminalreporter.write_sep("-", nodeid)
        terminalreporter.write_line(text)


@pytest.fixture
def corpus(tmp_path):
    """A training corpus directory (train.txt / heldout.txt: the bundled held-out sample, halved)."""
    from nonstop.weights.resolve import ASSETS

    text = (ASSETS / "heldout_sample.txt").read_text(encoding="utf-8")
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "train.txt").write_text(text[: len(text) // 2], encoding="utf-8")
    (d / "heldout.txt").write_text(text[len(text) // 2 :], encoding="utf-8")
    return d
