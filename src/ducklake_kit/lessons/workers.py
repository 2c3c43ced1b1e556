"""The worker plane's stage of `all`: the workers share one lake, each keeps its own worker-local tables.

1. `up` of the plane (the kit's own, or --scheduler): at least two workers, each with the lake attached (after
   `up --workers 0` the stage is skipped and says so).
2. The trips counted per month, one task per month, all submitted at once so they spread over the workers; their
   sum equals the count one connection of this process reads (an independent reader of the same snapshot).
3. A worker-local table made on the first worker is there for the next task on that worker and on no other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ducklake_kit.checks import CheckRun
from ducklake_kit.lake import Lake
from ducklake_kit.lessons.result import LessonResult, lesson
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.workers import WorkerPlane
from ducklake_kit.workers import plane as plane_mod
from ducklake_kit.workers.client import name_order
from ducklake_kit.workers.plane import PlaneStatus

LOCAL_TABLE = "local.kit_check"
PLANE_OFF = "the worker plane is off (`up --workers 0`)"  # a stage's result when its checks were skipped for that


def plane_for(kit: Kit, stage: str) -> PlaneStatus | None:
    """The worker plane for a stage of `all` (`up`: the kit's own, or --scheduler); None, said to the reporter, when
    the user turned it off (`up --workers 0`): the stage's checks are skipped, which is not a failure."""
    status = plane_mod.up(kit.state, kit.platform.endpoints(), None, kit.scheduler)
    if status.off:
        kit.say(f"{stage}: {status.detail}; its checks are skipped")
        return None
    return status


@dataclass(kw_only=True)
class WorkersResult(LessonResult):
    workers: list[str] = field(default_factory=list)  # the plane's workers, w1 first
    tasks: int | None = None  # the per-month tasks run (None: fewer than two workers, nothing submitted)
    ran_on: list[str] = field(default_factory=list)  # the workers those tasks ran on
    skipped: str | None = None  # why the lesson's checks were skipped (PLANE_OFF)

    def as_dict(self) -> dict[str, Any]:
        if self.skipped:
            return {"workers": self.workers, "skipped": self.skipped}
        if self.tasks is None:
            return {"workers": self.workers}
        return {"workers": self.workers, "tasks": self.tasks, "ran_on": self.ran_on}


@lesson("workers")
def run(kit: Kit, checks: CheckRun) -> WorkersResult:
    ep = kit.platform.endpoints()
    kit.say("worker plane: the scheduler and the workers, each with the lake attached")
    status = plane_for(kit, "worker plane")
    if status is None:
        return WorkersResult(skipped=PLANE_OFF)
    names = sorted((w.name for w in status.workers), key=name_order)
    checks.true(
        "workers: at least two workers, each with the lake attached",
        status.healthy and len(names) >= 2,
        expected="healthy, >= 2 workers",
        actual=status.detail,
    )
    if len(names) < 2:
        return WorkersResult(workers=names)
    with Lake(ep) as lake:
        snapshot = lake.current_snapshot()
        months = [
            m
            for (m,) in lake.con.execute(
                f"SELECT DISTINCT pickup_month FROM trips AT (VERSION => {snapshot}) ORDER BY 1"
            ).fetchall()
        ]
        total = lake.scalar(f"SELECT count(*) FROM trips AT (VERSION => {snapshot})")
    with WorkerPlane(status.address, ep) as wp:
        kit.say(f"worker plane: the trips counted per month, {len(months)} tasks on {len(names)} workers")
        futures = [
            wp.submit(f"SELECT count(*) FROM trips AT (VERSION => {snapshot}) WHERE pickup_month = {m}") for m in months
        ]
        results = [wp.result(f) for f in futures]
        failed = [r.error.line() for r in results if not r.ok]
        checks.equal("workers: every per-month task succeeded", failed, [])
        counted = sum(r.rows[0][0] for r in results if r.ok)
        checks.equal("workers: the per-month counts sum to the lake's count", counted, total)
        ran_on = sorted({r.worker for r in results}, key=name_order)
        kit.say(f"worker plane: a worker-local table on {names[0]}, looked for on every worker")
        made = wp.run(
            [f"CREATE OR REPLACE TABLE {LOCAL_TABLE} AS SELECT {total} AS trips", f"SELECT trips FROM {LOCAL_TABLE}"],
            worker=names[0],
        )
        checks.equal(
            f"workers: {LOCAL_TABLE} made on {names[0]} is there for its next task",
            wp.run(f"SELECT trips FROM {LOCAL_TABLE}", worker=names[0]).rows if made.ok else made.error.line(),
            [(total,)],
        )
        # on every other worker the same query must fail because the table does not exist there (not for any reason)
        elsewhere = {n: wp.run(f"SELECT 1 FROM {LOCAL_TABLE}", worker=n) for n in names[1:]}
        answers = {
            n: "does not exist"
            if not r.ok and "does not exist" in r.error.error
            else (r.error.line() if r.error else r.rows)
            for n, r in elsewhere.items()
        }
        checks.equal(
            f"workers: {LOCAL_TABLE} does not exist on the other workers",
            answers,
            dict.fromkeys(names[1:], "does not exist"),
        )
        wp.run(f"DROP TABLE {LOCAL_TABLE}", worker=names[0])
    return WorkersResult(workers=names, tasks=len(results), ran_on=ran_on)
