"""Stored kernels carry the candidate rules they were checked under (``rules``): one that older rules passed
(rules 1 let attribute chains off imported names run any code at import) is not imported by the executor,
and any newly verified winner takes its place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nonstop.runtime import tuned
from nonstop.tune import store

KEY = "B1xT1 w=8x8 float32"
PLANTED = "open({marker!r}, 'w').write('ran')\ndef launch(op, env):\n    pass\n"


def _entry(path: Path) -> dict:
    return json.loads(path.read_text())["entries"]["cpu"]["mlp"][KEY]


def test_a_new_entry_records_this_nonstops_rules(tmp_path):
    path = tmp_path / "tuning.json"
    assert store.record(path, "cpu", "mlp", KEY, "def launch(op, env):\n    pass\n", {"proposer": "verify"})
    assert _entry(path)["rules"] == tuned.CANDIDATE_RULES


@pytest.mark.parametrize("rules", [None, 1, tuned.CANDIDATE_RULES + 1])
def test_a_kernel_checked_under_other_rules_is_not_imported(tmp_path, rules):
    marker = tmp_path / "ran.txt"
    path = tmp_path / "tuning.json"
    store.record(path, "cpu", "mlp", KEY, PLANTED.format(marker=str(marker)), {"proposer": "verify"})
    data = json.loads(path.read_text())
    entry = data["entries"]["cpu"]["mlp"][KEY]
    if rules is None:
        del entry["rules"]  # a store written before entries carried their rules
    else:
        entry["rules"] = rules
    path.write_text(json.dumps(data))
    with pytest.warns(RuntimeWarning, match="checked under candidate rules"):
        assert tuned.load_kernel(tmp_path, entry) is None
    assert not marker.exists()


def test_an_entry_of_older_rules_holds_no_place(tmp_path):
    """On a CPU an untimed winner only fills an empty place: an entry older rules passed is one."""
    path = tmp_path / "tuning.json"
    store.record(path, "cpu", "mlp", KEY, "# old\ndef launch(op, env):\n    pass\n", {"proposer": "verify"})
    data = json.loads(path.read_text())
    del data["entries"]["cpu"]["mlp"][KEY]["rules"]
    path.write_text(json.dumps(data))
    assert store.record(path, "cpu", "mlp", KEY, "# new\ndef launch(op, env):\n    pass\n", {"proposer": "verify"})
    assert _entry(path)["rules"] == tuned.CANDIDATE_RULES
    assert (tmp_path / _entry(path)["kernel"]).read_text().startswith("# new")


def test_a_kernel_of_this_nonstops_rules_is_imported(tmp_path):
    marker = tmp_path / "ran.txt"
    path = tmp_path / "tuning.json"
    store.record(path, "cpu", "mlp", KEY, PLANTED.format(marker=str(marker)), {"proposer": "verify"})
    assert callable(tuned.load_kernel(tmp_path, _entry(path)))
    assert marker.exists()
