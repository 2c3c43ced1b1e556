"""bench: measured figures, printed (commands, not timed tests). The suites, their options and what each option
means to each suite live in bench/suites.py; this command parses, refuses an option the suite does not take,
calls the suite and renders its Report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ducklake_kit.bench import suites
from ducklake_kit.cli.common import JsonOpt, Kit, app, command, reporter
from ducklake_kit.cli.output import console, print_json, table
from ducklake_kit.errors import EXIT_CHECK_FAILED, KitError


def _opt(option: str) -> typer.models.OptionInfo:
    return typer.Option(suites.flag(option), help=suites.help_for(option))


@app.command()
@command
def bench(
    ctx: typer.Context,
    suite: Annotated[str, typer.Option(help=suites.suites_help())] = "load",
    rows: Annotated[list[str] | None, _opt("rows")] = None,
    runs: Annotated[int | None, _opt("runs")] = None,
    months: Annotated[str | None, _opt("months")] = None,
    file_cache: Annotated[
        bool | None, typer.Option("--file-cache/--no-file-cache", help=suites.help_for("file_cache"))
    ] = None,
    workers: Annotated[int | None, _opt("workers")] = None,
    writers: Annotated[int | None, _opt("writers")] = None,
    ops: Annotated[int | None, _opt("ops")] = None,
    modes: Annotated[str | None, _opt("modes")] = None,
    out_file: Annotated[Path | None, _opt("out")] = None,
    png_file: Annotated[Path | None, _opt("png")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure, in one run, and print the figures (commands, not timed tests): --suite load, queries, concurrency, pipeline, steps, dynamic or console. An option the suite does not take is refused."""
    given = {"rows": rows, "runs": runs, "months": months, "file_cache": file_cache, "workers": workers}
    given |= {"writers": writers, "ops": ops, "modes": modes, "out": out_file, "png": png_file}
    prepared = suites.prepare(suite, given)  # refuses before anything starts
    kit: Kit = ctx.obj.with_reporter(reporter(as_json))
    report = prepared.run(kit)
    out = console(stderr=as_json)  # with --json, stdout carries only the envelope
    out.print(table(report.table.title, report.table.columns, report.table.rows))
    for line in report.notes + [f"wrote {path}" for path in report.written]:
        out.print(line, markup=False)
    if report.defect:
        if as_json:
            print_json("error", report.as_dict())
            raise typer.Exit(EXIT_CHECK_FAILED)
        raise KitError(report.defect, report.fix, exit_code=EXIT_CHECK_FAILED)
    for line in report.passed:
        out.print(line, markup=False)
    if as_json:
        print_json("ok", report.as_dict())
