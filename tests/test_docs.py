"""The docs stay true: relative links resolve (files and #anchors), glossary links name a heading that exists, the
manual in docs/ builds as a site with `mkdocs build --strict` (a broken link or anchor, or a page left out of the
nav, fails it), the CLI reference is the code's `--help`, and the README stays short."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from mkdocs.config import load_config

from ducklake_kit.cli import app, reference

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]+\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.M)
# the terms the learning-material issue names; the glossary may hold more
REQUIRED_TERMS = [
    "DuckLake",
    "Catalog",
    "Data path",
    "Snapshot",
    "Time travel",
    "Change feed",
    "Data inlining",
    "Partitioning",
    "Parquet",
    "S3 path style",
    "rclone",
    "Port-forward",
    "Kustomize base and overlay",
    "k3d",
    "Driver",
    "Executor",
    "Spark master",
    "Spark worker",
    "Spark Connect",
    "Dynamic table",
    "Target lag",
    "Incremental refresh",
    "Affected keys",
    "Full refresh",
]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"[`*_]", "", heading.strip().lower()).replace("_", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def markdown_of(path: Path) -> str:
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return path.read_text()


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "LEARNING_PATH.md", ROOT / "GLOSSARY.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted((ROOT / "notebooks").glob("*.md")) + sorted((ROOT / "notebooks").glob("*.ipynb"))
    files += (
        sorted(ROOT.glob("overlays/*/README.md"))
        + sorted(ROOT.glob("databases/README.md"))
        + sorted(ROOT.glob("base/README.md"))
    )
    return [f for f in files if f.exists()]


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", markdown_of(path), flags=re.S)  # a `# comment` in a code block is no heading
    return {slug(h) for h in HEADING.findall(text)}


def broken_links(path: Path) -> list[str]:
    out = []
    for target in LINK.findall(markdown_of(path)):
        if re.match(r"^[a-z]+://|^mailto:", target):
            continue  # external: not checked offline
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            out.append(f"{path.name}: {target} (no such file)")
        elif anchor and dest.suffix in (".md", ".ipynb") and anchor not in anchors(dest):
            out.append(f"{path.name}: {target} (no heading with that anchor in {dest.name})")
    return out


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path):
    assert broken_links(path) == []


def test_the_link_checker_catches_a_broken_anchor_and_a_missing_file(tmp_path):
    (tmp_path / "GLOSSARY.md").write_text("# Glossary\n\n## Snapshot\ntext\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](GLOSSARY.md#snapshot) [bad](GLOSSARY.md#snapshots) [gone](nope.md)\n")
    assert broken_links(doc) == [
        "doc.md: GLOSSARY.md#snapshots (no heading with that anchor in GLOSSARY.md)",
        "doc.md: nope.md (no such file)",
    ]


def test_slug_matches_github_for_the_lab_headings():
    assert slug("02 · Catalog and data: what `up` starts") == "02--catalog-and-data-what-up-starts"
    assert slug("Kustomize base and overlay") == "kustomize-base-and-overlay"
    assert slug("Port-forward") == "port-forward"


def test_glossary_has_one_heading_per_required_term_and_each_says_where_the_kit_shows_it():
    text = (ROOT / "GLOSSARY.md").read_text()
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert len(headings) == len(set(headings)), "one heading per term"
    missing = [t for t in REQUIRED_TERMS if t not in headings]
    assert not missing, f"GLOSSARY.md lacks {missing}"
    sections = re.split(r"^## .+$", text, flags=re.M)[1:]
    without = [h for h, body in zip(headings, sections) if "Shown by:" not in body]
    assert not without, f"these terms do not say where the kit shows them: {without}"


def test_the_docs_link_to_the_glossary():
    # the learner meets the terms where they are used: the learning path links each one at first use
    linked = set(re.findall(r"GLOSSARY\.md#([\w-]+)", (ROOT / "LEARNING_PATH.md").read_text()))
    assert {"catalog", "snapshot", "data-path", "time-travel", "change-feed", "data-inlining"} <= linked


# -- the site ---------------------------------------------------------------------------------------------------
# A copy of the repository for a build that must fail: docs/ and mkdocs.yml copied (to be broken), the rest linked.
NOT_COPIED = {".git", ".venv", ".ducklake", "site", "docs", "mkdocs.yml", "LEARNING_PATH.md"}


def mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's notice about its successor: noise here
    )


def test_the_site_builds_with_strict(tmp_path):
    result = mkdocs_build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    # the root files are pages of the site, and the files they link to are there too
    for page in ["index.html", "LEARNING_PATH/index.html", "GLOSSARY/index.html", "cli/index.html"]:
        assert (tmp_path / "site" / page).is_file(), page
    assert (tmp_path / "site" / "notebooks" / "04_worker_plane.ipynb").is_file()


def test_a_broken_link_an_unknown_anchor_or_a_page_left_out_of_the_nav_fails_the_build(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in NOT_COPIED:
            (repo / entry.name).symlink_to(entry)
    shutil.copytree(ROOT / "docs", repo / "docs")
    shutil.copy(ROOT / "mkdocs.yml", repo / "mkdocs.yml")
    (repo / "LEARNING_PATH.md").write_text(
        (ROOT / "LEARNING_PATH.md").read_text() + "\n[a root page's link](docs/harness.md#no-such-lab)\n"
    )
    with (repo / "docs" / "flow.md").open("a") as page:
        page.write("\n[gone](no-such-page.md) and [a heading that is not there](harness.md#no-such-heading)\n")
    (repo / "docs" / "orphan.md").write_text("# A page no nav names\n")
    result = mkdocs_build(repo, tmp_path / "site")
    assert result.returncode != 0
    # each is a WARNING, not an INFO line: --strict fails on any one of them alone
    warnings = [m for m in re.split(r"^(?=[A-Z]+ +- )", result.stderr, flags=re.M) if m.startswith("WARNING")]
    for problem in ["'no-such-page.md'", "'#no-such-heading'", "'#no-such-lab'", "- orphan.md"]:
        assert any(problem in w for w in warnings), f"{problem} is no warning:\n{result.stderr}"


def nav_pages(nav) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    items = nav.values() if isinstance(nav, dict) else nav
    return set().union(*(nav_pages(item) for item in items))


def test_every_page_is_in_the_nav_and_the_root_files_are_pages_of_the_site():
    config = load_config(str(ROOT / "mkdocs.yml"))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    hook = config.hooks["docs/_hooks/repo_files.py"]
    assert {"LEARNING_PATH.md", "GLOSSARY.md", "README.md"} <= hook.INCLUDED.keys()
    assert nav_pages(config.nav) == pages | set(hook.INCLUDED.values())


# -- the CLI reference and the README ---------------------------------------------------------------------------


def test_the_cli_reference_is_not_stale():
    assert reference.main(["--check"]) == 0, "docs/cli.md is stale: python -m ducklake_kit.cli.reference --write"


def test_a_stale_cli_reference_is_one_line_and_exit_1(tmp_path):
    page = tmp_path / "cli.md"
    page.write_text(reference.render().replace("Show this message and exit.", "Show this.", 1))
    result = subprocess.run(
        [sys.executable, "-m", "ducklake_kit.cli.reference", "--check", "--page", str(page)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr == f"Error: {page} is stale. Try: python -m ducklake_kit.cli.reference --write.\n"


def test_the_cli_reference_has_every_command_and_subcommand():
    text = (ROOT / "docs" / "cli.md").read_text()
    root = typer.main.get_command(app)
    ctx = typer.Context(root)
    for group in [root, *(root.get_command(ctx, n) for n in root.list_commands(ctx))]:
        names = group.list_commands(ctx) if hasattr(group, "list_commands") else []
        prefix = "" if group is root else f"{group.name} "
        for name in names:
            assert f"## `{prefix}{name}`" in text, f"docs/cli.md lacks {prefix}{name}"


def test_the_readme_is_short_and_keeps_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 150, "the README is a front door: the manual goes in docs/"
    assert "```bash\njust ducklake-test\njust test\n```" in text
    assert "pip install rust-just" in text  # the line .ci/run runs word for word
