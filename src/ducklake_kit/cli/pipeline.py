"""SQL pipelines: `pipeline plan FILE`, `pipeline run FILE`, `pipeline lineage TABLE`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text
from rich.tree import Tree

from ducklake_kit.cli.common import JsonOpt, Kit, app, command, reporter
from ducklake_kit.cli.output import console, print_json, table
from ducklake_kit.errors import EXIT_CHECK_FAILED, KitError
from ducklake_kit.workers.config import PlaneConfig

if TYPE_CHECKING:
    from ducklake_kit.pipelines.flow import LineageView, Plan, RunOutcome

pipeline_app = typer.Typer(
    help="SQL pipelines: a .sql file whose statements carry `-- id:`, `-- depends_on:`, `-- node:` headers, run as a "
    "DAG on the worker plane, with lineage recorded in the lake.",
    no_args_is_help=True,
)
app.add_typer(pipeline_app, name="pipeline")

FileArg = Annotated[Path, typer.Argument(help="The pipeline file, e.g. pipelines/taxi_marts.sql.")]
SelectOpt = Annotated[
    str | None,
    typer.Option(
        "--select",
        help="Only these nodes, dbt's forms: name, +name (with its ancestors), name+ (with its descendants).",
    ),
]
StrictOpt = Annotated[
    bool, typer.Option("--strict", help="An inferred dependency the headers do not declare is an error.")
]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Run every chosen node, even those whose fingerprint (normalised SQL + the snapshots of the tables they "
        "read) is unchanged since their last successful run.",
    ),
]
EnvOpt = Annotated[
    str | None,
    typer.Option(
        "--env",
        help="Build in this environment (e.g. dev): each table goes to <env>__<schema>, tables the environment does "
        "not hold are read from prod, and prod is never written.",
    ),
]


def _warn(lines: list[str], as_json: bool) -> None:
    out = console(stderr=as_json)
    for line in lines:
        out.print(f"warning: {line}", markup=False)


def _read(file: Path, select: str | None, strict: bool):
    from ducklake_kit.pipelines import dag

    pipeline = dag.load(file, strict=strict)
    if select:
        pipeline.select(select)
    return pipeline


@pipeline_app.command("plan")
@command
def plan_cmd(
    ctx: typer.Context,
    file: FileArg,
    select: SelectOpt = None,
    strict: StrictOpt = False,
    png: Annotated[Path | None, typer.Option("--png", help="Also draw the DAG to this PNG file.")] = None,
    force: ForceOpt = False,
    env: EnvOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The DAG: its waves, every edge (declared or inferred), where each node runs, its audits, and which nodes a run would run and why (new, SQL changed and whether breaking, input changed) or leave unchanged. Runs nothing."""
    from ducklake_kit.pipelines import flow

    c: Kit = ctx.obj
    pipeline = _read(file, select, strict)  # bad input is one line before any service is asked
    plan = flow.plan(
        pipeline,
        PlaneConfig.of(c.state, c.scheduler).address,
        c.platform.endpoints(),
        flow.Options(select=select, force=force, env=env),
    )
    if png is not None:
        _draw_plan(plan, png)
    if as_json:
        print_json("ok", plan.as_dict() | ({"png": str(png)} if png else {}))
        _warn(plan.warnings, True)
        return
    _print_plan(plan)
    _warn(plan.warnings, False)
    if png is not None:
        typer.echo(f"DAG drawn to {png}")


def _print_plan(plan: Plan) -> None:
    p = plan.pipeline
    out = console()
    wave_of = {n: i + 1 for i, wave in enumerate(plan.waves) for n in wave}
    rows = [
        [
            n.id,
            wave_of.get(n.id, "-"),
            ", ".join(sorted(p.parents(n.id), key=list(p.nodes).index)) or "-",
            n.pin or "any",
            ", ".join(sorted(map(str, n.use.writes))) or "-",
            ", ".join(sorted(map(str, n.use.reads))) or "-",
            ", ".join(a.text for a in n.audits) or "-",
            n.description or "",
        ]
        for n in p.nodes.values()
        if n.id in plan.selected
    ]
    out.print(
        table(
            f"Pipeline {p.name} ({p.file}): {len(plan.selected)} node(s) in {len(plan.waves)} wave(s)",
            ["node", "wave", "after", "worker", "writes", "reads", "audits", "description"],
            rows,
        )
    )
    edges = [[e.parent, e.child, e.kind, e.why or "-"] for e in p.edges]
    if edges:
        out.print(table("Edges", ["parent", "child", "kind", "inferred from"], edges))
    for n in p.nodes.values():
        if n.pin_reason and n.pin_reason != "-- node":
            out.print(f"node {n.id} runs on {n.pin}: it {n.pin_reason}", markup=False)
        if n.kind is not None:
            out.print(
                f"node {n.id} is {n.kind.text}: once built, a run reads only what changed in {n.kind.source} since "
                "its last run",
                markup=False,
            )
    if plan.workers is not None:
        out.print(f"workers running: {', '.join(plan.workers) or 'none'}", markup=False)
    if plan.decisions is not None:
        decided = [n for n in p.nodes if n in plan.decisions]
        out.print(
            table(
                f"A run now would run {len(plan.would_run())} of {len(decided)} node(s)",
                ["node", "would", "why"],
                [[n, "run" if plan.decisions[n].run else "skip", plan.decisions[n].reason] for n in decided],
            )
        )


def _draw_plan(plan: Plan, png: Path) -> None:
    from ducklake_kit.pipelines.draw import Arrow, draw

    p = plan.pipeline
    nodes = [n for n in p.nodes if n in plan.selected]
    arrows = [
        Arrow(e.parent, e.child, dashed=not e.declared)
        for e in p.edges
        if e.parent in plan.selected and e.child in plan.selected
    ]
    labels = {n: f"{n}\n{p.nodes[n].pin or 'any worker'}" for n in nodes}
    draw(nodes, arrows, png, title=f"pipeline {p.name} (dashed: inferred edge)", labels=labels)


@pipeline_app.command("run")
@command
def run_cmd(
    ctx: typer.Context,
    file: FileArg,
    select: SelectOpt = None,
    from_failed: Annotated[
        bool,
        typer.Option(
            "--from-failed", help="Re-run only the nodes that failed or were skipped in the last run of this pipeline."
        ),
    ] = False,
    strict: StrictOpt = False,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Seconds a node may run; its worker interrupts it after that.")
    ] = None,
    force: ForceOpt = False,
    env: EnvOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the pipeline on the worker plane: each node as soon as its dependencies are done; a failed node's descendants are skipped. Change-aware: a node whose SQL and input tables are unchanged since its last successful run is left `unchanged` (say --force to run it). A node's `-- audit:` checks run in its transaction: a failed audit fails the node and rolls its write back. An incremental node (`-- kind: incremental_by_time(col)` or `incremental_by_key(col)`) reads only its source's rows changed since its last run. Exit 1 if a node failed."""
    from ducklake_kit.pipelines import flow

    c: Kit = ctx.obj
    if select and from_failed:
        raise typer.BadParameter("give --select or --from-failed, not both", param_hint="--from-failed")
    pipeline = _read(file, select, strict)  # bad input is one line before any service is asked
    report = reporter(as_json)
    step = report.say
    # a bar of nodes in a terminal; how many run is known up front unless --select or --from-failed picks them
    bar = report.open(f"pipeline {pipeline.name}", None if select or from_failed else len(pipeline.nodes), "nodes")

    def on_event(kind: str, node) -> None:
        if kind == "start":
            step(f"node {node.id}: started" + (f" on {node.pin}" if node.pin else ""))
            return
        bar.advance()
        if node.status == "unchanged":
            step(f"node {node.id}: unchanged, not run ({node.reason})")
        elif node.status == "ok" and node.duration_ms is None:  # its worker died after the commit: the lake said ok
            step(f"node {node.id}: ok ({node.reason})")
        elif node.status == "ok":
            step(f"node {node.id}: ok on {node.worker} in {node.duration_ms:.0f} ms")
        else:
            step(f"node {node.id}: {node.status.upper()}: {node.error or node.reason}")

    try:
        outcome = flow.run(
            pipeline,
            PlaneConfig.of(c.state, c.scheduler).address,
            c.platform.endpoints(),
            flow.Options(select=select, from_failed=from_failed, timeout_s=timeout, force=force, env=env),
            platform_name=c.platform_name,
            on_event=on_event,
        )
    finally:
        bar.close()
    if outcome is None:
        if as_json:
            print_json("ok", {"run_id": None, "nodes": [], "note": "the last run had no failed or skipped node"})
        else:
            typer.echo("nothing to re-run: the last run of this pipeline had no failed or skipped node")
        return
    if as_json:
        print_json(
            "ok" if outcome.run.ok else "error",
            outcome.run.as_dict() | {"history_snapshot": outcome.history_snapshot, "warnings": outcome.warnings},
            outcome.catalog_info,
        )
        _warn(outcome.warnings, True)
    else:
        _print_run(outcome)
        _warn(outcome.warnings, False)
    if outcome.run.aborted:
        typer.echo(_aborted_line(outcome.run.aborted), err=True)
    if not outcome.run.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


def _aborted_line(aborted: str) -> str:
    """The one error line of a run the worker plane could not finish (the details are in the run's table)."""
    if aborted.startswith("the worker plane's scheduler was lost"):
        return KitError(
            "the worker plane's scheduler was lost during the run",
            "run `up` to start it again, then `pipeline run --from-failed`",
        ).line()
    return KitError(aborted, "run `status`, then `pipeline run --from-failed`").line()


def _audits_said(audits: list[dict]) -> str:
    passed = [a["audit"] for a in audits if a["status"] == "passed"]
    failed = [a["audit"] for a in audits if a["status"] == "failed"]
    parts = ([f"audit FAILED: {', '.join(failed)}"] if failed else []) + (
        [f"audits passed: {', '.join(passed)}"] if passed else []
    )
    return "".join(f"; {p}" for p in parts)


def _print_run(outcome: RunOutcome) -> None:
    r = outcome.run
    rows = [
        [
            n.id,
            n.status if n.status in ("ok", "unchanged") else n.status.upper(),
            n.worker or "-",
            n.started_at.strftime("%H:%M:%S.%f")[:-3] if n.started_at else "-",
            f"{n.duration_ms:.0f}" if n.duration_ms is not None else "-",
            n.snapshot_id if n.snapshot_id is not None else "-",
            (n.error or n.reason or (f"ran: {n.why}" if n.why else "")) + _audits_said(n.audits),
        ]
        for n in r.nodes
    ]
    out = console()
    out.print(
        table(
            f"Pipeline {r.pipeline}, run {r.run_id}",
            ["node", "status", "worker", "started", "ms", "snapshot", "error / reason"],
            rows,
        )
    )
    if r.aborted:
        out.print(f"ABORTED: {r.aborted}", markup=False)
    verdict = ("PASS" if r.ok else "FAIL") + (
        f": {r.count('ok')} ok, {r.count('failed')} failed, {r.count('skipped')} skipped, "
        f"{r.count('unchanged')} unchanged"
    )
    out.print(
        f"{verdict}; run and lineage recorded in snapshot {outcome.history_snapshot} "
        f"(SELECT * FROM pipeline_nodes WHERE run_id = '{r.run_id}')",
        markup=False,
    )


@pipeline_app.command("lineage")
@command
def lineage_cmd(
    ctx: typer.Context,
    table_name: Annotated[
        str, typer.Argument(metavar="TABLE", help="A table a pipeline built: name, schema.name or local.name.")
    ],
    columns: Annotated[bool, typer.Option("--columns", help="Also each column's upstream columns.")] = False,
    png: Annotated[Path | None, typer.Option("--png", help="Also draw the upstream tree to this PNG file.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The tables (and with --columns the columns) a table was built from, recursively, as pipelines recorded them."""
    from ducklake_kit.pipelines import flow

    c: Kit = ctx.obj
    view = flow.lineage(c.platform.endpoints(), table_name, columns=columns)
    if png is not None:
        _draw_lineage(view, png)
    if as_json:
        print_json("ok", view.as_dict() | ({"png": str(png)} if png else {}))
        return
    out = console()
    out.print(_upstream_tree(view))
    if columns:
        out.print(_column_tree(view))
    if png is not None:
        typer.echo(f"lineage drawn to {png}")


def _upstream_tree(view: LineageView) -> Tree:
    parents: dict[str, list] = {}
    for e in view.edges:
        parents.setdefault(e.child, []).append(e)

    def label(name: str, location: str) -> Text:
        where = "" if location == "lake" else f" (worker-local, on {location})"
        built = sorted({f"pipeline {e.pipeline}, node {e.node_id}" for e in parents.get(name, [])})
        return Text(name + where + (f"  <- built by {'; '.join(built)}" if built else ""))

    def grow(tree: Tree, name: str, seen: frozenset[str]) -> None:
        for e in sorted(parents.get(name, []), key=lambda x: x.parent):
            branch = tree.add(label(e.parent, e.parent_location))
            if e.parent not in seen:
                grow(branch, e.parent, seen | {e.parent})

    top = parents[view.table][0].location if view.table in parents else "lake"
    root = Tree(label(view.table, top))
    grow(root, view.table, frozenset({view.table}))
    return root


def _column_tree(view: LineageView) -> Tree:
    ups: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for child, child_col, parent, parent_col in view.columns:
        ups.setdefault((child, child_col), []).append((parent, parent_col))

    def grow(tree: Tree, key: tuple[str, str], depth: int) -> None:
        for parent in sorted(ups.get(key, [])):
            branch = tree.add(Text(f"{parent[0]}.{parent[1]}"))
            if depth < 20:
                grow(branch, parent, depth + 1)

    root = Tree(Text(f"columns of {view.table}"))
    for key in sorted(k for k in ups if k[0] == view.table):
        grow(root.add(Text(key[1])), key, 0)
    return root


def _draw_lineage(view: LineageView, png: Path) -> None:
    from ducklake_kit.pipelines.draw import Arrow, draw

    names = sorted({e.child for e in view.edges} | {e.parent for e in view.edges})
    arrows = sorted({Arrow(e.parent, e.child) for e in view.edges}, key=lambda a: (a.parent, a.child))
    local = {e.parent: e.parent_location for e in view.edges if e.parent_location != "lake"}
    local |= {e.child: e.location for e in view.edges if e.location != "lake"}
    labels = {n: f"{n}\n(on {local[n]})" if n in local else n for n in names}
    colors = dict.fromkeys(local, "#fde2c8") | {view.table: "#c8f0d0"}
    draw(names, arrows, png, title=f"upstream of {view.table} (orange: worker-local)", labels=labels, colors=colors)


EnvArg = Annotated[
    str, typer.Argument(metavar="ENV", help="The environment, e.g. dev (its tables are in dev__<schema>).")
]


@pipeline_app.command("diff")
@command
def diff_cmd(ctx: typer.Context, env: EnvArg, as_json: JsonOpt = False) -> None:
    """Compare each table the environment holds with prod's table of the same name: row counts, columns only one has, rows only one has (EXCEPT ALL both ways) and, when the node that built it has a `-- key:` header, the keys added, removed and changed. Changes nothing."""
    from ducklake_kit.pipelines import flow

    c: Kit = ctx.obj
    result, info = flow.env_diff(c.platform.endpoints(), env, platform_name=c.platform_name)
    if as_json:
        print_json("ok", result.as_dict(), info)
        return
    shown = lambda v: "-" if v is None else str(v)  # noqa: E731
    rows = [
        [
            t.table,
            shown(t.prod_rows) if t.prod_rows is not None else "absent",
            t.env_rows,
            "same" if t.same else "differs",
            ", ".join(t.key) or "-",
            shown(t.added),
            shown(t.removed),
            shown(t.changed),
            shown(t.only_in_env),
            shown(t.only_in_prod),
            "; ".join(
                ([f"+{', '.join(t.columns_added)}"] if t.columns_added else [])
                + ([f"-{', '.join(t.columns_removed)}"] if t.columns_removed else [])
            )
            or "-",
        ]
        for t in result.tables
    ]
    console().print(
        table(
            f"Environment {env} against prod: {result.as_dict()['differ']} of {len(rows)} table(s) differ",
            [
                "table",
                "prod rows",
                f"{env} rows",
                "",
                "key",
                "keys added",
                "removed",
                "changed",
                f"rows only in {env}",
                "only in prod",
                "columns",
            ],
            rows,
        )
    )
    for t in result.tables:
        for kind, keys in t.examples.items():
            if keys:
                console().print(f"{t.table}: keys {kind}, e.g. {', '.join(keys)}", markup=False)


@pipeline_app.command("promote")
@command
def promote_cmd(
    ctx: typer.Context,
    env: EnvArg,
    migrate: Annotated[
        bool,
        typer.Option(
            "--migrate",
            help="Once, when prod's names are real tables: rename them aside (<name>__prod_v<N>, data kept) in the "
            "same snapshot, so that they can become views.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Make prod serve the environment's tables in ONE snapshot, copying no data: each table is renamed to its physical name (dev__<schema>.<name>__v<N>) and prod's name becomes a view over it. Refused (nothing changed) when the environment's last run failed or skipped a node, or when a prod name is a real table (see --migrate)."""
    from ducklake_kit.pipelines import flow

    c: Kit = ctx.obj
    result, info = flow.promote(c.platform.endpoints(), env, migrate=migrate, platform_name=c.platform_name)
    if as_json:
        print_json("ok", result.as_dict(), info)
        return
    console().print(
        table(
            f"prod serves {len(result.tables)} table(s) of {env} since snapshot {result.snapshot_id}",
            ["table", "reads", "was"],
            [[t.table, t.physical, t.was] for t in result.tables],
        )
    )
