"""How the console draws an answer: a table's cells, and a chart whose kind and axes come from the columns' types
(a bar chart over a text or other category column, a line over a time or number column, one series per other number
column); no number column, no chart."""

from __future__ import annotations

import datetime as dt
import decimal
from dataclasses import dataclass
from typing import Any

INTEGERS = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"}
FLOATS = {"FLOAT", "DOUBLE", "REAL"}


def is_number(duckdb_type: str) -> bool:
    t = duckdb_type.upper()
    return t in INTEGERS or t in FLOATS or t.startswith("DECIMAL")


def is_time(duckdb_type: str) -> bool:
    return duckdb_type.upper().startswith(("DATE", "TIMESTAMP", "TIME"))


@dataclass
class ChartSpec:
    kind: str  # "bar" or "line"
    x: int  # the column on the x axis
    ys: list[int]  # one series per column


def chart_spec(types: list[str]) -> ChartSpec | None:
    """The chart for columns of these DuckDB types, or None when there is nothing to draw."""
    if len(types) < 2:
        return None
    numbers = [i for i, t in enumerate(types) if is_number(t)]
    others = [i for i in range(len(types)) if i not in numbers]
    x = others[0] if others else 0
    ys = [i for i in numbers if i != x]
    if not ys:
        return None
    kind = "line" if is_time(types[x]) or is_number(types[x]) else "bar"
    return ChartSpec(kind, x, ys)


def cell(value: Any) -> Any:
    """A value as the page shows it: numbers stay numbers, NULL says so, the rest is its text."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return value if abs(value) < 2**53 else str(value)  # beyond that a browser's number is not exact
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat()
    return str(value)


def _number(value: Any) -> float | None:
    if value is None:
        return None
    return float(value)


def chart_options(spec: ChartSpec, columns: list[str], rows: list[tuple]) -> dict[str, Any]:
    """ECharts options for the drawn rows."""
    return {
        "animation": False,
        "tooltip": {"trigger": "axis"},
        "legend": {"data": [columns[i] for i in spec.ys]},
        "xAxis": {"type": "category", "name": columns[spec.x], "data": [str(cell(r[spec.x])) for r in rows]},
        "yAxis": {"type": "value"},
        "series": [{"name": columns[i], "type": spec.kind, "data": [_number(r[i]) for r in rows]} for i in spec.ys],
    }


def diff_summary(diff) -> str:
    """The line over a diff (lake.explore.TableDiff), on the page and in /api/diff:
    `schema.table, snapshots 5..7: delete 4, insert 1`."""
    counts = ", ".join(f"{k} {v}" for k, v in sorted(diff.counts.items())) or "nothing changed"
    return f"{diff.table}, snapshots {diff.before + 1}..{diff.after}: {counts}"


def table_columns(columns: list[str]) -> list[dict[str, Any]]:
    """Quasar's columns: fields c0, c1, ... (a column's own name may hold dots or repeat), labelled by the names."""
    return [{"name": f"c{i}", "label": name, "field": f"c{i}", "align": "left"} for i, name in enumerate(columns)]


def table_rows(rows: list[tuple]) -> list[dict[str, Any]]:
    return [{"_row": n, **{f"c{i}": cell(v) for i, v in enumerate(r)}} for n, r in enumerate(rows)]
