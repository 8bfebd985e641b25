"""The layer rule of docs/architecture.md holds for the code: every import of a ``nonstop`` module (at module
level or inside a function) points down the page's layer table, and the modules import each other without
a cycle. The table is read from the page itself, so the page and the code cannot drift apart."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# "Beside them" on the page: helpers any layer may use (they import nothing of nonstop above the config)
HELPERS = {"hostinfo", "threads", "jsonfile", "file_lock", "stops", "cache_dirs"}
# placed by the page's prose rather than its table: the package root re-exports the engine's API; the
# bundled model's training uses the engine and sits under the commands that run it
EXTRA = {"__init__": "engine", "train": "tools", "__main__": "face"}


def layer_table() -> tuple[list[str], dict[str, str]]:
    """(layer names bottom-up, {top-level unit (``config_parse``, ``runtime``, ...): its layer}) from the page;
    units joined by ``<`` in one row are sub-layers in that order, units joined by ``,`` share a layer."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## Layers", 1)[1].split("\n\n## ", 1)[0]
    order, unit_layer = [], {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("layer", "---"):
            continue
        name, package = cells[0], cells[1]
        for i, group in enumerate(package.split("<")):
            layer = name if "<" not in package else f"{name}:{i}"
            order.append(layer)
            for unit in re.findall(r"`([\w]+)(?:\.py|/)`", group):
                unit_layer[unit] = layer
    for unit, layer in EXTRA.items():
        unit_layer.setdefault(unit, layer)
    return order, unit_layer


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str, root: Path) -> bool:
    rel = Path(*name.split("."))
    return (root / rel).with_suffix(".py").exists() or (root / rel / "__init__.py").exists()


def imports(path: Path, root: Path = ROOT) -> set[str]:
    """The nonstop modules ``path`` imports anywhere in its body (``from pkg import sub`` counts as ``pkg.sub``)."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if _is_module(sub, root) else base)
    return {m for m in out if m == "nonstop" or m.startswith("nonstop.")}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    return {module_name(p, root): imports(p, root) for p in (root / "nonstop").rglob("*.py")}


def test_every_unit_has_a_layer_on_the_page():
    _, unit_layer = layer_table()
    units = {_unit(m) for m in import_graph()}
    assert units - set(unit_layer) - HELPERS == set()


def upward_imports(graph: dict[str, set[str]], order: list[str], unit_layer: dict[str, str]) -> list[str]:
    rank = {layer: i for i, layer in enumerate(order)}
    upward = []
    for module, targets in graph.items():
        source = _unit(module)
        for target in targets:
            unit = _unit(target)
            if unit == source or unit in HELPERS:
                continue
            if source in HELPERS:
                if not unit.startswith("config"):
                    upward.append(f"{module} -> {target} (a helper beside the layers)")
                continue
            if rank[unit_layer[unit]] > rank[unit_layer[source]]:
                upward.append(f"{module} ({unit_layer[source]}) -> {target} ({unit_layer[unit]})")
    return sorted(upward)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_imports_point_down_the_layers():
    assert upward_imports(import_graph(), *layer_table()) == []


def test_no_import_cycle():
    assert import_cycles(import_graph()) == []


def test_the_checks_can_fail(tmp_path):
    """A lazy upward import and a two-module cycle, in a small tree of their own, are both reported."""
    for package in ("nonstop", "nonstop/model", "nonstop/engine"):
        (tmp_path / package).mkdir(exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "nonstop/model/a.py").write_text("def f():\n    from nonstop.engine import b\n")
    (tmp_path / "nonstop/engine/b.py").write_text("from nonstop.model import a\n")
    graph = import_graph(tmp_path)
    assert graph["nonstop.model.a"] == {"nonstop.engine.b"} and graph["nonstop.engine.b"] == {"nonstop.model.a"}
    assert upward_imports(graph, *layer_table()) == ["nonstop.model.a (model) -> nonstop.engine.b (engine)"]
    assert import_cycles(graph) == [["nonstop.engine.b", "nonstop.model.a"]]
