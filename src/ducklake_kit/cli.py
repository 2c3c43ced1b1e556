"""The harness: thin commands that parse, call the library, and render.

Exit codes: 0 ok, 1 a computed check failed, 2 usage error, 3 bad input, an environment problem or a declined confirmation.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import duckdb
import psycopg
import typer
from botocore.exceptions import BotoCoreError, ClientError

from . import connect as connect_mod
from . import doctor as doctor_mod
from .taxi import sources
from .checks import CheckRun
from .errors import EXIT_CHECK_FAILED, EXIT_ERROR, KitError, first_line
from .lake import Lake
from .output import console, print_checks, print_json, render_checks, render_statement, table
from .platforms import PLATFORMS, get_platform
from .state import State

app = typer.Typer(
    help="ducklake-kit: a DuckLake learning lab (DuckDB engine, PostgreSQL catalog, Parquet on S3).\n\n"
    "Exit codes: 0 ok, 1 a check failed, 2 usage error, 3 bad input, an environment problem or a declined confirmation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

JsonOpt = Annotated[bool, typer.Option("--json", help='Print {"status", "result", "catalog_info"} as JSON.')]


class Ctx:
    def __init__(self, platform: str, home: Path | None, pg_port: int | None, s3_port: int | None):
        self.platform_name = platform
        self.state = State(home)
        self.options = {"pg_port": pg_port, "s3_port": s3_port} if platform in ("local", "k3d") else {}

    def platform(self):
        return get_platform(self.platform_name, self.state, **self.options)


@app.callback()
def main_options(
    ctx: typer.Context,
    platform: Annotated[str, typer.Option(envvar="DUCKLAKE_PLATFORM", help=f"Where the services run: {', '.join(PLATFORMS)}.")] = "local",
    home: Annotated[Optional[Path], typer.Option(envvar="DUCKLAKE_HOME", help="State folder (data, logs, credentials). Default: ./.ducklake")] = None,
    pg_port: Annotated[Optional[int], typer.Option(envvar="DUCKLAKE_PG_PORT", help="Local PostgreSQL port (default 55432; k3d: 55433, the port-forward).")] = None,
    s3_port: Annotated[Optional[int], typer.Option(envvar="DUCKLAKE_S3_PORT", help="Local S3 port (default 59000; k3d: 59001, the port-forward).")] = None,
) -> None:
    if platform not in PLATFORMS:
        raise typer.BadParameter(f"choose one of {', '.join(PLATFORMS)}", param_hint="--platform")
    ctx.obj = Ctx(platform, home, pg_port, s3_port)


def command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn KitError into one line on stderr (or a JSON error envelope) and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KitError as exc:
            _fail(exc, kwargs.get("as_json") is True)
        except (duckdb.Error, psycopg.Error, BotoCoreError, ClientError) as exc:
            # a service failed in a place without its own explanation: still one line, not a traceback
            first = first_line(exc)
            _fail(KitError(f"{type(exc).__name__}: {first}", "run `status` to see whether the services answer"),
                  kwargs.get("as_json") is True)

    return wrapper


def _fail(exc: KitError, as_json: bool) -> None:
    if as_json:
        print_json("error", {"error": exc.line(), "detail": exc.detail})
    else:
        typer.echo(exc.line(), err=True)  # one line, never wrapped
        if exc.detail:
            typer.echo(exc.detail, err=True)
    raise typer.Exit(exc.exit_code)


def _services_table(statuses) -> Any:
    rows = [[s.name, "yes" if s.healthy else "NO", s.port or "", s.pid or "", _size(s.data_bytes), s.detail] for s in statuses]
    return table("Services", ["service", "healthy", "port", "pid", "data", "detail"], rows)


def _size(n: int | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@app.command()
@command
def doctor(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Check prerequisites (Python, Java 17+, uv, just; docker, k3d, kubectl for k3d) with versions and install hints."""
    c: Ctx = ctx.obj
    tools = doctor_mod.check(c.platform_name)
    ok = all(t.ok for t in tools)
    if as_json:
        print_json("ok" if ok else "error", {"platform": c.platform_name, "tools": [t.as_dict() for t in tools]})
    else:
        rows = [[t.name, "ok" if t.found else ("MISSING" if t.required else "missing (optional here)"), t.version,
                 "" if t.found else t.hint] for t in tools]
        console().print(table(f"Prerequisites for --platform {c.platform_name}", ["tool", "state", "version", "install hint"], rows))
        for t in tools:
            if not t.ok:
                problem = "is missing" if t.version == "not found" else f"is not usable: {t.version}"
                typer.echo(f"Error: {t.name} {problem} ({t.why}). Try: {t.hint}.", err=True)
    if not ok:
        raise typer.Exit(EXIT_ERROR)


@app.command()
@command
def up(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Start the catalog (PostgreSQL) and the S3 store, create the catalog database and buckets. Idempotent."""
    platform = ctx.obj.platform()
    statuses = platform.up()
    if as_json:
        print_json("ok", {"services": [vars(s) for s in statuses]})
    else:
        console().print(_services_table(statuses))


@app.command()
@command
def down(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Stop the services the kit started. Data stays (see `reset`)."""
    msgs = ctx.obj.platform().down()
    if as_json:
        print_json("ok", {"stopped": msgs})
    else:
        for m in msgs:
            console().print(m, markup=False)


@app.command()
@command
def status(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Show each service's health (a real round trip), port, pid and data size. Exit 1 when one is down."""
    statuses = ctx.obj.platform().status()
    healthy = all(s.healthy for s in statuses)
    if as_json:
        print_json("ok" if healthy else "error", {"services": [vars(s) for s in statuses]})
    else:
        console().print(_services_table(statuses))
    if not healthy:
        raise typer.Exit(EXIT_CHECK_FAILED)


@app.command()
@command
def reset(
    ctx: typer.Context,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Stop the services and delete all their data and credentials (asks first)."""
    c: Ctx = ctx.obj
    if not yes and not typer.confirm(f"Delete the catalog, the lake data and the credentials in {c.state.home}?", default=False):
        raise KitError("reset cancelled; nothing was deleted", "pass --yes to reset without asking")
    msgs = c.platform().reset()
    if as_json:
        print_json("ok", {"reset": msgs})
    else:
        for m in msgs:
            console().print(m, markup=False)


@app.command()
@command
def connect(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Print how to reach the catalog (psql, DBeaver) and the lake (DuckDB CLI with an init SQL file)."""
    c: Ctx = ctx.obj
    info = connect_mod.describe(c.state, c.platform().endpoints())
    if as_json:
        print_json("ok", info)
        return
    out = console()
    out.print("[bold]Catalog (PostgreSQL) with psql:[/]")
    out.print(f"  {info['psql']}", markup=False)
    out.print("  worth running there:")
    for q in info["psql_queries"]:
        out.print(f"    {q}", markup=False)
    out.print("[bold]Lake with the DuckDB CLI[/] (extensions from the wheels, lake attached):")
    out.print(f"  {info['duckdb_cli']}", markup=False)
    out.print("  then e.g.: FROM ducklake_snapshots('lake');", markup=False)
    out.print("  or simply: python ducklake_test.py shell   (the same command, run for you)", markup=False)
    out.print("[bold]DBeaver:[/]")
    for kind, settings in info["dbeaver"].items():
        out.print(f"  {kind}: " + ", ".join(f"{k}={v}" for k, v in settings.items()), markup=False)
    out.print("[bold]S3:[/] " + ", ".join(f"{k}={v}" for k, v in info["s3"].items()), markup=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@command
def shell(ctx: typer.Context) -> None:
    """Open the DuckDB CLI with the lake attached (the init SQL `connect` prints); extra arguments go to duckdb, e.g. -c "SQL"."""
    import subprocess

    c: Ctx = ctx.obj
    argv = connect_mod.shell_argv(c.state, c.platform().endpoints(), list(ctx.args))
    try:
        code = subprocess.call(argv)
    except OSError as exc:
        raise KitError(f"could not start the DuckDB CLI {argv[0]} ({exc.strerror})",
                       "run `uv sync`: the duckdb-cli wheel provides it") from None
    raise typer.Exit(code)


@app.command()
@command
def sql(
    ctx: typer.Context,
    query: Annotated[str, typer.Argument(help="One or more SQL statements, run against the attached lake (USE lake).")],
    expect: Annotated[Optional[str], typer.Option(
        help="Check the answer: the last statement must return exactly one value equal to this text (else exit 1).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run SQL against the lake; rows for every statement that returns them, real affected-row counts."""
    c: Ctx = ctx.obj
    with Lake(c.platform().endpoints()) as lake:
        results = lake.run(query)
        info = lake.catalog_info(c.platform_name)
    check = expect_check(results[-1], expect) if expect is not None else None
    if as_json:
        body: dict[str, Any] = {"statements": [r.as_dict() for r in results]}
        if check:
            body["expect"] = check
        print_json("ok" if not check or check["passed"] else "error", body, info)
    else:
        for r in results:
            console().print(render_statement(r))
        if check:
            typer.echo(f"{'ok' if check['passed'] else 'FAIL'}: expected {check['expected']}, got {check['actual']}")
    if check and not check["passed"]:
        raise typer.Exit(EXIT_CHECK_FAILED)


def expect_check(result, expected: str) -> dict[str, Any]:
    """Compare a statement's single value (or affected-row count) with the expected text."""
    if result.affected_rows is not None:
        actual = str(result.affected_rows)
    elif len(result.rows) == 1 and len(result.rows[0]) == 1:
        value = result.rows[0][0]
        # as SQL prints it: NULL, true/false
        actual = "NULL" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    else:
        actual = f"{len(result.rows)} rows x {len(result.columns)} columns (--expect needs exactly one value)"
    return {"expected": expected, "actual": actual, "passed": actual == expected}


@app.command()
@command
def load(
    ctx: typer.Context,
    source: Annotated[str, typer.Option(help="auto (TLC if reachable, else synthetic), tlc, synthetic or files.")] = "auto",
    months: Annotated[str, typer.Option(help="Months to load: 2024-01..2024-03 or 2024-01,2024-05.")] = sources.DEFAULT_MONTHS,
    path: Annotated[Optional[list[str]], typer.Option(help="Files or globs for --source files (repeatable).")] = None,
    rows_per_month: Annotated[int, typer.Option(help="Rows a synthetic month holds.")] = sources.DEFAULT_ROWS_PER_MONTH,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic generator (same seed, same data).")] = 0,
    mode: Annotated[str, typer.Option(help="skip (a file already loaded is not loaded again), append, or replace.")] = "skip",
    spark_master: Annotated[Optional[str], typer.Option(help="Spark master URL (default local[*]); SPARK_REMOTE for Spark Connect.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Load NYC taxi trips through PySpark into the lake: one load, one snapshot; re-running is a no-op."""
    from .taxi import flow as taxi_flow  # Spark and pyarrow load only for the commands that use them

    c: Ctx = ctx.obj
    result, run = taxi_flow.load_and_verify(
        c.platform(), c.state, source=source, months=months, paths=path or [], rows_per_month=rows_per_month,
        seed=seed, mode=mode, spark_master=spark_master, on_step=_step_printer(as_json))
    if as_json:
        print_json("ok" if run.ok else "error", {**result.as_dict(), **run.as_dict()})
    else:
        _render_load(result, run)
    if not run.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


def _step_printer(as_json: bool) -> Callable[[str], None]:
    out = console(stderr=as_json)
    return lambda msg: out.print(f"[dim]•[/] {msg}", markup=True, highlight=False)


def _render_load(result, run: CheckRun) -> None:
    out = console()
    rows = [[f.source.path.name, f.source.period, f.status, f"{f.rows_read:,}", f"{f.rows_accepted:,}", f"{f.rows_rejected:,}",
             f.data_files, f.reason] for f in result.files]
    out.print(table(f"Load {result.load_id} ({result.source_note}; zones: {result.zones})",
                    ["file", "period", "status", "read", "accepted", "quarantined", "data files", "note"], rows))
    snap = (f"snapshot {result.snapshot_id} (was {result.previous_snapshot})" if result.snapshot_id is not None
            else f"no new snapshot (still {result.previous_snapshot})")
    timing = ", ".join(f"{k} {v:.1f}s" for k, v in result.timings.items())
    out.print(f"{snap}; {timing}", markup=False)
    if run.checks:
        print_checks(run, "Loaded figures vs the source (computed independently)")


@app.command()
@command
def bench(
    ctx: typer.Context,
    suite: Annotated[str, typer.Option(help="load (DuckLake vs plain Parquet writes), queries (DuckLake vs Parquet on S3 vs Spark SQL) or concurrency (many writers).")] = "load",
    rows: Annotated[Optional[list[int]], typer.Option(help="Rows (load: repeat to compare sizes; queries: one size). Default 1,000,000.")] = None,
    runs: Annotated[int, typer.Option(help="queries: timed runs per query and engine, after one warm-up.")] = 5,
    workers: Annotated[int, typer.Option(help="concurrency: writer processes.")] = 3,
    ops: Annotated[int, typer.Option(help="concurrency: inserts per writer.")] = 100,
    json_file: Annotated[Optional[Path], typer.Option("--json", help="Also write the results to this JSON file.")] = None,
    png_file: Annotated[Optional[Path], typer.Option("--png", help="queries/concurrency: also draw a bar chart to this PNG file.")] = None,
) -> None:
    """Measure, in one run, and print the figures (commands, not timed tests): --suite load, queries or concurrency."""
    from . import bench as bench_mod

    suites = ("load", "queries", "concurrency")
    if suite not in suites:
        raise KitError(f"unknown suite '{suite}'", f"choose one of: {', '.join(suites)}")
    c: Ctx = ctx.obj
    step = _step_printer(False)
    out = console()
    if suite == "queries":
        from .bench_queries import bench_queries

        r = bench_queries(c.platform(), c.state, rows=(rows or [1_000_000])[0], runs=runs, on_step=step,
                          json_path=json_file, png_path=png_file)
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
        if not r["answers_agree"]:
            raise KitError("the engines returned different answers", "see the JSON results (--json FILE) for the differences",
                           exit_code=EXIT_CHECK_FAILED)
        return
    if suite == "concurrency":
        from .bench_concurrency import bench_concurrency

        r = bench_concurrency(c.platform(), c.state, workers=workers, ops=ops, on_step=step, json_path=json_file, png_path=png_file)
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
        if d:
            # the correctness claim (not the speed goals): every insert that reported success is in the table, once
            if d["rows_lost"] or d["duplicate_rows"]:
                raise KitError(f"DuckLake lost {d['rows_lost']} and duplicated {d['duplicate_rows']} of {d['expected_rows']} rows "
                               f"({d['errors']} inserts reported an error, {d['silently_lost']} lost silently)",
                               "see errors_by_kind in the JSON results (--json FILE)", exit_code=EXIT_CHECK_FAILED)
            out.print(f"PASS: DuckLake kept all {d['actual_rows']} of {d['expected_rows']} rows, none lost or duplicated", markup=False)
        return
    results = [bench_mod.bench_load(c.platform(), c.state, n, on_step=step) for n in (rows or [1_000_000])]
    rows_out = []
    for r in results:
        d, p = r["ducklake"], r["parquet"]
        rows_out.append([f"{r['rows']:,}", f"{d['rows_per_s']:,}", f"{p['rows_per_s']:,}", f"{r['ratio_ducklake_to_parquet']:.2f}",
                         f"{d['driver_python_peak_mib']} (+{d['driver_python_growth_mib']}) / {d['driver_jvm_peak_mib']}",
                         f"{p['driver_python_peak_mib']} (+{p['driver_python_growth_mib']}) / {p['driver_jvm_peak_mib']}"])
    out.print(table(f"bench --suite load ({results[0]['cores']} cores; goal: ratio >= {results[0]['goal_ratio']})",
                    ["rows", "DuckLake rows/s", "Parquet rows/s", "ratio",
                     "DuckLake: driver peak MiB, python (+growth during the load) / JVM", "Parquet: same"], rows_out))
    if json_file:
        json_file.parent.mkdir(parents=True, exist_ok=True)
        json_file.write_text(json.dumps({"suite": suite, "results": results}, indent=2))
        out.print(f"wrote {json_file}", markup=False)


@app.command()
@command
def query(
    ctx: typer.Context,
    names: Annotated[Optional[list[str]], typer.Argument(help="Queries to run (file names in queries/ without the number); all by default.")] = None,
    check: Annotated[bool, typer.Option("--check/--no-check", help="Check each answer against the source files (default).")] = True,
    as_json: JsonOpt = False,
) -> None:
    """Run the named queries from queries/ and check each answer against an independent computation on the raw files."""
    from . import queries as q

    c: Ctx = ctx.obj
    run = CheckRun()
    with Lake(c.platform().endpoints()) as lake:
        if check:
            answers = q.check_queries(lake, run, names or None)
        else:
            answers = {n: q.run_query(lake, n) for n in (names or [x.name for x in q.list_queries()])}
        info = lake.catalog_info(c.platform_name)
    if as_json:
        print_json("ok" if run.ok else "error", {"queries": q.answers_as_dict(answers), **run.as_dict()}, info)
    else:
        out = console()
        teaches = {x.name: x.teaches for x in q.list_queries()}
        for name, (columns, rows, seconds) in answers.items():
            out.print(table(f"{name} ({len(rows)} rows, {seconds * 1000:.0f} ms): {teaches.get(name, '')}", columns, rows[:25]))
            if len(rows) > 25:
                out.print(f"... {len(rows) - 25} more rows (--json for all)", markup=False)
        if check:
            print_checks(run, "Answers vs the source files (computed independently)")
    if check and not run.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


@app.command()
@command
def timetravel(
    ctx: typer.Context,
    rows_per_month: Annotated[int, typer.Option(help="Synthetic trips a month in the lesson's two loads.")] = 20_000,
    as_json: JsonOpt = False,
) -> None:
    """The time-travel and change-feed lesson, checked: two loads, a correction, AT (VERSION/TIMESTAMP), table_changes, a restore."""
    from . import timetravel as tt

    c: Ctx = ctx.obj
    run = CheckRun()
    result = tt.run_timetravel(c.platform(), c.state, run, rows_per_month=rows_per_month, on_step=_step_printer(as_json))
    if as_json:
        print_json("ok" if run.ok else "error", {**result, **run.as_dict()})
    else:
        out = console()
        out.print(table(f"Snapshots of the lesson (schema {result['schema']})", ["step", "snapshot_id", "time", "message"],
                        [[r.get("step"), r.get("snapshot_id"), r.get("snapshot_time"), r.get("commit_message")]
                         for r in result["snapshots"]]))
        out.print(table("trips AT (VERSION => n)", ["step", "snapshot_id", "trips"],
                        [[r["step"], r["snapshot_id"], f"{r['trips']:,}"] for r in result["counts_at_version"]]))
        out.print(f"AT (TIMESTAMP => ...): {result['at_timestamp']}", markup=False)
        out.print(table("ducklake_table_changes (from..to, both included)", ["from", "to", "changes"],
                        [[r["from"], r["to"], {k: v for k, v in r.items() if k not in ("from", "to")}] for r in result["changes"]]))
        out.print(f"correction: {result['rule']} ({result['rule_why']}); restore: {result['restore']}", markup=False)
        print_checks(run, "Time travel checks")
    if not run.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


@app.command()
@command
def maintain(
    ctx: typer.Context,
    older_than: Annotated[str, typer.Option(help="Expire snapshots (and delete orphaned files) older than this: '7 days', '2 hours', '0 seconds' (all but the current one), or a timestamp.")] = "7 days",
    version: Annotated[Optional[list[int]], typer.Option(help="Expire exactly this snapshot instead (repeatable).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would go; change nothing.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Flush inlined data, merge adjacent files, expire snapshots, clean up old and orphaned files, CHECKPOINT; checked."""
    from . import maintain as mt

    c: Ctx = ctx.obj
    run = CheckRun()
    result = mt.run_maintain(c.platform(), run, older_than=older_than, versions=version or None, dry_run=dry_run,
                             on_step=_step_printer(as_json))
    if as_json:
        print_json("ok" if run.ok else "error", {**result, **run.as_dict()})
    else:
        out = console()
        before, after = result["before"], result["after"]
        out.print(table("Before / after" + (" (dry run: nothing changed)" if dry_run else ""), ["", "before", "after"],
                        [[k, before[k], after.get(k)] for k in before]))
        detail = result.get("would") if dry_run else result.get("done")
        for k, v in (detail or {}).items():
            out.print(f"{'would ' if dry_run else ''}{k}: {v if not isinstance(v, list) or len(v) <= 5 else f'{len(v)} items'}", markup=False)
        print_checks(run, "Maintenance checks")
    if not run.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


@app.command(name="all")
@command
def all_(
    ctx: typer.Context,
    source: Annotated[str, typer.Option(help="Where the trips come from: synthetic (offline, quick), auto or tlc (downloads the real months).")] = "synthetic",
    mode: Annotated[str, typer.Option(help="Mode of the first load: skip, append or replace (the second is always skip).")] = "skip",
    bench: Annotated[bool, typer.Option("--bench/--no-bench", help="Finish with the short concurrency benchmark.")] = True,
    as_json: JsonOpt = False,
) -> None:
    """The whole flow with checks (what `just ducklake-test` runs): foundation, load, queries, time travel, maintenance, a short benchmark. Exit 0 only if every check holds."""
    from . import flow

    c: Ctx = ctx.obj
    run = CheckRun()
    result = flow.run_all(c.platform(), c.state, run, source=source, mode=mode, bench=bench, on_step=_step_printer(as_json))
    info = result.pop("catalog_info")
    if as_json:
        print_json("ok" if run.ok else "error", {**result, **run.as_dict()}, info)
    else:
        out = console()
        out.print(render_checks(run, f"ducklake-test on --platform {c.platform_name}"))
        if "bench" in result:
            out.print(_bench_concurrency_line(result["bench"]), markup=False)
        out.print(table("Summary", ["stage", "checks passed", "seconds"],
                        [[st["stage"], f"{st['passed']}/{st['checks']}", f"{st['seconds']:.1f}"] for st in run.summary()]
                        + [["total", f"{len(run.checks) - len(run.failed)}/{len(run.checks)}", f"{sum(run.stages.values()):.1f}"]]))
        verdict = f"{len(run.checks) - len(run.failed)}/{len(run.checks)} checks passed"
        out.print(f"[green]{verdict}[/]" if run.ok else f"[red]{verdict}[/]")
    if not run.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


def _bench_concurrency_line(figures: dict) -> str:
    parts = []
    for mode, r in figures["results"].items():
        parts.append(f"{mode}: {r['total_s']:.2f} s total, median {r['median_ms'] or 0:.1f} ms, p95 {r.get('p95_ms') or 0:.1f} ms, "
                     f"{r['errors']} errors, {r['rows_lost']} rows lost")
    return f"bench ({figures['workers']} writers x {figures['ops_per_worker']} inserts): " + "; ".join(parts)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
