"""What the lake's catalog says that a refresh needs: the refresh commits of a definition (each carries what it
read in its commit_extra_info), the snapshots since a refresh (time, schema version, changes, extra info: one
round trip), the snapshot a table reflects, the sources' columns and table ids, and the query's plan with them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from sqlglot import exp

from ducklake_kit.dynamic_tables import feed
from ducklake_kit.dynamic_tables import plan as planner
from ducklake_kit.dynamic_tables.metadata import Definition
from ducklake_kit.lake import Lake
from ducklake_kit.lake.sql import quote_ident, quote_literal


def lake_commits(lake: Lake, d: Definition, after: int | None = None) -> list[tuple[int, dict]]:
    """(snapshot, commit_extra_info) of every committed refresh of this definition that records what it read,
    oldest first; only commits after snapshot `after` are searched (the filter goes to PostgreSQL: the catalog
    keeps every snapshot)."""
    meta = quote_ident(f"__ducklake_metadata_{lake.alias}")
    rows = lake.con.execute(
        f"SELECT snapshot_id, commit_extra_info FROM {meta}.ducklake_snapshot_changes "
        "WHERE snapshot_id > ? AND commit_extra_info IS NOT NULL ORDER BY snapshot_id",
        [after if after is not None else -1],
    ).fetchall()
    return refresh_commits(rows, d)


def refresh_commits(rows: list[tuple[int, str | None]], d: Definition) -> list[tuple[int, dict]]:
    """Of (snapshot, commit_extra_info) rows in snapshot order, those of a committed refresh of `d` (`lake_commits`)."""
    out = []
    for snapshot, info in rows:
        if info is None:
            continue
        try:
            extra = json.loads(info)
        except ValueError:  # another writer's own extra info
            continue
        if (
            isinstance(extra, dict)
            and extra.get("dynamic_table") == d.name
            and extra.get("definition") == d.definition_id
            and isinstance(extra.get("read"), int)
        ):
            out.append((int(snapshot), extra))
    return out


@dataclass(frozen=True)
class Snapshot:
    """One snapshot as the catalog keeps it: its commit time, the lake's schema version then, what it changed
    (`changes_made`) and its commit_extra_info."""

    id: int
    time: datetime
    version: int
    changes: str | None
    extra: str | None


def snapshots_since(
    lake: Lake, since: int | None, now: int, tables: list[int] | None = None
) -> tuple[list[Snapshot], feed.Size | None]:
    """The snapshots after `since` up to `now` (all up to `now` when `since` is None; `now` always), oldest first,
    in one round trip to PostgreSQL: what a refresh reads of the catalog before it knows what to do (its snapshot's
    time and schema version, the refresh commits to recover, the changes to read), which took three catalog scans.
    With `tables` (table ids) and a `since`, the same round trip also gives `feed.size` of tables' change in
    since+1..now (inlined rows not counted: `feed.sized` of its row adds them), else None: ADAPTIVE's size query,
    which cost a query of its own (3-7 ms)."""
    lo = 0 if since is None else min(int(since) + 1, int(now))
    sized = bool(tables) and since is not None
    size = ", __size.changed, __size.live" if sized else ""
    joined = f" CROSS JOIN ({feed.size_sql('public', tables, lo, now)}) AS __size" if sized else ""
    text = (
        f"SELECT s.snapshot_id, s.snapshot_time, s.schema_version, c.changes_made, c.commit_extra_info{size} "
        f"FROM public.ducklake_snapshot s LEFT JOIN public.ducklake_snapshot_changes c USING (snapshot_id){joined} "
        f"WHERE s.snapshot_id BETWEEN {lo} AND {int(now)} ORDER BY s.snapshot_id"
    )
    rows = lake.con.execute(
        f"SELECT * FROM postgres_query({quote_literal(f'__ducklake_metadata_{lake.alias}')}, {quote_literal(text)})"
    ).fetchall()
    seen = [Snapshot(int(r[0]), r[1], int(r[2]), r[3], r[4]) for r in rows]
    return seen, (feed.sized(rows[-1][5:7]) if sized and rows else None)


def columns_of(lake: Lake, name: str) -> list[tuple[str, str]]:
    """(column, DuckDB type) of lake table `schema.table` now, in order (names matched case-insensitively)."""
    schema, table = name.split(".")
    return [
        (r[0], r[1])
        for r in lake.con.execute(
            "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = ? AND lower(schema_name) = ? "
            "AND lower(table_name) = ? ORDER BY column_index",
            [lake.alias, schema.lower(), table.lower()],
        ).fetchall()
    ]


def analyze(lake: Lake, query: exp.Expression, name: str, columns: list[str]) -> planner.Plan:
    """The plan of a dynamic table's query, with the types of its result (as table `name` has them, when it
    exists) and its sources' columns (a GROUP BY name that is a column means the column; a WITH clause is inlined
    with them)."""
    return planner.analyze(
        query, columns, lake.alias, types=dict(columns_of(lake, name)), schema=source_schema(lake, query)
    )


def source_schema(lake: Lake, query: exp.Expression) -> dict[str, dict[str, str]]:
    """Each lake table the query reads (`schema.table`) -> its columns and their DuckDB types, as they are now."""
    return {s: dict(columns_of(lake, s)) for s in planner.all_sources(query, lake.alias)}


def table_ids_at(lake: Lake, source: str, snapshots: tuple[int, int]) -> tuple[int | None, int | None]:
    """The catalog's id of table `source` at each of two snapshots (None: no such table then), in one query. A table
    dropped and created again under the same name has a new id, and its change feed knows nothing of the old one's
    rows."""
    meta = quote_ident(f"__ducklake_metadata_{lake.alias}")
    schema, table = source.split(".")
    at = f"""
        (SELECT t.table_id FROM {meta}.ducklake_table t JOIN {meta}.ducklake_schema s USING (schema_id)
         WHERE lower(s.schema_name) = $1 AND lower(t.table_name) = $2
           AND t.begin_snapshot <= {{n}} AND (t.end_snapshot IS NULL OR t.end_snapshot > {{n}})
           AND s.begin_snapshot <= {{n}} AND (s.end_snapshot IS NULL OR s.end_snapshot > {{n}}))"""
    a, b = (int(n) for n in snapshots)
    row = lake.con.execute(f"SELECT {at.format(n=a)}, {at.format(n=b)}", [schema.lower(), table.lower()]).fetchone()
    return (int(row[0]) if row[0] is not None else None, int(row[1]) if row[1] is not None else None)


def reflected(lake: Lake, d: Definition, commits: list[tuple[int, dict]] | None = None) -> int | None:
    """The snapshot of the sources the table reflects now: the later of the metadata's record and the lake's
    (`commits`: `lake_commits(lake, d, d.data_snapshot)` when the caller has read them already)."""
    if commits is None:
        commits = lake_commits(lake, d, d.data_snapshot)
    recorded = [s for s in (d.data_snapshot, commits[-1][1]["read"] if commits else None) if s is not None]
    return max(recorded) if recorded else None


def snapshot_time(lake: Lake, snapshot: int) -> datetime:
    return snapshot_at(lake, snapshot)[0]


def snapshot_at(lake: Lake, snapshot: int) -> tuple[datetime, int]:
    """The snapshot's commit time and the lake's schema version then (it changes with every CREATE, ALTER, DROP)."""
    meta = quote_ident(f"__ducklake_metadata_{lake.alias}")
    row = lake.con.execute(
        f"SELECT snapshot_time, schema_version FROM {meta}.ducklake_snapshot WHERE snapshot_id = ?", [snapshot]
    ).fetchone()
    return row[0], int(row[1])
