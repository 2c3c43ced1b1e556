"""The pipeline stage of `all`: `pipelines/taxi_marts.sql` run as a DAG on the worker plane, every mart checked
against the same figure computed here directly from `trips` and `zones` (written differently: correlated lookups
instead of joins, EXISTS instead of IN), the worker-local step on its worker, and the lineage recorded. The first
run rebuilds every node (`force`: that is the lesson); a second, change-aware run right after it leaves every node
unchanged, since neither the file nor the tables it reads changed.

A mart and its direct computation are compared whole, both ways (`EXCEPT ALL`), at one snapshot; money is DECIMAL,
so equal means equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ducklake_kit.checks import CheckRun
from ducklake_kit.lake import Lake
from ducklake_kit.lessons.result import LessonResult, lesson
from ducklake_kit.lessons.workers import PLANE_OFF, plane_for
from ducklake_kit.pipelines import dag, flow
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.platforms.state import project_root

PIPELINE_FILE = (project_root() or Path.cwd()) / "pipelines" / "taxi_marts.sql"


def direct_queries(trips: str, zones: str) -> dict[str, str]:
    """Each mart, and the same figure computed directly from `trips` and `zones` (table expressions that take an
    alias, e.g. `(SELECT * FROM trips AT (VERSION => 7))`)."""
    airport = (
        f"EXISTS (SELECT 1 FROM {zones} z WHERE z.location_id IN (t.pu_location_id, t.do_location_id) "
        "AND z.service_zone IN ('Airports', 'EWR'))"
    )
    borough = f"(SELECT z.borough FROM {zones} z WHERE z.location_id = t.pu_location_id)"

    def name(col: str) -> str:
        return f"(SELECT z.borough || ' / ' || z.zone FROM {zones} z WHERE z.location_id = t.{col})"

    def known(col: str) -> str:
        return f"t.{col} IN (SELECT location_id FROM {zones})"

    return {
        "marts.daily_revenue": f"""
            SELECT t.pickup_date, {borough} AS borough, count(*), sum(t.total_amount::DECIMAL(18, 2))
            FROM {trips} t WHERE {known("pu_location_id")} GROUP BY 1, 2""",
        "marts.hourly_demand": f"""
            SELECT pickup_weekday, pickup_hour, count(*), sum(trip_duration_s) FROM {trips} GROUP BY 1, 2""",
        "marts.airport_trips": f"""
            SELECT t.pu_borough, t.pickup_date, count(*), sum(t.fare_amount::DECIMAL(18, 2))
            FROM {trips} t WHERE {airport} GROUP BY 1, 2""",
        "marts.zone_flows": f"""
            SELECT {name("pu_location_id")}, {name("do_location_id")}, count(*) FROM {trips} t
            WHERE {known("pu_location_id")} AND {known("do_location_id")} GROUP BY 1, 2""",
        "marts.borough_summary": f"""
            WITH per AS (
                SELECT {borough} AS borough, count(*) AS trips, sum(t.total_amount::DECIMAL(18, 2)) AS revenue
                FROM {trips} t WHERE {known("pu_location_id")} GROUP BY 1),
            air AS (SELECT t.pu_borough AS borough, count(*) AS n FROM {trips} t WHERE {airport} GROUP BY 1)
            SELECT per.borough, per.trips, per.revenue, coalesce(air.n, 0), round(coalesce(air.n, 0) / per.trips, 4)
            FROM per LEFT JOIN air ON air.borough IS NOT DISTINCT FROM per.borough""",
    }


def differences(lake: Lake, mart: str, direct_at: str, snapshot: int) -> tuple[int, int, int]:
    """(rows in the mart, rows only in the mart, rows only in the direct computation), both read at `snapshot`."""
    pinned = f"{mart} AT (VERSION => {snapshot})"
    rows = lake.scalar(f"SELECT count(*) FROM {pinned}")
    only_mart = lake.scalar(f"SELECT count(*) FROM (SELECT * FROM {pinned} EXCEPT ALL ({direct_at}))")
    only_direct = lake.scalar(f"SELECT count(*) FROM (({direct_at}) EXCEPT ALL SELECT * FROM {pinned})")
    return rows, only_mart, only_direct


@dataclass(kw_only=True)
class PipelineResult(LessonResult):
    run_id: str | None = None
    nodes: dict[str, str] = field(default_factory=dict)  # node id -> status
    rows: dict[str, int] = field(default_factory=dict)  # mart -> rows, each checked against its direct computation
    history_snapshot: int | None = None  # the snapshot that recorded the run's history
    skipped: str | None = None  # why the lesson's checks were skipped (PLANE_OFF)

    def as_dict(self) -> dict[str, Any]:
        if self.skipped:
            return {"skipped": self.skipped}
        return {
            "run_id": self.run_id,
            "nodes": self.nodes,
            "rows": self.rows,
            "history_snapshot": self.history_snapshot,
        }


@lesson("pipeline")
def run(kit: Kit, checks: CheckRun, *, path: Path = PIPELINE_FILE) -> PipelineResult:
    ep = kit.platform.endpoints()
    status = plane_for(kit, "pipeline")
    if status is None:
        return PipelineResult(skipped=PLANE_OFF)
    kit.say(f"pipeline: {path.name} on the worker plane ({', '.join(w.name for w in status.workers)})")
    say = lambda kind, n: kit.say(f"pipeline: node {n.id} {'started' if kind == 'start' else n.status}")  # noqa: E731
    outcome = flow.run(
        path, status.address, ep, flow.Options(force=True), platform_name=kit.platform.name, on_event=say
    )
    done = outcome.run
    checks.equal(
        "pipeline: every node ran and succeeded",
        {n.id: n.error or n.status for n in done.nodes},
        dict.fromkeys(dag.load(path).nodes, "ok"),
    )
    nodes = {n.id: n for n in done.nodes}
    checks.equal(
        "pipeline: the worker-local steps and the node that reads their table ran on w1",
        [nodes[n].worker if n in nodes else None for n in ("zone_names", "zone_flows", "drop_zone_names")],
        ["w1", "w1", "w1"],
    )
    figures: dict[str, int] = {}
    with Lake(ep) as lake:
        snapshot = lake.current_snapshot()
        # a table read AT a version takes no alias: pinned through a subquery
        direct = direct_queries(
            f"(SELECT * FROM trips AT (VERSION => {snapshot}))", f"(SELECT * FROM zones AT (VERSION => {snapshot}))"
        )
        for mart, query in direct.items():
            rows, only_mart, only_direct = differences(lake, mart, query, snapshot)
            checks.equal(
                f"pipeline: {mart} equals the same figure computed from trips ({rows} rows, both ways)",
                (rows > 0, only_mart, only_direct),
                (True, 0, 0),
            )
            figures[mart] = rows
        parents = {
            r[0]
            for r in lake.con.execute(
                "SELECT parent FROM lineage_tables WHERE pipeline = ? AND child = 'marts.borough_summary'",
                [done.pipeline],
            ).fetchall()
        }
        checks.equal(
            "pipeline: lineage of marts.borough_summary names the two marts it joins",
            parents,
            {"marts.daily_revenue", "marts.airport_trips"},
        )
    again = flow.run(path, status.address, ep, platform_name=kit.platform.name, on_event=say).run
    checks.equal(
        "pipeline: a second run right after leaves every node unchanged (same SQL, same input snapshots)",
        {n.id: n.error or n.status for n in again.nodes},
        dict.fromkeys(dag.load(path).nodes, "unchanged"),
    )
    return PipelineResult(
        run_id=done.run_id,
        nodes={n.id: n.status for n in done.nodes},
        rows=figures,
        history_snapshot=outcome.history_snapshot,
    )
