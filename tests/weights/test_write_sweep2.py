"""Writing checkpoints, second sweep: SIGTERM during a write and staging left by a killed one, which weight
files an old checkpoint's are, and synth drawing its tensors without full-size float32 temporaries."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import nonstop.weights.synth as synth
from nonstop.cli import main
from nonstop.config import ModelConfig
from nonstop.weights.synth import INIT_STD, iter_random_tensors, write_checkpoint
from nonstop.weights.write import STAGING_PREFIX, staged_checkpoint
from tests.tiny_configs import LLAMA, TINY_CONFIGS

ROOT = Path(__file__).resolve().parents[2]
CFG = ModelConfig.from_hf_dict(LLAMA)
SHARDS = 20_000  # bytes: the tiny llama in several shards


def _python(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (a SIGTERM test must not risk the test process)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


# SIGTERM sent to the process itself as synth saves its second shard (or, ``at="put"``, as the new files are
# being put in place), then `nonstop synth` over an old checkpoint; prints the handler in force afterwards.
SIGTERM_DRIVER = """
import json, os, signal, sys
import safetensors.torch
import nonstop.weights.write as write
from nonstop.cli import main

out, config, at = {out!r}, {config!r}, {at!r}
real_save, real_mode, calls = safetensors.torch.save_file, write.file_mode, []

def save(tensors, path, metadata=None):
    calls.append(path)
    if len(calls) == 2 and at == "save":
        os.kill(os.getpid(), signal.SIGTERM)
    return real_save(tensors, path, metadata=metadata)

def mode():
    if at == "put":
        os.kill(os.getpid(), signal.SIGTERM)
    return real_mode()

safetensors.torch.save_file, write.file_mode = save, mode
try:
    code = main(["synth", "--config", config, "--out", out, "--shard-size", "0.00002", "--seed", "5"])
except SystemExit as exc:
    code = exc.code
print("handler", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, file=sys.stderr)
sys.exit(code)
"""


def _old_checkpoint_then_sigterm(tmp_path: Path, at: str) -> tuple[Path, dict, subprocess.CompletedProcess]:
    out, config = tmp_path / "ckpt", tmp_path / "llama.json"
    config.write_text(json.dumps({**LLAMA, "num_hidden_layers": 1}))
    write_checkpoint(CFG, out, seed=1, dtype=torch.float32, max_shard_bytes=SHARDS)
    (out / "notes.txt").write_text("mine")
    before = _snapshot(out)
    result = _python(SIGTERM_DRIVER.format(out=str(out), config=str(config), at=at), tmp_path)
    return out, before, result


def test_sigterm_during_synth_removes_its_staging_and_ends_with_one_line(tmp_path):
    """timeout, Slurm and docker stop send SIGTERM: it killed synth before its cleanup, leaving a hidden
    staging directory as large as the checkpoint written so far."""
    out, before, result = _old_checkpoint_then_sigterm(tmp_path, "save")
    assert result.returncode == 143, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-2:] == ["nonstop: terminated", "handler True"], result.stderr
    assert "Traceback" not in result.stderr
    assert _snapshot(out) == before  # no staging directory, the old checkpoint as it was


def test_sigterm_while_the_new_files_are_put_in_place_waits_for_them(tmp_path):
    """Cut halfway, the old weights would be gone and the new ones still staged: the SIGTERM is held until
    the new checkpoint is whole, then ends the command."""
    out, before, result = _old_checkpoint_then_sigterm(tmp_path, "put")
    assert result.returncode == 143, result.stderr
    assert result.stderr.strip().splitlines()[-2:] == ["nonstop: terminated", "handler True"], result.stderr
    assert not list(out.glob(f"{STAGING_PREFIX}*"))
    assert (out / "notes.txt").read_text() == "mine"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == sorted(p.name for p in out.glob("model-*.safetensors"))
    assert _snapshot(out) != before  # the seed-5 checkpoint replaced the seed-1 one


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_staging_left_by_a_killed_write_is_removed_by_the_next(tmp_path, capsys):
    out = tmp_path / "ckpt"
    write_checkpoint(CFG, out, dtype=torch.float32)
    host = socket.gethostname()
    dead = out / f"{STAGING_PREFIX}{_dead_pid()}-{host}-abcd_123"
    alive = out / f"{STAGING_PREFIX}{os.getpid()}-{host}-efgh4567"  # a write still running
    elsewhere = out / f"{STAGING_PREFIX}1-{host}.elsewhere-ijkl8901"  # another host's: its PID says nothing here
    unnamed = out / f"{STAGING_PREFIX}mnop2345"  # as nonstop named them before: no owner to look at
    for stage in (dead, alive, elsewhere, unnamed):
        stage.mkdir()
        (stage / "shard-00000.tmp.safetensors").write_bytes(b"x" * 100)
    capsys.readouterr()
    with staged_checkpoint(out) as stage:
        assert stage.name.startswith(f"{STAGING_PREFIX}{os.getpid()}-{host}-")  # its own owner, named
        (stage / "model.safetensors").write_bytes(b"new")
    err = capsys.readouterr().err
    assert not dead.exists() and f"nonstop: removed {dead}" in err
    assert alive.exists() and str(alive) not in err
    for kept in (elsewhere, unnamed):
        assert kept.exists() and f"nonstop: note: {kept} is left from an unfinished write" in err
    assert sorted(p.name for p in out.glob(f"{STAGING_PREFIX}*")) == sorted(p.name for p in (alive, elsewhere, unnamed))


def test_only_an_old_checkpoints_own_weight_files_are_replaced(tmp_path, capsys):
    """``model*.safetensors`` took the user's ``model_backup.safetensors`` too; a shard the old index names
    under another name (a checkpoint written elsewhere) was left behind; neither was reported."""
    out, config = tmp_path / "ckpt", tmp_path / "llama.json"
    config.write_text(json.dumps(LLAMA))
    write_checkpoint(CFG, out, dtype=torch.float32, max_shard_bytes=SHARDS)
    old_shards = sorted(p.name for p in out.glob("model-*-of-*.safetensors"))
    assert len(old_shards) > 1
    index = json.loads((out / "model.safetensors.index.json").read_text())
    renamed = next(iter(index["weight_map"].values()))  # a shard under a name synth never gives
    (out / renamed).rename(out / "weights-a.safetensors")
    index["weight_map"] = {n: "weights-a.safetensors" if f == renamed else f for n, f in index["weight_map"].items()}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    mine = ("model_backup.safetensors", "model-final.safetensors", "model.safetensors.bak")
    for name in mine:
        (out / name).write_bytes(b"mine")
    capsys.readouterr()
    assert main(["synth", "--config", str(config), "--out", str(out)]) == 0
    gone = {"weights-a.safetensors", "model.safetensors.index.json", *old_shards} - {renamed}
    assert all((out / name).read_bytes() == b"mine" for name in mine)
    assert not any((out / name).exists() for name in gone)
    assert (out / "model.safetensors").exists()
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("removed from the old checkpoint"))
    assert set(line.split(": ", 1)[1].split(", ")) == gone


@pytest.mark.parametrize("chunk", [16, 48, 1008])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_drawing_in_chunks_draws_the_same_values(monkeypatch, chunk, dtype):
    """Tests and users depend on the exact weights of a seed: the chunked draw is bit-equal to one
    ``randn * std`` call, and leaves the generator where that call leaves it."""
    monkeypatch.setattr(synth, "DRAW_CHUNK", chunk)
    for shape in [(5, 7), (64, 33), (97, 41), (3, 1024), (16,), (4099,)]:
        want_gen, got_gen = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
        want = (torch.randn(shape, generator=want_gen) * INIT_STD).to(dtype)
        got = synth._normal(shape, INIT_STD, dtype, got_gen)
        assert got.dtype == dtype and got.shape == shape
        assert torch.equal(got.view(-1).view(torch.uint8), want.view(-1).view(torch.uint8)), shape
        assert torch.equal(torch.randn(20, generator=got_gen), torch.randn(20, generator=want_gen)), shape


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_a_seed_gives_the_same_checkpoint_drawn_in_chunks(monkeypatch, name):
    cfg = ModelConfig.from_hf_dict(TINY_CONFIGS[name])
    whole = list(iter_random_tensors(cfg, torch.bfloat16, 3))
    monkeypatch.setattr(synth, "DRAW_CHUNK", 32)
    chunked = list(iter_random_tensors(cfg, torch.bfloat16, 3))
    assert [n for _, n, _ in chunked] == [n for _, n, _ in whole]
    for (_, n, a), (_, _, b) in zip(whole, chunked):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), n


def test_a_large_tensor_is_drawn_without_full_size_float32_copies(tmp_path):
    """``(randn * std).to(bf16)`` held two float32 copies of the whole tensor, 4x its bf16 bytes (kimi-k2
    with two layers peaked at 16.9 GB for 4 GB shards)."""
    result = _python(
        f"""
        import re, torch
        from pathlib import Path
        from nonstop.config import ModelConfig
        from nonstop.weights.synth import iter_random_tensors

        def kib(field):
            return int(re.search(field + r":\\s+(\\d+) kB", Path("/proc/self/status").read_text())[1])

        big = {{"vocab_size": 1 << 20, "hidden_size": 64, "num_hidden_layers": 1}}  # a 64M-value embedding
        cfg = ModelConfig.from_hf_dict({{**{LLAMA!r}, **big}})
        torch.randn(1000).mul_(2).to(torch.bfloat16)  # the kernels' own memory, before the baseline
        base = kib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
        for _, name, t in iter_random_tensors(cfg, torch.bfloat16, 0):
            del t
        print((kib("VmHWM") - base) // 1024)
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    grown_mib = int(result.stdout.split()[-1])
    # the 64M-value embedding is 128 MiB in bf16 and a chunk 64 MiB of float32; drawn at once it took 512 MiB
    assert grown_mib < 128 + 2 * 64 + 64, grown_mib


def test_a_shard_is_saved_before_the_next_tensor_is_drawn(monkeypatch, tmp_path):
    """Memory holds one shard: the tensor that does not fit is drawn after the full shard is saved (it was
    drawn first, so a shard and the next tensor, as large as an embedding, were held together)."""
    import safetensors.torch

    drawn, at_save = [], []
    real_iter, real_save = synth.iter_random_tensors, safetensors.torch.save_file

    def counting_iter(*args, **kwargs):
        for item in real_iter(*args, **kwargs):
            drawn.append(item[1])
            yield item

    def save(tensors, path, metadata=None):
        at_save.append((len(drawn), len(tensors)))
        return real_save(tensors, path, metadata=metadata)

    monkeypatch.setattr(synth, "iter_random_tensors", counting_iter)
    monkeypatch.setattr(safetensors.torch, "save_file", save)
    write_checkpoint(CFG, tmp_path / "ckpt", dtype=torch.float32, max_shard_bytes=SHARDS)
    assert len(at_save) > 2
    saved = 0
    for n_drawn, n_tensors in at_save:
        saved += n_tensors
        assert n_drawn == saved  # nothing drawn beyond the shard being saved
    assert saved == len(drawn)
