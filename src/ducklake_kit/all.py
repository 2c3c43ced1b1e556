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

Exit 0 only if every check of every stage holds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ducklake_kit.bench import concurrency as bench_concurrency
from ducklake_kit.checks import CheckRun
from ducklake_kit.lake import Lake
from ducklake_kit.lessons import dynamic, foundation, maintain, pipeline, queries, steps, timetravel, workers
from ducklake_kit.platforms.base import Platform
from ducklake_kit.platforms.state import State
from ducklake_kit.taxi import flow as taxi_flow
from ducklake_kit.taxi import sources

# synthetic by default (offline, quick on 2 cores; `--source auto` downloads ~9M real rows when the TLC host
# answers); size overridable with DUCKLAKE_ALL_ROWS_PER_MONTH
ALL_MONTHS = "2024-01..2024-03"
ALL_ROWS_PER_MONTH = sources.DEFAULT_ROWS_PER_MONTH


def all_rows_per_month() -> int:
    return int(os.environ.get("DUCKLAKE_ALL_ROWS_PER_MONTH") or ALL_ROWS_PER_MONTH)


def run_all(
    platform: Platform,
    state: State,
    checks: CheckRun,
    *,
    source: str = "synthetic",
    mode: str = "skip",
    bench: bool = True,
    scheduler: str | None = None,
    on_step: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    with checks.stage("foundation"):
        on_step("foundation: services, buckets, a table, two inserts, time travel")
        result = foundation.run(platform, checks)

    with checks.stage("load"):
        first, _ = taxi_flow.load_and_verify(
            platform,
            state,
            source=source,
            months=ALL_MONTHS,
            rows_per_month=all_rows_per_month(),
            mode=mode,
            on_step=on_step,
            checks=checks,
        )
        on_step("the same load again: every file must be skipped")
        again, _ = taxi_flow.load_and_verify(
            platform,
            state,
            source=source,
            months=ALL_MONTHS,
            rows_per_month=all_rows_per_month(),
            on_step=on_step,
            checks=checks,
            verify_skipped=False,
        )  # the figures were just checked
        checks.equal(
            "re-running the load skips every file", [f.status for f in again.files], ["skipped"] * len(first.files)
        )
    result["load"] = first.as_dict()

    with checks.stage("queries"):
        on_step("aggregations: every query in queries/, checked against the raw files")
        with Lake(platform.endpoints()) as lake:
            answers = queries.check_queries(lake, checks)
        result["queries"] = {
            name: {"rows": len(rows), "seconds": round(sec, 4)} for name, (_c, rows, sec) in answers.items()
        }

    with checks.stage("timetravel"):
        lesson = timetravel.run_timetravel(
            platform, state, checks, rows_per_month=timetravel.ROWS_PER_MONTH, on_step=on_step
        )
        result["timetravel"] = {"snapshots": [r["snapshot_id"] for r in lesson["counts_at_version"]]}

    with checks.stage("maintain"):
        # expire the lesson's first snapshot (its story is told and checked): shows an expired version is gone
        # while everything current answers as before; the learner's own history is left alone
        first_snapshot = lesson["counts_at_version"][0]["snapshot_id"]
        done = maintain.run_maintain(platform, checks, versions=[first_snapshot], on_step=on_step)
        result["maintain"] = {
            "expired": done.get("done", {}).get("expired"),
            "before": done["before"],
            "after": done["after"],
        }

    with checks.stage("workers"):
        result["workers"] = workers.run_workers(platform, state, checks, scheduler=scheduler, on_step=on_step)

    with checks.stage("pipeline"):
        result["pipeline"] = pipeline.run_pipeline(platform, state, checks, scheduler=scheduler, on_step=on_step)

    with checks.stage("steps"):
        result["steps"] = steps.run_steps(platform, state, checks, scheduler=scheduler, on_step=on_step)

    with checks.stage("dynamic"):
        result["dynamic"] = dynamic.run_dynamic(
            platform, state, checks, source=source, rows_per_month=all_rows_per_month(), on_step=on_step
        )

    if bench:
        with checks.stage("bench"):
            on_step(
                "a short benchmark: 3 writers x 100 inserts into DuckLake (processes, worker plane tasks) and into one DuckDB file"
            )
            figures = bench_concurrency.bench_concurrency(
                platform, state, workers=3, ops=100, on_step=on_step, scheduler=scheduler
            )
            for mode, label in (("ducklake", "DuckLake"), ("workers", "DuckLake from the worker plane")):
                lake_side = figures.results[mode]
                checks.equal(f"bench: {label} lost no rows (3 x 100 inserts)", lake_side.rows_lost, 0)
                checks.equal(f"bench: {label} reported no errors", lake_side.errors, 0)
            result["bench"] = figures.as_dict()

    with Lake(platform.endpoints()) as lake:
        result["catalog_info"] = lake.catalog_info(platform.name)  # after everything, not before
    return result
