"""Rendering: rich tables for people, one JSON shape for programs:
`{"status": "ok"|"error", "result": {...}, "catalog_info": {...}}`."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import sys
import uuid
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ducklake_kit.checks import CheckRun
from ducklake_kit.lake import StatementResult


def console(stderr: bool = False) -> Console:
    width = int(os.environ["COLUMNS"]) if os.environ.get("COLUMNS", "").isdigit() else None
    stream = sys.stderr if stderr else sys.stdout
    if width is None and not stream.isatty():
        width = 140  # logs and CI: Rich would assume 80 columns and wrap every table row
    return Console(stderr=stderr, width=width, soft_wrap=False, highlight=False)


def _default(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (uuid.UUID, dt.timedelta)):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, set):
        return sorted(value)
    return str(value)


def envelope(status: str, result: dict[str, Any] | None = None, catalog_info: dict[str, Any] | None = None) -> str:
    return json.dumps(
        {"status": status, "result": result or {}, "catalog_info": catalog_info or {}}, default=_default, indent=2
    )


def print_json(status: str, result: dict[str, Any] | None = None, catalog_info: dict[str, Any] | None = None) -> None:
    sys.stdout.write(envelope(status, result, catalog_info) + "\n")


def table(title: str, columns: list[str], rows: list[list[Any]] | list[tuple]) -> Table:
    """Cells and headers are plain text, never Rich markup: a value such as `l[i]` or `[/x]` prints as it is."""
    t = Table(title=Text(title), title_justify="left")
    for c in columns:
        t.add_column(Text(str(c)))
    for r in rows:
        t.add_row(*(Text("NULL") if v is None else Text(str(v)) for v in r))
    return t


def render_statement(res: StatementResult) -> Any:
    if res.affected_rows is not None:
        return f"{res.statement_type}: {res.affected_rows} rows affected"
    if res.columns:
        return table(f"{res.statement_type} ({len(res.rows)} rows)", res.columns, res.rows)
    return f"{res.statement_type}: ok"


def render_checks(run: CheckRun, title: str = "Checks") -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("check", "result", "expected", "actual"):
        t.add_column(col)
    for c in run.checks:
        t.add_row(c.name, "[green]PASS[/]" if c.passed else "[red]FAIL[/]", _short(c.expected), _short(c.actual))
    return t


def checks_verdict(run: CheckRun) -> str:
    """One line a reader (and a lab's Verify) can look for: how many computed checks held."""
    n = len(run.checks)
    if run.ok:
        return f"PASS: all {n} checks hold"
    if not n:
        return "FAIL: no check ran"
    return f"FAIL: {len(run.failed)} of {n} checks failed (first: {run.failed[0].name})"


def print_checks(run: CheckRun, title: str) -> None:
    out = console()
    out.print(render_checks(run, title))
    verdict = checks_verdict(run)
    out.print(f"[green]{verdict}[/]" if run.ok else f"[red]{verdict}[/]", highlight=False)


def _short(value: Any, limit: int = 60) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
