"""The dynamic stage of `all`: the taxi examples in `dynamic_tables/*.sql` created (again, from scratch), one more
month loaded through PySpark, then one refresh: each table must refresh INCREMENTALLY (or find no net change, when
the month's trips came back the same) and equal its query run in full at the snapshot it read (EXCEPT ALL both
ways); the April rows of the daily table must add up to the month's trips read from `trips` itself; the history is
shown.

The month is loaded with mode `replace`: the first run's refresh merges its inserts into the tables' groups; a later
run loads the same trips again (new row ids, new load id), which the refresher nets out to no change, and NO_DATA is
then what the stage expects. Which of the two applies is decided independently of the refreshes: the month's trips
before and after the load, compared both ways. A load leaves `zones` as it is when the lookup file is unchanged
(taxi.load.write_zones)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ducklake_kit.checks import CheckRun
from ducklake_kit.dynamic_tables import ddl, manage
from ducklake_kit.dynamic_tables.metadata import Metadata, Refresh
from ducklake_kit.dynamic_tables.refresh import INCREMENTAL, Refresher
from ducklake_kit.lake import Lake
from ducklake_kit.lessons.result import LessonResult, lesson
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.platforms.state import project_root
from ducklake_kit.taxi import flow as taxi_flow

FOLDER = (project_root() or Path.cwd()) / "dynamic_tables"
EXTRA_MONTH = "2024-04"


def examples(folder: Path = FOLDER) -> list[ddl.CreateDynamicTable]:
    """The CREATE statements of every file, in file-name order (a table is created after those it reads)."""
    out = []
    for path in sorted(folder.glob("*.sql")):
        out += [s for s in ddl.parse(path.read_text()) if isinstance(s, ddl.CreateDynamicTable)]
    return out


@dataclass(kw_only=True)
class DynamicResult(LessonResult):
    tables: list[str]  # the examples' dynamic tables, in creation order
    refreshes: list[Refresh]  # the refresh after the extra month's load, one per table, upstream first
    history: dict[str, list[tuple]]  # per table, its last 3 refreshes: (trigger, status, mode, inserted, deleted)

    def as_dict(self) -> dict[str, Any]:
        return {"tables": self.tables, "refreshes": [r.as_dict() for r in self.refreshes], "history": self.history}


@lesson("dynamic")
def run(kit: Kit, checks: CheckRun, *, source: str, rows_per_month: int, folder: Path = FOLDER) -> DynamicResult:
    ep = kit.platform.endpoints()
    tables = examples(folder)
    names = [t.name for t in tables]
    with Lake(ep) as lake, Metadata(ep) as meta:
        kit.say(f"dynamic: create {', '.join(names)} from {folder.name}/")
        for name in reversed(names):  # readers first
            manage.drop(lake, meta, name, if_exists=True)
        for stmt in tables:
            first = manage.create(lake, meta, stmt)
            checks.true(
                f"dynamic: {stmt.name} created and filled",
                first is not None and first.rows_inserted > 0,
                expected="> 0 rows",
                actual=first.rows_inserted if first else None,
            )
            checks.equal(
                f"dynamic: {stmt.name} equals its query run in full after create",
                manage.check(lake, meta, stmt.name),
                (0, 0),
            )
        before = lake.current_snapshot()
    kit.say(f"dynamic: load {EXTRA_MONTH} through PySpark (mode replace)")
    spec = taxi_flow.LoadSpec(source=source, months=EXTRA_MONTH, rows_per_month=rows_per_month, mode="replace")
    taxi_flow.load_checked(kit, spec, checks)
    with Lake(ep) as lake, Metadata(ep) as meta:
        # what the refreshes must do, decided independently of them: the month's trips before and after the load,
        # compared whole (but for the load's own bookkeeping columns) both ways
        month = (
            f"SELECT * EXCLUDE (load_id, source_file) FROM trips {{at}} "
            f"WHERE strftime(pickup_date, '%Y-%m') = '{EXTRA_MONTH}'"
        )
        changed = lake.scalar(
            f"SELECT count(*) FROM (({month.format(at=f'AT (VERSION => {before})')}) EXCEPT ALL "
            f"({month.format(at='')}))"
        ) + lake.scalar(
            f"SELECT count(*) FROM (({month.format(at='')}) EXCEPT ALL "
            f"({month.format(at=f'AT (VERSION => {before})')}))"
        )
        kit.say(f"dynamic: {EXTRA_MONTH}'s trips differ in {changed} rows from before the load")
        kit.say("dynamic: refresh (upstream first), then compare each table with its full recompute")
        with Refresher(lake, meta, report=kit.reporter) as refresher:
            batch = manage.refresh_many(lake, meta, names, refresher=refresher)
        for r in batch.refreshes:
            kit.say(f"dynamic: {r.name} {r.status} {r.mode or ''} +{r.rows_inserted} -{r.rows_deleted} ({r.reason})")
            # the same trips loaded again (a second `all`) are no net change: NO_DATA is then the right answer; a
            # table over another dynamic table may find that table's rows back unchanged even when trips changed
            upstream = bool(meta.get(r.name).depends_on)
            if changed:
                allowed = [("SUCCEEDED", INCREMENTAL, None)] + ([("NO_DATA", None, None)] if upstream else [])
                label = "refreshed incrementally" + (" (or had no net change to apply)" if upstream else "")
            else:
                allowed, label = [("NO_DATA", None, None)], "found no net change (the same trips loaded again)"
            checks.true(
                f"dynamic: {r.name} {label}",
                (r.status, r.mode, r.error) in allowed,
                expected=" or ".join(map(str, allowed)),
                actual=(r.status, r.mode, r.error),
            )
            checks.equal(
                f"dynamic: {r.name} equals its query run in full at snapshot {r.read_snapshot}",
                manage.check(lake, meta, r.name),
                (0, 0),
            )
        daily = next((n for n in names if n.endswith("daily_revenue_by_borough")), None)
        if daily is not None:
            month = lake.con.execute(
                f"SELECT sum(trips) FROM lake.{daily} WHERE strftime(pickup_date, '%Y-%m') = ?", [EXTRA_MONTH]
            ).fetchone()
            direct = lake.con.execute(
                "SELECT count(*) FROM trips t JOIN zones z ON t.pu_location_id = z.location_id "
                "WHERE strftime(t.pickup_date, '%Y-%m') = ?",
                [EXTRA_MONTH],
            ).fetchone()
            checks.equal(
                f"dynamic: {EXTRA_MONTH}'s trips in {daily} = the month's trips counted from trips",
                int(month[0] or 0),
                int(direct[0]),
            )
        history = {
            n: [(h.trigger, h.status, h.mode, h.rows_inserted, h.rows_deleted) for h in meta.history(n, 3)]
            for n in names
        }
    for name, rows in history.items():
        kit.say(f"dynamic: history of {name} (newest first): {rows}")
    return DynamicResult(tables=names, refreshes=batch.refreshes, history=history)
