"""`all`, the whole flow with checks (what `just ducklake-test` runs), in stages; it sits above lessons and bench
(the only module that reads both):

foundation  up, buckets, a table, two inserts, snapshots, time travel by version, files on S3
load        the NYC Taxi load through PySpark, checked against the raw files; the same load again is a no-op
queries     every SQL lesson in queries/, each answer checked against an independent computation
timetravel  the change-feed lesson in its own schema, every figure checked
maintain    flush, merge, expire the lesson's first snapshot, clean up, CHECKPOINT: answers unchanged
workers     the worker plane: every worker attached, per-month counts from tasks sum to the lake's, a
            worker-local table on its worker only
pipeline    pipelines/taxi_marts.sql as a DAG on the workers: every mart equals the same figure computed
            directly from trips, the worker-local step on w1, lineage recorded
steps       steps/distributed_loop.yaml by the step runner: every batch inserted once, by the worker reported
dynamic     the dynamic tables of dynamic_tables/*.sql created, one more month loaded through PySpark, refreshed:
            each refresh incremental and equal to its query run in full, the new month's trips all there
bench       a short concurrency benchmark (3 writers x 100 inserts: processes, and worker plane tasks), counts checked

`--stages` runs a subset (in the flow's order; `maintain` needs `timetravel`, whose first snapshot it expires): the
lake keeps what earlier runs made, so e.g. `foundation,load,queries` on a lake where `all` ran checks a re-run.

Each lesson stage runs one lesson, `run(kit, checks) -> <Lesson>Result`; `run_all` keeps the typed results
(`AllResult`), and `AllResult.as_dict()` is what `all --json` prints. Exit 0 only if every check of every stage holds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from ducklake_kit.bench import concurrency as bench_concurrency
from ducklake_kit.checks import CheckRun
from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.lessons import dynamic, foundation, maintain, pipeline, queries, steps, timetravel, workers
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.taxi import flow as taxi_flow
from ducklake_kit.taxi import sources
from ducklake_kit.taxi.load import LoadResult

# synthetic by default (offline, quick on 2 cores; `--source auto` downloads ~9M real rows when the TLC host
# answers); size overridable with DUCKLAKE_ALL_ROWS_PER_MONTH
ALL_MONTHS = "2024-01..2024-03"
ALL_ROWS_PER_MONTH = sources.DEFAULT_ROWS_PER_MONTH


STAGES = ("foundation", "load", "queries", "timetravel", "maintain", "workers", "pipeline", "steps", "dynamic", "bench")


def parse_stages(text: str | None) -> tuple[str, ...]:
    """`--stages a,b`: the named stages in the flow's order (all of them for None or ''); refused before anything runs
    for an unknown name, or `maintain` without `timetravel`."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    if not names:
        return STAGES
    unknown = [n for n in names if n not in STAGES]
    if unknown:
        raise KitError(f"unknown stage '{unknown[0]}'", f"choose from: {', '.join(STAGES)}")
    if "maintain" in names and "timetravel" not in names:
        raise KitError("stage maintain needs timetravel (it expires that lesson's first snapshot)", "add timetravel")
    return tuple(s for s in STAGES if s in names)


def all_rows_per_month() -> int:
    return int(os.environ.get("DUCKLAKE_ALL_ROWS_PER_MONTH") or ALL_ROWS_PER_MONTH)


ALL_BENCH_OPS = 100  # inserts per writer in the bench stage; overridable with DUCKLAKE_ALL_BENCH_OPS


def all_bench_ops() -> int:
    return int(os.environ.get("DUCKLAKE_ALL_BENCH_OPS") or ALL_BENCH_OPS)


@dataclass
class AllResult:
    """Every stage's typed result (the checks themselves are in the CheckRun, grouped by stage)."""

    foundation: foundation.FoundationResult | None = None  # None: not in `--stages`
    load: LoadResult | None = None  # the first load (the second, a no-op, is checked and not kept)
    queries: queries.QueriesResult | None = None
    timetravel: timetravel.TimetravelResult | None = None
    maintain: maintain.MaintainResult | None = None
    workers: workers.WorkersResult | None = None
    pipeline: pipeline.PipelineResult | None = None
    steps: steps.StepsResult | None = None
    dynamic: dynamic.DynamicResult | None = None
    bench: bench_concurrency.ConcurrencyRun | None = None  # None: `--no-bench`
    catalog_info: dict[str, Any] = field(default_factory=dict)  # the lake's, after everything

    def as_dict(self) -> dict[str, Any]:
        """`all --json`'s result (without catalog_info, which the envelope carries)."""
        out: dict[str, Any] = {}
        if self.foundation is not None:
            out = {k: v for k, v in self.foundation.as_dict().items() if k != "catalog_info"}
        if self.load is not None:
            out["load"] = self.load.as_dict()
        if self.queries is not None:
            out["queries"] = self.queries.summary()
        if self.timetravel is not None:
            out["timetravel"] = {"snapshots": self.timetravel.versions}
        if self.maintain is not None:
            done = self.maintain.done
            out["maintain"] = {
                "expired": done.expired if done else None,
                "before": self.maintain.before,
                "after": self.maintain.after,
            }
        for name in ("workers", "pipeline", "steps", "dynamic"):
            stage = getattr(self, name)
            if stage is not None:
                out[name] = stage.as_dict()
        if self.bench is not None:
            out["bench"] = self.bench.as_dict()
        return out


def run_all(
    kit: Kit,
    checks: CheckRun,
    *,
    source: str = "synthetic",
    mode: str = "skip",
    bench: bool = True,
    stages: str | None = None,
) -> AllResult:
    """`stages`: `--stages`' text (see `parse_stages`; refused before anything runs); `bench=False` drops bench."""
    run = set(parse_stages(stages)) - (set() if bench else {"bench"})
    result = AllResult()
    if "foundation" in run:
        with checks.stage("foundation"):
            kit.say("foundation: services, buckets, a table, two inserts, time travel")
            result.foundation = foundation.run(kit, checks)

    if "load" in run:
        with checks.stage("load"):
            result.load = _load_twice(kit, checks, source=source, mode=mode)

    if "queries" in run:
        with checks.stage("queries"):
            kit.say("aggregations: every query in queries/, checked against the raw files")
            result.queries = queries.run(kit, checks)

    if "timetravel" in run:
        with checks.stage("timetravel"):
            result.timetravel = timetravel.run(kit, checks, rows_per_month=timetravel.ROWS_PER_MONTH)

    if "maintain" in run and result.timetravel is not None:
        with checks.stage("maintain"):
            # expire the lesson's first snapshot (its story is told and checked): shows an expired version is gone
            # while everything current answers as before; the learner's own history is left alone
            result.maintain = maintain.run(kit, checks, versions=[result.timetravel.story.month1])

    if "workers" in run:
        with checks.stage("workers"):
            result.workers = workers.run(kit, checks)

    if "pipeline" in run:
        with checks.stage("pipeline"):
            result.pipeline = pipeline.run(kit, checks)

    if "steps" in run:
        with checks.stage("steps"):
            result.steps = steps.run(kit, checks)

    if "dynamic" in run:
        with checks.stage("dynamic"):
            result.dynamic = dynamic.run(kit, checks, source=source, rows_per_month=all_rows_per_month())

    if "bench" in run:
        with checks.stage("bench"):
            result.bench = _bench(kit, checks)

    with Lake(kit.platform.endpoints()) as lake:
        result.catalog_info = lake.catalog_info(kit.platform.name)  # after everything, not before
    return result


def _load_twice(kit: Kit, checks: CheckRun, *, source: str, mode: str) -> LoadResult:
    """The taxi load through PySpark, checked against the raw files; then the same load again, every file skipped."""
    spec = taxi_flow.LoadSpec(source=source, months=ALL_MONTHS, rows_per_month=all_rows_per_month(), mode=mode)
    first, _ = taxi_flow.load_checked(kit, spec, checks)
    kit.say("the same load again: every file must be skipped")
    again, _ = taxi_flow.load_checked(kit, replace(spec, mode="skip"), checks, verify_skipped=False)  # just checked
    checks.equal(
        "re-running the load skips every file", [f.status for f in again.files], ["skipped"] * len(first.files)
    )
    return first


def _bench(kit: Kit, checks: CheckRun) -> bench_concurrency.ConcurrencyRun:
    ops = all_bench_ops()
    kit.say(
        f"a short benchmark: 3 writers x {ops} inserts into DuckLake (processes, worker plane tasks) and into one "
        "DuckDB file"
    )
    figures = bench_concurrency.bench_concurrency(kit, writers=3, ops=ops)
    for mode, label in (("ducklake", "DuckLake"), ("workers", "DuckLake from the worker plane")):
        lake_side = figures.results[mode]
        checks.equal(f"bench: {label} lost no rows (3 x {ops} inserts)", lake_side.rows_lost, 0)
        checks.equal(f"bench: {label} reported no errors", lake_side.errors, 0)
    return figures
