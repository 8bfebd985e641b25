"""Where the tuning store is and how a stored winner is found: ``~`` in ``NONSTOP_TUNING_STORE``, the device key of
an indexed CPU device, and the shape key of ops with integer-packed weights or flag attributes (keys written by
hand from the documented format ``B<B>xT<T> <weights or int attrs> <dtype>``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from nonstop.program.lower import lower
from nonstop.runtime import tuned
from nonstop.runtime.tuned import device_name, program_shape_key, shape_key
from tests.tiny_configs import TINY_CONFIGS
from tests.tune.helpers import tiny_target


def _op(weights: dict, attrs: dict | None = None):
    return SimpleNamespace(weights=weights, attrs=attrs or {})


def test_a_home_relative_store_path_is_expanded(monkeypatch, tmp_path):
    """``NONSTOP_TUNING_STORE=~/t.json`` is the file in the home directory, not a folder named "~" in the cwd."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(tuned.STORE_ENV, "~/t.json")
    assert tuned.store_path() == tmp_path / "t.json"


def test_an_indexed_cpu_device_has_the_cpu_key():
    """Winners tuned on the CPU are stored under "cpu": ``cpu:0`` must find them (not a key "cpu:0")."""
    assert device_name("cpu:0") == "cpu"
    assert device_name(torch.device("cpu", 0)) == "cpu"


def test_weights_of_another_dtype_than_the_activations_name_theirs():
    """The key ends in the activations' dtype; uint8 packed experts and bf16 scales under fp32 activations
    name their own. Without an activation dtype the first FLOATING weight's is the key's (uint8 packed
    weights sort first but say nothing of the precision the kernel computes in)."""
    op = _op({"a_packed": torch.zeros(2, 3, dtype=torch.uint8), "b_scale": torch.zeros(2, dtype=torch.bfloat16)})
    assert shape_key(op, 1, 1, torch.float32) == "B1xT1 a_packed=2x3:uint8 b_scale=2:bfloat16 float32"
    assert shape_key(op, 1, 1) == "B1xT1 a_packed=2x3:uint8 b_scale=2 bfloat16"


def test_only_integer_weights_take_the_activation_dtype():
    """With no floating weight the key takes the activations' dtype; the integer weight names its own."""
    op = _op({"idx": torch.zeros(4, dtype=torch.int32)})
    assert shape_key(op, 2, 1, torch.float16) == "B2xT1 idx=4:int32 float16"


@pytest.mark.parametrize(
    "config, kind", [("kimi_linear", "kda_core"), ("deepseek_v3", "moe_experts"), ("deepseek_v3", "mla_q_up")]
)
def test_a_winner_is_keyed_at_the_model_dtype_it_was_tuned_at(config, kind):
    """Ops that keep an fp32 weight in a bf16 model (KDA's A_log / dt_bias, the router bias, MLA's inv_freq):
    the key ``nonstop tune`` records for a bf16 target is the one the executor looks up in a bf16 model, and
    the fp32 and bf16 keys differ. The key took the first floating weight's dtype, fp32 whatever the model:
    an fp32 winner ran in bf16 models (and fp16), and the tuner, casting every weight to bf16, recorded keys
    no bf16 model looked up."""
    cfg = ModelConfig.from_hf_dict(TINY_CONFIGS[config])
    keys = {}
    for dtype in (torch.float32, torch.bfloat16):
        tuned_keys = [s.key for s in tiny_target(kind, config, (1,), dtype).shapes]
        program = lower(random_model(cfg, dtype))
        run_keys = {program_shape_key(program, op, 1, 1) for op in program.ops if op.kind == kind}
        assert tuned_keys and set(tuned_keys) == run_keys
        keys[dtype] = run_keys
    assert not keys[torch.float32] & keys[torch.bfloat16]


def test_flag_attributes_of_a_weightless_op_are_in_its_key_as_a_hash():
    """A weightless op's key names its integer attributes; its flags (bools are ints in Python), floats and
    strings enter the ``attrs=`` hash; the per-layer ``cache_layer`` is left out."""
    attrs = {"heads": 4, "causal": True, "window": 0, "cache_layer": 3, "scale": 0.5, "name": "x"}
    key = shape_key(_op({}, attrs), 3, 2, torch.bfloat16)
    assert key.startswith("B3xT2 heads=4 window=0 bfloat16 attrs=")
    assert shape_key(_op({}, {**attrs, "cache_layer": 7}), 3, 2, torch.bfloat16) == key
    for change in ({"causal": False}, {"scale": 0.25}, {"name": "y"}):
        assert shape_key(_op({}, {**attrs, **change}), 3, 2, torch.bfloat16) != key, change


def test_weight_names_are_sorted_in_the_key():
    """The key lists the weights by name, sorted, so two programs holding the same weights in another order
    find the same winner."""
    a = _op({"w": torch.zeros(2, 3), "b": torch.zeros(2)})
    b = _op({"b": torch.zeros(2), "w": torch.zeros(2, 3)})
    assert shape_key(a, 1, 1) == shape_key(b, 1, 1) == "B1xT1 b=2 w=2x3 float32"


def test_store_path_default_uses_home_cache_without_xdg(monkeypatch, tmp_path):
    """Without ``XDG_CACHE_HOME`` the store is ``~/.cache/nonstop/tuning.json``."""
    monkeypatch.delenv(tuned.STORE_ENV, raising=False)
    monkeypatch.delenv("NONSTOP_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert tuned.store_path() == Path(tmp_path) / ".cache" / "nonstop" / "tuning.json"
