"""The lake's maintenance operations, one function each: flush inlined data, merge adjacent files, expire
snapshots, clean up the files they held, delete orphaned files and the files of dead loads, CHECKPOINT; and what a
dry run lists instead. The `maintain` lesson (lessons/maintain.py) runs them in order and checks each one.

DuckLake semantics these rely on (checked by experiment on DuckDB 1.5.5 / ducklake 1.5.5):
- `ducklake_expire_snapshots(older_than => ts)` never expires the latest snapshot; `versions => [...]`
  expires exactly those. Files only an expired snapshot referenced are then *scheduled* for deletion, with
  the time of the expiry: `ducklake_cleanup_old_files(older_than => ts)` with a cutoff from before the
  expiry deletes none of them, so the cleanup here uses `cleanup_all => true` (those files are unreachable
  from every remaining snapshot).
- `ducklake_delete_orphaned_files` deletes files under the data path that no snapshot knows, such as those a
  killed load wrote, but only when older than its cutoff (default: a week). A load that is running right now
  has unregistered files too: the age cutoff (`older_than`, here the same as for snapshots) protects them, so
  don't pass a cutoff of "now" while a load runs.
- `ducklake_flush_inlined_data` and `ducklake_merge_adjacent_files` have no dry run: the dry run reports the
  inlined rows per table (from the catalog's inlined-data tables) and the data files per table instead.
- Flushing and merging each commit a snapshot; a CHECKPOINT with nothing left to do commits none.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb

from ducklake_kit.errors import KitError, first_line
from ducklake_kit.lake.connection import Lake
from ducklake_kit.lake.inventory import delete_s3_objects, inlined_rows
from ducklake_kit.lake.locks import commit_lock, held_now, load_id_of, load_life_key
from ducklake_kit.platforms.base import Endpoints

DEFAULT_OLDER_THAN = "7 days"
# duckdb/ducklake#1462: DuckLake keeps its PostgreSQL catalog transaction open while it does the Parquet work of an
# operation (ducklake_merge_adjacent_files reads and rewrites the files, ducklake_flush_inlined_data writes them, a
# fingerprint scans every row), idle between its catalog queries; on a catalog whose idle_in_transaction_session_timeout
# is shorter, PostgreSQL ends the session and the operation fails (DuckLake 1.5.5, measured: 100 files merged in 3.4 s
# under a 1 s timeout fail with `Failed to execute query "ROLLBACK"`). Smaller merges (max_compacted_files) shorten
# that time but do not bound it (one large file, a flush, a scan), so maintain's own catalog sessions turn the timeout
# off: a per-session setting (libpq `options`, Lake's catalog_settings), which overrides ALTER DATABASE / ALTER ROLE
# values; every other session, the writers' included, keeps the server's.
CATALOG_SETTINGS = {"idle_in_transaction_session_timeout": "0"}

# an expiry's arguments: the SQL after the alias and its parameters (versions => ? or older_than => ?)
ExpireArgs = tuple[str, list]


def resolve_cutoff(lake: Lake, older_than: str | timedelta | datetime) -> datetime:
    """The age as an absolute time: an interval string ('7 days', '1 hour'), a timedelta, or a timestamp
    (a datetime or an ISO string). Resolved once, at the start, so every step uses the same cutoff."""
    if isinstance(older_than, datetime):
        return older_than if older_than.tzinfo else older_than.replace(tzinfo=UTC)
    now = lake.scalar("SELECT now()")
    if isinstance(older_than, timedelta):
        return now - older_than
    text = str(older_than).strip()
    try:
        if re.match(r"^\d{4}-\d{2}-\d{2}", text):
            return lake.scalar("SELECT CAST(? AS TIMESTAMPTZ)", [text])
        return lake.scalar("SELECT now() - CAST(? AS INTERVAL)", [text])
    except duckdb.Error:
        raise KitError(
            f"cannot read the age '{older_than}'",
            "give an interval such as '7 days' or '2 hours', or a timestamp such as '2026-01-31 12:00:00'",
        ) from None


def expire_args(lake: Lake, cutoff: datetime, versions: list[int] | None) -> ExpireArgs:
    """Expire exactly `versions` when given, else every snapshot committed before `cutoff`."""
    if versions:
        return "versions => ?", [lake.alias, [int(v) for v in versions]]
    return "older_than => ?", [lake.alias, cutoff]


def _paths(lake: Lake, sql: str, params: list) -> list[str]:
    return [r[0] for r in lake.con.execute(sql, params).fetchall()]


def expire(lake: Lake, args: ExpireArgs, *, dry_run: bool) -> list[int]:
    """The snapshots the expiry removes (or would remove, with `dry_run`)."""
    sql = (
        f"SELECT snapshot_id FROM ducklake_expire_snapshots(?, dry_run => {'true' if dry_run else 'false'}, {args[0]})"
    )
    return sorted(int(r[0]) for r in lake.con.execute(sql, args[1]).fetchall())


def unreferenced_files(lake: Lake, ep: Endpoints) -> dict[str, list[str]]:
    """The data files no snapshot references, whatever their age, by why they are there: `running` (a load that
    is alive wrote them and may still commit them), `dead` (a load whose life lock is free: finished, failed or
    killed, it can never commit them), `other` (not named for a load: another writer's, an older kit's, or one DuckLake
    itself wrote in a transaction that never committed, such as a killed load's zones)."""
    paths = _paths(
        lake, "SELECT path FROM ducklake_delete_orphaned_files(?, dry_run => true, older_than => now())", [lake.alias]
    )
    by_load: dict[str, list[str]] = {}
    out: dict[str, list[str]] = {"running": [], "dead": [], "other": []}
    for path in paths:
        load = load_id_of(path)
        if load is None:
            out["other"].append(path)
        else:
            by_load.setdefault(load, []).append(path)
    alive = held_now(ep, [load_life_key(load) for load in by_load])  # asked after listing: a new load has a new id
    for load, files in by_load.items():
        out["running" if load_life_key(load) in alive else "dead"].extend(files)
    return {k: sorted(v) for k, v in out.items()}


def would_do(lake: Lake, args: ExpireArgs, cutoff: datetime) -> dict[str, Any]:
    """What a run would do, changing nothing (flush and merge have no dry run: the inlined rows and the tables of
    more than one data file stand in for them)."""
    a = lake.alias
    return {
        "flush_inlined_rows": inlined_rows(lake),
        # schema.table: `trips` lives in several schemas (main, timetravel, ...)
        "merge_candidates": dict(
            lake.con.execute(
                f"SELECT s.schema_name || '.' || i.table_name, i.file_count FROM ducklake_table_info(?) i "
                f"JOIN __ducklake_metadata_{a}.ducklake_schema s ON s.schema_id = i.schema_id AND s.end_snapshot IS NULL "
                "WHERE i.file_count > 1 ORDER BY 1",
                [a],
            ).fetchall()
        ),
        "expire_snapshots": expire(lake, args, dry_run=True),
        # files already scheduled; those the expiry would free are scheduled only when it runs
        "cleanup_files": _paths(
            lake, "SELECT path FROM ducklake_cleanup_old_files(?, dry_run => true, cleanup_all => true)", [a]
        ),
        "orphaned_files": _paths(
            lake, "SELECT path FROM ducklake_delete_orphaned_files(?, dry_run => true, older_than => ?)", [a, cutoff]
        ),
    }


def committing(lake: Lake, operation: Callable[[], list[tuple]]) -> tuple[list[tuple], int | None]:
    """Run one operation that may commit: (its rows, the snapshot it committed or None)."""
    before = lake.last_committed_snapshot()
    rows = operation()
    made = lake.last_committed_snapshot()
    return rows, (made if made is not None and made != before else None)


def flush(lake: Lake) -> list[tuple]:
    """Flush inlined data into Parquet files: (schema, table, rows flushed) per table."""
    sql = "SELECT schema_name, table_name, rows_flushed FROM ducklake_flush_inlined_data(?)"
    return lake.con.execute(sql, [lake.alias]).fetchall()


def merge(lake: Lake) -> list[tuple]:
    """Merge adjacent small files: (schema, table, files processed, files created) per table."""
    sql = "SELECT schema_name, table_name, files_processed, files_created FROM ducklake_merge_adjacent_files(?)"
    return lake.con.execute(sql, [lake.alias]).fetchall()


def checkpoint(lake: Lake) -> list[tuple]:
    return lake.con.execute("CHECKPOINT").fetchall()


def cleanup_old_files(lake: Lake) -> list[str]:
    """Delete the files only expired snapshots used: their paths."""
    return _paths(lake, "SELECT path FROM ducklake_cleanup_old_files(?, cleanup_all => true)", [lake.alias])


def delete_orphans(lake: Lake, cutoff: datetime) -> list[str]:
    """Delete the files no snapshot knows, last written before `cutoff`: their paths."""
    sql = "SELECT path FROM ducklake_delete_orphaned_files(?, older_than => ?)"
    return _paths(lake, sql, [lake.alias, cutoff])


def delete_dead_loads_files(lake: Lake, ep: Endpoints, on_delete: Callable[[str], None] = lambda _m: None) -> list[str]:
    """Delete the unreferenced files of loads known dead: their paths. Under the loads' commit lock: no load commits
    between the listing and the deletion, and a load checks its own life lock under it before committing
    (taxi.load.run_load)."""
    with commit_lock(ep):
        dead = unreferenced_files(lake, ep)["dead"]
        if dead:
            on_delete(f"deleting {len(dead)} file(s) of loads known dead (their life lock is free)")
            delete_s3_objects(ep, dead)
    return dead


def version_error(lake: Lake, table: str, version: int) -> str:
    """The first line of the error reading `table AT (VERSION => version)`, or '' when it answers."""
    try:
        lake.con.execute(f"SELECT count(*) FROM {table} AT (VERSION => {version})").fetchall()
    except duckdb.Error as exc:
        return first_line(exc)
    return ""
