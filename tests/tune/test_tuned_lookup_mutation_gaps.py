"""Gaps a mutation audit of ``runtime/tuned.py`` (reading the tuning store) found: where the store is,
shape keys (attention ops of every layer share one; the dtype is the weights'), a stored winner runs only at
the step shape it was verified at, a refused shape falls back for good with one warning, entries checked
under older candidate rules or edited since are not run, and ``stats["tuned"]`` counts the calls."""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nonstop.program.lower import lower
from nonstop.runtime import tuned
from nonstop.runtime.tuned import (
    CANDIDATE_RULES,
    TunedKind,
    entry_problem,
    op_variant,
    rules_problem,
    shape_key,
    use_tuned,
)
from tests.runtime.helpers import tiny_model


@pytest.fixture(scope="module")
def program():
    return lower(tiny_model("llama"))


def _ops(program, kind):
    return [op for op in program.ops if op.kind == kind]


@pytest.mark.parametrize("value", ["off", "0", "", " OFF ", "none"])
def test_the_store_can_be_turned_off(monkeypatch, value):
    monkeypatch.setenv(tuned.STORE_ENV, value)
    assert tuned.store_path() is None


def test_the_default_store_is_under_the_cache_home(monkeypatch, tmp_path):
    monkeypatch.delenv(tuned.STORE_ENV, raising=False)
    monkeypatch.delenv("NONSTOP_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tuned.store_path() == tmp_path / "nonstop" / "tuning.json"
    monkeypatch.setenv(tuned.STORE_ENV, str(tmp_path / "elsewhere.json"))
    assert tuned.store_path() == tmp_path / "elsewhere.json"


def test_the_default_store_follows_the_cache_root(monkeypatch, tmp_path):
    """$NONSTOP_CACHE_DIR moves the compiled kernels and the megakernel source: the tuning store (and its
    kernels beside it) moved with it too, not staying under ~/.cache/nonstop."""
    monkeypatch.delenv(tuned.STORE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("NONSTOP_CACHE_DIR", str(tmp_path / "mine"))
    assert tuned.store_path() == tmp_path / "mine" / "tuning.json"


def test_attention_ops_of_every_layer_share_one_shape_key(program):
    """An attention op has no weights: its key is its head counts, not the cache layer it reads."""
    keys = {shape_key(op, 1, 1, torch.float32) for op in _ops(program, "gqa_attn")}
    assert len(_ops(program, "gqa_attn")) > 1 and len(keys) == 1
    (key,) = keys
    assert key == "B1xT1 head_dim=10 heads=5 kv_heads=1 float32"


def test_the_key_dtype_is_the_activations_and_other_weight_dtypes_are_named():
    """An fp16 model's linear_residual: keyed at fp16 activations, its weights fp16 too (no weight names a
    dtype); without an activation dtype the first floating weight's; at fp32 activations each fp16 weight
    names its dtype."""
    model_program = lower(tiny_model("llama", dtype=torch.float16))
    op = _ops(model_program, "linear_residual")[0]
    at16 = shape_key(op, 2, 3, torch.float16)
    assert at16.startswith("B2xT3 ") and at16.endswith(" float16") and ":" not in at16
    assert shape_key(op, 2, 3) == at16
    at32 = shape_key(op, 2, 3, torch.float32)
    assert at32.endswith(" float32") and at32.count(":float16") == len(op.weights)


@pytest.mark.parametrize(
    "entry,phrase",
    [
        ({"kernel": "k.py", "sha256": "0", "round": True}, "'round' bool"),
        ({"kernel": "k.py", "sha256": "0", "timed": True}, "timed but has no 'time_ms'"),
        ({"kernel": "k.py", "sha256": "0", "timed": True, "time_ms": None}, "timed but has no 'time_ms'"),
    ],
)
def test_entry_problems(entry, phrase):
    assert phrase in (entry_problem(entry) or "")


def test_an_entry_without_rules_was_checked_under_rules_1():
    assert "candidate rules 1" in (rules_problem({"kernel": "k.py"}) or "")
    assert rules_problem({"rules": CANDIDATE_RULES}) is None


def _env(program, op, B, T):
    return SimpleNamespace(B=B, T=T, buf={op.reads[0]: torch.zeros(1)})


def test_a_winner_runs_only_at_the_step_shape_it_was_stored_for(program):
    op = _ops(program, "linear_residual")[0]
    ran = []
    kind = TunedKind("linear_residual", lambda op, env: ran.append(("builtin", env.B)), {}, Path("."))
    key = shape_key(op, 1, 1, torch.float32)
    kind.entries = {key: {"variants": [op_variant(op)]}}
    kind.loaded[key] = lambda op, env: ran.append(("stored", env.B))
    kind(op, _env(program, op, 1, 1))
    kind(op, _env(program, op, 2, 1))  # same op, another step shape: no stored winner there
    kind(op, _env(program, op, 1, 1))
    assert ran == [("stored", 1), ("builtin", 2), ("stored", 1)]
    assert kind.used == {key: 2}


def test_a_refused_shape_runs_the_builtin_from_then_on_with_one_warning(program):
    op = _ops(program, "linear_residual")[0]
    ran = []
    key = shape_key(op, 1, 1, torch.float32)
    entries = {key: {"variants": [op_variant(op)]}}
    kind = TunedKind("linear_residual", lambda op, env: ran.append("builtin"), entries, Path("."))
    kind.loaded[key] = lambda op, env: ran.append("stored")
    env = _env(program, op, 1, 1)
    kind(op, env)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kind.refuse(op, env, "it keeps its own kernel")
        kind.refuse(op, env, "it keeps its own kernel")
    assert len(caught) == 1 and "the built-in kernel runs there" in str(caught[0].message)
    kind(op, env)
    assert ran == ["stored", "builtin"]
    assert kind.used == {key: 0} and kind.refused == {key: "it keeps its own kernel"}


def test_keyword_arguments_go_to_the_builtin(program):
    op = _ops(program, "linear_residual")[0]
    key = shape_key(op, 1, 1, torch.float32)
    ran = []
    kind = TunedKind("linear_residual", lambda op, env, **kw: ran.append(("builtin", kw)), {key: {}}, Path("."))
    kind.loaded[key] = lambda op, env: ran.append(("stored", {}))
    kind(op, _env(program, op, 1, 1), record=True)
    assert ran == [("builtin", {"record": True})]


LAUNCH = "def launch(op, env):\n    env.buf['seen'].append(op.name)\n"


def _store(tmp_path, program, source=LAUNCH, rules=CANDIDATE_RULES, edit=None) -> tuple[Path, str]:
    op = _ops(program, "linear_residual")[0]
    key = shape_key(op, 1, 1, torch.float32)
    (tmp_path / "kernels").mkdir()
    kernel = tmp_path / "kernels" / "linear_residual-x.py"
    kernel.write_text(source)
    entry = {
        "kernel": "kernels/linear_residual-x.py",
        "sha256": hashlib.sha256(source.encode()).hexdigest(),
        "variants": ["accumulate=False", "accumulate=True"],
    }
    if rules is not None:
        entry["rules"] = rules
    if edit is not None:
        kernel.write_text(edit)
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"version": 1, "entries": {"cpu": {"linear_residual": {key: entry}}}}))
    return path, key


def _run(program, table, op):
    env = SimpleNamespace(B=1, T=1, buf={op.reads[0]: torch.zeros(1), "seen": []})
    table[op.kind](op, env)
    return env.buf["seen"]


def test_use_tuned_runs_the_stored_launch_and_counts_it(tmp_path, monkeypatch, program):
    path, key = _store(tmp_path, program)
    monkeypatch.setenv(tuned.STORE_ENV, str(path))
    stats: dict = {}
    table = use_tuned({"linear_residual": lambda op, env: env.buf["seen"].append("builtin")}, program, "cpu", stats)
    op = _ops(program, "linear_residual")[0]
    assert _run(program, table, op) == [op.name]
    assert stats["tuned"] == {"linear_residual": {"shapes": 1, "used": {key: 1}, "refused": {}, "unverified": {}}}


@pytest.mark.parametrize(
    "rules,edit,phrase",
    [(None, None, "candidate rules 1"), (1, None, "candidate rules 1"), (CANDIDATE_RULES, LAUNCH + "#\n", "SHA-256")],
)
def test_use_tuned_skips_old_rules_and_edited_files(tmp_path, monkeypatch, program, rules, edit, phrase):
    path, _ = _store(tmp_path, program, rules=rules, edit=edit)
    monkeypatch.setenv(tuned.STORE_ENV, str(path))
    table = use_tuned({"linear_residual": lambda op, env: env.buf["seen"].append("builtin")}, program, "cpu")
    with pytest.warns(RuntimeWarning, match=phrase):
        assert _run(program, table, _ops(program, "linear_residual")[0]) == ["builtin"]


def test_a_stored_kind_the_table_lacks_is_left_out(tmp_path, monkeypatch, program):
    path, _ = _store(tmp_path, program)
    monkeypatch.setenv(tuned.STORE_ENV, str(path))
    table = {"embed": object()}
    assert use_tuned(table, program, "cpu") is table


def test_an_unreadable_store_is_reported_once_per_process(tmp_path, monkeypatch, caplog):
    bad = tmp_path / "tuning.json"
    bad.write_text("{not json")
    monkeypatch.setattr(tuned, "_warned", set())
    with caplog.at_level("WARNING", logger="nonstop.tuning"):
        assert tuned.load_store(bad)["entries"] == {}
        assert tuned.load_store(bad)["entries"] == {}
    assert len([r for r in caplog.records if "is not valid JSON" in r.getMessage()]) == 1


TRITON_LAUNCH = """import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, FLAG: tl.constexpr):
    tl.store(y_ptr, tl.load(x_ptr))


def launch(op, env):
    copy_kernel[(1,)](env.buf["x"], env.buf["y"], FLAG=env.buf["flag"])
"""


def test_a_stored_kernel_refuses_a_container_argument(tmp_path, monkeypatch, program):
    """The kernels of a stored file take tensors, numbers, strings, None, dtypes (``plain_launch_args``):
    a dict launched as a constexpr is refused before the kernel runs."""
    pytest.importorskip("triton")
    path, _ = _store(tmp_path, program, source=TRITON_LAUNCH)
    monkeypatch.setenv(tuned.STORE_ENV, str(path))
    table = use_tuned({"linear_residual": lambda op, env: None}, program, "cpu")
    op = _ops(program, "linear_residual")[0]
    x, y = torch.tensor([3.0]), torch.zeros(1)
    env = SimpleNamespace(B=1, T=1, buf={op.reads[0]: torch.zeros(1), "x": x, "y": y, "flag": 1})
    table[op.kind](op, env)
    assert y.tolist() == [3.0]
    env.buf["flag"] = {"state": 1}
    with pytest.raises(TypeError, match="launched with a dict"):
        table[op.kind](op, env)
