"""bench: measured figures, printed (commands, not timed tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ducklake_kit.bench.results import Outputs
from ducklake_kit.cli.common import JsonOpt, Kit, app, command, reporter
from ducklake_kit.cli.output import console, print_json, table
from ducklake_kit.errors import EXIT_CHECK_FAILED, EXIT_USAGE, KitError


@app.command()
@command
def bench(
    ctx: typer.Context,
    suite: Annotated[
        str,
        typer.Option(
            help="load (Spark -> DuckLake on local[*] and on a standalone cluster vs Spark -> plain Parquet vs DuckDB alone), queries (DuckLake vs Parquet on S3 vs Spark SQL), concurrency (many writers), pipeline (the DAG runner vs its bound), steps (the step runner vs direct inserts) or dynamic (incremental vs full refresh of a dynamic table)."
        ),
    ] = "load",
    rows: Annotated[
        list[str] | None,
        typer.Option(
            help="Rows (load: a comma list or repeated, default 1000000,10000000; queries: one size, default 1,000,000; dynamic: rows per month, default 100,000)."
        ),
    ] = None,
    runs: Annotated[
        int | None,
        typer.Option(
            help="queries: timed runs per query and engine, after one warm-up (default 5); dynamic: months appended and refreshed per base (default 2)."
        ),
    ] = None,
    months: Annotated[
        int, typer.Option(help="dynamic: months in the first base (the second base has twice as many).")
    ] = 12,
    file_cache: Annotated[
        bool,
        typer.Option(
            help="dynamic: keep DuckDB's external file cache on (the full recompute then reads the base from memory)."
        ),
    ] = False,
    workers: Annotated[
        int | None,
        typer.Option(help="pipeline: the worker plane's Dask workers, default 2; steps: default 3."),
    ] = None,
    writers: Annotated[
        int | None,
        typer.Option(
            help="concurrency: concurrent writers, default 3 (processes; in the workers modes, one worker plane worker each)."
        ),
    ] = None,
    ops: Annotated[
        int, typer.Option(help="concurrency: inserts per writer; steps: loop iterations (inserts in all).")
    ] = 100,
    modes: Annotated[
        str | None,
        typer.Option(
            help="concurrency: the modes to run, a comma list of file, ducklake, ducklake-optimistic, workers, workers-optimistic (default: all; -optimistic: without the commit gate)."
        ),
    ] = None,
    out_file: Annotated[Path | None, typer.Option("--out", help="Also write the results to this JSON file.")] = None,
    png_file: Annotated[
        Path | None, typer.Option("--png", help="queries/concurrency: also draw a bar chart to this PNG file.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure, in one run, and print the figures (commands, not timed tests): --suite load, queries, concurrency, pipeline, steps or dynamic."""
    suites = ("load", "queries", "concurrency", "pipeline", "steps", "dynamic")
    if suite not in suites:
        raise KitError(f"unknown suite '{suite}'", f"choose one of: {', '.join(suites)}")
    _check_counts(suite, workers, writers)
    c: Kit = ctx.obj.with_reporter(reporter(as_json))
    out = console(stderr=as_json)  # with --json, stdout carries only the envelope
    if suite == "queries":
        # each suite loads only when asked for (Spark, matplotlib)
        from ducklake_kit.bench.queries import GOAL_LAKE_TO_PARQUET, GOAL_SPEEDUP_VS_SPARK, bench_queries

        r = bench_queries(c, rows=_sizes(rows, [1_000_000])[0], runs=runs or 5, outputs=Outputs(out_file, png_file))
        t = r.totals
        out.print(
            table(
                f"bench --suite queries: {r.table_rows:,} trips, median of {r.runs} runs ({r.machine.cores} cores; "
                f"load average {r.machine.load_average_before[0]})",
                [
                    "query",
                    "DuckLake ms",
                    "same files as plain Parquet ms",
                    "Spark SQL ms",
                    "DuckLake/Parquet",
                    "Spark/DuckLake",
                    "answers agree",
                ],
                [
                    [
                        q.name,
                        f"{q.engines['ducklake'].median_s * 1000:.1f}",
                        f"{q.engines['parquet'].median_s * 1000:.1f}",
                        f"{q.engines['spark'].median_s * 1000:.1f}",
                        q.ratio_ducklake_to_parquet,
                        q.speedup_vs_spark,
                        "yes" if q.answers_agree else "NO",
                    ]
                    for q in r.queries
                ],
            )
        )
        fc = r.fixed_cost
        if fc:
            out.print(
                f"fixed cost of a DuckLake query (`{fc['probe']}`): {fc['ducklake_ms']} ms vs {fc['parquet_ms']} ms on the same "
                f"files as plain Parquet ({fc['catalog_round_trips']} catalog round trips)",
                markup=False,
            )
        out.print(
            f"sum of medians: DuckLake/Parquet {t.ratio_ducklake_to_parquet} (goal <= {GOAL_LAKE_TO_PARQUET}: "
            f"{'met' if t.ratio_met else 'NOT met'}); Spark/DuckLake {t.speedup_vs_spark}x (goal >= "
            f"{GOAL_SPEEDUP_VS_SPARK}x: {'met' if t.speedup_met else 'NOT met'})",
            markup=False,
        )
        if as_json:
            print_json("ok" if r.answers_agree else "error", r.as_dict())
            if not r.answers_agree:
                raise typer.Exit(EXIT_CHECK_FAILED)
        if not r.answers_agree:
            raise KitError(
                "the engines returned different answers",
                "see the JSON results (--out FILE) for the differences",
                exit_code=EXIT_CHECK_FAILED,
            )
        return
    if suite == "pipeline":
        _bench_pipeline(c, workers or 2, out, out_file, as_json)
        return
    if suite == "steps":
        _bench_steps(c, workers or 3, ops, out, out_file, as_json)
        return
    if suite == "dynamic":
        _bench_dynamic(c, months, _sizes(rows, [100_000])[0], runs or 2, file_cache, out, out_file, as_json)
        return
    if suite == "concurrency":
        from ducklake_kit.bench.concurrency import (
            CONTENTION_GOALS,
            MODES,
            bench_concurrency,  # each suite loads only when asked for
        )

        writers = writers or 3
        chosen = tuple(m.strip() for m in modes.split(",") if m.strip()) if modes else MODES
        r = bench_concurrency(c, writers=writers, ops=ops, modes=chosen, outputs=Outputs(out_file, png_file))
        out.print(
            table(
                f"bench --suite concurrency: {writers} writers x {ops} inserts ({r.machine.cores} cores; load average "
                f"{r.machine.load_average_before[0]} before, {r.machine.load_average_after[0]} after)",
                [
                    "target",
                    "commit gate",
                    "inserts/s",
                    "total s",
                    "p50 ms",
                    "p99 ms",
                    "max ms",
                    "errors",
                    "retries",
                    "rows lost",
                    "duplicated",
                ],
                [
                    [
                        m,
                        x.commit_gate or "-",
                        x.ops_per_s,
                        x.total_s,
                        x.median_ms,
                        x.p99_ms,
                        x.max_ms,
                        x.errors,
                        x.retries,
                        x.rows_lost,
                        x.duplicate_rows,
                    ]
                    for m, x in r.results.items()
                ],
            )
        )
        if r.goals is not None:
            out.print(
                f"goals for DuckLake at 3 x 100 (total < 1 s, median < 5 ms, 0 errors, 0 lost): {r.goals.met}",
                markup=False,
            )
            g = CONTENTION_GOALS
            out.print(
                f"goals under contention, set at 16 x 1,000 (p99 <= {g['p99_ms']:g} ms, max <= {g['max_ms']:g} ms, "
                f">= {g['ops_per_s']:g} inserts/s, 0 lost, 0 duplicated): "
                + "; ".join(
                    f"{m} {'met' if all(v.values()) else 'NOT met: ' + ', '.join(k for k, ok in v.items() if not ok)}"
                    for m, v in r.goals.contention_met.items()
                ),
                markup=False,
            )
        if r.floor is not None:
            fl, reach = r.floor, (r.goals.reachable_here if r.goals and r.goals.reachable_here is not None else {})
            out.print(
                f"floor from one writer measured alone: {fl.cpu_ms_per_insert} ms CPU an insert, so >= {fl.total_s_at_least} s "
                f"total and >= {fl.median_ms_at_least} ms median here; time goals reachable on this machine: {reach}",
                markup=False,
            )
            if r.goals is not None and r.goals.contention_reachable_here is not None:
                out.print(
                    f"so at most {fl.ops_per_s_at_most} inserts/s and, {writers} writers each waiting for the others, a mean "
                    f"latency >= {fl.mean_ms_at_least} ms (Little's law); through the commit gate, one commit at a time: at "
                    f"most {fl.gated_ops_per_s_at_most} inserts/s, a mean >= {fl.gated_mean_ms_at_least} ms; p99 <= "
                    f"{g['p99_ms']:g} ms with max <= {g['max_ms']:g} ms needs a mean <= "
                    f"{round(0.99 * g['p99_ms'] + 0.01 * g['max_ms'], 1)} ms; contention goals "
                    f"reachable on this machine: {r.goals.contention_reachable_here}",
                    markup=False,
                )
        defect = r.lake_defect()  # the correctness claim (not the speed goals)
        if as_json:
            print_json("error" if defect else "ok", r.as_dict())
            if defect:
                raise typer.Exit(EXIT_CHECK_FAILED)
        if defect:
            raise KitError(defect, "see errors_by_kind in the JSON results (--out FILE)", exit_code=EXIT_CHECK_FAILED)
        if r.vs_floor:
            out.print(
                "total over the floor's total (goal <= 1.5 at 3 x 100): "
                + ", ".join(f"{m} {v}x" for m, v in r.vs_floor.items()),
                markup=False,
            )
        for mode, d in r.results.items():
            if mode != "file":
                label = "DuckLake" if mode.startswith("ducklake") else "DuckLake from the worker plane"
                out.print(
                    f"PASS: {label} (commit gate {d.commit_gate}) kept all {d.actual_rows} of {d.expected_rows} rows, "
                    "none lost or duplicated",
                    markup=False,
                )
        return
    _bench_load(c, rows, out, out_file, as_json)


def _check_counts(suite: str, workers: int | None, writers: int | None) -> None:
    """--workers is the worker plane's Dask workers in every command; the concurrency suite's writers have their own
    name, and each option is refused where it would mean something else, with the spelling that works."""
    if suite == "concurrency" and workers is not None:
        raise KitError(
            "bench --suite concurrency takes --writers N (the concurrent writers); --workers is the worker plane's "
            "Dask workers",
            f"bench --suite concurrency --writers {workers}",
            exit_code=EXIT_USAGE,
        )
    if suite != "concurrency" and writers is not None:
        raise KitError(
            f"--writers is for --suite concurrency, not {suite}",
            f"bench --suite {suite} --workers {writers}"
            if suite in ("pipeline", "steps")
            else f"bench --suite concurrency --writers {writers}",
            exit_code=EXIT_USAGE,
        )


def _sizes(rows: list[str] | None, default: list[int]) -> list[int]:
    """--rows as given: repeated, or a comma list (1000000,10000000), or both."""
    if not rows:
        return default
    try:
        return [int(v.replace("_", "")) for r in rows for v in r.split(",") if v.strip()]
    except ValueError:
        raise KitError(
            f"--rows {','.join(rows)} is not a list of whole numbers",
            "e.g. --rows 1000000,10000000",
            exit_code=EXIT_USAGE,
        ) from None


def _bench_load(c: Kit, rows: list[str] | None, out, out_file: Path | None, as_json: bool) -> None:
    from ducklake_kit.bench.load import (
        DEFAULT_ROWS,
        GOAL_ROWS,
        bench_load,
    )  # each suite loads only when asked for (Spark)
    from ducklake_kit.bench.results import write_outputs

    r = bench_load(c, _sizes(rows, list(DEFAULT_ROWS)))

    def rate(f) -> str:
        return f"{f.rows_per_s:,}" if f else "-"

    def ratio(v) -> str:
        return "-" if v is None else f"{v:.2f}"

    rows_out = [
        [
            f"{s.rows:,}",
            rate(s.sides["a"]),
            rate(s.sides["a_cluster"]),
            rate(s.sides["b"]),
            rate(s.sides["c"]),
            ratio(s.ratios["a_to_c"]),
            ratio(s.ratios["a_cluster_to_a"]),
            ratio(s.ratios["a_to_b"]),
            " / ".join(
                f"{s.sides[k].load_average_before:g}" if s.sides[k] else "-" for k in ("b", "a", "c", "a_cluster")
            ),
        ]
        for s in r.sizes
    ]
    m = r.machine
    out.print(
        table(
            f"bench --suite load: rows/s ({m.cores} cores; load average before {m.load_average_before}, after "
            f"{m.load_average_after})",
            [
                "rows",
                "(a) Spark local[*] -> DuckLake",
                "(a') standalone cluster -> DuckLake",
                "(b) Spark -> plain Parquet",
                "(c) DuckDB alone",
                "a/c",
                "a'/a",
                "a/b",
                "load avg at b / a / c / a'",
            ],
            rows_out,
        )
    )
    for g in r.goals:
        verdict = "not measured (add 10000000 to --rows)" if g.met is None else ("met" if g.met else "NOT met")
        out.print(
            f"goal at {GOAL_ROWS:,} rows: {g.name} = {ratio(g.value)} (goal >= {g.at_least}): {verdict}", markup=False
        )
    out.print(
        f"(a') cluster: {r.cluster}; every side writes Snappy Parquet; (a) and (a') include the commit "
        "(landing the raw files is part of no side)",
        markup=False,
    )
    doc = {"suite": "load", **r.as_dict()}
    if out_file:
        write_outputs(doc, out_file, None)
        out.print(f"wrote {out_file}", markup=False)
    if as_json:
        print_json("ok", doc)


def _bench_pipeline(c: Kit, workers: int, out, out_file: Path | None, as_json: bool) -> None:
    from ducklake_kit.bench.pipeline import GOAL_SCHEDULING_MS, GOAL_VS_BOUND, bench_pipeline

    r = bench_pipeline(c, workers=workers, json_path=out_file)
    p, s = r.parallel, r.serial
    out.print(
        table(
            f"bench --suite pipeline: {r.independent} independent nodes + a chain of {r.chain} "
            f"({r.rows_per_node:,} rows of md5 each) on {r.workers} workers ({r.machine.cores} cores; load "
            f"average {r.machine.load_average_before[0]})",
            ["run", "makespan s", "node time s (total)", "critical path s", "bound s", "makespan / bound"],
            [
                [f"DAG on {r.workers} workers", p.makespan_s, p.total_node_s, p.critical_path_s, p.bound_s, p.vs_bound],
                ["serial (one worker)", s.makespan_s, s.total_node_s, s.critical_path_s, s.bound_s, s.vs_bound],
            ],
        )
    )
    out.print(
        f"speed-up over the serial run: {r.speedup_vs_serial}x; makespan / bound {p.vs_bound} (goal <= "
        f"{GOAL_VS_BOUND}: {'met' if p.vs_bound <= GOAL_VS_BOUND else 'NOT met'})",
        markup=False,
    )
    out.print(
        f"scheduling cost: {r.scheduling_ms_per_node} ms a node over a chain of {r.scheduling_nodes} trivial nodes "
        f"(goal < {GOAL_SCHEDULING_MS:g} ms: {'met' if r.scheduling_ms_per_node < GOAL_SCHEDULING_MS else 'NOT met'})",
        markup=False,
    )
    if out_file:
        out.print(f"wrote {out_file}", markup=False)
    if as_json:
        print_json("ok" if r.order_held else "error", r.as_dict())
    if not r.order_held:
        raise KitError(
            "a node started before one of its dependencies finished",
            "this is a defect of the runner: report it",
            exit_code=EXIT_CHECK_FAILED,
        )


def _bench_steps(c: Kit, workers: int, iterations: int, out, out_file: Path | None, as_json: bool) -> None:
    from ducklake_kit.bench.steps import GOAL_VS_DIRECT, SEED, bench_steps  # each suite loads only when asked for

    r = bench_steps(c, workers=workers, iterations=iterations, json_path=out_file)
    f = r.runner
    out.print(
        table(
            f"bench --suite steps: {iterations} one-row INSERTs over {workers} workers ({r.machine.cores} cores; "
            f"load average {r.machine.load_average_before[0]})",
            ["", "total s", "median ms", "p95 ms", "errors", "rows lost"],
            [
                ["step runner (loop, mode: async)", f.total_s, f.median_ms, f.p95_ms, f.errors, f.rows_lost],
                [
                    f"direct: {workers} processes x {r.direct_inserts // workers}, scaled to {iterations}",
                    r.direct_total_scaled_s,
                    r.direct_median_ms,
                    "-",
                    r.direct_errors,
                    r.direct_rows_lost,
                ],
                [
                    f"worker plane, no runner: {workers} tasks x {r.direct_inserts // workers}, scaled",
                    r.plane_total_scaled_s,
                    r.plane_median_ms,
                    "-",
                    r.plane_errors,
                    r.plane_rows_lost,
                ],
                ["the seed (NoETL, 100 over 3)", SEED["total_s"], SEED["median_ms"], "-", "-", "-"],
            ],
        )
    )
    out.print(
        f"runner / direct: {r.ratio_vs_direct}x (goal <= {GOAL_VS_DIRECT}: {'met' if r.goal_met else 'NOT met'}); "
        f"workers used: {', '.join(f.workers_used)}",
        markup=False,
    )
    defect = r.defect()
    if as_json:
        print_json("error" if defect else "ok", r.as_dict())
        if defect:
            raise typer.Exit(EXIT_CHECK_FAILED)
        return
    if defect:
        raise KitError(defect, "see the JSON results (--out FILE)", exit_code=EXIT_CHECK_FAILED)
    out.print(
        f"PASS: all {f.iterations} iterations inserted their row exactly once ({f.rows_counted} rows counted)",
        markup=False,
    )


def _bench_dynamic(
    c: Kit,
    months: int,
    rows_per_month: int,
    runs: int,
    file_cache: bool,
    out,
    out_file: Path | None,
    as_json: bool,
) -> None:
    from ducklake_kit.bench.dynamic import bench_dynamic  # each suite loads only when asked for

    r = bench_dynamic(
        c, months=months, rows_per_month=rows_per_month, runs=runs, file_cache=file_cache, json_path=out_file
    )
    g = r.goals()
    out.print(
        table(
            f"bench --suite dynamic: daily revenue by borough, one month appended then refreshed, median of "
            f"{runs} ({r.machine.cores} cores; load average {r.machine.load_average_before[0]}; file cache "
            f"{'on' if file_cache else 'off'})",
            ["base months", "base rows", "rows appended", "incremental s", "full s", "incremental / full"],
            [
                [b.months, f"{b.base_rows:,}", f"{b.change_rows:,}", b.incremental_median_s, b.full_median_s, b.ratio]
                for b in r.bases
            ],
        )
    )
    size_note = "" if g["at_goal_size"] else f" (the goal is set at {g['goal_base_rows']:,} base rows: --rows 1000000)"
    out.print(
        f"incremental / full at {g['first_base_rows']:,} rows: {g['ratio_at_first_base']} (goal <= {g['ratio_goal']}: "
        f"{'met' if g['ratio_met'] else 'NOT met'}){size_note}; the base doubled, the incremental time changed by "
        f"{g['growth_when_doubled']:+.0%} (goal under {g['growth_goal']:.0%}: {'met' if g['growth_met'] else 'NOT met'})",
        markup=False,
    )
    out.print(
        f"PASS: both tables equal their query run in full after every refresh; incremental: {r.bases[0].incremental_how}",
        markup=False,
    )
    if as_json:
        print_json("ok", r.as_dict())
