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
runs them in order and checks each one: `run(kit, checks, ...) -> MaintainResult`.
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
from ducklake_kit.lessons.result import LessonResult, lesson
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.platforms.kit import Kit

__all__ = [
    "DEFAULT_OLDER_THAN",
    "Done",
    "MaintainResult",
    "fingerprint",
    "referenced_files",
    "run",
    "run_maintain",
    "s3_objects",
    "unreferenced_files",
]

_LEFT_BECAUSE = {
    "running": "written by a load that is still running (it may commit them)",
    "dead": "of loads known dead, kept until they are older than {cutoff} (`maintain --dead-loads` removes them now)",
    "other": "not named for a load, kept until they are older than {cutoff}",
}


@dataclass
class Done:
    """What a real run did, operation by operation."""

    flushed: dict[str, int] = field(default_factory=dict)  # schema.table -> inlined rows written to Parquet
    merged: dict[str, dict[str, int]] = field(default_factory=dict)  # schema.table -> files_processed, files_created
    expired: list[int] = field(default_factory=list)  # snapshot ids
    cleaned: list[str] = field(default_factory=list)  # files only expired snapshots used, deleted
    orphans_deleted: list[str] = field(default_factory=list)
    dead_load_files_deleted: list[str] | None = None  # None: not asked for (`dead_loads`)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "flushed": self.flushed,
            "merged": self.merged,
            "expired": self.expired,
            "cleaned": self.cleaned,
            "orphans_deleted": self.orphans_deleted,
        }
        if self.dead_load_files_deleted is not None:
            out["dead_load_files_deleted"] = self.dead_load_files_deleted
        return out


@dataclass(kw_only=True)
class MaintainResult(LessonResult):
    dry_run: bool
    cutoff: str  # ISO timestamp: snapshots and orphaned files older than it go
    versions: list[int] | None  # the snapshots asked to expire (None: by age)
    before: dict[str, Any]  # the lake's inventory before
    after: dict[str, Any] = field(default_factory=dict)  # and after
    would: dict[str, Any] | None = None  # a dry run: what would go
    done: Done | None = None  # a real run: what went
    unreferenced_left: dict[str, int] = field(default_factory=dict)  # running | dead | other -> files left on S3
    other_writers_snapshots: list[int] = field(default_factory=list)  # other writers' commits while maintain ran
    reachability: dict[str, Any] = field(default_factory=dict)  # the expired and the current version, read back
    deleted_from_s3: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "dry_run": self.dry_run,
            "cutoff": self.cutoff,
            "versions": self.versions,
            "before": self.before,
        }
        if self.dry_run:
            return {**out, "would": self.would, "unreferenced_left": self.unreferenced_left, "after": self.after}
        return {
            **out,
            "unreferenced_left": self.unreferenced_left,
            "done": self.done.as_dict() if self.done else None,
            "after": self.after,
            "other_writers_snapshots": self.other_writers_snapshots,
            "reachability": self.reachability,
            "deleted_from_s3": self.deleted_from_s3,
        }


@lesson("maintain")
def run(
    kit: Kit,
    checks: CheckRun,
    *,
    older_than: str | timedelta | datetime = DEFAULT_OLDER_THAN,
    versions: list[int] | None = None,
    dry_run: bool = False,
    dead_loads: bool = False,
) -> MaintainResult:
    """`older_than`: snapshots committed before it expire, and orphaned files last written before it are deleted.
    `versions`: expire exactly these snapshots instead (orphans still use `older_than`). `dead_loads`: also delete
    now, whatever their age, the files of loads known dead (their life lock is free: see `unreferenced_files`)."""
    ep = kit.platform.endpoints()
    with Lake(ep, catalog_settings=CATALOG_SETTINGS) as lake:
        cutoff = ops.resolve_cutoff(lake, older_than)
        m = _Maintain(lake, ep, checks, kit.say, cutoff, ops.expire_args(lake, cutoff, versions))
        m.read_before(versions, dry_run=dry_run)
        if dry_run:
            m.dry_run(dead_loads=dead_loads)
        else:
            m.operations(dead_loads=dead_loads)
            m.check_after()
    return m.result


def run_maintain(kit: Kit, checks: CheckRun, **options: Any) -> dict[str, Any]:
    """`run(...).as_dict()`: the name and the dict notebook 05 still use (kept until the notebook reads the result)."""
    return run(kit, checks, **options).as_dict()


@dataclass
class _Maintain:
    """One maintain run: the lake, what it was before, and the result as it grows. Each method is one operation
    and its checks, or one group of checks."""

    lake: Lake
    ep: Endpoints
    checks: CheckRun
    say: Callable[[str], None]
    cutoff: datetime
    args: ops.ExpireArgs
    own: list[int] = field(default_factory=list)  # the snapshots maintain's own operations committed

    def read_before(self, versions: list[int] | None, *, dry_run: bool) -> None:
        lake = self.lake
        self.result = MaintainResult(
            dry_run=dry_run, cutoff=self.cutoff.isoformat(), versions=versions, before=inventory(lake, self.ep)
        )
        self.snaps_before = snapshot_ids(lake)
        self.objects_before = s3_objects(self.ep)
        with self.checks.timed("maintain: fingerprint before"):
            self.fp_before = fingerprint(lake)
            # the oldest snapshot that will survive (not the current one): its answers must not change either
            survivors = [s for s in self.snaps_before[:-1] if s not in ops.expire(lake, self.args, dry_run=True)]
            self.kept = survivors[0] if survivors else None
            self.fp_kept = fingerprint(lake, self.kept) if self.kept is not None else {}

    # -- a dry run: lists, then checks that nothing changed

    def dry_run(self, *, dead_loads: bool) -> None:
        lake, ep, checks, result = self.lake, self.ep, self.checks, self.result
        self.say("dry run: listing what would go, changing nothing")
        result.would = ops.would_do(lake, self.args, self.cutoff)
        left = unreferenced_files(lake, ep)
        result.unreferenced_left = {k: len(v) for k, v in left.items()}
        if dead_loads:
            result.would["dead_load_files"] = left["dead"]
        result.after = inventory(lake, ep)
        checks.equal("dry run: the snapshots are unchanged", snapshot_ids(lake), self.snaps_before)
        checks.equal("dry run: the files on S3 are unchanged (keys and sizes)", s3_objects(ep), self.objects_before)
        checks.equal("dry run: every table's fingerprint is unchanged", fingerprint(lake), self.fp_before)

    # -- a real run: each operation, and the check that goes with it

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
        done = self.result.done = Done()
        done.flushed = self._flush()
        done.merged = self._merge()
        done.expired = self._expire()
        with self.checks.timed("maintain: clean up old files"):
            self.say("deleting the files only expired snapshots used")
            done.cleaned = ops.cleanup_old_files(self.lake)
        with self.checks.timed("maintain: delete orphaned files"):
            self.say("deleting orphaned files (written but never committed, e.g. by a killed load)")
            done.orphans_deleted = ops.delete_orphans(self.lake, self.cutoff)
        with self.checks.timed("maintain: files of dead loads"):
            if dead_loads:
                done.dead_load_files_deleted = self._dead_loads()
            self._unreferenced_left()
        with self.checks.timed("maintain: checkpoint"):
            self.say("CHECKPOINT")
            self.answer_preserving("CHECKPOINT", lambda: ops.checkpoint(self.lake))
        self.result.after = inventory(self.lake, self.ep)

    def _flush(self) -> dict[str, int]:
        with self.checks.timed("maintain: flush inlined data"):
            self.say("flushing inlined data into Parquet files")
            rows = self.answer_preserving("flushing inlined data", lambda: ops.flush(self.lake))
        return {f"{s}.{t}": int(n) for s, t, n in rows}

    def _merge(self) -> dict[str, dict[str, int]]:
        with self.checks.timed("maintain: merge adjacent files"):
            self.say("merging adjacent small files")
            rows = self.answer_preserving("merging adjacent files", lambda: ops.merge(self.lake))
        return {f"{s}.{t}": {"files_processed": int(p), "files_created": int(c)} for s, t, p, c in rows}

    def _expire(self) -> list[int]:
        with self.checks.timed("maintain: expire snapshots"):
            versions = self.result.versions
            self.say(f"expiring snapshots {'in ' + str(versions) if versions else 'older than ' + self.result.cutoff}")
            return ops.expire(self.lake, self.args, dry_run=False)

    def _dead_loads(self) -> list[str]:
        dead = ops.delete_dead_loads_files(self.lake, self.ep, on_delete=self.say)
        if dead:
            still = sorted(set(dead) & set(s3_objects(self.ep)))
            self.checks.equal("the dead loads' files are gone from S3", still, [])
        return dead

    def _unreferenced_left(self) -> None:
        left = unreferenced_files(self.lake, self.ep)
        self.result.unreferenced_left = {k: len(v) for k, v in left.items()}
        for kind, files in left.items():
            if files:
                self.say(
                    f"{len(files)} unreferenced file(s) left: {_LEFT_BECAUSE[kind].format(cutoff=self.result.cutoff)}"
                )

    # -- after a real run: the lake answers as before, expired is gone, every needed file is there

    def check_after(self) -> None:
        with self.checks.timed("maintain: fingerprint after"):
            fp_after = fingerprint(self.lake)
        snaps_after = snapshot_ids(self.lake)
        self._check_answers(fp_after, snaps_after)
        self._check_expired(snaps_after)
        if self.kept is not None:
            self.checks.equal(
                f"a kept older snapshot ({self.kept}) answers as before (time travel survives the merge)",
                fingerprint(self.lake, self.kept),
                self.fp_kept,
            )
        self.result.reachability = self._check_reachability(fp_after, snaps_after)
        self._check_files()

    def _check_answers(self, fp_after: dict[str, Any], snaps_after: list[int]) -> None:
        others = sorted(set(snaps_after) - set(self.snaps_before) - set(self.own))  # other writers' commits meanwhile
        self.result.other_writers_snapshots = others
        if not others:  # nobody else wrote: the whole lake's answers are as before, too
            self.checks.equal(
                "current answers unchanged: every table's rows and row-hash sum", fp_after, self.fp_before
            )
        else:
            self.say(
                f"{len(others)} snapshot(s) of other writers landed meanwhile: each of maintain's own commits was "
                "checked against the snapshot it was built on instead"
            )

    def _check_expired(self, snaps_after: list[int]) -> None:
        expired, versions = self._done.expired, self.result.versions
        self.checks.equal("expired snapshots are no longer listed", sorted(set(expired) & set(snaps_after)), [])
        if versions:
            self.checks.equal(
                "exactly the requested versions expired",
                expired,
                sorted({int(v) for v in versions} & set(self.snaps_before)),
            )
        else:
            gone = [s for s in self.snaps_before if s not in snaps_after]
            self.checks.equal("every snapshot that is gone was reported expired", gone, expired)

    def _check_reachability(self, fp_after: dict[str, Any], snaps_after: list[int]) -> dict[str, Any]:
        expired_ids, probe = self._done.expired, next(iter(fp_after), None)
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
        done = self._done
        objects_after = s3_objects(self.ep)
        needed = referenced_files(self.lake)
        self.checks.equal(
            "every file the current snapshot references is on S3", sorted(needed - set(objects_after)), []
        )
        deleted = set(done.cleaned) | set(done.orphans_deleted)
        self.checks.equal("every file reported deleted is gone from S3", sorted(deleted & set(objects_after)), [])
        self.result.deleted_from_s3 = sorted(set(self.objects_before) - set(objects_after))

    @property
    def _done(self) -> Done:
        assert self.result.done is not None  # check_after runs after operations
        return self.result.done
