"""The package's import graph, read with `ast` (nothing is imported): no cycles, no module imports a higher layer
(../shared/DESIGN.md: cli -> all -> lessons | bench -> steps/pipelines/dynamic_tables -> workers/taxi -> lake ->
platforms), and no two packages of one layer import each other (lessons and bench included). Function-local imports
count too: a cycle hidden inside a function is still a cycle."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "ducklake_kit"
# the layer of each top-level part of the package; a module may import its own layer or lower ones
LAYERS = {
    "errors": 0,
    "checks": 0,
    "faults": 0,
    "platforms": 1,
    "lake": 2,
    "taxi": 3,
    "workers": 3,
    "steps": 4,
    "pipelines": 4,
    "dynamic_tables": 4,
    "lessons": 5,
    "bench": 5,
    "all": 6,
    "cli": 7,
    "console": 7,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports (a `from pkg import mod` counts as importing pkg.mod)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in known else target)
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else 0


def test_the_graph_is_read():
    g = graph()
    # a few edges that exist, so a parser that finds nothing fails here
    assert "ducklake_kit.lake.connection" in g["ducklake_kit.lessons.timetravel"] | g["ducklake_kit.lake"]
    assert "ducklake_kit.taxi.reference" in g["ducklake_kit.taxi.verify"]
    assert (
        "ducklake_kit.platforms.state" in g["ducklake_kit.cli.app"]
        or "ducklake_kit.platforms.state" in g["ducklake_kit.cli.common"]
    )


def test_every_module_has_a_layer():
    unknown = sorted(m for m in modules() if layer(m) is None)
    assert unknown == [], f"add these parts of the package to LAYERS: {unknown}"


def test_no_import_cycles():
    try:
        graphlib.TopologicalSorter(graph()).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


def test_no_module_imports_a_higher_layer():
    upward = sorted(
        f"{m} (layer {layer(m)}) imports {dep} (layer {layer(dep)})"
        for m, deps in graph().items()
        for dep in deps
        if (layer(dep) or 0) > (layer(m) or 0)
    )
    assert upward == []


def part(module: str) -> str:
    """The top-level part of the package a module belongs to: `lessons` for ducklake_kit.lessons.queries."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def is_package(name: str) -> bool:
    return (SRC / PACKAGE / name).is_dir()


def sideways(g: dict[str, set[str]]) -> list[str]:
    """Imports between two packages of one layer (taxi -> workers, lessons -> bench, ...)."""
    return sorted(
        f"{m} imports {dep} (both layer {layer(m)})"
        for m, deps in g.items()
        for dep in deps
        if part(m) != part(dep) and layer(dep) == layer(m) and is_package(part(m)) and is_package(part(dep))
    )


def test_no_two_packages_of_one_layer_import_each_other():
    assert sideways(graph()) == []


def test_the_checker_catches_a_cycle_and_an_upward_import(tmp_path):
    # the checker itself: a two-module cycle and an import from lake up to lessons are both reported
    pkg = tmp_path / PACKAGE
    (pkg / "lake").mkdir(parents=True)
    (pkg / "lessons").mkdir()
    for p in (pkg / "__init__.py", pkg / "lake" / "__init__.py", pkg / "lessons" / "__init__.py"):
        p.write_text("")
    (pkg / "lake" / "a.py").write_text("from ducklake_kit.lake import b\n")
    (pkg / "lake" / "b.py").write_text("def f():\n    from . import a\n    from ducklake_kit.lessons import c\n")
    (pkg / "lessons" / "c.py").write_text("")
    known = {"ducklake_kit.lake.a", "ducklake_kit.lake.b", "ducklake_kit.lessons.c"}
    g = {
        "ducklake_kit.lake.a": imports_of("ducklake_kit.lake.a", pkg / "lake" / "a.py", known),
        "ducklake_kit.lake.b": imports_of("ducklake_kit.lake.b", pkg / "lake" / "b.py", known),
    }
    assert g["ducklake_kit.lake.a"] == {"ducklake_kit.lake.b"}
    assert g["ducklake_kit.lake.b"] == {"ducklake_kit.lake.a", "ducklake_kit.lessons.c"}
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter(g).prepare()
    assert layer("ducklake_kit.lessons.c") > layer("ducklake_kit.lake.b")


def test_the_checker_catches_lessons_and_bench_leaning_on_each_other():
    # the tree before issue 24: lessons/flow.py imported bench.concurrency, bench/queries.py lessons.queries
    g = {
        "ducklake_kit.lessons.flow": {"ducklake_kit.bench.concurrency", "ducklake_kit.lake"},
        "ducklake_kit.bench.queries": {"ducklake_kit.lessons.queries"},
        "ducklake_kit.all": {"ducklake_kit.bench.concurrency", "ducklake_kit.lessons.queries"},
    }
    assert sideways(g) == [
        "ducklake_kit.bench.queries imports ducklake_kit.lessons.queries (both layer 5)",
        "ducklake_kit.lessons.flow imports ducklake_kit.bench.concurrency (both layer 5)",
    ]
