"""`bench --suite steps`: the seed's benchmark through the step runner, beside the same inserts without it.

The runner: `steps/bench_inserts.yaml`, a loop of N one-row INSERTs (`mode: async`, one iteration per worker at a
time) on W workers. Its total is the loop's wall time as the runner saw it, from its first iteration submitted to
its last result read (rendering, submitting, the workers' INSERTs, reading each result); median and p95 are per iteration, as each worker timed it; errors are failed
iterations; rows lost and duplicated are counted in the table afterwards (every iteration inserts its own `i`).

The direct bench of the same shape, in the same run: the concurrency suite's `ducklake` mode (W processes, each
with its own lake connection, ceil(N / W) INSERTs each, no runner and no Dask), its total scaled to N inserts; the
goal compares the runner's total with it. Its `workers` mode (the same inserts as one task per writer on the worker
plane, no runner) is shown beside them, to tell the runner's cost from the plane's.
The seed reported 28 s total and 280 ms median for 100 inserts over 3 workers.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ducklake_kit.bench.concurrency import WriterTuning, bench_concurrency
from ducklake_kit.bench.results import BENCH_SCHEMA, Machine, load_average, write_outputs
from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.platforms.state import project_root
from ducklake_kit.steps import runner
from ducklake_kit.workers import plane as plane_mod

PLAYBOOK = (project_root() or Path.cwd()) / "steps" / "bench_inserts.yaml"
GOAL_VS_DIRECT = 1.3  # the runner's total over the direct bench's, for the same number of inserts
SEED = {"total_s": 28.0, "median_ms": 280.0}  # the seed's figures for 100 inserts over 3 workers


@dataclass
class RunnerFigures:
    iterations: int
    workers_used: list[str]
    total_s: float  # the loop's wall time: its first iteration submitted to its last result read
    playbook_s: float  # the whole playbook: the table's creation and the count included
    median_ms: float | None
    p95_ms: float | None
    errors: int
    rows_counted: int
    rows_lost: int
    duplicate_rows: int


@dataclass
class StepsBench:
    workers: int
    machine: Machine
    runner: RunnerFigures
    direct_inserts: int
    direct_total_s: float
    direct_total_scaled_s: float  # scaled to the runner's number of inserts
    direct_median_ms: float | None
    direct_errors: int
    direct_rows_lost: int
    ratio_vs_direct: float
    # the same inserts as worker plane tasks without the runner: one task per writer doing all of its inserts
    plane_total_scaled_s: float | None = None
    plane_median_ms: float | None = None
    plane_errors: int | None = None
    plane_rows_lost: int | None = None
    goal_vs_direct: float = GOAL_VS_DIRECT
    seed: dict[str, float] | None = None

    @property
    def goal_met(self) -> bool:
        r = self.runner
        return r.errors == 0 and r.rows_lost == 0 and r.duplicate_rows == 0 and self.ratio_vs_direct <= GOAL_VS_DIRECT

    def defect(self) -> str | None:
        """The correctness claim (not the speed goal): every insert reported and counted exactly once."""
        r = self.runner
        if r.errors or r.rows_lost or r.duplicate_rows:
            return (
                f"the runner's loop had {r.errors} error(s), {r.rows_lost} row(s) lost, {r.duplicate_rows} duplicated"
            )
        return None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"goal_met": self.goal_met, "seed": SEED}


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def bench_steps(
    kit: Kit,
    *,
    workers: int = 3,
    iterations: int = 100,
    json_path: Path | None = None,
) -> StepsBench:
    if workers < 1 or iterations < 1:
        raise KitError("--workers and --ops must be at least 1", "e.g. --workers 3 --ops 100")
    ep, state, say = kit.platform.endpoints(), kit.state, kit.say
    load_before = load_average()
    with plane_mod.borrowed(state, ep, workers, kit.scheduler) as status:
        say(f"the step runner: {PLAYBOOK.name}, {iterations} iterations on {len(status.workers)} workers")
        run = runner.run_file(PLAYBOOK, kit, scheduler=status.address, overrides={"iterations": iterations})
    loop = next((s for s in run.steps if s.iterations is not None), None)
    if loop is None:  # the playbook failed before its loop (the table could not be made)
        first = next((s for s in run.steps if s.error), None)
        raise KitError(
            f"the benchmark's playbook failed before its loop ({first.error.line() if first else 'no loop ran'})",
            "run `steps run steps/bench_inserts.yaml` to see it",
        )
    its = loop.iterations or []
    done = [it.seconds * 1000 for it in its if not it.failure]
    with Lake(ep) as lake:
        counted, distinct = lake.con.execute(
            f"SELECT count(*), count(DISTINCT i) FROM {BENCH_SCHEMA}.step_inserts"
        ).fetchone()
    figures = RunnerFigures(
        iterations,
        sorted({it.worker for it in its if it.worker}),
        round(loop.iterations_seconds or 0.0, 3),
        round(run.seconds, 3),
        round(statistics.median(done), 2) if done else None,
        round(_p95(done), 2) if done else None,
        sum(1 for it in its if it.failure),
        int(counted),
        iterations - int(distinct),
        int(counted) - int(distinct),
    )
    ops = math.ceil(iterations / workers)
    say(f"the direct bench of the same shape: {workers} writers x {ops} inserts, no runner")
    both = bench_concurrency(
        kit, writers=workers, ops=ops, modes=("ducklake", "workers"), tuning=WriterTuning()
    ).results
    direct, plane_direct = both["ducklake"], both["workers"]
    scale = iterations / (workers * ops)
    scaled = direct.total_s * scale
    return _written(
        StepsBench(
            workers,
            Machine.since(load_before),
            figures,
            workers * ops,
            round(direct.total_s, 3),
            round(scaled, 3),
            direct.median_ms,
            direct.errors,
            direct.rows_lost,
            round(figures.total_s / scaled, 2) if scaled else float("inf"),
            plane_total_scaled_s=round(plane_direct.total_s * scale, 3),
            plane_median_ms=plane_direct.median_ms,
            plane_errors=plane_direct.errors,
            plane_rows_lost=plane_direct.rows_lost,
            seed=SEED,
        ),
        json_path,
    )


def _written(result: StepsBench, json_path: Path | None) -> StepsBench:
    write_outputs(result, json_path, None)
    return result
