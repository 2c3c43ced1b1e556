"""bench: measured figures, printed (commands, not timed tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ducklake_kit.cli.common import Ctx, JsonOpt, app, command, step_printer
from ducklake_kit.cli.output import console, print_json, table
from ducklake_kit.errors import EXIT_CHECK_FAILED, KitError


@app.command()
@command
def bench(
    ctx: typer.Context,
    suite: Annotated[str, typer.Option(help="load (DuckLake vs plain Parquet writes), queries (DuckLake vs Parquet on S3 vs Spark SQL) or concurrency (many writers).")] = "load",
    rows: Annotated[Optional[list[int]], typer.Option(help="Rows (load: repeat to compare sizes; queries: one size). Default 1,000,000.")] = None,
    runs: Annotated[int, typer.Option(help="queries: timed runs per query and engine, after one warm-up.")] = 5,
    workers: Annotated[int, typer.Option(help="concurrency: writer processes.")] = 3,
    ops: Annotated[int, typer.Option(help="concurrency: inserts per writer.")] = 100,
    out_file: Annotated[Optional[Path], typer.Option("--out", help="Also write the results to this JSON file.")] = None,
    png_file: Annotated[Optional[Path], typer.Option("--png", help="queries/concurrency: also draw a bar chart to this PNG file.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure, in one run, and print the figures (commands, not timed tests): --suite load, queries or concurrency."""
    suites = ("load", "queries", "concurrency")
    if suite not in suites:
        raise KitError(f"unknown suite '{suite}'", f"choose one of: {', '.join(suites)}")
    c: Ctx = ctx.obj
    step = step_printer(as_json)
    out = console(stderr=as_json)  # with --json, stdout carries only the envelope
    if suite == "queries":
        from ducklake_kit.bench.queries import bench_queries  # each suite loads only when asked for (Spark, matplotlib)

        r = bench_queries(c.platform(), c.state, rows=(rows or [1_000_000])[0], runs=runs, on_step=step,
                          json_path=out_file, png_path=png_file)
        out.print(table(f"bench --suite queries: {r['table_rows']:,} trips, median of {r['runs']} runs ({r['cores']} cores; "
                        f"load average {r['load_average_before'][0]})",
                        ["query", "DuckLake ms", "same files as plain Parquet ms", "Spark SQL ms", "DuckLake/Parquet", "Spark/DuckLake", "answers agree"],
                        [[q["name"], f"{q['ducklake']['median_s'] * 1000:.1f}", f"{q['parquet']['median_s'] * 1000:.1f}",
                          f"{q['spark']['median_s'] * 1000:.1f}", q["ratio_ducklake_to_parquet"], q["speedup_vs_spark"],
                          "yes" if q["answers_agree"] else "NO"] for q in r["queries"]]))
        fc = r.get("fixed_cost")
        if fc:
            out.print(f"fixed cost of a DuckLake query (`{fc['probe']}`): {fc['ducklake_ms']} ms vs {fc['parquet_ms']} ms on the same "
                      f"files as plain Parquet ({fc['catalog_round_trips']} catalog round trips)", markup=False)
        g = r["goals"]
        out.print(f"sum of medians: DuckLake/Parquet {r['ratio_ducklake_to_parquet']} (goal <= {g['ratio_ducklake_to_parquet_max']}: "
                  f"{'met' if g['ratio_met'] else 'NOT met'}); Spark/DuckLake {r['speedup_vs_spark']}x (goal >= "
                  f"{g['speedup_vs_spark_min']}x: {'met' if g['speedup_met'] else 'NOT met'})", markup=False)
        if as_json:
            print_json("ok" if r["answers_agree"] else "error", r)
            if not r["answers_agree"]:
                raise typer.Exit(EXIT_CHECK_FAILED)
        if not r["answers_agree"]:
            raise KitError("the engines returned different answers", "see the JSON results (--out FILE) for the differences",
                           exit_code=EXIT_CHECK_FAILED)
        return
    if suite == "concurrency":
        from ducklake_kit.bench.concurrency import bench_concurrency  # each suite loads only when asked for

        r = bench_concurrency(c.platform(), c.state, workers=workers, ops=ops, on_step=step, json_path=out_file, png_path=png_file)
        out.print(table(f"bench --suite concurrency: {workers} writers x {ops} inserts ({r['cores']} cores; load average "
                        f"{r['load_average_before'][0]})",
                        ["target", "total s", "median ms", "p95 ms", "errors", "retries", "rows lost"],
                        [[m, x["total_s"], x["median_ms"], x["p95_ms"], x["errors"], x.get("retries"), x["rows_lost"]]
                         for m, x in r["results"].items()]))
        if "goals" in r:
            out.print(f"goals for DuckLake at 3 x 100 (total < 1 s, median < 5 ms, 0 errors, 0 lost): {r['goals']['met']}", markup=False)
        fl = r.get("floor")
        if fl:
            reach = r.get("goals", {}).get("reachable_here", {})
            out.print(f"floor from one writer measured alone: {fl['cpu_ms_per_insert']} ms CPU an insert, so >= {fl['total_s_at_least']} s "
                      f"total and >= {fl['median_ms_at_least']} ms median here; time goals reachable on this machine: {reach}", markup=False)
        d = r["results"].get("ducklake")
        lost = bool(d and (d["rows_lost"] or d["duplicate_rows"]))
        if as_json:
            print_json("error" if lost else "ok", r)
            if lost:
                raise typer.Exit(EXIT_CHECK_FAILED)
        if d:
            # the correctness claim (not the speed goals): every insert that reported success is in the table, once
            if d["rows_lost"] or d["duplicate_rows"]:
                raise KitError(f"DuckLake lost {d['rows_lost']} and duplicated {d['duplicate_rows']} of {d['expected_rows']} rows "
                               f"({d['errors']} inserts reported an error, {d['silently_lost']} lost silently)",
                               "see errors_by_kind in the JSON results (--out FILE)", exit_code=EXIT_CHECK_FAILED)
            out.print(f"PASS: DuckLake kept all {d['actual_rows']} of {d['expected_rows']} rows, none lost or duplicated", markup=False)
        return
    from ducklake_kit.bench.load import bench_load  # each suite loads only when asked for (Spark)
    from ducklake_kit.bench.results import write_outputs

    results = [bench_load(c.platform(), c.state, n, on_step=step) for n in (rows or [1_000_000])]
    rows_out = []
    for r in results:
        d, p = r["ducklake"], r["parquet"]
        rows_out.append([f"{r['rows']:,}", f"{d['rows_per_s']:,}", f"{p['rows_per_s']:,}", f"{r['ratio_ducklake_to_parquet']:.2f}",
                         f"{d['driver_python_peak_mib']} (+{d['driver_python_growth_mib']}) / {d['driver_jvm_peak_mib']}",
                         f"{p['driver_python_peak_mib']} (+{p['driver_python_growth_mib']}) / {p['driver_jvm_peak_mib']}"])
    out.print(table(f"bench --suite load ({results[0]['cores']} cores; load average {results[0]['load_average_before'][0]}; "
                    f"goal: ratio >= {results[0]['goal_ratio']})",
                    ["rows", "DuckLake rows/s", "Parquet rows/s", "ratio",
                     "DuckLake: driver peak MiB, python (+growth during the load) / JVM", "Parquet: same"], rows_out))
    if out_file:
        write_outputs({"suite": suite, "results": results}, out_file, None)
        out.print(f"wrote {out_file}", markup=False)
    if as_json:
        print_json("ok", {"suite": suite, "results": results})


