"""A pipeline file -> its statements, each with its headers and line numbers.

Statements are split by sqlglot's tokenizer (a `;` inside a string or a comment is not a separator). The text
between two statements holds nothing but whitespace and comments (anything else would be a token), so the headers
are read from the comment lines there, in any order:

    -- id: daily_revenue          an int or a name; default: the statement's position in the file (1, 2, ...)
    -- depends_on: a, b           ids of other statements of the file
    -- node: w2                   run it on that worker (its worker-local tables live there)
    -- description: one line      shown by `pipeline plan`
    -- audit: not_null(k)         a check of the table it writes (see audits.py); this one may be given again
    -- kind: incremental_by_time(day)   how a run rebuilds its table (see incremental.py; default: full)
    -- key: k                     the columns that name a row of its table (`pipeline diff` compares rows by it)

Only these seven words make a header; any other comment is a comment (`-- NOTE: ...`, `-- TODO: ...`), except a word
so close to a header that it is most likely a misspelt one (`-- depend_on: a`): that is an error, lest a dependency
be dropped without a word. Every error names the file and line: `PipelineError`.
"""

from __future__ import annotations

import difflib
import itertools
from dataclasses import dataclass, field
from pathlib import Path

import sqlglot
from sqlglot.errors import TokenError
from sqlglot.tokens import TokenType

from ducklake_kit.errors import KitError

HEADERS = ("id", "depends_on", "node", "description", "audit", "kind", "key")
REPEATABLE = ("audit",)  # headers a statement may carry more than once
DIALECT = "duckdb"


class PipelineError(KitError):
    """Bad pipeline input: one line naming the file and line."""

    def __init__(self, file: str, line: int | None, what: str, fix: str):
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {what}", fix)


@dataclass
class Header:
    key: str
    value: str
    line: int


@dataclass
class Statement:
    """One statement of the file with the headers written above it."""

    sql: str
    line: int  # where the statement starts (1-based)
    position: int  # 1-based position among the file's statements
    headers: dict[str, Header] = field(default_factory=dict)
    audits: list[Header] = field(default_factory=list)  # every `-- audit:` line, in order

    def header(self, key: str) -> str | None:
        h = self.headers.get(key)
        return h.value if h else None


def _comments(text: str, offset: int, source: str, file: str) -> list[tuple[int, str, bool]]:
    """The comments in `text` (known to hold only whitespace and comments): (absolute offset, body, is a line
    comment). Block comments may nest, as DuckDB's do."""
    out, i = [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
        elif text.startswith("--", i):
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            out.append((offset + i, text[i + 2 : end], True))
            i = end
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < len(text) and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append((offset + i, text[i + 2 : j - 2], False))
            i = j
        else:  # cannot happen: the tokenizer found no token here
            raise PipelineError(
                file, _line(source, offset + i), "unexpected text between statements", "check the file's syntax"
            )
    return out


def _line(source: str, offset: int) -> int:
    return source.count("\n", 0, offset) + 1


def _starts_line(source: str, offset: int) -> bool:
    """Nothing but whitespace before `offset` on its line."""
    return source[source.rfind("\n", 0, offset) + 1 : offset].strip() == ""


def _header(body: str) -> tuple[str, str] | None:
    """(key, value) of a header or of a misspelt one; None for any other comment."""
    key, sep, value = body.partition(":")
    key = key.strip().lower()
    if not sep or not key.isidentifier() or (key not in HEADERS and not _misspelt(key)):
        return None
    return key, value.strip()


def _misspelt(key: str) -> str | None:
    """The header `key` most likely meant (depend_on -> depends_on), if any."""
    close = difflib.get_close_matches(key, HEADERS, n=1, cutoff=0.8)
    return close[0] if close else None


def _header_lines(source: str, start: int, end: int, file: str) -> list[tuple[int, str, str, bool]]:
    """The header-shaped line comments between `start` and `end`: (line, key, value, starts its line)."""
    out = []
    for at, body, is_line in _comments(source[start:end], start, source, file):
        parsed = _header(body) if is_line else None
        if parsed is not None:
            out.append((_line(source, at), *parsed, _starts_line(source, at)))
    return out


def _headers(found: list[tuple[int, str, str, bool]], file: str) -> tuple[dict[str, Header], list[Header]]:
    headers: dict[str, Header] = {}
    repeated: list[Header] = []
    for line, key, value, own_line in found:
        if not own_line:
            raise PipelineError(
                file,
                line,
                f"header '{key}' after the end of a statement",
                "put each header on its own line above its statement",
            )
        if key not in HEADERS:
            raise PipelineError(
                file,
                line,
                f"unknown header '{key}' (did you mean '{_misspelt(key)}'?)",
                f"spell it as one of {', '.join(HEADERS)}; for a plain comment, leave out the colon",
            )
        if key in REPEATABLE:
            repeated.append(Header(key, value, line))
            continue
        if key in headers:
            raise PipelineError(
                file,
                line,
                f"header '{key}' given twice for one statement (first on line {headers[key].line})",
                "keep one",
            )
        headers[key] = Header(key, value, line)
    return headers, repeated


def split_statements(source: str, file: str = "<sql>") -> list[Statement]:
    """The statements of a pipeline file, with their headers. Raises PipelineError for an unknown, repeated or
    misplaced header (after a statement on its line, inside a statement: a missing `;`, above an empty statement
    or at the end of the file)."""
    try:
        tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(source)
    except TokenError as exc:
        raise PipelineError(file, None, f"the SQL does not tokenize ({exc})", "check quotes and comments") from None
    chunks: list[list] = [[]]  # the tokens of each statement, its `;` last when it has one
    for tok in tokens:
        chunks[-1].append(tok)
        if tok.token_type == TokenType.SEMICOLON:
            chunks.append([])
    statements: list[Statement] = []
    gap_start = 0  # where the text before the next statement starts
    for chunk in chunks:
        words = [t for t in chunk if t.token_type != TokenType.SEMICOLON]
        end = chunk[-1].start if chunk else len(source)
        found = _header_lines(source, gap_start, words[0].start if words else end, file)
        if not words:  # an empty statement (`;;`), or the end of the file
            if found:
                raise PipelineError(
                    file,
                    found[0][0],
                    "headers with no statement after them",
                    "put the statement under its headers, or remove them",
                )
            gap_start = chunk[-1].end + 1 if chunk else gap_start
            continue
        for before, after in itertools.pairwise(words):  # a header-shaped line inside a statement: a `;` is missing
            inside = [h for h in _header_lines(source, before.end + 1, after.start, file) if h[3]]
            if inside:
                raise PipelineError(
                    file,
                    inside[0][0],
                    f"header '{inside[0][1]}' inside a statement",
                    "end the statement above it with `;`",
                )
        headers, audits = _headers(found, file)
        first, last = words[0], words[-1]
        statements.append(
            Statement(
                source[first.start : last.end + 1].strip(),
                _line(source, first.start),
                len(statements) + 1,
                headers,
                audits,
            )
        )
        gap_start = chunk[-1].end + 1  # after its `;` (or its last word)
    if chunks[-1]:  # the file ends without `;`: what follows its last statement
        trailing = _header_lines(source, gap_start, len(source), file)
        if trailing:
            raise PipelineError(
                file,
                trailing[0][0],
                "headers with no statement after them",
                "put the statement under its headers, or remove them",
            )
    return statements


def read_file(path: Path) -> tuple[str, str]:
    """(text, display name) of a pipeline file; one clear line when it cannot be read. UTF-8 with an optional
    byte-order mark (editors on Windows write one): left in, sqlglot reads it as part of the first statement, and
    the headers above it are lost."""
    try:
        return path.read_text(encoding="utf-8-sig"), str(path)
    except FileNotFoundError:
        raise KitError(
            f"no pipeline file at {path}", "give the path of a .sql file, e.g. pipelines/taxi_marts.sql"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KitError(f"cannot read the pipeline file {path} ({exc})", "check the file") from None
