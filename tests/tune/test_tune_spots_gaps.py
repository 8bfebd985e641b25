"""Spots of the tuner an earlier audit left open: variants that share a store key (``target.py``), a launcher
that launches several kernels (``tile_order.py``), what the prompt shows of the twin and the kernel
(``prompt.py``), and the verification child's entry point (``child.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from nonstop.config import ModelConfig
from nonstop.tune import prompt, tile_order
from nonstop.tune.target import make_target
from tests.tiny_configs import TINY_CONFIGS

ROOT = Path(__file__).resolve().parents[2]


def test_variants_with_the_same_weights_share_one_tuned_shape():
    """Kimi K3's attnres_mix_norm ops differ only in attributes (n_blocks / store_block), all with a 44-wide
    norm and query: one tuned shape per B, which lists every other variant in ``others``."""
    from nonstop.model.build import meta_model
    from nonstop.program.lower import lower
    from nonstop.tune.cases import layers_for, variants

    cfg = ModelConfig.from_hf_dict(TINY_CONFIGS["kimi_k3"])
    target = make_target("attnres_mix_norm", "tiny-k3", cfg, torch.float32, "cpu", [1, 2])
    cut = cfg.with_num_layers(layers_for(cfg, "attnres_mix_norm"))
    n = len(variants(lower(meta_model(cut, torch.float32)), "attnres_mix_norm"))
    assert n > 1
    assert [(s.B, s.variant, s.others) for s in target.shapes] == [
        (1, 0, tuple(range(1, n))),
        (2, 0, tuple(range(1, n))),
    ]


def test_a_launcher_of_two_kernels_gets_no_tile_order():
    """Two single-phase kernels in one launcher: no single order applies (not an arbitrary one of them)."""
    from nonstop.kernels import kda

    assert tile_order.ordered_kernel(kda, "def f(op, env):\n    kda_core_kernel[(1,)](x)\n") == "kda_core_kernel"
    two = "def f(op, env):\n    kda_core_kernel[(1,)](x)\n    kda_in_proj_kernel[(1,)](x)\n"
    assert tile_order.ordered_kernel(kda, two) is None


def test_the_twin_text_carries_the_equations_of_the_model_functions_it_calls():
    """The MLP twin calls nonstop.model's glu and linear: their signatures and docstrings are shown."""
    text = prompt.twin_text("mlp")
    assert "# nonstop.model.activations.glu(" in text and "# nonstop.model.linear.linear(" in text
    assert "#   y = x W" in text


def test_the_kernel_text_reaches_the_tiles_helpers():
    """launcher -> kernel -> tile -> its helpers: mlp_tile calls gemv_tile, three levels below ``mlp``."""
    import inspect

    from nonstop.kernels import dense

    assert "gemv_tile(" in inspect.getsource(dense.mlp_tile.fn if hasattr(dense.mlp_tile, "fn") else dense.mlp_tile)
    assert "def gemv_tile(" in prompt.kernel_text("mlp")


CHILD_PROBE = """
import json, socket, sys, torch
sys.path.insert(0, sys.argv[2])
import nonstop.tune.child_run as child_run
child_run.run_job = lambda job: {"ran": job}
from nonstop.tune import child
child.main(sys.argv[1])
refused = {}
calls = [("socket", lambda: socket.socket()), ("create_connection", lambda: socket.create_connection(("127.0.0.1", 9))),
         ("getaddrinfo", lambda: socket.getaddrinfo("localhost", 80))]
for name, call in calls:
    try:
        call()
        refused[name] = False
    except PermissionError:
        refused[name] = True
print(json.dumps({"refused": refused, "threads": torch.get_num_threads()}))
"""


def test_the_child_runs_the_job_with_the_network_blocked(tmp_path):
    """``child.main`` saves run_job's result of the job it loads, after blocking sockets (a candidate must not
    reach the network) and pinning torch to one thread."""
    torch.save({"job": 7}, tmp_path / "job.pt")
    script = tmp_path / "probe.py"
    script.write_text(CHILD_PROBE)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"refused": {"socket": True, "create_connection": True, "getaddrinfo": True}, "threads": 1}
    assert torch.load(tmp_path / "result.pt") == {"ran": {"job": 7}}
