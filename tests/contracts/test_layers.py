"""The "Never" rules of DESIGN.md as a test over the import graph (every import, function-level
ones included, read with :mod:`ast` from the source files)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _modules(package: str) -> dict[str, Path]:
    """Dotted module name → file, for every .py file under ``package``."""
    base = ROOT / package
    files = [base] if base.suffix == ".py" else sorted(base.rglob("*.py"))
    out = {}
    for path in files:
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a.b import c`` counts as ``a.b`` and ``a.b.c``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found.update(names)
            if not all(_is_module(name) for name in names):  # names defined in the module
                found.add(node.module)
    return found


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _violations(importers: tuple[str, ...], forbidden: tuple[str, ...], allowed=()) -> list[str]:
    bad = []
    for package in importers:
        for name, path in _modules(package).items():
            for imported in sorted(_imports(path)):
                if _within(imported, forbidden) and not _within(imported, allowed):
                    bad.append(f"{name} imports {imported}")
    return bad


CONTRACTS = {
    "hwspecs imports nothing from planner": (("hwspecs",), ("planner",), ()),
    "spec and structure never import cost": (
        ("planner/spec", "planner/structure"), ("planner.cost",), ()),
    "cost never imports evaluate, columns or comm": (
        ("planner/cost",),
        ("planner.evaluate", "planner.columns", "planner.comm", "planner.search",
         "planner.estimate"),
        (),
    ),
    "pipeline knows no links, Jobs or Layouts": (
        ("planner/pipeline",),
        ("planner.spec", "planner.comm", "planner.cost", "hwspecs.schema", "hwspecs.catalog"),
        (),
    ),
    "front ends call planner.api only": (
        ("commands", "plots", "validate", "cli.py"),
        ("planner",),
        ("planner.api",),
    ),
    "nothing in planner imports torch": (("planner",), ("torch",), ()),
}  # fmt: skip


@pytest.mark.parametrize("rule", list(CONTRACTS))
def test_layer_contract(rule):
    importers, forbidden, allowed = CONTRACTS[rule]
    assert _violations(importers, forbidden, allowed) == []


def test_nothing_in_planner_prints():
    printing = [
        f"{name}:{node.lineno}"
        for name, path in _modules("planner").items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print"
    ]
    assert printing == []


def test_the_graph_reader_sees_imports():
    """The reader itself: planner.api imports the search, so the contract test can fail."""
    assert "planner.search" in _imports(ROOT / "planner" / "api" / "search.py")
