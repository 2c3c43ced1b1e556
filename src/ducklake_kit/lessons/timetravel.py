"""The time-travel and change-feed lesson (`timetravel`), re-runnable and checked.

It lives in its own schema, `lake.timetravel`, dropped and rebuilt at the start, so every run tells the same
story and `main` is never touched:

1. load month 1 (the PySpark load: one snapshot)
2. load month 2 (one more snapshot)
3. a correction, in one transaction (one snapshot): a new quality rule says a trip with `trip_distance = 0`
   went nowhere (a meter test, a cancelled ride, a driver who never started the trip meter). The load
   accepts those rows (a zero distance breaks no load rule), so the correction DELETEs them from `trips`.
4. restore the table to the snapshot before the correction (one snapshot), by re-inserting the rows the
   correction deleted, read back from the change feed. Chosen over `CREATE OR REPLACE TABLE ... AS SELECT *
   ... AT (VERSION => n)` because it keeps the table itself: the same table id, its partitioning, its
   history and change feed go on, and only the deleted rows are written (not the whole table again).

Then every figure shown is computed from the lake and compared with a value computed another way:
counts per snapshot from the loads' own results (each load is checked against its raw file first), the
number of zero-distance trips from the raw files in the `raw` bucket, the DELETE's and INSERT's affected-row
counts, and the restored table against the earlier version row for row (EXCEPT ALL both ways).

DuckLake semantics this lesson shows (checked by experiment on DuckDB 1.5.5 / ducklake 1.5.5):
- `ducklake_table_changes(catalog, schema, table, start, end)` includes BOTH ends: (n, n) is snapshot n's
  own changes, and (month 2, correction) holds month 2's inserts as well as the correction's deletes.
- `AT (TIMESTAMP => ts)` reads the latest snapshot committed at or before ts.
- `AT (VERSION => n)` before the table existed fails with a catalog error ("does not exist").
- Re-inserted rows get new row ids: the restored table equals the earlier version in content, not in rowid.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import duckdb

from ducklake_kit.checks import CheckRun
from ducklake_kit.errors import KitError, first_line
from ducklake_kit.lake import Lake
from ducklake_kit.lake.changes import change_counts, changes_sql
from ducklake_kit.lake.sql import schema_exists
from ducklake_kit.lake.transactions import commit
from ducklake_kit.lessons import LESSON_ROWS_PER_MONTH
from ducklake_kit.lessons.result import LessonResult, lesson
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.taxi import sources
from ducklake_kit.taxi.flow import SPARK_LOG
from ducklake_kit.taxi.load import QUARANTINE, TRIPS, LoadInput, LoadResult, run_load
from ducklake_kit.taxi.verify import verify_file

SCHEMA = "timetravel"
MONTHS = ((2024, 1), (2024, 2))
SEED = 0
ROWS_PER_MONTH = LESSON_ROWS_PER_MONTH
RULE = "trip_distance = 0"  # the correction: trips that went nowhere
RULE_WHY = "a trip with zero distance went nowhere (meter test or cancelled ride): not a trip for the statistics"
CORRECTION_MESSAGE = f"timetravel: delete trips where {RULE}"
RESTORE_MESSAGE = "timetravel: restore trips to the snapshot before the correction (re-insert the deleted rows)"
TABLE = f"{SCHEMA}.{TRIPS}"


@dataclass
class Story:
    """What the lesson did and what it expects, each expectation computed independently of the figure it checks."""

    before: int  # the latest snapshot before month 1 (the schema does not exist there)
    month1: int
    month2: int
    correction: int
    restore: int
    accepted: list[int]  # trips accepted by each month's load, from the load's own result
    zero_distance: int  # from the raw files: zero-distance rows minus those the load quarantined
    deleted: int  # the DELETE's affected rows
    reinserted: int  # the restoring INSERT's affected rows
    load_ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _reset(lake: Lake) -> None:
    """Drop the lesson's schema (one snapshot) so a re-run starts from the same place; `main` is not touched."""
    if schema_exists(lake.con, lake.alias, SCHEMA):
        lake.con.execute(f"DROP SCHEMA {SCHEMA} CASCADE")


def _one_transaction(lake: Lake, sql: str, message: str) -> tuple[int, int]:
    """One DML statement and its commit message in one transaction: (affected rows, the snapshot it made)."""
    done = commit(lake, sql, message)
    if done.snapshot_id is None:
        raise KitError(f"`{message}` made no snapshot", "this is a bug: the lesson's data always has rows to change")
    return done.affected_rows, done.snapshot_id


def _zero_distance_from_raw(lake: Lake, loads: list[LoadResult]) -> int:
    """Zero-distance trips the lake should hold, computed from the raw files (not from `trips`): the raw
    objects' zero-distance rows minus those the load routed to quarantine (every raw row is in exactly one
    of the two tables: `verify_file` checks that)."""
    total = 0
    for load in loads:
        for fr in load.files:
            raw = lake.scalar(f"SELECT count(*) FROM read_parquet(?) WHERE {RULE}", [fr.raw_uri])
            quarantined = lake.scalar(
                f"SELECT count(*) FROM {SCHEMA}.{QUARANTINE} WHERE load_id = ? AND source_file = ? AND {RULE}",
                [load.load_id, fr.source.path.name],
            )
            total += int(raw) - int(quarantined)
    return total


def build_story(kit: Kit, checks: CheckRun, *, rows_per_month: int = ROWS_PER_MONTH, seed: int = SEED) -> Story:
    """Steps 1-4: reset the schema, two loads, the correction, the restore. Checks each load against its raw file."""
    ep, state, say = kit.platform.endpoints(), kit.state, kit.say
    cache = state.cache_dir
    files = sources.synthetic_files(cache, list(MONTHS), rows_per_month, seed)
    zones_path, zones_note = sources.zone_lookup(cache)
    with Lake(ep) as lake:
        say(f"dropping the schema `{SCHEMA}` so the lesson starts from scratch (`main` is untouched)")
        _reset(lake)
        before = lake.current_snapshot()

    loads: list[LoadResult] = []
    for f in files:
        say(f"loading {f.period} into {TABLE} (one snapshot)")
        with checks.timed(f"timetravel: load {f.period}"):
            loads.append(
                run_load(
                    kit,
                    LoadInput([f], zones_path, zones_note, f"timetravel lesson {f.period}"),
                    mode="replace",
                    schema_name=SCHEMA,
                    spark_log=state.log_dir / SPARK_LOG,
                )
            )
    with Lake(ep) as lake:
        lake.con.execute(f"USE {lake.alias}.{SCHEMA}")  # verify_file reads `trips`/`quarantine` unqualified
        try:
            for load in loads:
                for fr in load.files:
                    verify_file(lake, fr, load.load_id, checks)
        finally:
            lake.con.execute(f"USE {lake.alias}")
        zero = _zero_distance_from_raw(lake, loads)

        say(f"correction in one transaction: DELETE FROM {TABLE} WHERE {RULE}")
        deleted, correction = _one_transaction(lake, f"DELETE FROM {TABLE} WHERE {RULE}", CORRECTION_MESSAGE)
        say("restore: re-insert the rows the correction deleted, read from the change feed")
        reinserted, restore = _one_transaction(
            lake,
            f"INSERT INTO {TABLE} SELECT * EXCLUDE (snapshot_id, rowid, change_type) "
            f"FROM {changes_sql(lake, TABLE, correction, correction)} "
            "WHERE change_type = 'delete'",
            RESTORE_MESSAGE,
        )
    if any(load.snapshot_id is None for load in loads):
        raise KitError("a lesson load made no snapshot", "this is a bug: the schema was dropped, so every month is new")
    return Story(
        before=before,
        month1=int(loads[0].snapshot_id),
        month2=int(loads[1].snapshot_id),
        correction=correction,
        restore=restore,
        accepted=[sum(fr.rows_accepted for fr in load.files) for load in loads],
        zero_distance=zero,
        deleted=deleted,
        reinserted=reinserted,
        load_ids=[load.load_id for load in loads],
    )


def _changes(lake: Lake, start: int, end: int) -> dict[str, int]:
    return change_counts(lake, TABLE, start, end)


def _count_at(lake: Lake, version: int) -> int:
    return int(lake.scalar(f"SELECT count(*) FROM {TABLE} AT (VERSION => {int(version)})"))


@dataclass(kw_only=True)
class TimetravelResult(LessonResult):
    """The figures shown, every one of them through a check; the lists hold the rows `timetravel` renders."""

    story: Story
    snapshots: list[dict[str, Any]]  # the lesson's snapshots: step, snapshot_id, snapshot_time, commit_message, changes
    counts_at_version: list[dict[str, Any]]  # step, snapshot_id, trips
    at_timestamp: dict[str, Any]  # timestamp, trips, reads_snapshot ({} when the commits' times were not listed)
    changes: list[dict[str, Any]]  # from, to, and the change feed's counts per change_type
    restore: dict[str, Any]  # method, to_version, rows_reinserted, extra_rows, missing_rows, trips_now

    @property
    def versions(self) -> list[int]:
        """The snapshots of the story's four steps: month 1, month 2, the correction, the restore."""
        s = self.story
        return [s.month1, s.month2, s.correction, s.restore]

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "rule": RULE,
            "rule_why": RULE_WHY,
            "snapshots": self.snapshots,
            "counts_at_version": self.counts_at_version,
            "at_timestamp": self.at_timestamp,
            "changes": self.changes,
            "restore": self.restore,
            "story": self.story.as_dict(),
        }


def check_story(lake: Lake, story: Story, checks: CheckRun) -> TimetravelResult:
    """Show and check: snapshots, counts per version, a timestamp query, the change feed, the restore.
    Returns the figures for rendering; every one of them went through a check."""
    s = story
    steps = {"month 1": s.month1, "month 2": s.month2, "correction": s.correction, "restore": s.restore}
    m1, m2 = s.accepted
    expected_counts = {s.month1: m1, s.month2: m1 + m2, s.correction: m1 + m2 - s.zero_distance, s.restore: m1 + m2}

    # -- the correction and the restore did what they said
    checks.equal(
        f"the correction deleted every zero-distance trip (raw files: {s.zero_distance})", s.deleted, s.zero_distance
    )
    checks.true(
        "the lesson has something to correct (some zero-distance trips)", s.zero_distance > 0, actual=s.zero_distance
    )
    checks.equal("the restore re-inserted the deleted rows", s.reinserted, s.deleted)

    # -- ducklake_snapshots: the lesson's snapshots, one per step, with their commit messages
    rows = lake.con.execute(
        "SELECT snapshot_id, snapshot_time, commit_message, changes FROM ducklake_snapshots(?) "
        "WHERE snapshot_id > ? AND snapshot_id <= ? ORDER BY snapshot_id",
        [lake.alias, s.before, s.restore],
    ).fetchall()
    snapshots = [
        {
            "step": next((k for k, v in steps.items() if v == r[0]), "?"),
            "snapshot_id": r[0],
            "snapshot_time": r[1].isoformat(),
            "commit_message": r[2],
            "changes": r[3],
        }
        for r in rows
    ]
    checks.equal(
        "ducklake_snapshots: one snapshot per step, nothing in between",
        [r[0] for r in rows],
        list(range(s.before + 1, s.before + 5)),
    )
    checks.equal("ducklake_snapshots: the steps in order", [r[0] for r in rows], list(steps.values()))
    messages = {r[0]: r[2] or "" for r in rows}
    checks.equal(
        "commit messages name each step",
        [
            messages.get(s.month1, "").startswith(f"load {s.load_ids[0]}"),
            messages.get(s.month2, "").startswith(f"load {s.load_ids[1]}"),
            messages.get(s.correction),
            messages.get(s.restore),
        ],
        [True, True, CORRECTION_MESSAGE, RESTORE_MESSAGE],
    )
    times = {r[0]: r[1] for r in rows}

    # -- AT (VERSION => n) for each snapshot
    counts = {}
    for step, version in steps.items():
        counts[step] = _count_at(lake, version)
        checks.equal(f"AT (VERSION => {version}) [{step}]: trips", counts[step], expected_counts[version])
    try:
        _count_at(lake, s.before)
        before_error = ""
    except duckdb.Error as exc:
        before_error = first_line(exc)
    checks.true(
        f"AT (VERSION => {s.before}) [before month 1]: the table does not exist yet",
        "does not exist" in before_error,
        expected="an error saying the table does not exist",
        actual=before_error or "no error",
    )

    # -- AT (TIMESTAMP => ...) halfway between month 1's and month 2's commits reads month 1's snapshot
    t1, t2 = times.get(s.month1), times.get(s.month2)
    at_time: dict[str, Any] = {}
    if t1 is not None and t2 is not None:
        midway: datetime = t1 + (t2 - t1) / 2
        checks.true(
            "the timestamp lies strictly between the two loads' commits", t1 < midway < t2, actual=midway.isoformat()
        )
        n = int(lake.scalar(f"SELECT count(*) FROM {TABLE} AT (TIMESTAMP => ?::TIMESTAMPTZ)", [midway]))
        checks.equal(f"AT (TIMESTAMP => {midway.isoformat()}): trips as of month 1", n, m1)
        at_time = {"timestamp": midway.isoformat(), "trips": n, "reads_snapshot": s.month1}

    # -- the change feed: its range includes its start snapshot
    only_correction = _changes(lake, s.correction, s.correction)
    checks.equal(
        f"ducklake_table_changes({s.correction}, {s.correction}): the correction's own changes",
        only_correction,
        {"delete": s.zero_distance},
    )
    month2_to_correction = _changes(lake, s.month2, s.correction)
    checks.equal(
        f"ducklake_table_changes({s.month2}, {s.correction}): includes its start, month 2's inserts",
        month2_to_correction,
        {"delete": s.zero_distance, "insert": m2},
    )
    not_zero = lake.scalar(
        f"SELECT count(*) FROM {changes_sql(lake, TABLE, s.correction, s.correction)} "
        f"WHERE change_type = 'delete' AND NOT ({RULE})"
    )
    checks.equal("every deleted row breaks the rule", not_zero, 0)
    restore_changes = _changes(lake, s.restore, s.restore)
    checks.equal(
        f"ducklake_table_changes({s.restore}, {s.restore}): the restore inserted the deleted rows",
        restore_changes,
        {"insert": s.zero_distance},
    )

    # -- the restored table equals the version before the correction, row for row (multiset, both ways)
    extra = lake.scalar(f"SELECT count(*) FROM (FROM {TABLE} EXCEPT ALL FROM {TABLE} AT (VERSION => {s.month2}))")
    missing = lake.scalar(f"SELECT count(*) FROM (FROM {TABLE} AT (VERSION => {s.month2}) EXCEPT ALL FROM {TABLE})")
    checks.equal(f"restored table EXCEPT ALL version {s.month2}: no extra rows", extra, 0)
    checks.equal(f"version {s.month2} EXCEPT ALL restored table: no missing rows", missing, 0)
    current = int(lake.scalar(f"SELECT count(*) FROM {TABLE}"))
    checks.equal("current trips == month 1 + month 2", current, m1 + m2)

    return TimetravelResult(
        story=s,
        snapshots=snapshots,
        counts_at_version=[{"step": k, "snapshot_id": v, "trips": counts[k]} for k, v in steps.items()],
        at_timestamp=at_time,
        changes=[
            {"from": s.correction, "to": s.correction, **only_correction},
            {"from": s.month2, "to": s.correction, **month2_to_correction},
            {"from": s.restore, "to": s.restore, **restore_changes},
        ],
        restore={
            "method": "re-insert the deleted rows from the change feed",
            "to_version": s.month2,
            "rows_reinserted": s.reinserted,
            "extra_rows": extra,
            "missing_rows": missing,
            "trips_now": current,
        },
    )


@lesson("timetravel")
def run(kit: Kit, checks: CheckRun, *, rows_per_month: int = ROWS_PER_MONTH, seed: int = SEED) -> TimetravelResult:
    """Steps 1-4 (`build_story`), then every figure shown and checked (`check_story`)."""
    story = build_story(kit, checks, rows_per_month=rows_per_month, seed=seed)
    with checks.timed("timetravel: checks"), Lake(kit.platform.endpoints()) as lake:
        return check_story(lake, story, checks)
