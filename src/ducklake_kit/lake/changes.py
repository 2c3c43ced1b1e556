"""The change feed: the rows of any `schema.table` that changed between two snapshots, with their change type
(`insert`, `delete`, `update_preimage`, `update_postimage`), from `ducklake_table_changes`.

DuckLake 1.5.5: the range includes BOTH ends, so (n, n) is snapshot n's own changes."""

from __future__ import annotations

from ducklake_kit.lake.connection import Lake
from ducklake_kit.lake.sql import quote_literal, split_name


def changes_sql(lake: Lake, table: str, start: int, end: int) -> str:
    """A relation (for FROM) of the rows of `table` ('schema.table' or 'table' in main) changed in snapshots
    start..end (both included), with `snapshot_id`, `rowid`, `change_type` and the table's columns."""
    schema_name, name = split_name(table)
    return (
        f"ducklake_table_changes({quote_literal(lake.alias)}, {quote_literal(schema_name)}, {quote_literal(name)}, "
        f"{int(start)}, {int(end)})"
    )


def change_counts(lake: Lake, table: str, start: int, end: int) -> dict[str, int]:
    """Rows changed per change type in snapshots start..end (both included), e.g. {'delete': 3, 'insert': 10}."""
    rows = lake.con.execute(
        f"SELECT change_type, count(*) FROM {changes_sql(lake, table, start, end)} GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    return {str(k): int(v) for k, v in rows}


def split_changes(changes_made: str | None) -> list[str]:
    """A snapshot's `changes_made` (`created_table:"main"."t",inserted_into_table:5`) split at the commas between
    changes, not those inside a quoted name."""
    out, current, quoted = [], [], False
    for ch in changes_made or "":
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            out.append("".join(current))
            current = []
        else:
            current.append(ch)
    if current:
        out.append("".join(current))
    return out
