"""The Python recipe of docs/distributed.md runs as written (its imports named modules that did not resolve:
``nonstop.dist.comm`` without an import of its own, ``nonstop.DistributedLLM``)."""

from __future__ import annotations

import re

from tests.dist.procs import ROOT, launched


def test_the_documented_python_recipe_generates_on_two_ranks(tmp_path):
    text = (ROOT / "docs" / "distributed.md").read_text()
    (recipe,) = re.findall(r"```python\n(.*?)```", text, re.S)
    script = tmp_path / "recipe.py"
    script.write_text(recipe)
    with launched([str(script)], cwd=tmp_path) as proc:
        out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert len(out.strip()) > 0 and "Traceback" not in err, (out, err)
