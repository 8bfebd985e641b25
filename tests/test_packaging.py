"""Every data file the package reads at run time ships in a built wheel.

setuptools copies only the .py files of a package plus what ``[tool.setuptools.package-data]`` names; an
editable install hides a missing pattern (it reads the source tree), a wheel does not.
"""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nonstop"


def shipped_data_files() -> set[Path]:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["nonstop"]
    return {path for pattern in patterns for path in PACKAGE.glob(pattern) if path.is_file()}


def source_data_files() -> set[Path]:
    return {
        path
        for path in PACKAGE.rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    }


def test_every_data_file_of_the_package_is_named_by_package_data():
    missing = sorted(str(path.relative_to(PACKAGE)) for path in source_data_files() - shipped_data_files())
    assert not missing, f"not in [tool.setuptools.package-data], so absent from a wheel: {missing}"


def test_the_planner_data_is_among_them():
    shipped = {str(path.relative_to(PACKAGE)) for path in shipped_data_files()}
    assert {"plan/chips.json", "plan/constants.json", "plan/heldout.json", "plan/validation.json"} <= shipped
    assert any(name.startswith("plan/models/") and name.endswith("config.json") for name in shipped)
