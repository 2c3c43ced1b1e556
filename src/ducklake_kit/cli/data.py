"""Working with the lake: sql, load, query, timetravel, maintain, and `all` (the whole flow, checked)."""

from __future__ import annotations

import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from ducklake_kit.checks import CheckRun
from ducklake_kit.cli.common import JsonOpt, Kit, app, command, reporter
from ducklake_kit.cli.output import console, print_checks, print_json, render_checks, render_statement, table
from ducklake_kit.errors import EXIT_CHECK_FAILED, KitError
from ducklake_kit.lake import Lake, StatementFailed
from ducklake_kit.lake.expect import SqlRun, expect_value, run_sql
from ducklake_kit.lessons import LESSON_ROWS_PER_MONTH
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.taxi import sources


@app.command()
@command
def sql(
    ctx: typer.Context,
    query: Annotated[
        str | None,
        typer.Argument(
            help="One or more SQL statements, run against the attached lake (USE lake). Text that starts with `-` (a "
            '`--` comment) goes after `--`: sql -- "$(cat q.sql)"; or use --file.'
        ),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            "-f",
            help="Read the SQL from this file instead (`-`: standard input), as psql -f and duckdb -f do.",
        ),
    ] = None,
    expect: Annotated[
        str | None,
        typer.Option(
            help="Check the answer: the last statement must return exactly one value equal to this text (else exit 1)."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run SQL against the lake; rows for every statement that returns them, real affected-row counts. Dynamic-table DDL (CREATE DYNAMIC TABLE, ALTER / DROP / SHOW DYNAMIC ...) is accepted too."""
    c: Kit = ctx.obj
    query = _sql_text(query, file)
    ep = c.platform.endpoints()
    try:
        run = _dynamic_sql(c, ep, query, expect) or run_sql(ep, c.platform_name, query, expect)
    except StatementFailed as exc:
        raise _storage_down(exc, ep) or exc from None
    check = run.expectation
    if as_json:
        body: dict[str, Any] = {"statements": [r.as_dict() for r in run.results]}
        if check:
            body["expect"] = check.as_dict()
        print_json("ok" if run.ok else "error", body, run.catalog_info)
    else:
        for r in run.results:
            console().print(render_statement(r))
        if check:
            typer.echo(f"{'ok' if check.passed else 'FAIL'}: expected {check.expected}, got {check.actual}")
    if not run.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


def _sql_text(query: str | None, file: Path | None) -> str:
    """The SQL `sql` runs: the argument, or the file's text (`-`: standard input). Read as UTF-8 with an optional
    byte-order mark (editors on Windows write one; DuckDB would take it for part of the first keyword)."""
    if (query is None) == (file is None):
        raise KitError(
            "give the SQL as text or with --file, one of the two",
            'e.g. `sql "SELECT 1"`, `sql --file q.sql`, or `sql --file -` to read standard input',
        )
    if file is None:
        return query  # type: ignore[return-value]
    try:
        raw = sys.stdin.buffer.read() if str(file) == "-" else file.read_bytes()
        return raw.decode("utf-8-sig")
    except OSError as exc:
        raise KitError(
            f"cannot read the SQL file {file} ({exc.strerror})",
            "give the path of a readable .sql file, or - for standard input",
        ) from None
    except UnicodeDecodeError as exc:
        raise KitError(f"the SQL file {file} is not UTF-8 text (byte {exc.start})", "save it as UTF-8") from None


def _storage_down(exc: StatementFailed, ep: Endpoints) -> KitError | None:
    """When a failed statement met an S3 server that no longer answers: that, and `up`, instead of "fix the
    statement". Asked (a ListBuckets round trip), not guessed from DuckDB's text, as the load does."""
    from ducklake_kit.platforms import s3  # boto3: only once a statement failed (start-up)

    try:
        s3.list_buckets(ep.s3)
    except KitError as down:
        where = (
            ""
            if exc.total == 1
            else (f" at statement {exc.index + 1} of {exc.total} (the {exc.index} before it ran, the rest did not)")
        )
        return KitError(
            f"SQL failed{where} because the lake's S3 server stopped answering ({down.what})",
            "run `up` (it restarts what is down), then the SQL that did not run",
        )
    return None


def _dynamic_sql(c: Kit, ep: Endpoints, query: str, expect: str | None) -> SqlRun | None:
    """`sql` text with dynamic-table statements, run in order (None when it has none)."""
    if "dynamic" not in query.lower():
        # every dynamic-table statement has the keyword DYNAMIC: text without the word holds none, and needs no
        # tokenizing (sqlglot's import is ~45 ms of a `sql` call); text with it is read by ddl.has_dynamic
        return None
    from ducklake_kit.dynamic_tables import ddl

    if not ddl.has_dynamic(query):
        return None
    from ducklake_kit.dynamic_tables import manage  # the refresher and its catalog: only for dynamic-table statements
    from ducklake_kit.dynamic_tables.metadata import Metadata

    with Lake(ep) as lake, Metadata(ep) as meta:
        lake.autocommit_tag = {"run": "sql", "id": uuid.uuid4().hex}  # its plain writes, as run_sql tags them
        results = manage.run_text(lake, meta, query)
        info = lake.catalog_info(c.platform_name)
    return SqlRun(results, info, expect_value(results[-1], expect) if expect is not None and results else None)


@app.command()
@command
def load(
    ctx: typer.Context,
    source: Annotated[
        str, typer.Option(help="auto (TLC if reachable, else synthetic), tlc, synthetic or files.")
    ] = "auto",
    months: Annotated[
        str, typer.Option(help="Months to load: 2024-01..2024-03 or 2024-01,2024-05.")
    ] = sources.DEFAULT_MONTHS,
    path: Annotated[list[str] | None, typer.Option(help="Files or globs for --source files (repeatable).")] = None,
    rows_per_month: Annotated[int, typer.Option(help="Rows a synthetic month holds.")] = sources.DEFAULT_ROWS_PER_MONTH,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic generator (same seed, same data).")] = 0,
    mode: Annotated[
        str, typer.Option(help="skip (a file already loaded is not loaded again), append, or replace.")
    ] = "skip",
    spark_master: Annotated[
        str | None,
        typer.Option(
            help="Where Spark runs: local[*] (default), spark://host:port, sc://host:port (Spark Connect; "
            "or SPARK_REMOTE), or standalone / connect: the cluster `spark up` started."
        ),
    ] = None,
    load_id: Annotated[
        str | None,
        typer.Option(
            help="The load's id, 12 hex digits the lake has not seen (default: a new one): a caller that must find "
            "out afterwards whether the load committed (the console's Load page) chooses it."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Load NYC taxi trips through PySpark into the lake: one load, one snapshot; re-running is a no-op."""
    from ducklake_kit.taxi import flow as taxi_flow  # Spark and pyarrow load only for the commands that use them

    kit = replace(ctx.obj, spark_master=spark_master, reporter=reporter(as_json))
    spec = taxi_flow.LoadSpec(
        source=source,
        months=months,
        paths=path or [],
        rows_per_month=rows_per_month,
        seed=seed,
        mode=mode,
        load_id=load_id,
    )
    result, run = taxi_flow.load_checked(kit, spec)
    if as_json:
        print_json("ok" if run.ok else "error", {**result.as_dict(), **run.as_dict()})
    else:
        _render_load(result, run)
    if not run.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


def _render_load(result, run: CheckRun) -> None:
    out = console()
    rows = [
        [
            f.source.path.name,
            f.source.period,
            f.status,
            f"{f.rows_read:,}",
            f"{f.rows_accepted:,}",
            f"{f.rows_rejected:,}",
            f.data_files,
            f.reason,
        ]
        for f in result.files
    ]
    out.print(
        table(
            f"Load {result.load_id} ({result.source_note}; zones: {result.zones})",
            ["file", "period", "status", "read", "accepted", "quarantined", "data files", "note"],
            rows,
        )
    )
    snap = (
        f"snapshot {result.snapshot_id} (was {result.previous_snapshot})"
        if result.snapshot_id is not None
        else f"no new snapshot (still {result.previous_snapshot})"
    )
    timing = ", ".join(f"{k} {v:.1f}s" for k, v in result.timings.items())
    out.print(f"{snap}; {timing}", markup=False)
    if run.checks:
        print_checks(run, "Loaded figures vs the source (computed independently)")


@app.command()
@command
def query(
    ctx: typer.Context,
    names: Annotated[
        list[str] | None,
        typer.Argument(help="Queries to run (file names in queries/ without the number); all by default."),
    ] = None,
    check: Annotated[
        bool, typer.Option("--check/--no-check", help="Check each answer against the source files (default).")
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """Run the named queries from queries/ and check each answer against an independent computation on the raw files."""
    from ducklake_kit.lessons import queries as q  # lessons load only for the command that runs them (start-up)

    c: Kit = ctx.obj
    run = CheckRun()
    result = q.run(c, run, names=names or None, check=check)
    if as_json:  # --no-check computes no check: its answers are the result, and nothing failed
        status = "ok" if run.ok or not check else "error"
        print_json(status, {**result.as_dict(), **run.as_dict()}, result.catalog_info)
    else:
        out = console()
        teaches = {x.name: x.teaches for x in q.list_queries()}
        for name, (columns, rows, seconds) in result.answers.items():
            out.print(
                table(
                    f"{name} ({len(rows)} rows, {seconds * 1000:.0f} ms): {teaches.get(name, '')}", columns, rows[:25]
                )
            )
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
    rows_per_month: Annotated[
        int, typer.Option(help="Synthetic trips a month in the lesson's two loads.")
    ] = LESSON_ROWS_PER_MONTH,
    as_json: JsonOpt = False,
) -> None:
    """The time-travel and change-feed lesson, checked: two loads, a correction, AT (VERSION/TIMESTAMP), table_changes, a restore."""
    from ducklake_kit.lessons import timetravel as tt  # start-up: loads only for this command

    c: Kit = ctx.obj
    run = CheckRun()
    result = tt.run(c.with_reporter(reporter(as_json)), run, rows_per_month=rows_per_month)
    if as_json:
        print_json("ok" if run.ok else "error", {**result.as_dict(), **run.as_dict()})
    else:
        out = console()
        out.print(
            table(
                f"Snapshots of the lesson (schema {tt.SCHEMA})",
                ["step", "snapshot_id", "time", "message"],
                [
                    [r.get("step"), r.get("snapshot_id"), r.get("snapshot_time"), r.get("commit_message")]
                    for r in result.snapshots
                ],
            )
        )
        out.print(
            table(
                "trips AT (VERSION => n)",
                ["step", "snapshot_id", "trips"],
                [[r["step"], r["snapshot_id"], f"{r['trips']:,}"] for r in result.counts_at_version],
            )
        )
        out.print(f"AT (TIMESTAMP => ...): {result.at_timestamp}", markup=False)
        out.print(
            table(
                "ducklake_table_changes (from..to, both included)",
                ["from", "to", "changes"],
                [[r["from"], r["to"], {k: v for k, v in r.items() if k not in ("from", "to")}] for r in result.changes],
            )
        )
        out.print(f"correction: {tt.RULE} ({tt.RULE_WHY}); restore: {result.restore}", markup=False)
        print_checks(run, "Time travel checks")
    if not run.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


@app.command()
@command
def maintain(
    ctx: typer.Context,
    older_than: Annotated[
        str,
        typer.Option(
            help="Expire snapshots (and delete orphaned files) older than this: '7 days', '2 hours', '0 seconds' (all but the current one), or a timestamp."
        ),
    ] = "7 days",
    version: Annotated[
        list[int] | None, typer.Option(help="Expire exactly this snapshot instead (repeatable).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would go; change nothing.")] = False,
    dead_loads: Annotated[
        bool,
        typer.Option(
            "--dead-loads",
            help="Also delete now, whatever their age, the unreferenced files of loads known dead (killed or failed: their lock in the catalog is free); a running load's files are never touched.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Flush inlined data, merge adjacent files, expire snapshots, clean up old and orphaned files, CHECKPOINT; checked. Says how many unreferenced files it left, and why."""
    from ducklake_kit.lessons import maintain as mt  # start-up: loads only for this command

    c: Kit = ctx.obj
    run = CheckRun()
    result = mt.run(
        c.with_reporter(reporter(as_json)),
        run,
        older_than=older_than,
        versions=version or None,
        dry_run=dry_run,
        dead_loads=dead_loads,
    )
    if as_json:
        print_json("ok" if run.ok else "error", {**result.as_dict(), **run.as_dict()})
    else:
        out = console()
        before, after = result.before, result.after
        out.print(
            table(
                "Before / after" + (" (dry run: nothing changed)" if dry_run else ""),
                ["", "before", "after"],
                [[k, before[k], after.get(k)] for k in before],
            )
        )
        detail = result.would if dry_run else (result.done.as_dict() if result.done else None)
        for k, v in (detail or {}).items():
            out.print(
                f"{'would ' if dry_run else ''}{k}: {v if not isinstance(v, list) or len(v) <= 5 else f'{len(v)} items'}",
                markup=False,
            )
        print_checks(run, "Maintenance checks")
    if not run.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


@app.command(name="all")
@command
def all_(
    ctx: typer.Context,
    source: Annotated[
        str,
        typer.Option(
            help="Where the trips come from: synthetic (offline, quick), auto or tlc (downloads the real months)."
        ),
    ] = "synthetic",
    mode: Annotated[
        str, typer.Option(help="Mode of the first load: skip, append or replace (the second is always skip).")
    ] = "skip",
    bench: Annotated[
        bool, typer.Option("--bench/--no-bench", help="Finish with the short concurrency benchmark.")
    ] = True,
    stages: Annotated[
        str,
        typer.Option(
            help="Only these stages, comma-separated, run in the flow's order: foundation, load, queries, timetravel, "
            "maintain (needs timetravel), workers, pipeline, steps, dynamic, bench. All by default."
        ),
    ] = "",
    as_json: JsonOpt = False,
) -> None:
    """The whole flow with checks (what `just ducklake-test` runs): foundation, load, queries, time travel, maintenance, a short benchmark. Exit 0 only if every check holds."""
    from ducklake_kit import all as all_flow  # start-up: loads only for this command

    c: Kit = ctx.obj
    run = CheckRun()
    result = all_flow.run_all(
        c.with_reporter(reporter(as_json)), run, source=source, mode=mode, bench=bench, stages=stages
    )
    if as_json:
        print_json("ok" if run.ok else "error", {**result.as_dict(), **run.as_dict()}, result.catalog_info)
    else:
        out = console()
        out.print(render_checks(run, f"ducklake-test on --platform {c.platform_name}"))
        if result.bench is not None:
            out.print(_bench_concurrency_line(result.bench.as_dict()), markup=False)
        out.print(
            table(
                "Summary",
                ["stage", "checks passed", "seconds"],
                [[st["stage"], f"{st['passed']}/{st['checks']}", f"{st['seconds']:.1f}"] for st in run.summary()]
                + [
                    [
                        "total",
                        f"{len(run.checks) - len(run.failed)}/{len(run.checks)}",
                        f"{sum(run.stages.values()):.1f}",
                    ]
                ],
            )
        )
        verdict = f"{len(run.checks) - len(run.failed)}/{len(run.checks)} checks passed"
        out.print(f"[green]{verdict}[/]" if run.ok else f"[red]{verdict}[/]")
    if not run.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


def _bench_concurrency_line(figures: dict) -> str:
    parts = []
    for mode, r in figures["results"].items():
        parts.append(
            f"{mode}: {r['total_s']:.2f} s total, median {r['median_ms'] or 0:.1f} ms, p95 {r.get('p95_ms') or 0:.1f} ms, "
            f"{r['errors']} errors, {r['rows_lost']} rows lost"
        )
    return f"bench ({figures['writers']} writers x {figures['ops_per_writer']} inserts): " + "; ".join(parts)
