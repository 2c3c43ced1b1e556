"""What `pipeline plan` and `pipeline run` do, end to end: read the file, build the DAG, check the pins against the
running workers, choose the nodes (`--select`, `--from-failed`), run them on the worker plane, then record the run
and its lineage in the lake."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ducklake_kit.errors import KitError, first_line
from ducklake_kit.lake import Lake
from ducklake_kit.lake.locks import held_exclusively, named_key
from ducklake_kit.lake.transactions import snapshot_of_token
from ducklake_kit.pipelines import changes, dag, environments, history, incremental, runner
from ducklake_kit.pipelines import promote as promotion
from ducklake_kit.pipelines.dag import Node, Pipeline
from ducklake_kit.pipelines.runner import FAILED, OK, SKIPPED, UNCHANGED, NodeRun, PipelineRun
from ducklake_kit.pipelines.sqlfile import PipelineError
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.workers.client import SchedulerUnreachable, WorkerPlane, name_order


@dataclass
class Plan:
    pipeline: Pipeline
    waves: list[list[str]]
    selected: set[str]
    workers: list[str] | None  # the running workers; None when the plane did not answer (pins unchecked)
    warnings: list[str] = field(default_factory=list)
    decisions: dict[str, changes.Decision] | None = None  # what a run would do with each node; None: lake unread

    def would_run(self) -> list[str]:
        return [n for n in self.pipeline.nodes if self.decisions and n in self.decisions and self.decisions[n].run]

    def as_dict(self) -> dict[str, Any]:
        p = self.pipeline
        return {
            "pipeline": p.name,
            "file": p.file,
            "waves": self.waves,
            "nodes": [
                {
                    "id": n.id,
                    "line": n.line,
                    "description": n.description,
                    "runs_on": n.pin or "any worker",
                    "pin_reason": n.pin_reason,
                    "parents": sorted(p.parents(n.id), key=list(p.nodes).index),
                    "writes": sorted(map(str, n.use.writes)),
                    "reads": sorted(map(str, n.use.reads)),
                    "audit_reads": sorted(map(str, n.audit_reads)),
                    "commits_snapshot": n.commits,
                    "audits": [a.as_dict() for a in n.audits],
                    "audited": str(n.audited) if n.audited else None,
                    "kind": n.kind.as_dict() if n.kind else None,
                    "key": list(n.key),
                    "selected": n.id in self.selected,
                    "would_run": self.decisions[n.id].run if self.decisions and n.id in self.decisions else None,
                    "decision": self.decisions[n.id].as_dict() if self.decisions and n.id in self.decisions else None,
                    "sql": n.sql,
                }
                for n in p.nodes.values()
            ],
            "edges": [{"parent": e.parent, "child": e.child, "kind": e.kind, "why": e.why} for e in p.edges],
            "workers": self.workers,
            "warnings": self.warnings,
        }


@dataclass(frozen=True)
class Options:
    """How `plan` and `run` choose and run the nodes (the CLI's options): `select`, dbt's forms (see
    Pipeline.select); `from_failed`, only the nodes the last run failed or skipped (run only); `strict`, an inferred
    edge the headers do not declare is an error; `timeout_s` per node, enforced on its worker (run only); `force`,
    run every chosen node, unchanged or not; `env`, the environment to build in (see environments.py; None: prod)."""

    select: str | None = None
    from_failed: bool = False
    strict: bool = False
    timeout_s: float | None = None
    force: bool = False
    env: str | None = None


DEFAULTS = Options()


def _running_workers(plane: WorkerPlane) -> list[str]:
    return sorted(plane.names(), key=name_order)


def _pipeline(source: Path | Pipeline, options: Options) -> Pipeline:
    """The pipeline, named for its environment when `options.env` gives one (its tables renamed later, with the
    lake in hand: see environments.rewrite)."""
    pipeline = source if isinstance(source, Pipeline) else dag.load(source, strict=options.strict)
    if options.env is not None:
        pipeline = environments.named(pipeline, environments.check_env(options.env))
    return pipeline


def plan(source: Path | Pipeline, scheduler: str, endpoints: Endpoints, options: Options = DEFAULTS) -> Plan:
    """The DAG, where each node runs, and which nodes a run would run and why (change-aware: see changes.py); runs
    nothing. The pins are checked when the worker plane answers. `source`: the file, or the pipeline already read
    from it (`dag.load`); of `options`, plan reads select, strict and force."""
    select, force = options.select, options.force
    pipeline = _pipeline(source, options)
    selected = pipeline.select(select) if select else set(pipeline.nodes)
    warnings = list(pipeline.warnings)
    try:
        with WorkerPlane(scheduler, endpoints, register=False) as plane:
            workers: list[str] | None = _running_workers(plane)
    except SchedulerUnreachable as exc:
        workers = None
        warnings.append(f"the worker plane does not answer, so `-- node:` pins were not checked ({exc.what})")
    if workers is not None:
        pipeline.check_pins(workers)
    waves = pipeline.waves(selected)
    decisions = None
    try:
        with Lake(endpoints) as lake:
            if pipeline.env is not None:
                pipeline = environments.rewrite(pipeline, environments.built(lake, pipeline.env), selected)
            previous = history.previous(lake, pipeline.name)
            decider = _decider(lake, pipeline, previous)
            decisions = decider.plan([n for wave in waves for n in wave], force=force)
            fresh = _decider(lake, pipeline, previous)  # the tables as they are, not as the plan's runs leave them
            for node_id, d in decisions.items():  # what an incremental node that would run would do
                node = pipeline.nodes[node_id]
                if d.run and node.kind is not None:
                    source = d.inputs.get(str(node.kind.source), "")
                    d.reason += "; " + (
                        _incremental(lake, fresh, node, d, force).why
                        if source.isdigit()
                        else f"incremental or full: decided when it runs ({node.kind.source} is rebuilt {source})"
                    )
    except PipelineError:
        raise  # a node that cannot be named in the environment: bad input, not a lake that does not answer
    except Exception as exc:  # noqa: BLE001 - the plan of the graph stands without the lake
        warnings.append(f"the lake does not answer, so what a run would skip is not known ({first_line(exc)})")
    return Plan(pipeline, waves, selected, workers, warnings, decisions)


def _decider(lake: Lake, pipeline: Pipeline, previous: dict[str, changes.Previous]) -> changes.Decider:
    """`previous`: history.previous of the pipeline, read once for the deciders of one plan or run (they only read
    it)."""
    return changes.Decider(
        pipeline,
        previous,
        lambda: changes.versions(lake),
        lambda: history.current_schema(lake),
    )


@dataclass
class RunOutcome:
    run: PipelineRun
    lineage: history.Lineage
    warnings: list[str]
    history_snapshot: int | None  # the snapshot that recorded the run and its lineage
    catalog_info: dict[str, Any] = field(default_factory=dict)


def _from_failed(lake: Lake, pipeline: Pipeline) -> tuple[set[str], str]:
    last = history.last_run(lake, pipeline.name)
    if last is None:
        raise KitError(
            f"pipeline {pipeline.name} has never run, so there is nothing to re-run",
            f"run it first: `pipeline run {pipeline.file}`",
        )
    run_id, statuses = last
    again = {n for n, s in statuses.items() if s in (FAILED, SKIPPED)}
    gone = sorted(again - set(pipeline.nodes))
    if gone:
        raise KitError(
            f"the last run ({run_id}) failed at nodes the file no longer has: {', '.join(gone)}",
            "run the whole pipeline again without --from-failed",
        )
    return again, run_id


def run(
    source: Path | Pipeline,
    scheduler: str,
    endpoints: Endpoints,
    options: Options = DEFAULTS,
    *,
    platform_name: str = "local",
    on_event: Callable[[str, NodeRun | Node], None] = lambda _k, _n: None,
) -> RunOutcome | None:
    """Run the pipeline (or the nodes `options` choose) and record it. None when --from-failed finds nothing to
    re-run. `source`: the file, or the pipeline already read from it (`dag.load`). Change-aware: a node whose
    fingerprint is what it was at its last successful run is left `unchanged` (decided when it becomes ready, after
    its parents ran); `options.force` runs every chosen node. `platform_name` labels the catalog info;
    `on_event("start", Node)` / `on_event("end", NodeRun)` as the nodes go."""
    select, from_failed, force = options.select, options.from_failed, options.force
    pipeline = _pipeline(source, options)
    run_id = runner.new_run_id()
    with (
        _one_run_at_a_time(endpoints, pipeline.name, run_id),
        Lake(endpoints) as lake,
        WorkerPlane(scheduler, endpoints) as plane,
    ):
        workers = _running_workers(plane)
        pipeline.check_pins(workers)
        selector = select
        if from_failed:
            only, last_id = _from_failed(lake, pipeline)
            if not only:
                return None
            selector = f"from-failed {last_id}"
        else:
            only = pipeline.select(select) if select else set(pipeline.nodes)
        if pipeline.env is not None:  # its tables in the environment, reading prod's where dev has none
            pipeline = environments.rewrite(pipeline, environments.built(lake, pipeline.env), only)
            environments.make_schemas(lake, pipeline, run_id)
        else:
            _not_promoted(lake, pipeline, only)
        # the nodes that share a worker-local table run together or not at all: decided up front from the plan
        previous = history.previous(lake, pipeline.name)
        planned = _decider(lake, pipeline, previous)
        planned.plan([n for wave in pipeline.waves(only) for n in wave], force=force)
        decider = _decider(lake, pipeline, previous)
        decider.local_plan = planned.local_plan

        how: dict[str, incremental.Choice] = {}  # incremental nodes: what their run does

        def gate(node_id: str, _done: dict[str, NodeRun]) -> str | None:
            decision = decider.decide(node_id, force=force)
            node = pipeline.nodes[node_id]
            if decision.run and node.kind is not None:
                how[node_id] = _incremental(lake, decider, node, decision, force)
            return None if decision.run else decision.reason

        def event(kind: str, node: NodeRun | Node) -> None:
            if kind == "end" and isinstance(node, NodeRun) and node.status == OK:
                decider.ran(node.id, node.snapshot_id)
            on_event(kind, node)

        done = runner.run(
            pipeline,
            plane,
            choice=runner.RunChoice(
                only, selector, options.timeout_s, gate=gate, texts=lambda n: how[n].statements if n in how else None
            ),
            run_id=run_id,
            on_event=event,
            landed=lambda token: snapshot_of_token(lake, token),
        )
        _fingerprints(pipeline, done, decider, changes.versions(lake))
        for n in done.nodes:
            if n.id in how and n.status != SKIPPED:
                n.incremental = how[n.id].record | {"why": how[n.id].why}
                n.why = f"{n.why}; {how[n.id].why}" if n.why else how[n.id].why
        warnings = list(pipeline.warnings)
        local: dict[str, list] = {}
        try:  # the worker-local tables' columns, for column lineage through them
            if not plane.scheduler_lost():
                local = {
                    w: plane.run(history.LOCAL_COLUMNS_SQL, worker=w).rows
                    for w in sorted({n.worker for n in done.nodes if n.worker and n.status != SKIPPED})
                }
        except Exception as exc:  # noqa: BLE001 - a worker gone since: the run is still recorded
            warnings.append(
                f"the workers' local tables could not be read ({first_line(exc)}): no column lineage through them"
            )
        schema = history.current_schema(lake, local)
        lineage = history.run_lineage(pipeline, done, schema, history.local_tables_on(lake))
        snapshot = history.record(lake, pipeline, done, lineage)
        info = lake.catalog_info(platform_name)
    return RunOutcome(done, lineage, warnings + lineage.warnings, snapshot, info)


def _not_promoted(lake: Lake, pipeline: Pipeline, only: set[str]) -> None:
    """A prod run must not write a name `pipeline promote` made a view (its node would fail on DuckDB's "is of type
    View"): refused in one line before anything runs."""
    views = {t for t, kind in promotion.table_kinds(lake).items() if kind == "VIEW"}
    served = {t: v for t, v in promotion.promoted(lake).items() if t in views}
    hits = sorted((str(t), n) for n in only for t in pipeline.nodes[n].use.writes if str(t) in served)
    if hits:
        table, node = hits[0]
        env, physical = served[table]
        raise KitError(
            f"prod's {table} is served by `pipeline promote` (a view over {physical}), so node {node} cannot write it",
            f"build in an environment and promote it: `pipeline run {pipeline.file} --env {env}`, then "
            f"`pipeline promote {env}`",
        )


def _incremental(
    lake: Lake, decider: changes.Decider, node: Node, decision: changes.Decision, force: bool
) -> incremental.Choice:
    """An incremental node that must run: incrementally when only its source changed since its last run (its SQL,
    its other inputs and its table as that run left them), else in full, saying why."""
    kind = node.kind
    assert kind is not None
    full = kind.as_dict() | {"mode": "full"}
    prev = decider.previous.get(node.id)
    if force:
        return incremental.Choice(None, "a full build (--force)", full)
    if prev is None or prev.status not in (OK, UNCHANGED) or prev.inputs is None or prev.outputs is None:
        return incremental.Choice(None, "a full build: no successful run to add to", full)
    if prev.sql_hash != decision.sql_hash:
        return incremental.Choice(None, "a full build: its SQL changed", full)
    other = sorted(t for t, v in decision.inputs.items() if prev.inputs.get(t) != v and t != str(kind.source))
    if other:
        return incremental.Choice(None, f"a full build: {other[0]} changed too", full)
    if decider.output_changed(node, prev) is not None:
        return incremental.Choice(None, f"a full build: {decider.output_changed(node, prev)}", full)
    source = str(kind.source)
    return incremental.choose(lake, kind, prev.inputs.get(source), decision.inputs.get(source))


def _fingerprints(pipeline: Pipeline, done: PipelineRun, decider: changes.Decider, now: dict[str, str]) -> None:
    """What the history records of each decided node: why it ran or was left; for a node that ran or was left
    unchanged, its fingerprint and the version of each table it writes, as it left them."""
    outputs = changes.outputs_after(pipeline, done.nodes, now, decider.previous)
    for n in done.nodes:
        d = decider.decided.get(n.id)
        if d is None:
            continue
        n.why = d.reason
        if n.status in (OK, UNCHANGED):
            n.fingerprint, n.sql_hash, n.inputs, n.outputs = d.fingerprint, d.sql_hash, d.inputs, outputs.get(n.id)


RUN_HOLDER = "ducklake-kit pipeline run "  # how a run names itself to PostgreSQL (application_name) while it holds
PROMOTE_HOLDER = "ducklake-kit pipeline "  # a promote: "ducklake-kit pipeline promote dev"


def _one_run_at_a_time(endpoints: Endpoints, name: str, run_id: str, holder: str = RUN_HOLDER):
    """Hold the pipeline's lock in the catalog (a PostgreSQL advisory lock, released when the run's session ends, a
    killed run included) for the run (or a promote of its environment: `holder`); a second run of the same pipeline
    is refused, naming the run that holds it."""

    def busy(other: str | None) -> KitError:
        if other and other.startswith(PROMOTE_HOLDER) and not other.startswith(RUN_HOLDER):
            return KitError(
                f"pipeline {name} is being promoted ({other.removeprefix(PROMOTE_HOLDER)}); a run and a promote of "
                "its environment never overlap, or the promote could take half a run's tables",
                "wait for the promote to end, then run it again",
            )
        run = f"run {other.removeprefix(RUN_HOLDER)}" if other and other.startswith(RUN_HOLDER) else "another run"
        return KitError(
            f"pipeline {name} is already running ({run}); one run of a pipeline at a time, or the two "
            "would replace each other's tables and race to record their history",
            "wait for that run to end, then run it again",
        )

    return held_exclusively(endpoints, named_key(b"P\x00", name), holder + run_id, busy)


@dataclass
class LineageView:
    table: str
    edges: list[history.UpstreamEdge]
    columns: list[history.ColumnLink]  # every column lineage edge above `table`

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "edges": [
                {
                    "child": e.child,
                    "parent": e.parent,
                    "pipeline": e.pipeline,
                    "node": e.node_id,
                    "location": e.location,
                    "parent_location": e.parent_location,
                }
                for e in self.edges
            ],
            "columns": [
                {"child": c, "child_column": cc, "parent": p, "parent_column": pc} for c, cc, p, pc in self.columns
            ],
        }


def lineage(endpoints: Endpoints, table: str, *, columns: bool = False) -> LineageView:
    """The recorded upstream of `table` (as pipelines built it): every table above it, and with `columns` every
    column above each of its columns."""
    from ducklake_kit.pipelines.tables import parse_table_name

    try:
        name = str(parse_table_name(table))
    except ValueError as exc:
        raise KitError(str(exc), "name it as table, schema.table or local.table") from None
    with Lake(endpoints) as lake:
        edges = history.upstream(lake, name)
        cols = history.upstream_columns(lake, name) if columns else []
    if not edges:
        raise KitError(
            f"no pipeline has recorded lineage for {name}",
            'run a pipeline that builds it (`pipeline run FILE`), or check the name with `sql "SELECT DISTINCT '
            'child FROM lineage_tables"`',
        )
    return LineageView(name, edges, cols)


def env_diff(endpoints: Endpoints, env: str, *, platform_name: str = "local") -> tuple[environments.EnvDiff, dict]:
    """`pipeline diff ENV`: every table of the environment against prod's (see environments.diff), with the catalog
    info."""
    with Lake(endpoints) as lake:
        return environments.diff(lake, env), lake.catalog_info(platform_name)


def promote(
    endpoints: Endpoints, env: str, *, migrate: bool = False, platform_name: str = "local"
) -> tuple[promotion.Promotion, dict]:
    """`pipeline promote ENV`: prod serves the environment's tables in one snapshot (see promote.py)."""
    with Lake(endpoints) as lake, ExitStack() as held:
        for name in promotion.env_pipelines(lake, env):  # no run of the environment writes while it is promoted
            held.enter_context(_one_run_at_a_time(endpoints, name, f"promote {env}", PROMOTE_HOLDER))
        return promotion.promote(lake, env, migrate=migrate), lake.catalog_info(platform_name)
