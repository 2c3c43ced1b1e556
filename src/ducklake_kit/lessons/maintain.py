"""Maintenance (`maintain`): flush inlined data, merge adjacent files, expire old snapshots, clean up the files
they held, delete orphaned files, CHECKPOINT; `dry_run` lists what would go and changes nothing.

Checked, not just printed:
- the lake's current answers are unchanged: a fingerprint of every table (row count and an order-independent
  hash of all its rows, `sum(hash(row))`) of each snapshot maintain's own operations (flush, merge, CHECKPOINT)
  committed == that of the snapshot it was built on (the one before it); and, when no other writer committed
  meanwhile, the whole lake's after == before (other writers are normal: a load or the worker plane);
- expired snapshots are gone: not listed by `ducklake_snapshots`, and `AT (VERSION => expired)` now fails,
  while `AT (VERSION => current)` still answers;
- every data and delete file the current snapshot references is still on S3, and every file the cleanup
  reported as deleted is gone;
- a dry run changes nothing: the same snapshots, the same objects on S3 (key and size), the same fingerprint.

DuckLake semantics this relies on (checked by experiment on DuckDB 1.5.5 / ducklake 1.5.5):
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

from ducklake_kit.checks import CheckRun
from ducklake_kit.errors import KitError, first_line
from ducklake_kit.lake import Lake
from ducklake_kit.lake.inventory import (
    delete_s3_objects,
    fingerprint,
    inlined_rows,
    inventory,
    referenced_files,
    s3_objects,
    snapshot_ids,
)
from ducklake_kit.lake.locks import held_now, load_life_key
from ducklake_kit.platforms.base import Endpoints, Platform
from ducklake_kit.taxi.load import commit_lock, load_id_of

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


# -- the run -----------------------------------------------------------------------------------------------


def _paths(lake: Lake, sql: str, params: list) -> list[str]:
    return [r[0] for r in lake.con.execute(sql, params).fetchall()]


def _expire(lake: Lake, expire_args: tuple[str, list], *, dry_run: bool) -> list[int]:
    sql = f"SELECT snapshot_id FROM ducklake_expire_snapshots(?, dry_run => {'true' if dry_run else 'false'}, {expire_args[0]})"
    return sorted(int(r[0]) for r in lake.con.execute(sql, expire_args[1]).fetchall())


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


def run_maintain(
    platform: Platform,
    checks: CheckRun,
    *,
    older_than: str | timedelta | datetime = DEFAULT_OLDER_THAN,
    versions: list[int] | None = None,
    dry_run: bool = False,
    dead_loads: bool = False,
    on_step: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """`older_than`: snapshots committed before it expire, and orphaned files last written before it are deleted.
    `versions`: expire exactly these snapshots instead (orphans still use `older_than`). `dead_loads`: also delete
    now, whatever their age, the files of loads known dead (their life lock is free: see `unreferenced_files`)."""
    ep = platform.endpoints()
    with Lake(ep, catalog_settings=CATALOG_SETTINGS) as lake:
        a = lake.alias
        cutoff = resolve_cutoff(lake, older_than)
        expire_args = (
            ("versions => ?", [a, [int(v) for v in versions]]) if versions else ("older_than => ?", [a, cutoff])
        )
        before = inventory(lake, ep)
        snaps_before = snapshot_ids(lake)
        objects_before = s3_objects(ep)
        with checks.step("maintain: fingerprint before"):
            fp_before = fingerprint(lake)
            # the oldest snapshot that will survive (not the current one): its answers must not change either
            survivors = [s for s in snaps_before[:-1] if s not in _expire(lake, expire_args, dry_run=True)]
            kept = survivors[0] if survivors else None
            fp_kept = fingerprint(lake, kept) if kept is not None else {}
        result: dict[str, Any] = {
            "dry_run": dry_run,
            "cutoff": cutoff.isoformat(),
            "versions": versions,
            "before": before,
        }

        if dry_run:
            on_step("dry run: listing what would go, changing nothing")
            result["would"] = {
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
                "expire_snapshots": _expire(lake, expire_args, dry_run=True),
                # files already scheduled; those the expiry would free are scheduled only when it runs
                "cleanup_files": _paths(
                    lake, "SELECT path FROM ducklake_cleanup_old_files(?, dry_run => true, cleanup_all => true)", [a]
                ),
                "orphaned_files": _paths(
                    lake,
                    "SELECT path FROM ducklake_delete_orphaned_files(?, dry_run => true, older_than => ?)",
                    [a, cutoff],
                ),
            }
            left = unreferenced_files(lake, ep)
            result["unreferenced_left"] = {k: len(v) for k, v in left.items()}
            if dead_loads:
                result["would"]["dead_load_files"] = left["dead"]
            after = inventory(lake, ep)
            checks.equal("dry run: the snapshots are unchanged", snapshot_ids(lake), snaps_before)
            checks.equal("dry run: the files on S3 are unchanged (keys and sizes)", s3_objects(ep), objects_before)
            checks.equal("dry run: every table's fingerprint is unchanged", fingerprint(lake), fp_before)
            result["after"] = after
            return result

        done: dict[str, Any] = {}
        own: list[int] = []  # the snapshots maintain's own operations committed

        def answer_preserving(what: str, rows: Callable[[], list[tuple]]) -> list[tuple]:
            """Run one committing operation; the snapshot it made (if any) must answer exactly as the one it was
            built on, whatever other writers committed before or after it."""
            before_op = lake.last_committed_snapshot()
            out = rows()
            made = lake.last_committed_snapshot()
            if made is not None and made != before_op:
                own.append(made)
                checks.equal(
                    f"{what} (snapshot {made}) changed no answer: every table's rows and row-hash sum",
                    fingerprint(lake, made),
                    fingerprint(lake, made - 1),
                )
            return out

        with checks.step("maintain: flush inlined data"):
            on_step("flushing inlined data into Parquet files")
            done["flushed"] = {
                f"{s}.{t}": int(n)
                for s, t, n in answer_preserving(
                    "flushing inlined data",
                    lambda: lake.con.execute(
                        "SELECT schema_name, table_name, rows_flushed FROM ducklake_flush_inlined_data(?)", [a]
                    ).fetchall(),
                )
            }
        with checks.step("maintain: merge adjacent files"):
            on_step("merging adjacent small files")
            done["merged"] = {
                f"{s}.{t}": {"files_processed": int(p), "files_created": int(c)}
                for s, t, p, c in answer_preserving(
                    "merging adjacent files",
                    lambda: lake.con.execute(
                        "SELECT schema_name, table_name, files_processed, files_created FROM ducklake_merge_adjacent_files(?)",
                        [a],
                    ).fetchall(),
                )
            }
        with checks.step("maintain: expire snapshots"):
            on_step(f"expiring snapshots {'in ' + str(versions) if versions else 'older than ' + cutoff.isoformat()}")
            done["expired"] = _expire(lake, expire_args, dry_run=False)
        with checks.step("maintain: clean up old files"):
            on_step("deleting the files only expired snapshots used")
            done["cleaned"] = _paths(lake, "SELECT path FROM ducklake_cleanup_old_files(?, cleanup_all => true)", [a])
        with checks.step("maintain: delete orphaned files"):
            on_step("deleting orphaned files (written but never committed, e.g. by a killed load)")
            done["orphans_deleted"] = _paths(
                lake, "SELECT path FROM ducklake_delete_orphaned_files(?, older_than => ?)", [a, cutoff]
            )
        with checks.step("maintain: files of dead loads"):
            if dead_loads:
                # under the loads' commit lock: no load commits between the listing and the deletion, and a load
                # checks its own life lock under it before committing (taxi.load.run_load)
                with commit_lock(ep):
                    left = unreferenced_files(lake, ep)
                    if left["dead"]:
                        on_step(f"deleting {len(left['dead'])} file(s) of loads known dead (their life lock is free)")
                        delete_s3_objects(ep, left["dead"])
                done["dead_load_files_deleted"] = left["dead"]
                if left["dead"]:
                    checks.equal(
                        "the dead loads' files are gone from S3", sorted(set(left["dead"]) & set(s3_objects(ep))), []
                    )
            left = unreferenced_files(lake, ep)
            result["unreferenced_left"] = {k: len(v) for k, v in left.items()}
            reasons = {
                "running": "written by a load that is still running (it may commit them)",
                "dead": f"of loads known dead, kept until they are older than {cutoff.isoformat()} "
                "(`maintain --dead-loads` removes them now)",
                "other": f"not named for a load, kept until they are older than {cutoff.isoformat()}",
            }
            for kind, files in left.items():
                if files:
                    on_step(f"{len(files)} unreferenced file(s) left: {reasons[kind]}")
        with checks.step("maintain: checkpoint"):
            on_step("CHECKPOINT")
            answer_preserving("CHECKPOINT", lambda: lake.con.execute("CHECKPOINT").fetchall())
        result["done"] = done
        after = inventory(lake, ep)
        result["after"] = after

        # -- checks
        with checks.step("maintain: fingerprint after"):
            fp_after = fingerprint(lake)
        snaps_after = snapshot_ids(lake)
        others = sorted(set(snaps_after) - set(snaps_before) - set(own))  # other writers' commits meanwhile
        result["other_writers_snapshots"] = others
        if not others:  # nobody else wrote: the whole lake's answers are as before, too
            checks.equal("current answers unchanged: every table's rows and row-hash sum", fp_after, fp_before)
        else:
            on_step(
                f"{len(others)} snapshot(s) of other writers landed meanwhile: each of maintain's own commits was "
                "checked against the snapshot it was built on instead"
            )
        checks.equal("expired snapshots are no longer listed", sorted(set(done["expired"]) & set(snaps_after)), [])
        if versions:
            checks.equal(
                "exactly the requested versions expired",
                done["expired"],
                sorted({int(v) for v in versions} & set(snaps_before)),
            )
        else:
            gone = [s for s in snaps_before if s not in snaps_after]
            checks.equal("every snapshot that is gone was reported expired", gone, done["expired"])
        if kept is not None:
            checks.equal(
                f"a kept older snapshot ({kept}) answers as before (time travel survives the merge)",
                fingerprint(lake, kept),
                fp_kept,
            )
        probe = next(iter(fp_after), None)
        reach: dict[str, Any] = {}
        if done["expired"] and probe:
            expired = done["expired"][-1]
            try:
                lake.con.execute(f"SELECT count(*) FROM {probe} AT (VERSION => {expired})").fetchall()
                error = ""
            except duckdb.Error as exc:
                error = first_line(exc)
            checks.true(
                f"AT (VERSION => {expired}) (expired) now fails",
                "No snapshot found" in error,
                expected="an error: No snapshot found",
                actual=error or "it still answers",
            )
            current = snaps_after[-1]
            n = lake.scalar(f"SELECT count(*) FROM {probe} AT (VERSION => {current})")
            checks.equal(f"AT (VERSION => {current}) (current) answers: {probe} rows", n, fp_after[probe][0])
            reach = {"expired_version": expired, "expired_error": error, "current_version": current, "table": probe}
        result["reachability"] = reach
        objects_after = s3_objects(ep)
        needed = referenced_files(lake)
        checks.equal("every file the current snapshot references is on S3", sorted(needed - set(objects_after)), [])
        deleted = set(done["cleaned"]) | set(done["orphans_deleted"])
        checks.equal("every file reported deleted is gone from S3", sorted(deleted & set(objects_after)), [])
        result["deleted_from_s3"] = sorted(set(objects_before) - set(objects_after))
    return result
