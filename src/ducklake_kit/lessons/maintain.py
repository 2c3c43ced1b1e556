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

The operations themselves are in lake/maintenance.py (with the DuckLake semantics they rely on); this lesson
runs them in order and checks each one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ducklake_kit.checks import CheckRun
from ducklake_kit.lake import Lake
from ducklake_kit.lake import maintenance as ops
from ducklake_kit.lake.inventory import fingerprint, inventory, referenced_files, s3_objects, snapshot_ids
from ducklake_kit.lake.maintenance import CATALOG_SETTINGS, DEFAULT_OLDER_THAN, unreferenced_files
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.platforms.kit import Kit

__all__ = [
    "DEFAULT_OLDER_THAN",
    "fingerprint",
    "referenced_files",
    "run_maintain",
    "s3_objects",
    "unreferenced_files",
]


def run_maintain(
    kit: Kit,
    checks: CheckRun,
    *,
    older_than: str | timedelta | datetime = DEFAULT_OLDER_THAN,
    versions: list[int] | None = None,
    dry_run: bool = False,
    dead_loads: bool = False,
) -> dict[str, Any]:
    """`older_than`: snapshots committed before it expire, and orphaned files last written before it are deleted.
    `versions`: expire exactly these snapshots instead (orphans still use `older_than`). `dead_loads`: also delete
    now, whatever their age, the files of loads known dead (their life lock is free: see `unreferenced_files`)."""
    ep = kit.platform.endpoints()
    with Lake(ep, catalog_settings=CATALOG_SETTINGS) as lake:
        cutoff = ops.resolve_cutoff(lake, older_than)
        run = _Maintain(lake, ep, checks, kit.say, cutoff, ops.expire_args(lake, cutoff, versions), versions)
        run.read_before()
        if dry_run:
            run.dry_run(dead_loads=dead_loads)
        else:
            run.operations(dead_loads=dead_loads)
            run.check_after()
    return run.result


@dataclass
class _Maintain:
    """One maintain run: the lake, what it was before, and the result as it grows."""

    lake: Lake
    ep: Endpoints
    checks: CheckRun
    say: Callable[[str], None]
    cutoff: datetime
    args: ops.ExpireArgs
    versions: list[int] | None
    result: dict[str, Any] = field(default_factory=dict)
    own: list[int] = field(default_factory=list)  # the snapshots maintain's own operations committed

    def read_before(self) -> None:
        lake, checks = self.lake, self.checks
        self.result.update(
            dry_run=False, cutoff=self.cutoff.isoformat(), versions=self.versions, before=inventory(lake, self.ep)
        )
        self.snaps_before = snapshot_ids(lake)
        self.objects_before = s3_objects(self.ep)
        with checks.step("maintain: fingerprint before"):
            self.fp_before = fingerprint(lake)
            # the oldest snapshot that will survive (not the current one): its answers must not change either
            survivors = [s for s in self.snaps_before[:-1] if s not in ops.expire(lake, self.args, dry_run=True)]
            self.kept = survivors[0] if survivors else None
            self.fp_kept = fingerprint(lake, self.kept) if self.kept is not None else {}

    def dry_run(self, *, dead_loads: bool) -> None:
        lake, ep, checks = self.lake, self.ep, self.checks
        self.result["dry_run"] = True
        self.say("dry run: listing what would go, changing nothing")
        self.result["would"] = ops.would_do(lake, self.args, self.cutoff)
        left = unreferenced_files(lake, ep)
        self.result["unreferenced_left"] = {k: len(v) for k, v in left.items()}
        if dead_loads:
            self.result["would"]["dead_load_files"] = left["dead"]
        after = inventory(lake, ep)
        checks.equal("dry run: the snapshots are unchanged", snapshot_ids(lake), self.snaps_before)
        checks.equal("dry run: the files on S3 are unchanged (keys and sizes)", s3_objects(ep), self.objects_before)
        checks.equal("dry run: every table's fingerprint is unchanged", fingerprint(lake), self.fp_before)
        self.result["after"] = after

    def answer_preserving(self, what: str, operation: Callable[[], list[tuple]]) -> list[tuple]:
        """Run one committing operation; the snapshot it made (if any) must answer exactly as the one it was
        built on, whatever other writers committed before or after it."""
        rows, made = ops.committing(self.lake, operation)
        if made is not None:
            self.own.append(made)
            self.checks.equal(
                f"{what} (snapshot {made}) changed no answer: every table's rows and row-hash sum",
                fingerprint(self.lake, made),
                fingerprint(self.lake, made - 1),
            )
        return rows

    def operations(self, *, dead_loads: bool) -> None:
        lake, checks, say, done = self.lake, self.checks, self.say, {}
        with checks.step("maintain: flush inlined data"):
            say("flushing inlined data into Parquet files")
            rows = self.answer_preserving("flushing inlined data", lambda: ops.flush(lake))
            done["flushed"] = {f"{s}.{t}": int(n) for s, t, n in rows}
        with checks.step("maintain: merge adjacent files"):
            say("merging adjacent small files")
            rows = self.answer_preserving("merging adjacent files", lambda: ops.merge(lake))
            done["merged"] = {f"{s}.{t}": {"files_processed": int(p), "files_created": int(c)} for s, t, p, c in rows}
        with checks.step("maintain: expire snapshots"):
            which = "in " + str(self.versions) if self.versions else "older than " + self.cutoff.isoformat()
            say(f"expiring snapshots {which}")
            done["expired"] = ops.expire(lake, self.args, dry_run=False)
        with checks.step("maintain: clean up old files"):
            say("deleting the files only expired snapshots used")
            done["cleaned"] = ops.cleanup_old_files(lake)
        with checks.step("maintain: delete orphaned files"):
            say("deleting orphaned files (written but never committed, e.g. by a killed load)")
            done["orphans_deleted"] = ops.delete_orphans(lake, self.cutoff)
        with checks.step("maintain: files of dead loads"):
            if dead_loads:
                self._dead_loads(done)
            self._unreferenced_left()
        with checks.step("maintain: checkpoint"):
            say("CHECKPOINT")
            self.answer_preserving("CHECKPOINT", lambda: ops.checkpoint(lake))
        self.result["done"] = done
        self.result["after"] = inventory(lake, self.ep)

    def _dead_loads(self, done: dict[str, Any]) -> None:
        dead = ops.delete_dead_loads_files(self.lake, self.ep, on_delete=self.say)
        done["dead_load_files_deleted"] = dead
        if dead:
            still = sorted(set(dead) & set(s3_objects(self.ep)))
            self.checks.equal("the dead loads' files are gone from S3", still, [])

    def _unreferenced_left(self) -> None:
        left = unreferenced_files(self.lake, self.ep)
        self.result["unreferenced_left"] = {k: len(v) for k, v in left.items()}
        cutoff = self.cutoff.isoformat()
        reasons = {
            "running": "written by a load that is still running (it may commit them)",
            "dead": f"of loads known dead, kept until they are older than {cutoff} "
            "(`maintain --dead-loads` removes them now)",
            "other": f"not named for a load, kept until they are older than {cutoff}",
        }
        for kind, files in left.items():
            if files:
                self.say(f"{len(files)} unreferenced file(s) left: {reasons[kind]}")

    def check_after(self) -> None:
        lake, checks, done = self.lake, self.checks, self.result["done"]
        with checks.step("maintain: fingerprint after"):
            fp_after = fingerprint(lake)
        snaps_after = snapshot_ids(lake)
        others = sorted(set(snaps_after) - set(self.snaps_before) - set(self.own))  # other writers' commits meanwhile
        self.result["other_writers_snapshots"] = others
        if not others:  # nobody else wrote: the whole lake's answers are as before, too
            checks.equal("current answers unchanged: every table's rows and row-hash sum", fp_after, self.fp_before)
        else:
            self.say(
                f"{len(others)} snapshot(s) of other writers landed meanwhile: each of maintain's own commits was "
                "checked against the snapshot it was built on instead"
            )
        checks.equal("expired snapshots are no longer listed", sorted(set(done["expired"]) & set(snaps_after)), [])
        if self.versions:
            checks.equal(
                "exactly the requested versions expired",
                done["expired"],
                sorted({int(v) for v in self.versions} & set(self.snaps_before)),
            )
        else:
            gone = [s for s in self.snaps_before if s not in snaps_after]
            checks.equal("every snapshot that is gone was reported expired", gone, done["expired"])
        if self.kept is not None:
            checks.equal(
                f"a kept older snapshot ({self.kept}) answers as before (time travel survives the merge)",
                fingerprint(lake, self.kept),
                self.fp_kept,
            )
        self.result["reachability"] = self._check_reachability(fp_after, snaps_after)
        self._check_files()

    def _check_reachability(self, fp_after: dict[str, Any], snaps_after: list[int]) -> dict[str, Any]:
        expired_ids, probe = self.result["done"]["expired"], next(iter(fp_after), None)
        if not (expired_ids and probe):
            return {}
        expired = expired_ids[-1]
        error = ops.version_error(self.lake, probe, expired)
        self.checks.true(
            f"AT (VERSION => {expired}) (expired) now fails",
            "No snapshot found" in error,
            expected="an error: No snapshot found",
            actual=error or "it still answers",
        )
        current = snaps_after[-1]
        n = self.lake.scalar(f"SELECT count(*) FROM {probe} AT (VERSION => {current})")
        self.checks.equal(f"AT (VERSION => {current}) (current) answers: {probe} rows", n, fp_after[probe][0])
        return {"expired_version": expired, "expired_error": error, "current_version": current, "table": probe}

    def _check_files(self) -> None:
        done = self.result["done"]
        objects_after = s3_objects(self.ep)
        needed = referenced_files(self.lake)
        self.checks.equal(
            "every file the current snapshot references is on S3", sorted(needed - set(objects_after)), []
        )
        deleted = set(done["cleaned"]) | set(done["orphans_deleted"])
        self.checks.equal("every file reported deleted is gone from S3", sorted(deleted & set(objects_after)), [])
        self.result["deleted_from_s3"] = sorted(set(self.objects_before) - set(objects_after))
