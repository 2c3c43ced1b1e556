"""The docs stay true: relative links resolve (files and #anchors), and glossary links name a heading that exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

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
