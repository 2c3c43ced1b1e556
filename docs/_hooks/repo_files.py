"""MkDocs hook: the site shows Markdown files that live outside docs/ (LEARNING_PATH.md, GLOSSARY.md, ...), and every
relative link works both on the repository (GitHub, an editor) and on the site.

The root files stay the source of truth (tests read them): they are added as pages at their repository path, and the
repository files any page links to (a notebook, a playbook, a module) are copied into the site at theirs. Each link is
resolved as the filesystem would resolve it from the page's own file, then rewritten to where that file is on the site
(docs/x.md is x.md there). A link to a Markdown file the site does not include is left alone, so `mkdocs build
--strict` fails on it as on any broken link.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

# pages of the site that are not in docs/: repository path -> path on the site (the README is the home page)
INCLUDED = {
    "README.md": "index.md",
    "LEARNING_PATH.md": "LEARNING_PATH.md",
    "GLOSSARY.md": "GLOSSARY.md",
    "notebooks/README.md": "notebooks/README.md",
    "overlays/local/README.md": "overlays/local/README.md",
}
LINK = re.compile(r"(?<!!)(\[[^\]]+\]\()([^)\s]+)(\))")
FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1", re.S | re.M)
EXTERNAL = re.compile(r"^([a-z][a-z0-9+.-]*:|#|/)", re.I)


def _roots(config) -> tuple[Path, Path]:
    return Path(config.config_file_path).resolve().parent, Path(config.docs_dir).resolve()


def _site_path(target: Path, repo: Path, docs: Path) -> str | None:
    """Where a repository file is on the site, or None when it is outside the repository."""
    if target.is_relative_to(repo) and target.relative_to(repo).as_posix() in INCLUDED:
        return INCLUDED[target.relative_to(repo).as_posix()]
    if target.is_relative_to(docs):
        return target.relative_to(docs).as_posix()
    if target.is_relative_to(repo):
        return target.relative_to(repo).as_posix()
    return None


def _targets(markdown: str, source: Path) -> list[tuple[str, Path]]:
    """(the link as written, the file it resolves to) for each relative link outside code blocks."""
    prose = FENCE.sub("", markdown)
    out = []
    for _, target, _ in LINK.findall(prose):
        if EXTERNAL.match(target):
            continue
        out.append((target, Path(os.path.normpath(source.parent / target.partition("#")[0]))))
    return out


def on_files(files: Files, config) -> Files:
    repo, docs = _roots(config)
    for rel, site in INCLUDED.items():
        files.append(File.generated(config, site, abs_src_path=str(repo / rel)))
    # the non-Markdown repository files the pages link to, copied as they are (a notebook, a playbook, a module)
    for page in files.documentation_pages():
        source = Path(page.abs_src_path)
        for _, target in _targets(source.read_text(encoding="utf-8"), source):
            site = _site_path(target, repo, docs)
            if site is None or target.suffix == ".md" or not target.is_file() or files.get_file_from_path(site):
                continue
            files.append(File.generated(config, site, abs_src_path=str(target)))
    return files


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    repo, docs = _roots(config)
    source = Path(page.file.abs_src_path)
    here = Path(page.file.src_uri).parent

    def rewrite(match: re.Match) -> str:
        opening, target, closing = match.groups()
        if EXTERNAL.match(target):
            return match.group(0)
        path, hash_, anchor = target.partition("#")
        site = _site_path(Path(os.path.normpath(source.parent / path)), repo, docs)
        if site is None or not files.get_file_from_path(site):
            return match.group(0)  # mkdocs reports it (strict: the build fails)
        return f"{opening}{os.path.relpath(site, here).replace(os.sep, '/')}{hash_}{anchor}{closing}"

    # links inside fenced code are text, not links: leave them as written
    out, last = [], 0
    for fence in FENCE.finditer(markdown):
        out += [LINK.sub(rewrite, markdown[last : fence.start()]), fence.group(0)]
        last = fence.end()
    return "".join([*out, LINK.sub(rewrite, markdown[last:])])
