"""What a lake explorer shows (the console's Lake page): its schemas and tables with their row counts, columns and
types; the snapshot timeline with each commit's author, message and extra info; a table's diff between two
snapshots, from the change feed; and the raw `ducklake_*` catalog tables, read from PostgreSQL in read-only
transactions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb
import psycopg
from psycopg import sql as pgsql

from ducklake_kit.errors import KitError, first_line
from ducklake_kit.lake import sql
from ducklake_kit.lake.changes import changes_sql
from ducklake_kit.lake.connection import Lake
from ducklake_kit.platforms import postgres

CATALOG_ROWS = 200  # the most rows of a catalog table shown at once


@dataclass
class TableInfo:
    schema: str
    name: str
    rows: int
    columns: list[tuple[str, str]] = field(default_factory=list)  # (name, DuckDB type), in the table's order

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass
class SnapshotInfo:
    snapshot_id: int
    time: Any  # a timezone-aware datetime
    schema_version: int
    changes: dict[str, list[str]]
    author: str | None
    commit_message: str | None
    commit_extra_info: str | None


@dataclass
class CatalogRows:
    """The first rows of one raw catalog table and how many it has."""

    table: str
    columns: list[str]
    rows: list[tuple]
    total_rows: int


@dataclass
class TableDiff:
    """What changed in a table after snapshot `before` up to snapshot `after`: the count per change type (insert,
    delete, update_preimage, update_postimage) and the first changed rows, each with its snapshot and change type."""

    table: str
    before: int
    after: int
    counts: dict[str, int]
    columns: list[str]
    rows: list[tuple]
    total_rows: int


def tables(lake: Lake) -> list[TableInfo]:
    """Every table of the lake, by schema and name, with its row count and its columns (read at one snapshot)."""
    out = []
    cols: dict[tuple[str, str], list[tuple[str, str]]] = {}
    lake.con.execute("BEGIN TRANSACTION")
    try:
        for schema_name, table, column, data_type in lake.con.execute(
            "SELECT schema_name, table_name, column_name, data_type FROM duckdb_columns() "
            "WHERE database_name = ? ORDER BY schema_name, table_name, column_index",
            [lake.alias],
        ).fetchall():
            cols.setdefault((schema_name, table), []).append((column, data_type))
        for schema_name, table in sql.tables(lake.con, lake.alias):
            n = lake.scalar(f"SELECT count(*) FROM {sql.qualified(lake.alias, schema_name, table)}")
            out.append(TableInfo(schema_name, table, int(n), cols.get((schema_name, table), [])))
    finally:
        lake.con.execute("ROLLBACK")
    return sorted(out, key=lambda t: (t.schema, t.name))


def snapshots(lake: Lake) -> list[SnapshotInfo]:
    """The snapshot timeline, newest first."""
    rows = lake.con.execute(
        "SELECT snapshot_id, snapshot_time, schema_version, changes, author, commit_message, commit_extra_info "
        "FROM ducklake_snapshots(?) ORDER BY snapshot_id DESC",
        [lake.alias],
    ).fetchall()
    return [SnapshotInfo(int(r[0]), r[1], int(r[2]), dict(r[3] or {}), r[4], r[5], r[6]) for r in rows]


def diff(lake: Lake, table: str, before: int, after: int, limit: int = CATALOG_ROWS) -> TableDiff:
    """The rows of `table` ('schema.table') that changed after snapshot `before` up to and including `after`
    (DuckLake's change feed over before+1..after), the first `limit` of them in snapshot order."""
    before, after = int(before), int(after)
    if not 0 <= before < after:
        raise KitError(
            f"a diff runs from an earlier snapshot to a later one, not from {before} to {after}",
            "give the earlier snapshot first",
        )
    feed = changes_sql(lake, table, before + 1, after)
    lake.con.execute("BEGIN TRANSACTION")  # the counts and the rows read at one snapshot
    try:
        counts = dict(
            lake.con.execute(f"SELECT change_type, count(*) FROM {feed} GROUP BY ALL ORDER BY ALL").fetchall()
        )
        # an update's preimage before its postimage
        cur = lake.con.execute(
            f"SELECT * FROM {feed} ORDER BY snapshot_id, rowid, change_type DESC LIMIT {max(0, int(limit))}"
        )
        columns = [d[0] for d in cur.description]
        rows = cur.fetchall()
    except duckdb.Error as exc:  # a table that did not exist yet, a snapshot that does not
        raise KitError(first_line(exc), "choose two snapshots of the timeline at which the table exists") from None
    finally:
        lake.con.execute("ROLLBACK")
    counts = {str(k): int(v) for k, v in counts.items()}
    return TableDiff(table, before, after, counts, columns, rows, sum(counts.values()))


def _catalog(lake: Lake) -> psycopg.Connection:
    conn = postgres.connect(lake.endpoints.pg)
    conn.autocommit = False
    conn.read_only = True  # every transaction of this connection is READ ONLY: PostgreSQL refuses any write
    return conn


def catalog_tables(lake: Lake) -> list[str]:
    """The names of DuckLake's own tables in the catalog database (ducklake_snapshot, ducklake_table, ...)."""
    with _catalog(lake) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
            "AND table_type = 'BASE TABLE' AND starts_with(table_name, 'ducklake_') ORDER BY 1"
        ).fetchall()
    return [r[0] for r in rows]


def catalog_rows(lake: Lake, table: str, limit: int = CATALOG_ROWS) -> CatalogRows:
    """The first `limit` rows of one of `catalog_tables` (any other name is refused), in a read-only transaction."""
    with _catalog(lake) as conn:
        known = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
                "AND starts_with(table_name, 'ducklake_')"
            ).fetchall()
        }
        if table not in known:
            raise KitError(f"'{table}' is not one of the catalog's ducklake_* tables", "choose one of the list")
        name = pgsql.Identifier(table)
        total = conn.execute(pgsql.SQL("SELECT count(*) FROM {}").format(name)).fetchone()[0]
        cur = conn.execute(pgsql.SQL("SELECT * FROM {} LIMIT %s").format(name), [max(0, int(limit))])
        columns = [d.name for d in cur.description]
        return CatalogRows(table, columns, cur.fetchall(), int(total))
