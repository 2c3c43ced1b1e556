"""Each bench suite's run: measure (the suite's own module, imported only when it runs: Spark, matplotlib, Dask),
then lay the figures out (`<suite>_report`, a pure function of the suite's typed result) as a renderer-neutral Report
(bench/results.py). Registered, with the options each takes and what they mean to it, in bench/suites.py; a run's
keyword parameters are exactly those options, with their defaults."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from ducklake_kit.bench.results import Outputs, Report, Table, write_outputs
from ducklake_kit.errors import EXIT_USAGE, KitError
from ducklake_kit.platforms.kit import Kit

if TYPE_CHECKING:  # each suite's module loads when it runs (Spark, matplotlib, Dask)
    from ducklake_kit.bench.concurrency import ConcurrencyRun
    from ducklake_kit.bench.dynamic import DynamicBench
    from ducklake_kit.bench.load import LoadBench
    from ducklake_kit.bench.pipeline import PipelineBench
    from ducklake_kit.bench.queries import QueriesRun
    from ducklake_kit.bench.steps import StepsBench


def _one_size(name: str, rows: tuple[int, ...] | None, default: int) -> int:
    if not rows:
        return default
    if len(rows) > 1:
        raise KitError(f"--suite {name} takes one size, not {len(rows)}", f"--rows {rows[0]}", exit_code=EXIT_USAGE)
    return rows[0]


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _files(*paths: Path | None) -> list[Path]:
    return [p for p in paths if p]


def load(kit: Kit, *, rows: tuple[int, ...] | None = None, out: Path | None = None) -> Report:
    from ducklake_kit.bench.load import DEFAULT_ROWS, bench_load

    report = load_report(bench_load(kit, list(rows or DEFAULT_ROWS)))
    write_outputs(report.document, out, None)
    report.written = _files(out)
    return report


def load_report(r: LoadBench) -> Report:
    from ducklake_kit.bench.load import GOAL_ROWS

    def rate(f) -> str:
        return f"{f.rows_per_s:,}" if f else "-"

    def ratio(v) -> str:
        return "-" if v is None else f"{v:.2f}"

    cells = [
        [
            f"{s.rows:,}",
            *(rate(s.sides[k]) for k in ("a", "a_cluster", "b", "c")),
            *(ratio(s.ratios[k]) for k in ("a_to_c", "a_cluster_to_a", "a_to_b")),
            " / ".join(
                f"{s.sides[k].load_average_before:g}" if s.sides[k] else "-" for k in ("b", "a", "c", "a_cluster")
            ),
        ]
        for s in r.sizes
    ]
    m = r.machine
    notes = [
        f"goal at {GOAL_ROWS:,} rows: {g.name} = {ratio(g.value)} (goal >= {g.at_least}): "
        + ("not measured (add 10000000 to --rows)" if g.met is None else _met(g.met))
        for g in r.goals
    ]
    notes.append(
        f"(a') cluster: {r.cluster}; every side writes Snappy Parquet; (a) and (a') include the commit "
        "(landing the raw files is part of no side)"
    )
    title = (
        f"bench --suite load: rows/s ({m.cores} cores; load average before {m.load_average_before}, after "
        f"{m.load_average_after})"
    )
    columns = [
        "rows",
        "(a) Spark local[*] -> DuckLake",
        "(a') standalone cluster -> DuckLake",
        "(b) Spark -> plain Parquet",
        "(c) DuckDB alone",
        "a/c",
        "a'/a",
        "a/b",
        "load avg at b / a / c / a'",
    ]
    return Report(r, Table(title, columns, cells), notes, {"suite": "load", **r.as_dict()})


def queries(
    kit: Kit, *, rows: tuple[int, ...] | None = None, runs: int = 5, out: Path | None = None, png: Path | None = None
) -> Report:
    size = _one_size("queries", rows, 1_000_000)  # refused before the suite's module (Spark) loads
    from ducklake_kit.bench.queries import bench_queries

    report = queries_report(bench_queries(kit, rows=size, runs=runs, outputs=Outputs(out, png)))
    report.written = _files(out, png)
    return report


def queries_report(r: QueriesRun) -> Report:
    from ducklake_kit.bench.queries import GOAL_LAKE_TO_PARQUET, GOAL_SPEEDUP_VS_SPARK

    t, fc = r.totals, r.fixed_cost
    cells = [
        [
            q.name,
            *(f"{q.engines[e].median_s * 1000:.1f}" for e in ("ducklake", "parquet", "spark")),
            q.ratio_ducklake_to_parquet,
            q.speedup_vs_spark,
            "yes" if q.answers_agree else "NO",
        ]
        for q in r.queries
    ]
    notes = []
    if fc:
        notes.append(
            f"fixed cost of a DuckLake query (`{fc['probe']}`): {fc['ducklake_ms']} ms vs {fc['parquet_ms']} ms on the "
            f"same files as plain Parquet ({fc['catalog_round_trips']} catalog round trips)"
        )
    notes.append(
        f"sum of medians: DuckLake/Parquet {t.ratio_ducklake_to_parquet} (goal <= {GOAL_LAKE_TO_PARQUET}: "
        f"{_met(t.ratio_met)}); Spark/DuckLake {t.speedup_vs_spark}x (goal >= {GOAL_SPEEDUP_VS_SPARK}x: "
        f"{_met(t.speedup_met)})"
    )
    title = (
        f"bench --suite queries: {r.table_rows:,} trips, median of {r.runs} runs ({r.machine.cores} cores; "
        f"load average {r.machine.load_average_before[0]})"
    )
    columns = [
        "query",
        "DuckLake ms",
        "same files as plain Parquet ms",
        "Spark SQL ms",
        "DuckLake/Parquet",
        "Spark/DuckLake",
        "answers agree",
    ]
    return Report(
        r,
        Table(title, columns, cells),
        notes,
        r.as_dict(),
        defect=None if r.answers_agree else "the engines returned different answers",
        fix="see the JSON results (--out FILE) for the differences",
    )


def concurrency(
    kit: Kit,
    *,
    writers: int = 3,
    ops: int = 100,
    modes: str | None = None,
    out: Path | None = None,
    png: Path | None = None,
) -> Report:
    from ducklake_kit.bench.concurrency import MODES, bench_concurrency

    chosen = tuple(m.strip() for m in modes.split(",") if m.strip()) if modes else MODES
    r = bench_concurrency(kit, writers=writers, ops=ops, modes=chosen, outputs=Outputs(out, png))
    report = concurrency_report(r)
    report.written = _files(out, png)
    return report


def concurrency_report(r: ConcurrencyRun) -> Report:
    from ducklake_kit.bench.concurrency import CONTENTION_GOALS

    m = r.machine
    cells = [
        [mode, x.commit_gate or "-", x.ops_per_s, x.total_s, x.median_ms, x.p99_ms, x.max_ms]
        + [x.errors, x.retries, x.rows_lost, x.duplicate_rows]
        for mode, x in r.results.items()
    ]
    notes, g = [], CONTENTION_GOALS
    if r.goals is not None:
        notes.append(f"goals for DuckLake at 3 x 100 (total < 1 s, median < 5 ms, 0 errors, 0 lost): {r.goals.met}")
        notes.append(
            f"goals under contention, set at 16 x 1,000 (p99 <= {g['p99_ms']:g} ms, max <= {g['max_ms']:g} ms, "
            f">= {g['ops_per_s']:g} inserts/s, 0 lost, 0 duplicated): "
            + "; ".join(
                f"{mode} {'met' if all(v.values()) else 'NOT met: ' + ', '.join(k for k, ok in v.items() if not ok)}"
                for mode, v in r.goals.contention_met.items()
            )
        )
    if r.floor is not None:
        fl, reach = r.floor, (r.goals.reachable_here if r.goals and r.goals.reachable_here is not None else {})
        notes.append(
            f"floor from one writer measured alone: {fl.cpu_ms_per_insert} ms CPU an insert, so >= "
            f"{fl.total_s_at_least} s total and >= {fl.median_ms_at_least} ms median here; time goals reachable on "
            f"this machine: {reach}"
        )
        if r.goals is not None and r.goals.contention_reachable_here is not None:
            notes.append(
                f"so at most {fl.ops_per_s_at_most} inserts/s and, {r.writers} writers each waiting for the others, a "
                f"mean latency >= {fl.mean_ms_at_least} ms (Little's law); through the commit gate, one commit at a "
                f"time: at most {fl.gated_ops_per_s_at_most} inserts/s, a mean >= {fl.gated_mean_ms_at_least} ms; "
                f"p99 <= {g['p99_ms']:g} ms with max <= {g['max_ms']:g} ms needs a mean <= "
                f"{round(0.99 * g['p99_ms'] + 0.01 * g['max_ms'], 1)} ms; contention goals reachable on this "
                f"machine: {r.goals.contention_reachable_here}"
            )
    passed = []
    if r.vs_floor:
        passed.append(
            "total over the floor's total (goal <= 1.5 at 3 x 100): "
            + ", ".join(f"{mode} {v}x" for mode, v in r.vs_floor.items())
        )
    for mode, d in r.results.items():
        if mode != "file":
            label = "DuckLake" if mode.startswith("ducklake") else "DuckLake from the worker plane"
            passed.append(
                f"PASS: {label} (commit gate {d.commit_gate}) kept all {d.actual_rows} of {d.expected_rows} rows, "
                "none lost or duplicated"
            )
    title = (
        f"bench --suite concurrency: {r.writers} writers x {r.ops_per_writer} inserts ({m.cores} cores; load average "
        f"{m.load_average_before[0]} before, {m.load_average_after[0]} after)"
    )
    columns = ["target", "commit gate", "inserts/s", "total s", "p50 ms", "p99 ms", "max ms"]
    columns += ["errors", "retries", "rows lost", "duplicated"]
    return Report(
        r,
        Table(title, columns, cells),
        notes,
        r.as_dict(),
        defect=r.lake_defect(),  # the correctness claim (not the speed goals)
        fix="see errors_by_kind in the JSON results (--out FILE)",
        passed=passed,
    )


def pipeline(kit: Kit, *, workers: int = 2, out: Path | None = None) -> Report:
    from ducklake_kit.bench.pipeline import bench_pipeline

    report = pipeline_report(bench_pipeline(kit, workers=workers, json_path=out))
    report.written = _files(out)
    return report


def pipeline_report(r: PipelineBench) -> Report:
    from ducklake_kit.bench.pipeline import GOAL_SCHEDULING_MS, GOAL_VS_BOUND

    p, s = r.parallel, r.serial
    cells = [
        [f"DAG on {r.workers} workers", p.makespan_s, p.total_node_s, p.critical_path_s, p.bound_s, p.vs_bound],
        ["serial (one worker)", s.makespan_s, s.total_node_s, s.critical_path_s, s.bound_s, s.vs_bound],
    ]
    notes = [
        f"speed-up over the serial run: {r.speedup_vs_serial}x; makespan / bound {p.vs_bound} (goal <= "
        f"{GOAL_VS_BOUND}: {_met(p.vs_bound <= GOAL_VS_BOUND)})",
        f"scheduling cost: {r.scheduling_ms_per_node} ms a node over a chain of {r.scheduling_nodes} trivial nodes "
        f"(goal < {GOAL_SCHEDULING_MS:g} ms: {_met(r.scheduling_ms_per_node < GOAL_SCHEDULING_MS)})",
    ]
    c = r.changes
    if c is not None:
        notes.append(
            f"change-aware: {c.nodes} lake tables, a --force run {c.forced_run_s} s, the same run again "
            f"{c.unchanged_run_s} s with {c.unchanged_nodes} of {c.nodes} nodes unchanged (end to end)"
        )
    unchanged = c is None or c.unchanged_nodes == c.nodes
    i = r.incremental
    if i is not None:
        notes.append(
            f"incremental_by_time after one more month ({i.months_before} before, {i.month_rows:,} rows each): read "
            f"{i.rows_read_incremental:,} of {i.rows_full_rebuild:,} source rows a full rebuild reads (ratio "
            f"{i.ratio}, 1/{i.months_before + 1} = {1 / (i.months_before + 1):.4f}); {i.mode} run "
            f"{i.incremental_run_s} s vs the full build {i.full_run_s} s; equals a full rebuild: "
            f"{'yes' if i.equals_full else 'NO'}"
        )
    k = r.by_key
    if k is not None:
        notes.append(
            f"incremental_by_key after {k.changed_keys:,} of {k.keys:,} accounts changed ({k.source_rows:,} ledger "
            f"rows): merged {k.rows_merged:,} of the {k.rows_full_rebuild:,} rows a full rebuild writes (ratio "
            f"{k.ratio}); {k.mode} run {k.incremental_run_s} s vs the full build {k.full_run_s} s; equals a full "
            f"rebuild: {'yes' if k.equals_full else 'NO'}"
        )
    incremental_ok = i is None or (i.equals_full and i.mode == "incremental")
    incremental_ok = incremental_ok and (k is None or (k.equals_full and k.mode == "incremental"))
    title = (
        f"bench --suite pipeline: {r.independent} independent nodes + a chain of {r.chain} "
        f"({r.rows_per_node:,} rows of md5 each) on {r.workers} workers ({r.machine.cores} cores; load "
        f"average {r.machine.load_average_before[0]})"
    )
    columns = ["run", "makespan s", "node time s (total)", "critical path s", "bound s", "makespan / bound"]
    return Report(
        r,
        Table(title, columns, cells),
        notes,
        r.as_dict(),
        defect=None
        if r.order_held and unchanged and incremental_ok
        else (
            "a node started before one of its dependencies finished"
            if not r.order_held
            else "a second run of an unchanged pipeline ran nodes"
            if not unchanged
            else "the incremental node did not run incrementally or differs from a full rebuild"
        ),
        fix="this is a defect of the runner: report it",
    )


def steps(kit: Kit, *, workers: int = 3, ops: int = 100, out: Path | None = None) -> Report:
    from ducklake_kit.bench.steps import bench_steps

    report = steps_report(bench_steps(kit, workers=workers, iterations=ops, json_path=out))
    report.written = _files(out)
    return report


def steps_report(r: StepsBench) -> Report:
    from ducklake_kit.bench.steps import GOAL_VS_DIRECT, SEED

    f, workers, each = r.runner, r.workers, r.direct_inserts // r.workers
    cells = [
        ["step runner (loop, mode: async)", f.total_s, f.median_ms, f.p95_ms, f.errors, f.rows_lost],
        [
            f"direct: {workers} processes x {each}, scaled to {f.iterations}",
            r.direct_total_scaled_s,
            r.direct_median_ms,
            "-",
            r.direct_errors,
            r.direct_rows_lost,
        ],
        [
            f"worker plane, no runner: {workers} tasks x {each}, scaled",
            r.plane_total_scaled_s,
            r.plane_median_ms,
            "-",
            r.plane_errors,
            r.plane_rows_lost,
        ],
        ["the seed (NoETL, 100 over 3)", SEED["total_s"], SEED["median_ms"], "-", "-", "-"],
    ]
    notes = [
        f"runner / direct: {r.ratio_vs_direct}x (goal <= {GOAL_VS_DIRECT}: {_met(r.goal_met)}); "
        f"workers used: {', '.join(f.workers_used)}"
    ]
    title = (
        f"bench --suite steps: {f.iterations} one-row INSERTs over {workers} workers ({r.machine.cores} cores; "
        f"load average {r.machine.load_average_before[0]})"
    )
    columns = ["", "total s", "median ms", "p95 ms", "errors", "rows lost"]
    passed = [f"PASS: all {f.iterations} iterations inserted their row exactly once ({f.rows_counted} rows counted)"]
    return Report(r, Table(title, columns, cells), notes, r.as_dict(), defect=r.defect(), passed=passed)


def dynamic(
    kit: Kit,
    *,
    rows: tuple[int, ...] | None = None,
    runs: int = 2,
    months: int | tuple[int, int] = 12,
    file_cache: bool = False,
    out: Path | None = None,
) -> Report:
    size = _one_size("dynamic", rows, 100_000)  # refused before the suite's module (Spark) loads
    from ducklake_kit.bench.dynamic import bench_dynamic

    r = bench_dynamic(kit, months=months, rows_per_month=size, runs=runs, file_cache=file_cache, json_path=out)
    report = dynamic_report(r)
    report.written = _files(out)
    return report


def dynamic_report(r: DynamicBench) -> Report:
    g = r.goals()
    cells = []
    for b in r.bases:
        cells.append(
            [b.months, f"{b.base_rows:,}", f"{b.small_change_rows:,}"]
            + [b.small_incremental_median_s, b.small_full_median_s, b.small_ratio]
        )
        cells.append(
            [b.months, f"{b.base_rows:,}", f"{b.change_rows:,}", b.incremental_median_s, b.full_median_s, b.ratio]
        )
    size_note = "" if g["at_goal_size"] else f" (the goal is set at {g['goal_base_rows']:,} base rows: --rows 1000000)"
    c = g["change"]
    change_note = "" if c["at_goal_size"] else " (the goal is set at 100,000 rows into 12,000,000 and 48,000,000: "
    change_note += "" if c["at_goal_size"] else "--rows 1000000 --months 12,48)"
    notes = [
        f"a month appended: incremental / full at {g['first_base_rows']:,} rows: {g['ratio_at_first_base']} (goal <= "
        f"{g['ratio_goal']}: {_met(g['ratio_met'])}){size_note}; from {g['first_base_rows']:,} to "
        f"{g['second_base_rows']:,} base rows the incremental time changed by {g['growth_when_doubled']:+.0%} (goal, "
        f"for a doubling: under {g['growth_goal']:.0%}: {_met(g['growth_met'])})",
        f"a change of {c['change_rows']:,} rows: incremental / full at {c['first_base_rows']:,} rows: {c['ratio']} "
        f"(goal <= {c['ratio_goal']}: {_met(c['ratio_met'])}); from {c['first_base_rows']:,} to "
        f"{c['second_base_rows']:,} base rows the incremental time grew {c['growth']:+.1%} (goal <= "
        f"{c['growth_goal']:+.0%}: {_met(c['growth_met'])}){change_note}; its incremental refresh's phases (ms, "
        "median): "
        + "; ".join(
            f"at {b.base_rows:,} rows " + ", ".join(f"{p} {ms:g}" for p, ms in b.small_phase_medians.items())
            for b in r.bases
        ),
    ]
    if r.fixed is not None:
        f = r.fixed
        phases = ", ".join(f"{p} {ms:g}" for p, ms in f.phase_medians.items())
        notes.append(
            f"fixed cost of a refresh (one row into {f.table_rows:,} rows, median of {f.runs}): {f.median_ms} ms "
            f"(goal < {g['fixed_cost_goal_ms']} ms: {_met(g['fixed_cost_met'])}); phases in ms: {phases}"
        )
    if r.stream is not None:
        st = r.stream
        chose = Counter(x.adaptive_mode for x in st.steps)
        measured = st.crossover()
        notes.append(
            f"stream of {len(st.steps)} refreshes on {st.base_rows:,} rows (appends of 1 %, one month replaced): "
            f"ADAPTIVE {st.total('adaptive')} s, always incremental {st.total('incremental')} s, always full "
            f"{st.total('full')} s; ADAPTIVE / the better = {st.ratio} (goal <= {g['adaptive_goal']}: "
            f"{_met(g['adaptive_met'])}); ADAPTIVE chose "
            + ", ".join(f"{m.lower()} {n}" for m, n in sorted(chose.items()))
            + "; crossover measured here: "
            + (f"{measured:.1%}" if measured is not None else "none (one mode was faster throughout)")
            + f" of the base (the kit's cost model turns at {st.as_dict()['crossover_used_at_base']:.1%} of these "
            f"{st.base_rows:,} rows, {st.as_dict()['crossover_used']:.1%} on very large sources)"
        )
        per = st.per_step()
        notes.append(
            f"per step, ADAPTIVE over the better of the other two: median {per['median']}, worst {per['worst']}, "
            f"{per['over_goal']} of {len(st.steps)} steps over {g['adaptive_goal']} (goal: none: "
            f"{_met(g['adaptive_per_step_met'])}); ADAPTIVE chose the mode that was faster in {per['chose_faster']} "
            f"of {len(st.steps)} steps ({per['over_chose_faster']} of the steps over {g['adaptive_goal']}); each "
            f"mode's time the median of its {len(st.steps[0].incremental_tables_s) if st.steps else 0} tables; "
            f"from one table per mode: median {per['one_table']['median']}, worst {per['one_table']['worst']}, "
            f"{per['one_table']['over_goal']} over; the noise, a mode's slowest table over its fastest in one step: "
            f"worst {per['noise_worst']}"
            + (
                f"; in the {per['over_both_incremental']} steps over where both merged, ADAPTIVE's refreshes took "
                "more than the INCREMENTAL table's by (ms, summed): "
                + ", ".join(f"{p} {ms:+g}" for p, ms in per["over_gap_ms"].items())
                if per["over_both_incremental"]
                else ""
            )
        )
    if r.star is not None:
        sj = r.star.as_dict()
        notes.append(
            f"star join (1 fact of {r.star.base_rows:,} rows + 3 dimensions) after appends of {r.star.append_rows:,} "
            f"facts, median of {len(r.star.joined_s)}: {sj['joined_median_s']} s against {sj['plain_median_s']} s "
            f"for the same groups without the joins = {sj['ratio']}x, delta terms evaluated: "
            f"{', '.join(map(str, r.star.joined_terms))}, dimensions read from memory: "
            f"{', '.join(map(str, r.star.joined_copied))} (goal <= {sj['goal']}x and 1 term: {_met(sj['met'])})"
        )
    if r.chain is not None:
        ch = r.chain.as_dict()
        notes.append(
            f"one row through a chain of 3 DOWNSTREAM tables, end to end (insert committed, the last table "
            f"refreshed, upstream first), median of {len(r.chain.end_to_end_s)}: {ch['median_s']} s "
            f"(goal < {ch['goal_s']} s: {_met(ch['met'])})"
        )
    passed = [
        f"PASS: every table equals its query run in full after its refreshes; incremental: {r.bases[0].incremental_how}"
    ]
    title = (
        f"bench --suite dynamic: daily revenue by borough, a tenth of a month then a month appended, each refreshed, "
        f"median of "
        f"{r.runs} ({r.machine.cores} cores; load average {r.machine.load_average_before[0]}; file cache "
        f"{'on' if r.file_cache else 'off'})"
    )
    columns = ["base months", "base rows", "rows appended", "incremental s", "full s", "incremental / full"]
    return Report(r, Table(title, columns, cells), notes, r.as_dict(), passed=passed)


def console(kit: Kit, *, rows: tuple[int, ...] | None = None, runs: int = 3, out: Path | None = None) -> Report:
    from ducklake_kit.bench.console import DEFAULT_ROWS, bench_console, report

    if rows and len(rows) != 1:
        raise KitError("--suite console takes one size", "e.g. --rows 10000000", exit_code=EXIT_USAGE)
    made = report(bench_console(kit, rows=rows[0] if rows else DEFAULT_ROWS, runs=runs, json_path=out))
    made.written = _files(out)
    return made
