"""Every tensor a lowered Program hands its kernels lives on the model's device.

The Triton kernels (and the megakernel's pointer tables) read ``op.weights`` by address: a tensor left
on the host (such as the rotary inverse frequencies, which ``model/rope.py`` computes on the CPU) is a
launch error in the superop executor and an illegal address inside the megakernel, seen on an H200.
The model is built on the meta device here, so any tensor the lowering leaves elsewhere shows up."""

from __future__ import annotations

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.model.stack import CausalLM
from nonstop.program.lower import lower
from tests.tiny_configs import TINY_CONFIGS


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_every_op_tensor_is_on_the_model_device(name):
    with torch.device("meta"):
        model = CausalLM(ModelConfig.from_hf_dict(TINY_CONFIGS[name]))
    program = lower(model)
    elsewhere = [
        f"{op.name}.{key} on {t.device}"
        for op in program.ops
        for key, t in {**op.weights, **op.attrs}.items()
        if isinstance(t, torch.Tensor) and t.device.type != "meta"
    ]
    assert program.ops and elsewhere == []


def test_the_megakernel_refuses_a_host_tensor_on_a_gpu():
    """Its tables hold raw addresses: a host tensor in a CUDA step is named, not read at an illegal address
    (off a GPU - the interpreter, gpucheck's meta weights - nothing is dereferenced by hardware)."""
    from types import SimpleNamespace

    from nonstop.runtime.megakernel.codegen.plan import _check_devices

    launch = SimpleNamespace(name="gqa_qkv_rope_kernel")
    args = [("w_ptr", "wptr", torch.empty(2, device="meta")), ("inv_freq_ptr", "wptr", torch.zeros(4)), ("n", "int", 3)]
    with pytest.raises(ValueError, match=r"gqa_qkv_rope_kernel .* w_ptr on meta, inv_freq_ptr on cpu"):
        _check_devices(launch, args, "cuda")
    _check_devices(launch, args, "cpu")
