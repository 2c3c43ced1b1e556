"""The step runner: `steps run FILE`, `steps validate FILE` (NoETL-style `tool: ducklake` playbooks)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from ducklake_kit.cli.common import JsonOpt, Kit, app, command, reporter
from ducklake_kit.cli.output import console, print_json, table
from ducklake_kit.errors import EXIT_CHECK_FAILED, KitError

if TYPE_CHECKING:
    from ducklake_kit.steps.results import PlaybookRun, StepRun

steps_app = typer.Typer(
    help="The step runner: NoETL's playbooks (YAML) as NoETL writes them: `ducklake` steps run on the worker plane "
    "(loops with `mode: parallel` or `async` spread over the workers), `postgres`, `duckdb`, `python`, `http`, `noop`, "
    "`workbook` and `playbook` steps beside them; any other tool kind is refused in one line.",
    no_args_is_help=True,
)
app.add_typer(steps_app, name="steps")

FileArg = Annotated[Path, typer.Argument(help="The playbook, e.g. steps/basic.yaml.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="Override or add a workload value: name=value (read as YAML: 3, [1, 2], text). Repeatable."
    ),
]
ResumeOpt = Annotated[
    str | None,
    typer.Option(
        "--resume",
        metavar="RUN",
        help="Run an earlier run again under its execution id: each step or iteration the lake "
        "says that run committed (by its token) is not run again; one whose statements autocommit one by one is not run "
        "again either (the lake cannot say).",
    ),
]
DropOpt = Annotated[
    bool,
    typer.Option(
        "--drop-constraints",
        help="Remove PRIMARY KEY and UNIQUE from the ducklake steps' CREATE TABLEs (DuckLake cannot enforce them; "
        "without this they are refused), with a warning per table. The key columns stay NOT NULL.",
    ),
]
ROWS_SHOWN = 10


@steps_app.command("validate")
@command
def validate_cmd(file: FileArg, set_: SetOpt = None, drop: DropOpt = False, as_json: JsonOpt = False) -> None:
    """Check a playbook without running it: JSON Schema (unknown keys are errors), routes, templates' names; warns about values pasted into SQL as they are. Exit 3 with the line of the first problem."""
    from ducklake_kit.steps import runner

    playbook = runner.load(file, runner.parse_overrides(set_ or []))
    warnings = (runner.without_constraints(playbook) if drop else []) + runner.paste_warnings(playbook)
    steps = [
        {
            "step": s.name,
            "line": s.line,
            "tool": s.tool,
            "commands": len(s.commands),
            "loop": ({"over": s.loop.collection, "as": s.loop.iterator, "mode": s.loop.mode} if s.loop else None),
            "next": [t for t, _ in s.next.targets()] if s.next else None,
        }
        for s in playbook.steps.values()
    ]
    if as_json:
        print_json(
            "ok",
            {
                "playbook": playbook.name,
                "file": playbook.file,
                "shape": playbook.shape,
                "start": playbook.start,
                "steps": steps,
                "warnings": warnings,
            },
        )
        return
    typer.echo(
        f"{file}: valid ({playbook.shape} shape), playbook {playbook.name}, {len(steps)} step(s) from "
        f"'{playbook.start}'"
    )
    for warning in warnings:
        typer.echo(f"warning: {warning}")


@steps_app.command("run")
@command
def run_cmd(
    ctx: typer.Context,
    file: FileArg,
    set_: SetOpt = None,
    resume: ResumeOpt = None,
    drop: DropOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Run a playbook on the worker plane. Exit 1 if a step failed (its command index, SQL and DuckDB's error are shown) or the plane was lost."""
    from ducklake_kit.steps import runner

    c: Kit = ctx.obj
    overrides = runner.parse_overrides(set_ or [])
    playbook = runner.load(file, overrides)  # bad input is one line before any service is asked
    dropped = runner.without_constraints(playbook) if drop else []
    report = reporter(as_json)
    say = report.say
    for warning in dropped:
        say(escape(f"warning: {warning}"))
    loop: list = []  # the bar of the loop under way: iterations, in a terminal

    def end_loop() -> None:
        while loop:
            loop.pop().close()

    def on_event(kind: str, data: dict[str, Any]) -> None:  # the playbook's text is escaped: never Rich markup
        if kind != "iteration":
            end_loop()
        if kind == "step":
            say(
                escape(
                    f"step {data['step']}"
                    + (" (loop)" if data["loop"] else "")
                    + (f": {data['desc']}" if data["desc"] else "")
                )
            )
        elif kind == "iteration":
            it = data["iteration"]
            if not loop:
                loop.append(report.open(f"step {data['step']}: iterations", data["total"], "iterations"))
            loop[0].advance()
            where = f" on {it['worker']}" if it["worker"] else ""
            say(
                escape(
                    f"  iteration {it['index'] + 1}/{data['total']} {it['status']}{where}"
                    + (f": {it['error']['message']}" if it["error"] else "")
                    + (f" ({it['note']})" if it["note"] else "")
                )
            )
        elif kind == "skipped":
            say(escape(f"step {data['step']}: skipped ({data['reason']})"))

    try:
        out = runner.run_file(playbook, c, overrides=overrides, on_event=on_event, resume=resume)
    finally:
        end_loop()
    out.warnings[:0] = dropped
    if as_json:
        print_json("ok" if out.ok else "error", out.as_dict(), out.catalog_info)
    else:
        _print(out)
    if out.aborted:  # the details (each step's and iteration's fate) are in the output above
        typer.echo(_aborted_line(out.aborted, file, out.execution_id), err=True)
    if not out.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


def _aborted_line(aborted: str, file: Path, execution_id: str) -> str:
    """The one error line of a run the worker plane could not finish."""
    again = f"`steps run {file} --resume {execution_id}`"
    if aborted.startswith("the worker plane's scheduler was lost"):
        return KitError(
            "the worker plane's scheduler was lost during the run", f"run `up` to start it again, then {again}"
        ).line()
    return KitError(aborted, f"run `status`, then {again}").line()


def _print(run: PlaybookRun) -> None:
    out = console()
    for step in run.steps:
        _print_step(out, step)
    for warning in run.warnings:
        out.print(f"warning: {warning}", markup=False)
    s = run.summary()
    verdict = "PASS" if run.ok else "ABORTED" if run.aborted else "FAIL"
    out.print(
        f"{verdict}: playbook {run.playbook} (run {run.execution_id}): {s['steps_ok']} ok, {s['steps_failed']} "
        f"failed, {s['steps_skipped']} skipped in {run.seconds:.2f} s",
        markup=False,
    )


def _print_step(out, step: StepRun) -> None:
    title = f"step {step.step}: {step.status.upper()}"
    if step.status == "skipped":
        out.print(f"{title} ({step.reason})", markup=False)
        return
    if step.iterations is not None:
        its = step.iterations
        ms = [it.seconds * 1000 for it in its if it.worker]
        workers = sorted({it.worker for it in its if it.worker})
        rows = [
            [
                len(its),
                sum(1 for it in its if not it.failure),
                sum(1 for it in its if it.failure),
                ", ".join(workers) or "-",
                f"{statistics.median(ms):.1f}" if ms else "-",
                f"{step.seconds:.2f}",
            ]
        ]
        out.print(table(title + " (loop)", ["iterations", "ok", "failed", "workers", "median ms", "total s"], rows))
        for it in its:  # how an iteration's fate was decided when its worker could not say
            if it.note:
                out.print(f"  iteration {it.index}: {it.note}", markup=False)
    elif step.attempt is not None and not step.attempt.statements:  # python, http, noop: their data, not rows
        a = step.attempt
        out.print(f"{title} ({step.kind}) on {a.worker}: {a.seconds * 1000:.1f} ms", markup=False)
        if a.data is not None:
            out.print(f"  data: {_one_line(json.dumps(a.data, default=str), 100)}", markup=False)
    elif step.attempt is not None:
        a = step.attempt
        rows = [
            [
                i,
                s.statement_type or "-",
                "error" if s.error else "ok",
                s.affected_rows if s.affected_rows is not None else (len(s.rows) if s.columns else "-"),
                s.snapshot_id if s.snapshot_id is not None else "-",
                f"{s.seconds * 1000:.1f}",
                _one_line(s.sql),
            ]
            for i, s in enumerate(a.statements)
        ]
        out.print(table(f"{title} on {a.worker}", ["#", "type", "status", "rows", "snapshot", "ms", "sql"], rows))
        shown = [s for s in a.statements if s.columns and not s.error]
        if shown:
            last = shown[-1]
            out.print(
                table(
                    f"rows of command {a.statements.index(last)} ({len(last.rows)})",
                    last.columns,
                    last.rows[:ROWS_SHOWN],
                )
            )
    else:
        out.print(title, markup=False)
    if step.attempt is not None and step.attempt.note:
        out.print(f"  {step.attempt.note}", markup=False)
    error = step.error
    if error is not None:
        out.print(f"  error: {error.line()}" + (f"\n  sql: {_one_line(error.sql)}" if error.sql else ""), markup=False)
    for name, value in step.vars.items():
        out.print(f"  vars.{name} = {value!r}", markup=False)
    for note in step.policy:
        out.print(f"  policy: {note}", markup=False)


def _one_line(sql: str | None, limit: int = 70) -> str:
    text = " ".join((sql or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
