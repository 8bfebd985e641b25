"""Gaps in the tests of ``nonstop gpucheck`` (``commands/gpucheck.py``) and the CPU-side parts of
``runtime/gpucheck.py`` found by mutation. No compile runs: ``run_check`` is replaced where the command is run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from nonstop.runtime import gpucheck

ROW = dict(
    shape="k3-nano", kernel="embed:embed_kernel", warps=1, registers=20, spill_bytes=0, shared_bytes=0,
    ctas_per_sm=8, grid=1, load_widths="16", spins=0, violations=[],
)  # fmt: skip


@pytest.fixture
def asked(monkeypatch):
    """The keyword arguments of every ``run_check`` call; each returns one clean row."""
    calls = []

    def check(shapes, **kwargs):
        calls.append(dict(shapes=shapes, **kwargs))
        return {"triton": "9.9", "rows": [ROW]}

    monkeypatch.setattr(gpucheck, "run_check", check)
    return calls


def test_the_flags_reach_the_check(asked, capsys):
    """--rows 16 (the most a decode step has) is accepted; --gpu, --no-megakernel and --quiet reach ``run_check``;
    without --quiet progress is shown."""
    from nonstop.cli import main

    assert (
        main(
            [
                "gpucheck",
                "-m",
                "k3-nano",
                "--rows",
                "16",
                "--gpu",
                "h200",
                "--no-megakernel",
                "-q",
            ]
        )
        == 0
    )
    assert main(["gpucheck", "-m", "k3-nano"]) == 0
    capsys.readouterr()
    first, second = asked
    assert first["rows"] == 16 and first["gpu"] == "h200" and first["megakernel"] is False
    assert first["progress"] is False and first["triton_path"] is None and first["arch"] == 90
    assert second["rows"] == 1 and second["gpu"] == "h100" and second["megakernel"] is True
    assert second["progress"] is True


def test_a_checkpoint_directory_is_named_by_its_folder(asked, tmp_path, capsys):
    """``-m /path/to/ckpt/`` is checked under the shape name ``ckpt`` (the table's first column), the path itself
    is what the child reads."""
    from nonstop.cli import main
    from tests.tiny_configs import LLAMA

    folder = tmp_path / "my-ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    assert main(["gpucheck", "-m", str(folder) + os.sep, "-q"]) == 0
    capsys.readouterr()
    assert asked[0]["shapes"] == [("my-ckpt", str(folder) + os.sep, None)]


def test_a_triton_dir_without_a_triton_folder_is_refused_without_importing(monkeypatch, tmp_path, capsys, asked):
    """--triton DIR with no ``triton/`` inside is one error line naming it, before any interpreter is started."""
    from nonstop.cli import main

    def no_probe(path):
        raise AssertionError("started an interpreter to probe an empty folder")

    monkeypatch.setattr(gpucheck, "triton_in", no_probe)
    with pytest.raises(SystemExit) as exc:
        main(["gpucheck", "-m", "k3-nano", "--triton", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err == f"nonstop: error: --triton {tmp_path}: no triton package in that directory"
    assert asked == []


def test_the_table_marks_violations_and_unknowns():
    """A row with violations ends with ``<- `` and each violation; a missing grid is ``-`` and unknown registers
    ``?``; a long kernel name is cut to its column; the Triton version heads the table."""
    rows = [
        gpucheck.Row(**{**ROW, "kernel": "k" * 60, "grid": None, "registers": None}),
        gpucheck.Row(**{**ROW, "violations": ["a spills", "b too wide"]}),
    ]
    lines = gpucheck.table(rows, "3.6.0").splitlines()
    assert lines[0] == "Triton 3.6.0" and lines[1].startswith("shape")
    first = lines[2].split()
    assert first[1] == "k" * 44 and first[3] == "?" and first[7] == "-"
    assert lines[3].endswith("16  <- a spills; b too wide")
    assert gpucheck.table(rows).splitlines()[0].startswith("shape")


def test_a_spill_names_the_three_heaviest_task_classes():
    """A megakernel row with spilled registers appends the three heaviest task classes to its spill violation
    (and only to that one); without spills the violations are left as they are."""
    report = SimpleNamespace(
        violations=["mk: spills 8 bytes", "mk: a load under 16 bytes"], name="mk", num_warps=8, registers=255,
        spill_bytes=8, shared_bytes=0, ctas_per_sm=1, grid=132, load_widths=lambda: "16", spins=[1],
    )  # fmt: skip
    classes = {
        "a (task_0)": 200,
        "b (task_1)": 150,
        "c (task_2)": 100,
        "d (task_3)": 50,
    }
    row = gpucheck._row("k3", report, classes)
    note = " (registers of the largest task classes: a (task_0) 200, b (task_1) 150, c (task_2) 100)"
    assert row.violations == ["mk: spills 8 bytes" + note, "mk: a load under 16 bytes"]
    assert row.classes == classes and row.spins == 1
    report.spill_bytes = 0
    assert gpucheck._row("k3", report, classes).violations == report.violations


def test_class_registers_match_each_task_by_its_own_number(monkeypatch):
    """Registers per task class come from the functions ``..._task_K_...``: task 1 does not take task 10's
    functions, each class reports its largest, and the classes come largest first."""
    from nonstop.kernels import offline

    used = {
        "f_task_1_a": 40,
        "f_task_1_b": 60,
        "f_task_10_a": 200,
        "f_task_0_x": 90,
        "other": 255,
    }
    monkeypatch.setattr(offline, "function_registers", lambda cubin, arch: used)
    classes = [SimpleNamespace(label=f"c{k}") for k in range(11)]
    got = gpucheck.class_registers(SimpleNamespace(asm={"cubin": b""}), classes)
    assert got == {"c10 (task_10)": 200, "c0 (task_0)": 90, "c1 (task_1)": 60}
    assert list(got) == ["c10 (task_10)", "c0 (task_0)", "c1 (task_1)"]


def test_launch_fingerprints_tell_aligned_from_unaligned_tensors():
    """Two launches differ when one tensor is 16-byte aligned and the other only 8-byte aligned (Triton
    specialises on 16): the second must be compiled too."""
    import torch

    base = torch.zeros(64, dtype=torch.uint8)
    aligned = base[16:] if base[16:].data_ptr() % 16 == 0 else base[8:]
    unaligned = base[aligned.storage_offset() + 8 :]
    assert aligned.data_ptr() % 16 == 0 and unaligned.data_ptr() % 16 == 8
    assert gpucheck._fingerprint(aligned) != gpucheck._fingerprint(unaligned)
    assert gpucheck._fingerprint(3) == "3"


def test_config_of_a_preset_a_dict_and_an_unknown_name(tmp_path):
    """A preset is cut to the layers asked (all without); an unknown name is a ValueError naming it."""
    assert gpucheck.config_of("k3-nano", 2).num_hidden_layers == 2
    assert gpucheck.config_of("k3-nano", None).num_hidden_layers == 8
    with pytest.raises(
        ValueError,
        match="'no-such-model' is neither a directory holding config.json nor a preset",
    ):
        gpucheck.config_of("no-such-model", None)


def test_finish_check_reads_the_last_line_and_reports_a_failure():
    """The child's result is its last stdout line (progress may come first); a child that exits non-zero is a
    RuntimeError carrying the end of its stderr."""
    ok = subprocess.Popen(
        [sys.executable, "-c", "print('compiling'); print('{\"triton\": \"x\", \"rows\": []}')"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert gpucheck.finish_check(ok, timeout=60) == {"triton": "x", "rows": []}
    bad = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('{}'); sys.stderr.write('ptxas fatal'); sys.exit(3)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="the offline GPU check failed:\nptxas fatal"):
        gpucheck.finish_check(bad, timeout=60)


def test_a_triton_beside_the_named_folder_is_not_taken_for_it(tmp_path, monkeypatch):
    """``--triton /x/tri`` where the Triton that imports lives in ``/x/triton36`` (a sibling whose name starts the
    same) holds no Triton of its own: refused, not accepted because one path is a prefix of the other."""
    path = tmp_path / "tri"
    (path / "triton").mkdir(parents=True)
    where = tmp_path / "triton36" / "triton" / "__init__.py"
    done = SimpleNamespace(returncode=0, stdout=f"3.6.0\n{where}\n", stderr="")
    monkeypatch.setattr(gpucheck.subprocess, "run", lambda *a, **k: done)
    with pytest.raises(ValueError, match="holds no whole triton package"):
        gpucheck.triton_in(str(path))
    inside = path / "triton" / "__init__.py"
    monkeypatch.setattr(
        gpucheck.subprocess,
        "run",
        lambda *a, **k: SimpleNamespace(**{**vars(done), "stdout": f"3.6.0\n{inside}\n"}),
    )
    assert gpucheck.triton_in(str(path)) == "3.6.0"


def test_a_triton_that_does_not_import_names_its_last_error_line(tmp_path, monkeypatch):
    """The refusal quotes the last line of the import's stderr (the exception), not the traceback's first."""
    done = SimpleNamespace(
        returncode=1,
        stdout="",
        stderr="Traceback (most recent call last):\n  ...\nImportError: x\n",
    )
    envs = []
    monkeypatch.setattr(gpucheck.subprocess, "run", lambda *a, env, **k: envs.append(env) or done)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match=r"triton does not import from it \(ImportError: x\)"):
        gpucheck.triton_in(str(tmp_path))
    # the probed folder comes first on the path, ahead of the environment's own, and no interpreter
    assert envs[0]["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), "/elsewhere"]
    assert "TRITON_INTERPRET" not in envs[0]


def test_the_check_child_runs_without_the_interpreter_and_with_the_named_triton_first(
    monkeypatch,
):
    """``start_check`` drops TRITON_INTERPRET, turns FP fusion on unless set, puts ``triton_path`` ahead of the
    repository on PYTHONPATH, and passes this process's id as the parent the child dies with."""
    seen = {}

    def popen(argv, env, **kwargs):
        seen.update(argv=argv, env=env, kwargs=kwargs)
        return "proc"

    monkeypatch.setattr(gpucheck.subprocess, "Popen", popen)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert gpucheck.start_check([("a", "k3-nano", 1)], triton_path="/opt/t36", gpu="h200") == "proc"
    env = seen["env"]
    assert "TRITON_INTERPRET" not in env and env["TRITON_DEFAULT_FP_FUSION"] == "1"
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[0] == "/opt/t36" and parts[-1] == "/elsewhere" and len(parts) == 3
    request = json.loads(seen["argv"][-1])
    assert request["parent"] == os.getpid() and request["gpu"] == "h200" and request["shapes"] == [["a", "k3-nano", 1]]
    assert seen["kwargs"]["stderr"] == subprocess.PIPE  # no progress: the child's stderr is kept for the error


def test_the_check_child_refuses_to_run_under_the_interpreter():
    """The child compiles real kernels: under TRITON_INTERPRET it stops at once with the reason (exit 1), instead
    of compiling in interpreter mode."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    request = json.dumps({"shapes": [], "rows": 1, "arch": 90, "kinds": None, "megakernel": False, "progress": False})
    done = subprocess.run(
        [sys.executable, "-m", "nonstop.runtime.gpucheck", request],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1 and "run the offline GPU check without TRITON_INTERPRET" in done.stderr
