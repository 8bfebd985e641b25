"""The offline GPU check (``nonstop gpucheck``, ``kernels/offline.py``) in a bounded form, for every Triton at hand:
the Triton of this environment and a Triton 3.6 installation (the GPU machines' version) when there is one
(``NONSTOP_TRITON36``, else ``build/triton36`` in the repository, as CI installs it:
``pip install --target build/triton36 --no-deps triton==3.6.0``).

* the PTX reading: a spin-wait whose acquire is an unused atomic after a volatile poll - the pattern Triton 3.6
  compiles to no acquire at all - is caught; ``launch.wait_at_least`` keeps its acquire under every Triton;
* at real preset widths (``BOUNDED``): the megakernels of Kimi K3 (4 layers: every kind of layer), Llama-3.2-1B
  (1 layer) and Kimi-Linear-48B-A3B (2 layers, 5 rows), every launcher of the last two and the K3 launchers that
  stand out (the MXFP4 routed experts, the LM head, MLA attention: 162 KB of shared memory, the sampler),
  compiled as they launch on an H100: no spill, a CTA fits, every spin-wait acquires, every weight stream uses
  16-byte loads (MXFP4 bytes included; their scales one load per thread and step). The full form is
  ``nonstop gpucheck`` (three preset shapes, every kernel).
Each check runs in a fresh process without ``TRITON_INTERPRET``; compiles are cached by Triton and ptxas
results by ``kernels/offline.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nonstop.kernels.offline import spin_waits

ROOT = Path(__file__).resolve().parents[2]
TRITON36 = os.environ.get("NONSTOP_TRITON36") or str(ROOT / "build" / "triton36")
TRITONS = [
    pytest.param(None, id="triton-here"),
    pytest.param(
        TRITON36,
        id="triton-3.6",
        marks=pytest.mark.skipif(
            not os.path.isdir(os.path.join(TRITON36, "triton")), reason=f"no Triton 3.6 installation at {TRITON36}"
        ),
    ),
]

pytestmark = pytest.mark.skipif(
    not os.path.isdir(os.path.join(os.path.dirname(__import__("triton").__file__), "backends", "nvidia")),
    reason="this Triton has no NVIDIA backend",
)


def _run(code: str, triton_path: str | None, folder: Path, timeout: float = 900) -> dict:
    """Run ``code`` (a script: Triton reads kernels' source from their file) without the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (triton_path, str(ROOT), env.get("PYTHONPATH")) if p)
    script = folder / "probe.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- reading PTX

SPIN_NO_ACQUIRE = """
$L__BB0_1:
	ld.volatile.global.b32 	%r5, [%rd2];
	setp.lt.s32 	%p1, %r5, %r1;
	@%p1 bra 	$L__BB0_1;
	ld.global.b32 	%r7, [%rd3];
"""
SPIN_ACQUIRE_AFTER = SPIN_NO_ACQUIRE.replace(
    "	ld.global.b32 	%r7, [%rd3];", "	fence.acq_rel.gpu;\n	ld.global.b32 	%r7, [%rd3];"
)
SPIN_ON_ACQUIRE = SPIN_NO_ACQUIRE.replace("ld.volatile.global.b32", "ld.global.gpu.acquire.b32")


def test_spin_waits_are_read_from_ptx():
    assert [s["acquire"] for s in spin_waits(SPIN_NO_ACQUIRE)] == [False]
    assert [s["how"] for s in spin_waits(SPIN_ACQUIRE_AFTER)] == ["acquire after the loop"]
    assert [s["how"] for s in spin_waits(SPIN_ON_ACQUIRE)] == ["the poll is an acquire"]
    assert spin_waits(SPIN_NO_ACQUIRE.replace("@%p1 bra 	$L__BB0_1;", "")) == []  # no loop, no spin


def test_scale_loads_may_be_narrow_but_not_per_element():
    """A side stream (MXFP4 scales) with one load per step passes; one load per element (16 per weight load)
    is reported, as are weight loads under 16 bytes."""
    from nonstop.kernels.offline import KernelReport

    def report(weight_widths, side_count):
        return KernelReport(
            "k",
            8,
            128,
            0,
            0,
            1,
            132,
            {"w": [(b, "gemv.py:1") for b in weight_widths]},
            {"s": [(1, "gemv.py:2")] * side_count},
            [],
        )

    assert report([16, 16], 2).violations == []
    assert "a load per element" in report([16], 16).violations[0]
    assert "under 16 bytes" in report([16, 8], 1).violations[0]


ACQUIRE_PROBE = """
import json, torch, triton, triton.language as tl
from nonstop.kernels import offline
from nonstop.kernels.launch import wait_at_least

@triton.jit
def unused_acquire(counter_ptr, x_ptr, out_ptr, target):
    while tl.load(counter_ptr, volatile=True) < target:
        pass
    tl.atomic_add(counter_ptr, 0, sem="acquire")  # the result is unused
    tl.store(out_ptr, tl.load(x_ptr))

@triton.jit
def polled_acquire(counter_ptr, x_ptr, out_ptr, target):
    wait_at_least(counter_ptr, target)
    tl.store(out_ptr, tl.load(x_ptr))

t = torch.empty(4, dtype=torch.int32, device="meta")
out = {}
for fn in (unused_acquire, polled_acquire):
    k, _ = offline.compile_launch(fn, dict(counter_ptr=t, x_ptr=t, out_ptr=t, target=5), {"num_warps": 4})
    out[fn.__name__] = [s["acquire"] for s in offline.spin_waits(k.asm["ptx"])]
print(json.dumps({"triton": triton.__version__, **out}))
"""


@pytest.mark.parametrize("triton_path", TRITONS)
def test_the_spin_wait_acquire_survives_every_triton(triton_path, tmp_path):
    """``wait_at_least`` (the poll is the acquire) compiles to an ordered spin under every Triton; the old
    pattern is checked too: Triton 3.6 drops its unused acquire, and the check says so."""
    got = _run(ACQUIRE_PROBE, triton_path, tmp_path)
    assert got["polled_acquire"] == [True], got
    if got["triton"].startswith("3.6"):
        assert got["unused_acquire"] == [False], got


# ----------------------------------------------------------------------------- the megakernel's PTX pass

SHARED_LOADS = """
	add.s32 	%r21, %r19, %r20;
	// begin inline asm
	@%p4 ld.shared.b32 %r22, [ %r21 + 0 ];
	// end inline asm
	// begin inline asm
	@!%p5 ld.shared.v2.b64 { %rd7, %rd8 }, [ %r21 + 0 ];
	// end inline asm
	// begin inline asm
	ld.shared.b32 %r23, [ %r21 + 0 ];
	// end inline asm
	// begin inline asm
	mov.u32 %r24, 0x0;
	@%p4 ld.global.b32 { %r24 }, [ %rd9 + 0 ];
	// end inline asm
"""


def test_ptx_pass_defines_predicated_shared_loads():
    """Each inline-asm block that is one predicated shared load gets its registers defined (0) first, at the
    width of the load, vector lanes included; unpredicated loads and Triton's masked global loads (which
    set their default inside the block) are left alone; a second pass changes nothing."""
    from nonstop.kernels.ptx_pass import define_predicated_loads

    out, changed = define_predicated_loads(SHARED_LOADS)
    assert changed == 2
    lines = [ln.strip() for ln in out.splitlines()]
    first = lines.index("@%p4 ld.shared.b32 %r22, [ %r21 + 0 ];")
    assert lines[first - 2 : first] == ["mov.b32 \t%r22, 0;", "// begin inline asm"]
    second = lines.index("@!%p5 ld.shared.v2.b64 { %rd7, %rd8 }, [ %r21 + 0 ];")
    assert lines[second - 3 : second] == ["mov.b64 \t%rd7, 0;", "mov.b64 \t%rd8, 0;", "// begin inline asm"]
    assert len(lines) == len(SHARED_LOADS.splitlines()) + 3
    assert define_predicated_loads(out) == (out, 0)


PASS_PROBE = """
import os
os.environ["TRITON_ALWAYS_COMPILE"] = "1"  # Triton 3.6's cache key does not include the pass: compile afresh
import json, torch, triton, triton.language as tl
from nonstop.kernels import offline
from nonstop.kernels import launch, ptx_pass as ptx  # importing launch installs the pass
from nonstop.runtime.megakernel.codegen import source

@triton.jit(noinline=True)
def task(x_ptr, out_ptr, tile, BLOCK: tl.constexpr):
    x = tl.load(x_ptr + tile * BLOCK + tl.arange(0, BLOCK))
    tl.store(out_ptr + tile, tl.sum(x * x, axis=0) + tl.max(x, axis=0))

@triton.jit
def megakernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    for tile in range(tl.program_id(0), n, 4):
        task(x_ptr, out_ptr, tile, BLOCK)

@triton.jit
def other(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    for tile in range(tl.program_id(0), n, 4):
        task(x_ptr, out_ptr, tile, BLOCK)

t = torch.empty(8192, dtype=torch.float32, device="meta")
out = {"triton": triton.__version__, "template": "def " + ptx.KERNEL_NAME + "(" in source.KERNEL}
for fn in (megakernel, other):
    k, _ = offline.compile_launch(fn, dict(x_ptr=t, out_ptr=t, n=7, BLOCK=1024), {"num_warps": 8})
    out[fn.__name__] = ptx.define_predicated_loads(k.asm["ptx"])[1]  # blocks still undefined
print(json.dumps(out))
"""


@pytest.mark.parametrize("triton_path", TRITONS)
def test_ptx_pass_runs_in_every_triton_pipeline(triton_path, tmp_path):
    """With ``nonstop.kernels.launch`` imported (every kernel module and the generated megakernel import it), a
    kernel named ``megakernel`` compiles with no undefined predicated shared load left in its PTX under every
    Triton; another kernel is not rewritten (Triton 3.6 emits such loads for its cross-warp reductions,
    Triton 3.9 none)."""
    got = _run(PASS_PROBE, triton_path, tmp_path)
    assert got["template"] and got["megakernel"] == 0, got
    if got["triton"].startswith("3.6"):
        assert got["other"] > 0, got


# (name, preset, layers, launchers checked, megakernel too, rows): real preset widths, few layers (a class compiles
# once, whatever the layers), one row count each (every row count takes the same blocks: ``platform.row_block``).
# Kimi K3's 4 layers hold every kind of layer (KDA, dense MLP, latent MoE with MXFP4 experts, gated MLA) and its
# launchers the ones that stand out (the MXFP4 experts, the LM head, MLA attention: 162 KB of shared memory, the
# sampler); Llama and Kimi Linear: every launcher but the sampler (K3's) and their megakernels - Kimi Linear at 5
# rows runs moe_tail (a 4-warp launcher) at the megakernel's 8 warps, where too narrow a K block once gave each
# thread 8 bytes of the tile.
LAUNCHERS = {
    "llama-3.2-1b": ["embed", "gqa_qkv_rope", "gqa_attn", "linear_residual", "mlp", "lm_head", "advance"],
    "kimi-linear-48b-a3b": [
        *("embed", "kda_in_proj", "kda_core", "linear_residual", "mlp"),
        *("moe_front", "moe_experts", "moe_tail", "lm_head", "advance"),
    ],
}
BOUNDED = [
    ("kimi-k3", "kimi-k3", 4, ["moe_experts", "lm_head", "mla_attn", "sample"], True, 1),
    ("llama-3.2-1b", "llama-3.2-1b", 1, LAUNCHERS["llama-3.2-1b"], True, 1),
    ("kimi-linear-48b-a3b", "kimi-linear-48b-a3b", 2, LAUNCHERS["kimi-linear-48b-a3b"], True, 5),
]


@pytest.mark.parametrize("triton_path", TRITONS)
def test_bounded_offline_check(triton_path):
    """Every kernel of the bounded set compiles as it launches on an H100 with no violation (no spill, a CTA
    fits, every spin-wait acquires, 16-byte weight loads); the three megakernels report their task classes'
    registers."""
    from nonstop.runtime import gpucheck

    # the three checks run side by side (each compiles in its own interpreter; the machine's cores share them)
    procs = [
        gpucheck.start_check([(name, model, layers)], n_rows, kinds=kinds, megakernel=mk, triton_path=triton_path)
        for name, model, layers, kinds, mk, n_rows in BOUNDED
    ]
    try:
        results = [gpucheck.finish_check(proc, timeout=1500) for proc in procs]
    finally:
        for proc in procs:  # a failed check stops the others, never leaves them behind
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    rows = [row for result in results for row in result["rows"]]
    result = results[-1]
    print(gpucheck.table([gpucheck.Row(**r) for r in rows], result["triton"]))
    assert [v for r in rows for v in r["violations"]] == []
    checked = {(r["shape"], r["kernel"].split(":")[0].split(" (")[0]) for r in rows}
    for name, _, _, kinds, _, _ in BOUNDED:
        assert {(name, kind) for kind in [*kinds, "megakernel"]} <= checked, name
    by = {r["kernel"]: r for r in rows if r["shape"] == "kimi-k3"}
    experts = by["moe_experts:moe_experts_kernel"]
    assert experts["load_widths"].split(",")[-1] == "16" and experts["ctas_per_sm"] >= 1  # MXFP4 bytes as 16-byte loads
    assert (
        by["mla_attn:mla_attn_kernel"]["shared_bytes"] > 100_000 and by["mla_attn:mla_attn_kernel"]["ctas_per_sm"] == 1
    )
    megakernels = [r for r in rows if r["kernel"].startswith("megakernel")]
    assert len(megakernels) == 3
    for mk in megakernels:
        assert mk["spins"] >= 1 and mk["warps"] == 8 and mk["load_widths"] != "-"
        assert mk["grid"] == mk["ctas_per_sm"] * 132
        assert max(mk["classes"].values()) <= mk["registers"] and len(mk["classes"]) >= 10


def test_command_exit_status_and_errors(tmp_path, capsys):
    """``nonstop gpucheck``: a bad model or --rows is one line on stderr (status 2); a checked model whose
    kernels violate a check exits 1 - an odd-width Llama's weight rows (40 bf16 = 80 bytes) cannot all be
    read with 16-byte loads - and --json lists the violations."""
    from nonstop.cli import main
    from tests.tiny_configs import LLAMA

    for argv in (["gpucheck", "-m", "no-such-model"], ["gpucheck", "-m", "llama-3.2-1b", "--rows", "17"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("nonstop: error:") and "\n" not in err
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "num_hidden_layers": 1}))
    status = main(["gpucheck", "-m", str(tmp_path), "--no-megakernel", "--json", "--quiet"])
    report = json.loads(capsys.readouterr().out)
    assert status == 1 and report["violations"] and all("under 16 bytes" in v for v in report["violations"])
    assert {r["kernel"] for r in report["results"][0]["rows"]} >= {"mlp:mlp_kernel", "lm_head:gemv_kernel"}


@pytest.mark.parametrize("triton_path", TRITONS)
def test_embed_of_a_narrow_row_streams_16_byte_loads(triton_path):
    """k3-nano's embedding rows are 256 bf16 (512 bytes): the embed launcher launches as many warps as give each
    thread a 16-byte load (one), and the check finds no load under 16 bytes (it once read 4-byte loads at 4 warps)."""
    from nonstop.runtime import gpucheck

    result = gpucheck.run_check(
        [("k3-nano", "k3-nano", 1)], kinds=["embed"], megakernel=False, triton_path=triton_path, timeout=900
    )
    [row] = result["rows"]
    assert row["kernel"] == "embed:embed_kernel" and row["violations"] == [], row
    assert row["load_widths"] == "16" and row["warps"] == 1, row


def test_num_layers_beyond_the_model_is_an_error(capsys, monkeypatch):
    """--num-layers above the model's layer count is refused before any compile (status 2, one line), with the
    wording of ``nonstop program`` / ``synth`` (``ModelConfig.with_num_layers``), not silently cut to the model."""
    from nonstop.cli import main
    from nonstop.config import ConfigError
    from nonstop.runtime import gpucheck

    with pytest.raises(ConfigError, match="cannot slice 8 layers to 100"):
        gpucheck.config_of("k3-nano", 100)
    assert gpucheck.config_of("k3-nano", 8).num_hidden_layers == 8
    assert gpucheck.config_of("k3-nano", 3).num_hidden_layers == 3

    def no_compile(*args, **kwargs):
        raise AssertionError("the check started compiling")

    monkeypatch.setattr(gpucheck, "run_check", no_compile)
    with pytest.raises(SystemExit) as exc:
        main(["gpucheck", "-m", "k3-nano", "--num-layers", "100"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == "nonstop: error: num_hidden_layers: cannot slice 8 layers to 100", err


@pytest.mark.parametrize("triton_path", TRITONS)
def test_embed_of_a_row_narrower_than_a_warp_is_no_violation(triton_path):
    """An embedding row of 128 bf16 (256 bytes) is gathered by one warp of 32 threads: 8 bytes a thread is the
    widest load it allows, and the check accepts that width there (it once failed every checkpoint of
    hidden size under 256); the report still shows the 8-byte loads."""
    from nonstop.runtime import gpucheck
    from tests.tiny_configs import LLAMA

    config = {**LLAMA, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1}
    result = gpucheck.run_check([("narrow", config, None)], kinds=["embed"], megakernel=False, triton_path=triton_path)
    [row] = result["rows"]
    assert row["kernel"] == "embed:embed_kernel" and row["violations"] == [], row
    assert row["load_widths"] == "8" and row["warps"] == 1, row


def test_the_load_width_a_report_wants_is_its_own():
    """``min_load_bytes`` sets the width weight loads must reach: narrower loads are reported with it."""
    from nonstop.kernels.offline import KernelReport

    def report(width, wanted):
        return KernelReport("k", 1, 32, 0, 0, 8, 1, {"w": [(width, "dense.py:55")]}, {}, [], wanted)

    assert report(8, 8).violations == []
    assert report(4, 8).violations == ["k: weight w streams with loads under 8 bytes at dense.py:55"]
    assert "under 16 bytes" in report(8, 16).violations[0]


def _no_compile(*args, **kwargs):
    raise AssertionError("the check started compiling")


def test_a_triton_dir_that_does_not_import_is_refused_before_any_compile(tmp_path, capsys, monkeypatch):
    """--triton DIR whose triton package raises on import, or a bare ``triton/`` folder (a namespace package that
    lets the environment's Triton through, so the "second" check would repeat the first), is one error line
    and status 2, before the first check starts."""
    from nonstop.cli import main
    from nonstop.runtime import gpucheck

    monkeypatch.setattr(gpucheck, "run_check", _no_compile)
    broken, bare = tmp_path / "broken", tmp_path / "bare"
    (broken / "triton").mkdir(parents=True)
    (broken / "triton" / "__init__.py").write_text("raise ImportError('half an install')\n")
    (bare / "triton").mkdir(parents=True)
    for folder, wanted in ((broken, "does not import from it (ImportError: half an install)"), (bare, "no whole")):
        with pytest.raises(SystemExit) as exc:
            main(["gpucheck", "-m", "k3-nano", "--triton", str(folder)])
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and err.startswith("nonstop: error: --triton") and "\n" not in err, err
        assert wanted in err, err


@pytest.mark.parametrize("mode", ["--json", "table"])
def test_a_check_that_fails_under_one_triton_keeps_the_others(mode, tmp_path, capsys, monkeypatch):
    """When the check cannot run under a second Triton, the results of the first are still printed and the
    status is 1: under --json as ``results`` and ``failures``, in table mode as the table with a count of the
    checks that failed to run under it."""
    from nonstop.cli import main
    from nonstop.runtime import gpucheck

    row = dict(
        shape="k3-nano", kernel="embed:embed_kernel", warps=1, registers=20, spill_bytes=0, shared_bytes=0,
        ctas_per_sm=8, grid=1, load_widths="16", spins=0, violations=[],
    )  # fmt: skip

    def check(shapes, triton_path=None, **kwargs):
        if triton_path:
            raise RuntimeError("the offline GPU check failed:\nptxas fatal")
        return {"triton": "9.9", "rows": [row]}

    monkeypatch.setattr(gpucheck, "run_check", check)
    monkeypatch.setattr(gpucheck, "triton_in", lambda path: "3.6.0")
    (tmp_path / "elsewhere" / "triton").mkdir(parents=True)
    argv = ["gpucheck", "-m", "k3-nano", "--triton", str(tmp_path / "elsewhere"), "-q"]
    status = main([*argv, "--json"] if mode == "--json" else argv)
    if mode == "--json":
        out = json.loads(capsys.readouterr().out)
        assert status == 1 and out["results"] == [{"triton": "9.9", "rows": [row]}]
        assert len(out["failures"]) == 1 and "elsewhere" in out["failures"][0] and "ptxas fatal" in out["failures"][0]
    else:
        out = capsys.readouterr().out
        assert status == 1 and "Triton 9.9" in out and "embed:embed_kernel" in out
        assert "1 check(s) failed to run (see above)" in out


def test_num_layers_without_a_model_cuts_each_preset_shape(monkeypatch, capsys):
    """Without --model, --num-layers N checks at most N layers of each preset shape (it was ignored: the full
    default run started); a larger N keeps each shape's default."""
    from nonstop.cli import main
    from nonstop.runtime import gpucheck

    asked = []

    def check(shapes, **kwargs):
        asked.append(shapes)
        return {"triton": "9.9", "rows": []}

    monkeypatch.setattr(gpucheck, "run_check", check)
    for n in (1, 6):
        assert main(["gpucheck", "--num-layers", str(n), "-q"]) == 0
    capsys.readouterr()
    assert asked[0] == [(name, name, 1) for name in gpucheck.PRESET_SHAPES]
    llama_layers = gpucheck.config_of("llama-3.2-1b", None).num_hidden_layers
    assert asked[1] == [("llama-3.2-1b", "llama-3.2-1b", 6), ("kimi-linear-48b-a3b", "kimi-linear-48b-a3b", 4),
                        ("kimi-k3", "kimi-k3", 4)] and llama_layers > 6  # fmt: skip


ORPHAN_PROBE = """
import sys, time
from nonstop.runtime import gpucheck
proc = gpucheck.start_check([("kimi-k3", "kimi-k3", 4)], progress=True)  # progress on the caller's stderr: a file
print(proc.pid, flush=True)
time.sleep(600)
"""


def test_the_check_dies_with_the_process_that_started_it(tmp_path):
    """A caller killed outright (SIGKILL: no handler runs) takes its check process with it: a stopped
    ``nonstop gpucheck`` or benchmark leaves no compile running (it once ran on for up to an hour)."""
    import signal
    import time

    script = tmp_path / "caller.py"
    script.write_text(ORPHAN_PROBE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), XDG_CACHE_HOME=str(tmp_path / "xdg"))  # no cached compile
    with open(tmp_path / "stderr", "w") as err:  # not a pipe, which would end an orphan at its next write
        caller = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        child = int(caller.stdout.readline())
        time.sleep(3)  # the check is importing or compiling by now
        assert _alive(child), "the check ended before its caller was killed"
        caller.send_signal(signal.SIGKILL)
        caller.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(child):
            time.sleep(0.2)
        assert not _alive(child), "the check outlived its caller"
    finally:
        caller.kill()
        caller.wait()


def _alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie (an orphan is reaped by init, a zombie child by nobody here)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_width_a_narrow_embedding_row_allows_is_a_load_width():
    """A row of 48 bf16 (96 bytes) over 32 threads allows 3 bytes a thread, which no load has: the check wants
    the widest real load under it (2), and 16 bytes from rows of 512 bytes on."""
    from types import SimpleNamespace

    from nonstop.runtime.gpucheck import _min_load_bytes

    def wanted(hidden):
        return _min_load_bytes(
            SimpleNamespace(kind="embed", weights={"embed": torch.empty(5, hidden, dtype=torch.bfloat16)})
        )

    assert [wanted(h) for h in (8, 48, 128, 200, 256, 4096)] == [1, 2, 8, 8, 16, 16]
    assert _min_load_bytes(SimpleNamespace(kind="mlp", weights={})) == 16


@pytest.mark.parametrize("argv", [[], ["--help"], ["a", "b"]])
def test_the_check_child_run_by_hand_says_what_to_run_instead(argv):
    """``python -m nonstop.runtime.gpucheck`` is the child ``nonstop gpucheck`` starts with a JSON request; run by
    hand (no argument, ``--help``) it ended in an IndexError or JSONDecodeError traceback. It now names the
    command to run, exit status 1."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "nonstop.runtime.gpucheck", *argv], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 1
    assert "run `nonstop gpucheck --help`" in done.stderr and "Traceback" not in done.stderr
