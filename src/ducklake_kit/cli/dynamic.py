"""Dynamic tables: `dynamic create|list|show|refresh|alter|drop|history|run` (the DDL is also accepted by `sql`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from ducklake_kit.cli.common import JsonOpt, Kit, app, command, reporter
from ducklake_kit.cli.output import console, print_json, table
from ducklake_kit.errors import EXIT_CHECK_FAILED, KitError

dynamic_app = typer.Typer(
    help="Dynamic tables: CREATE DYNAMIC TABLE name TARGET_LAG = '5 minutes' AS SELECT ..., kept fresh "
    "incrementally from the lake's change feed (definitions and history in the catalog's PostgreSQL, schema "
    "dynamic_tables).",
    no_args_is_help=True,
)
app.add_typer(dynamic_app, name="dynamic")

NameArg = Annotated[str, typer.Argument(help="The dynamic table: name or schema.name.")]


@contextmanager
def _open(ctx: typer.Context) -> Iterator[tuple[Any, Any]]:
    from ducklake_kit.dynamic_tables.metadata import Metadata
    from ducklake_kit.lake import Lake

    c: Kit = ctx.obj
    ep = c.platform.endpoints()
    with Lake(ep) as lake, Metadata(ep) as meta:
        yield lake, meta


def _refresh_rows(refreshes) -> list[list[Any]]:
    return [
        [
            r.name,
            r.status,
            r.mode or "-",
            r.rows_inserted if r.rows_inserted is not None else "-",
            r.rows_deleted if r.rows_deleted is not None else "-",
            r.read_snapshot or "-",
            r.commit_snapshot or "-",
            f"{r.duration_ms:.0f}" if r.duration_ms is not None else "-",
            r.error or r.reason or "",
        ]
        for r in refreshes
    ]


REFRESH_COLUMNS = ["table", "status", "mode", "inserted", "deleted", "read snapshot", "made snapshot", "ms", "why"]


@dynamic_app.command("create")
@command
def create_cmd(
    ctx: typer.Context,
    file: Annotated[
        Path | None, typer.Argument(help="A .sql file of CREATE [OR REPLACE] DYNAMIC TABLE statements.")
    ] = None,
    sql_text: Annotated[str | None, typer.Option("--sql", help="The statement(s) as text instead of a file.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create dynamic tables: the table is filled at once (unless INITIALIZE = ON_SCHEDULE) and its definition, mode and reason are recorded."""
    from ducklake_kit.dynamic_tables import ddl, manage

    if (file is None) == (sql_text is None):
        raise KitError("give a FILE or --sql, one of the two", "e.g. `dynamic create dynamic_tables/daily_revenue.sql`")
    if file is not None and not file.is_file():
        raise KitError(f"{file} is not a file", "give the path of a .sql file, e.g. dynamic_tables/daily_revenue.sql")
    try:  # UTF-8 with an optional byte-order mark: left in, it hides the CREATE from the parser
        text = file.read_text(encoding="utf-8-sig") if file is not None else sql_text
    except (OSError, UnicodeDecodeError) as exc:
        raise KitError(
            f"cannot read {file} ({getattr(exc, 'strerror', None) or exc})",
            "give the path of a readable UTF-8 .sql file",
        ) from None
    statements = ddl.parse(text or "")
    bad = [s for s in statements if not isinstance(s, ddl.CreateDynamicTable)]
    if bad:
        raise KitError(
            "`dynamic create` takes CREATE DYNAMIC TABLE statements only",
            "run ALTER / DROP / SHOW with `dynamic alter|drop|list` or with `sql`",
        )
    created = []
    with _open(ctx) as (lake, meta):
        for stmt in statements:
            first = manage.create(lake, meta, stmt)
            d = meta.get(stmt.name)
            created.append(
                {
                    "name": d.name,
                    "plan": d.plan_kind,
                    "how": d.plan,
                    "lag": d.lag,
                    "refresh_mode": d.refresh_mode,
                    "rows": first.rows_inserted if first else 0,
                    "snapshot": first.commit_snapshot if first else None,
                    "comment": stmt.comment,
                    "ignored": list(stmt.ignored),
                }
            )
            if not as_json:
                filled = (
                    f"{first.rows_inserted} rows at snapshot {first.read_snapshot}"
                    if first
                    else "empty until its first scheduled refresh"
                )
                typer.echo(f"created {d.name} (lag {d.lag}, {d.refresh_mode}): {filled}; {d.plan}")
                if stmt.ignored:
                    typer.echo(f"  ignored: {'; '.join(stmt.ignored)} (Snowflake's, they mean nothing on one DuckLake)")
    if as_json:
        print_json("ok", {"created": created})


@dynamic_app.command("list")
@command
def list_cmd(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List the dynamic tables: status, lag, mode, the snapshot each reflects."""
    with _open(ctx) as (_lake, meta):
        defs = meta.all()
    rows = [
        {
            "name": d.name,
            "status": d.status,
            "lag": d.lag,
            "refresh_mode": d.refresh_mode,
            "plan": d.plan_kind,
            "data_snapshot": d.data_snapshot,
            "data_timestamp": d.data_timestamp,
            "failures": d.consecutive_failures,
        }
        for d in defs
    ]
    if as_json:
        print_json("ok", {"dynamic_tables": rows})
        return
    console().print(
        table(f"Dynamic tables ({len(rows)})", list(rows[0]) if rows else ["name"], [list(r.values()) for r in rows])
    )


@dynamic_app.command("show")
@command
def show_cmd(ctx: typer.Context, name: NameArg, as_json: JsonOpt = False) -> None:
    """Show a dynamic table: definition, mode chosen and why, sources and the snapshot each was last read at, lag, status, last refresh."""
    from ducklake_kit.dynamic_tables import ddl, manage

    with _open(ctx) as (_lake, meta):
        d = manage.get(meta, name)
        last = meta.history(d.name, 1)
    written = ddl.parse_statement(d.ddl)  # the statement as written: its comment and what was ignored
    body = {
        "name": d.name,
        "status": d.status,
        "lag": d.lag,
        "refresh_mode": d.refresh_mode,
        "plan": d.plan_kind,
        "how": d.plan,
        "reason": d.reason,
        "columns": d.columns,
        "sources": d.sources,
        "depends_on": d.depends_on,
        "data_snapshot": d.data_snapshot,
        "data_timestamp": d.data_timestamp,
        "consecutive_failures": d.consecutive_failures,
        "comment": written.comment,
        "ignored": "; ".join(written.ignored) or None,
        "immutable_where": d.immutable_where,
        "query": d.query,
        "last_refresh": last[0].as_dict() if last else None,
    }
    if as_json:
        print_json("ok", body)
        return
    out = console()
    out.print(
        table(
            f"Dynamic table {d.name}",
            ["property", "value"],
            [[k, v] for k, v in body.items() if k not in ("sources", "last_refresh", "query")],
        )
    )
    out.print(
        table(
            "Sources",
            ["source", "last read at snapshot", "dynamic table"],
            [[s, snap, "yes" if s in d.depends_on else "no"] for s, snap in d.sources.items()],
        )
    )
    if last:
        out.print(table("Last refresh", REFRESH_COLUMNS, _refresh_rows(last)))
    out.print(d.query, markup=False)


@dynamic_app.command("refresh")
@command
def refresh_cmd(
    ctx: typer.Context,
    names: Annotated[
        list[str] | None,
        typer.Argument(help="Tables to refresh (default: all); the dynamic tables they read are refreshed first."),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Then compare each refreshed table with its query run in full at the snapshot it read (EXCEPT ALL both ways); exit 1 if any differs. A table whose query depends on the time (now(), current_date, ...) is reported as not compared.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Refresh now, upstream first, each table in its own transaction. Exit 1 if one failed (its dependents are skipped)."""
    from ducklake_kit.dynamic_tables import manage
    from ducklake_kit.dynamic_tables.metadata import FAILED, SKIPPED
    from ducklake_kit.dynamic_tables.refresh import Refresher

    checked: dict[str, tuple[int, int]] = {}
    not_compared: dict[str, str] = {}  # neither passed nor failed: the reason it cannot be compared
    with _open(ctx) as (lake, meta):
        with Refresher(lake, meta, report=reporter(as_json)) as refresher:
            batch = manage.refresh_many(lake, meta, names or None, refresher=refresher)
        for r in batch.refreshes if check else []:
            if r.status in (FAILED, SKIPPED):
                continue
            why = manage.not_comparable(meta, r.name)
            if why:
                not_compared[r.name] = why
            else:
                checked[r.name] = manage.check(lake, meta, r.name)
    wrong = {n: c for n, c in checked.items() if c != (0, 0)}
    ok = not batch.failed and not wrong
    if as_json:
        print_json(
            "ok" if ok else "error",
            {
                "refreshes": [r.as_dict() for r in batch.refreshes],
                "checks": {n: {"only_in_table": a, "only_in_query": b} for n, (a, b) in checked.items()},
                "not_compared": not_compared,
            },
        )
    else:
        console().print(table("Refreshes", REFRESH_COLUMNS, _refresh_rows(batch.refreshes)))
        for n, (a, b) in checked.items():
            verdict = "ok" if (a, b) == (0, 0) else "FAIL"
            typer.echo(
                f"{verdict}: {n} equals its query run in full"
                if verdict == "ok"
                else f"FAIL: {n} differs from its query run in full ({a} rows only in the table, {b} only in the query)"
            )
        for n, why in not_compared.items():
            typer.echo(f"not compared: {n}: {why}")
    if not ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


@dynamic_app.command("alter")
@command
def alter_cmd(
    ctx: typer.Context,
    name: NameArg,
    action: Annotated[
        str, typer.Argument(help="suspend, resume, refresh, or lag (with the new lag: '5 minutes' or DOWNSTREAM).")
    ],
    value: Annotated[str | None, typer.Argument(help="The new lag, for `lag`.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Suspend, resume or refresh a dynamic table, or set its lag (ALTER DYNAMIC TABLE ... in `sql`)."""
    from ducklake_kit.dynamic_tables import ddl, manage

    action = action.lower()
    if action not in ("suspend", "resume", "refresh", "lag") or (action == "lag") != (value is not None):
        raise KitError(
            f"`{action}{' ' + value if value else ''}` is not an alteration",
            "use suspend, resume, refresh, or lag '5 minutes' (or lag DOWNSTREAM)",
        )
    stmt = (
        ddl.AlterDynamicTable(name, "SET_LAG", ddl.parse_lag(value))
        if action == "lag"
        else ddl.AlterDynamicTable(name, action.upper())
    )
    with _open(ctx) as (lake, meta):
        refreshes = manage.alter(lake, meta, stmt)
        d = manage.get(meta, name)
    failed = [r for r in refreshes if r.status == "FAILED"]
    if as_json:
        print_json(
            "error" if failed else "ok",
            {"name": d.name, "status": d.status, "lag": d.lag, "refreshes": [r.as_dict() for r in refreshes]},
        )
    else:
        if refreshes:
            console().print(table("Refreshes", REFRESH_COLUMNS, _refresh_rows(refreshes)))
        typer.echo(f"{d.name}: {d.status}, lag {d.lag}")
    if failed:
        raise typer.Exit(EXIT_CHECK_FAILED)


@dynamic_app.command("drop")
@command
def drop_cmd(
    ctx: typer.Context,
    name: NameArg,
    if_exists: Annotated[bool, typer.Option("--if-exists", help="No error when it does not exist.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Drop a dynamic table: its table in the lake and its definition (refused while another dynamic table reads it)."""
    from ducklake_kit.dynamic_tables import manage

    with _open(ctx) as (lake, meta):
        dropped = manage.drop(lake, meta, name, if_exists=if_exists)
    if as_json:
        print_json("ok", {"name": name, "dropped": dropped})
    else:
        typer.echo(f"dropped {name}" if dropped else f"{name} did not exist")


@dynamic_app.command("history")
@command
def history_cmd(
    ctx: typer.Context,
    name: NameArg,
    limit: Annotated[int, typer.Option(help="How many refreshes, newest first.")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """A dynamic table's refreshes, newest first: mode and why, rows inserted and deleted, snapshots read and made."""
    from ducklake_kit.dynamic_tables import manage

    with _open(ctx) as (_lake, meta):
        d = manage.get(meta, name)
        rows = meta.history(d.name, limit)
    if as_json:
        print_json("ok", {"name": d.name, "refreshes": [r.as_dict() for r in rows]})
        return
    console().print(
        table(
            f"Refreshes of {d.name} ({len(rows)}, newest first)",
            ["id", "trigger", "started"] + REFRESH_COLUMNS[1:],
            [
                [r.id, r.trigger, r.started_at.strftime("%Y-%m-%d %H:%M:%S"), *row[1:]]
                for r, row in zip(rows, _refresh_rows(rows))
            ],
        )
    )


@dynamic_app.command("run")
@command
def run_cmd(
    ctx: typer.Context,
    once: Annotated[bool, typer.Option("--once", help="One round: refresh what is stale now, then stop.")] = False,
    for_seconds: Annotated[float | None, typer.Option("--for", help="Run this many seconds, then stop.")] = None,
    tick: Annotated[float, typer.Option(help="Seconds between rounds.")] = 1.0,
    as_json: JsonOpt = False,
) -> None:
    """The scheduler: refresh each table when it is stale (now minus the commit time of the snapshot it reflects exceeds its lag). Ctrl-C or SIGTERM finishes the refresh under way, then stops."""
    from ducklake_kit.dynamic_tables import scheduler

    if once and for_seconds is not None:
        raise KitError("give --once or --for, not both", "e.g. `dynamic run --for 60`")
    if tick <= 0 or (for_seconds is not None and for_seconds <= 0):
        raise KitError("--tick and --for must be positive", "e.g. `dynamic run --for 60 --tick 1`")

    def say(r) -> None:
        if not as_json:
            typer.echo(
                f"{r.finished_at:%H:%M:%S} {r.name}: {r.status}"
                + (f" {r.mode.lower()}, +{r.rows_inserted} -{r.rows_deleted}" if r.mode else "")
                + (f" ({r.error or r.reason})" if (r.error or r.reason) else "")
            )

    with _open(ctx) as (lake, meta):
        result = scheduler.run(
            lake,
            meta,
            once=once,
            seconds=for_seconds,
            tick_s=tick,
            listener=scheduler.Listener(
                on_refresh=say, on_error=lambda e: typer.echo(f"round failed, trying again next round: {e}", err=True)
            ),
        )
    failed = [r for r in result.refreshes if r.status == "FAILED"]
    if as_json:
        print_json(
            "error" if failed else "ok",
            {
                "rounds": result.ticks,
                "stopped_by": result.stopped_by,
                "refreshes": [r.as_dict() for r in result.refreshes],
            },
        )
    else:
        typer.echo(
            f"stopped ({result.stopped_by}) after {result.ticks} round(s): {len(result.refreshes)} refresh(es), "
            f"{len(failed)} failed"
        )
    if failed:
        raise typer.Exit(EXIT_CHECK_FAILED)
