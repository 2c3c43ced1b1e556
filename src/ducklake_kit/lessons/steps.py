"""The steps stage of `all`: `steps/distributed_loop.yaml` run by the step runner on the worker plane, its results
checked against the lake read here: every batch id inserted exactly once, each row written by the worker the runner
says ran its iteration, async iterations spread over the workers, and the reported catalog_info equal to the
catalog's own record of that snapshot."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ducklake_kit.checks import CheckRun
from ducklake_kit.lake import Lake
from ducklake_kit.lessons.result import LessonResult, lesson
from ducklake_kit.lessons.workers import PLANE_OFF, plane_for
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.platforms.state import project_root
from ducklake_kit.steps import runner

PLAYBOOK = (project_root() or Path.cwd()) / "steps" / "distributed_loop.yaml"
BATCH_IDS = list(range(1, 9))


@dataclass(kw_only=True)
class StepsResult(LessonResult):
    playbook: str = ""
    execution_id: str | None = None
    statuses: list[str] = field(default_factory=list)  # each step's status, in order
    iterations: int = 0  # of the async loop, each checked against the row it wrote
    workers: list[str] = field(default_factory=list)  # the workers the iterations ran on
    run_seconds: float | None = None  # the runner's own time for the playbook (`seconds` is the whole lesson's)
    skipped: str | None = None  # why the lesson's checks were skipped (PLANE_OFF)

    def as_dict(self) -> dict[str, Any]:
        if self.skipped:
            return {"skipped": self.skipped}
        return {
            "playbook": self.playbook,
            "execution_id": self.execution_id,
            "steps": self.statuses,
            "iterations": self.iterations,
            "workers": self.workers,
            "seconds": self.run_seconds,
        }


@lesson("steps")
def run(kit: Kit, checks: CheckRun, *, path: Path = PLAYBOOK) -> StepsResult:
    ep = kit.platform.endpoints()
    status = plane_for(kit, "steps")
    if status is None:
        return StepsResult(skipped=PLANE_OFF)
    kit.say(f"steps: {path.name} on the worker plane ({', '.join(w.name for w in status.workers)})")
    overrides = {"batch_ids": BATCH_IDS}
    playbook = runner.load(path, overrides)
    done = runner.run_file(
        playbook,
        kit,
        scheduler=status.address,
        overrides=overrides,
        on_event=lambda kind, d: kit.say(f"steps: step {d['step']}") if kind == "step" else None,
    )
    checks.equal(
        "steps: every step of the playbook ran and succeeded",
        {s.step: (s.error.line() if s.error else s.status) for s in done.steps},
        dict.fromkeys(playbook.steps, "ok"),
    )
    loop = next((s for s in done.steps if s.iterations is not None), None)
    ran_on = {it.element: it.worker for it in (loop.iterations if loop else [])}
    with Lake(ep) as lake:
        rows = lake.con.execute("SELECT batch_id, worker_id FROM processed_batches ORDER BY batch_id").fetchall()
        checks.equal(
            "steps: every batch id inserted exactly once (read back from the lake)", [r[0] for r in rows], BATCH_IDS
        )
        checks.equal(
            "steps: each row was written by the worker the runner reports for its iteration",
            {r[0]: r[1] for r in rows},
            ran_on,
        )
        if len(status.workers) > 1:
            checks.true(
                "steps: the async loop's iterations ran on more than one worker",
                len(set(ran_on.values())) > 1,
                expected="> 1 worker",
                actual=sorted(set(ran_on.values())),
            )
        info = done.steps[-1].catalog_info or {}
        latest = info.get("latest_snapshot") or {}
        row = lake.con.execute(
            "SELECT snapshot_id, commit_message FROM ducklake_snapshots('lake') WHERE snapshot_id = ?",
            [latest.get("snapshot_id")],
        ).fetchone()
        checks.equal(
            "steps: the reported catalog_info is the catalog's own record of that snapshot",
            (latest.get("snapshot_id"), latest.get("commit_message")),
            tuple(row) if row else None,
        )
        checks.true(
            "steps: catalog_info counts every snapshot (not capped at 5)",
            info.get("snapshot_count")
            == lake.scalar(
                "SELECT count(*) FROM ducklake_snapshots('lake') WHERE snapshot_id <= ?", [latest.get("snapshot_id")]
            ),
            expected="the catalog's count",
            actual=info.get("snapshot_count"),
        )
    return StepsResult(
        playbook=str(path),
        execution_id=done.execution_id,
        statuses=[s.status for s in done.steps],
        iterations=len(ran_on),
        workers=sorted(set(ran_on.values())),
        run_seconds=done.seconds,
    )
