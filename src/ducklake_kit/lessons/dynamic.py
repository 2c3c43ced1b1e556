"""The dynamic stage of `all`: the taxi examples in `dynamic_tables/*.sql` created (again, from scratch), one more
month loaded through PySpark, then one refresh: each table must refresh INCREMENTALLY and equal its query run in
full at the snapshot it read (EXCEPT ALL both ways); the April rows of the daily table must add up to the month's
trips read from `trips` itself; the history is shown.

The month is loaded with mode `replace`, so a second `all` changes the lake too: the first run's refresh merges
inserts, a later run's recomputes the replaced month's groups (deletes and inserts), both incremental. Each load
rewrites `zones` whole with the same rows: the refresher nets such changes out, so they touch no group."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ducklake_kit.checks import CheckRun
from ducklake_kit.dynamic_tables import ddl, manage
from ducklake_kit.dynamic_tables.metadata import Metadata
from ducklake_kit.dynamic_tables.refresh import INCREMENTAL
from ducklake_kit.lake import Lake
from ducklake_kit.platforms.base import Platform
from ducklake_kit.platforms.state import State, project_root
from ducklake_kit.taxi import flow as taxi_flow

FOLDER = (project_root() or Path.cwd()) / "dynamic_tables"
EXTRA_MONTH = "2024-04"


def examples(folder: Path = FOLDER) -> list[ddl.CreateDynamicTable]:
    """The CREATE statements of every file, in file-name order (a table is created after those it reads)."""
    out = []
    for path in sorted(folder.glob("*.sql")):
        out += [s for s in ddl.parse(path.read_text()) if isinstance(s, ddl.CreateDynamicTable)]
    return out


def run_dynamic(platform: Platform, state: State, checks: CheckRun, *, source: str, rows_per_month: int,
                folder: Path = FOLDER, on_step: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    ep = platform.endpoints()
    tables = examples(folder)
    names = [t.name for t in tables]
    with Lake(ep) as lake, Metadata(ep) as meta:
        on_step(f"dynamic: create {', '.join(names)} from {folder.name}/")
        for name in reversed(names):  # readers first
            manage.drop(lake, meta, name, if_exists=True)
        for stmt in tables:
            first = manage.create(lake, meta, stmt)
            checks.true(f"dynamic: {stmt.name} created and filled", first is not None and first.rows_inserted > 0,
                        expected="> 0 rows", actual=first.rows_inserted if first else None)
            checks.equal(f"dynamic: {stmt.name} equals its query run in full after create",
                         manage.check(lake, meta, stmt.name), (0, 0))
    on_step(f"dynamic: load {EXTRA_MONTH} through PySpark (mode replace)")
    taxi_flow.load_and_verify(platform, state, source=source, months=EXTRA_MONTH, rows_per_month=rows_per_month,
                              mode="replace", on_step=on_step, checks=checks)
    with Lake(ep) as lake, Metadata(ep) as meta:
        on_step("dynamic: refresh (upstream first), then compare each table with its full recompute")
        batch = manage.refresh_many(lake, meta, names)
        for r in batch.refreshes:
            on_step(f"dynamic: {r.name} {r.status} {r.mode or ''} +{r.rows_inserted} -{r.rows_deleted} ({r.reason})")
            # a table over another dynamic table may find that table's rows back unchanged (a month loaded again
            # with the same trips): its net change is empty, and NO_DATA is the right answer
            upstream = bool(meta.get(r.name).depends_on)
            allowed = [("SUCCEEDED", INCREMENTAL, None)] + ([("NO_DATA", None, None)] if upstream else [])
            checks.true(f"dynamic: {r.name} refreshed incrementally" + (" (or had no net change to apply)" if upstream else ""),
                        (r.status, r.mode, r.error) in allowed, expected=" or ".join(map(str, allowed)),
                        actual=(r.status, r.mode, r.error))
            checks.equal(f"dynamic: {r.name} equals its query run in full at snapshot {r.read_snapshot}",
                         manage.check(lake, meta, r.name), (0, 0))
        daily = next((n for n in names if n.endswith("daily_revenue_by_borough")), None)
        if daily is not None:
            month = lake.con.execute(
                f"SELECT sum(trips) FROM lake.{daily} WHERE strftime(pickup_date, '%Y-%m') = ?", [EXTRA_MONTH]).fetchone()
            direct = lake.con.execute(
                "SELECT count(*) FROM trips t JOIN zones z ON t.pu_location_id = z.location_id "
                "WHERE strftime(t.pickup_date, '%Y-%m') = ?", [EXTRA_MONTH]).fetchone()
            checks.equal(f"dynamic: {EXTRA_MONTH}'s trips in {daily} = the month's trips counted from trips",
                         int(month[0] or 0), int(direct[0]))
        history = {n: [(h.trigger, h.status, h.mode, h.rows_inserted, h.rows_deleted) for h in meta.history(n, 3)]
                   for n in names}
    for name, rows in history.items():
        on_step(f"dynamic: history of {name} (newest first): {rows}")
    return {"tables": names, "refreshes": [r.as_dict() for r in batch.refreshes], "history": history}
