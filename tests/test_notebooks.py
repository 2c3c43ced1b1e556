"""The guided notebooks: committed clean (no outputs, no execution counts, numbered names), and each one runs
top to bottom in a real Jupyter kernel against the session's services. The notebooks check their own figures
with `assert`, so a wrong answer is a failing cell, and a failing cell fails its test with the cell's error."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
NAME = re.compile(r"^\d\d_[a-z0-9_]+\.ipynb$")
SPARK = {"02_loading_with_spark.ipynb", "06_benchmarks.ipynb"}  # these start a SparkSession in the kernel
CELL_TIMEOUT_S = 420  # per cell; the slowest (a Spark load or benchmark) takes about a minute on an idle machine
HEADLESS = "module://matplotlib_inline.backend_inline"  # renders charts to PNG in the outputs; needs no display


def test_there_are_numbered_notebooks_and_nothing_else_in_the_folder():
    names = sorted(p.name for p in NOTEBOOKS_DIR.glob("*.ipynb"))
    assert names, "no notebooks in notebooks/"
    assert [n for n in names if not NAME.match(n)] == [], "names must be NN_lowercase_words.ipynb"
    assert names == [p.name for p in NOTEBOOKS]
    numbers = [n[:2] for n in names]
    assert numbers == [f"{i:02d}" for i in range(1, len(names) + 1)], "numbered 01, 02, ... without gaps or repeats"
    assert set(names) >= SPARK


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs_and_with_checks(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    dirty = [
        i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count is not None)
    ]
    assert dirty == [], f"cells {dirty} have outputs or execution counts: clear them before committing"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith(f"# {path.name[:2]} ")
    assert "What this teaches" in first.source and "What it assumes" in first.source
    assert sum("assert " in c.source for c in code) >= 3, (
        "a notebook checks its figures with assert, not only prints them"
    )
    assert any("plt.show()" in c.source for c in code), "every notebook draws at least one chart"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_glossary_links_name_headings_that_exist(path: Path):
    glossary = (ROOT / "GLOSSARY.md").read_text(encoding="utf-8")
    anchors = {_anchor(h) for h in re.findall(r"^## (.+)$", glossary, flags=re.MULTILINE)}
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
    links = re.findall(r"\]\(\.\./GLOSSARY\.md#([^)]+)\)", text)
    assert links, "the first cell links the terms it uses to the glossary"
    assert sorted(set(links) - anchors) == []


def _execute(path: Path, env: dict[str, str]) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S,
        startup_timeout=120,
        allow_errors=False,
        resources={"metadata": {"path": str(NOTEBOOKS_DIR)}},
    )  # cwd of the kernel
    client.execute(env=env)  # raises CellExecutionError with the failing cell's source and traceback
    return nb


def _notebook_params() -> list:
    return [pytest.param(p, marks=[pytest.mark.spark] if p.name in SPARK else [], id=p.stem) for p in NOTEBOOKS]


@pytest.mark.integration
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", _notebook_params())
def test_notebook_runs_top_to_bottom(path: Path, module_stack):
    # the kernel finds the services as the CLI does: DUCKLAKE_PLATFORM, DUCKLAKE_HOME, DUCKLAKE_PG_PORT, ..., and
    # the worker plane (notebook 04) by DUCKLAKE_SCHEDULER_PORT / DUCKLAKE_DASHBOARD_PORT, the stack's free ports.
    # A stack of their own, as a reader's lake would be: notebook 05 maintains the whole lake, whatever it holds
    env = {**os.environ, **module_stack.env, "MPLBACKEND": HEADLESS}
    env.pop("DISPLAY", None)  # nothing may open a window
    nb = _execute(path, env)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "every code cell ran"
    images = sum("image/png" in o.get("data", {}) for c in code for o in c.outputs)
    shows = sum(c.source.count("plt.show()") for c in code)
    assert images == shows, f"{shows} charts drawn, {images} rendered"
    # the notebook file itself is untouched: outputs stay out of the repository
    assert not any(c.get("outputs") for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")


def test_the_kernel_is_this_environment():
    """The kernelspec `python3` runs with this interpreter (jupyter_client replaces `python` with it), so the
    notebooks import the same ducklake_kit, duckdb and extension wheels as the tests."""
    km = KernelManager(kernel_name="python3")
    cmd = km.format_kernel_cmd()
    assert cmd[0] == sys.executable, cmd
