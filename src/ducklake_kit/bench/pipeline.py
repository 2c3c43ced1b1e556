"""`bench --suite pipeline`: how close the pipeline runner comes to what the workers allow.

A generated DAG of K independent CPU-bound nodes plus a chain of C such nodes (the same query each, sized to about
`node_s` seconds on one DuckDB thread), run on W workers. Its makespan (first node started to last node finished,
as the workers saw them) is compared with the bound no scheduler can beat, max(critical path, total node time / W),
both from the node times measured in that run, and with the same DAG run serially (every node pinned to w1).

The scheduling cost per node: a chain of N trivial nodes (`SELECT 1`), where every step is a round trip through
the runner: (makespan - the nodes' own time) / (N - 1), the N - 1 hand-overs from a node to the next.

Change-aware runs: a small DAG of lake tables (schema `bench_pipeline`) run end to end as `pipeline run --force`
does (every node, the history recorded), then again as `pipeline run` does: every node must be left unchanged, and
the second run's time is what deciding that costs (the catalog read, the fingerprints, the history written).

Incremental nodes: a table of M months of events (`bench_pipeline.events`) and a node `-- kind:
incremental_by_time(day)` that sums them per day, built in full; then one more month is appended and the node run
again. The figure is the ratio of the source rows its incremental run read (those from the earliest new day on,
counted in the lake) to the rows a full rebuild reads (all of them now): about 1 / (M + 1). The node's table is then
compared with its query run in full (EXCEPT ALL both ways): a difference is a defect. The same for a node `-- kind:
incremental_by_key(account)` over a ledger of K accounts: after rows for a few accounts are appended (half of them
existing, half new), the rows its incremental run wrote (its MERGE, read from DuckLake's change feed of the node's
snapshot) against the rows a full rebuild writes (every account).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ducklake_kit.bench.results import Machine, load_average, write_outputs
from ducklake_kit.errors import KitError
from ducklake_kit.pipelines.dag import Pipeline, build
from ducklake_kit.pipelines.runner import EVERY_NODE, PipelineRun, RunChoice, run
from ducklake_kit.platforms.kit import Kit

GOAL_VS_BOUND = 1.15  # makespan / max(critical path, total / workers), on 2 workers
GOAL_SCHEDULING_MS = 10.0  # per node
ROWS_PER_S = 4_000_000  # md5 rows one DuckDB thread does in about a second here; calibrated on the workers first


def busy_sql(rows: int) -> str:
    return f"SELECT sum(length(md5(i::VARCHAR))) AS busy FROM range({rows}) t(i)"


def dag_source(independent: int, chain: int, rows: int) -> str:
    """The generated pipeline: nodes i1..iK (independent) and c1 -> c2 -> ... -> cC."""
    parts = [f"-- id: i{k}\n{busy_sql(rows)};" for k in range(1, independent + 1)]
    parts += [
        f"-- id: c{k}\n" + (f"-- depends_on: c{k - 1}\n" if k > 1 else "") + f"{busy_sql(rows)};"
        for k in range(1, chain + 1)
    ]
    return "\n".join(parts)


def chain_source(n: int) -> str:
    return "\n".join(
        f"-- id: s{k}\n" + (f"-- depends_on: s{k - 1}\n" if k > 1 else "") + "SELECT 1;" for k in range(1, n + 1)
    )


def _seconds(node) -> float:
    return (node.finished_at - node.started_at).total_seconds()


def makespan(r: PipelineRun) -> float:
    return (max(n.finished_at for n in r.nodes) - min(n.started_at for n in r.nodes)).total_seconds()


def critical_path(pipeline: Pipeline, r: PipelineRun) -> float:
    """The longest path through the DAG, each node weighted by its measured time."""
    took = {n.id: _seconds(n) for n in r.nodes}
    longest: dict[str, float] = {}
    for wave in pipeline.waves():
        for node in wave:
            longest[node] = took[node] + max((longest[p] for p in pipeline.parents(node)), default=0.0)
    return max(longest.values())


@dataclass
class DagFigures:
    nodes: int
    makespan_s: float
    total_node_s: float
    critical_path_s: float
    bound_s: float  # max(critical path, total / workers)
    vs_bound: float  # makespan / bound
    median_node_s: float


def figures(pipeline: Pipeline, r: PipelineRun, workers: int) -> DagFigures:
    total = sum(_seconds(n) for n in r.nodes)
    cp = critical_path(pipeline, r)
    bound = max(cp, total / workers)
    span = makespan(r)
    return DagFigures(
        len(r.nodes),
        round(span, 3),
        round(total, 3),
        round(cp, 3),
        round(bound, 3),
        round(span / bound, 3),
        round(statistics.median(_seconds(n) for n in r.nodes), 3),
    )


CHANGES_SCHEMA = "bench_pipeline"


def changes_source(nodes: int) -> str:
    """A small DAG of lake tables: t1 from range(), then t2..tN each from the one before, and a summary of all."""
    parts = [f"-- id: t1\nCREATE OR REPLACE TABLE {CHANGES_SCHEMA}.t1 AS SELECT range AS x FROM range(1000);"]
    parts += [
        f"-- id: t{k}\nCREATE OR REPLACE TABLE {CHANGES_SCHEMA}.t{k} AS SELECT x + 1 AS x FROM {CHANGES_SCHEMA}.t{k - 1};"
        for k in range(2, nodes + 1)
    ]
    return "\n".join(parts)


@dataclass
class ChangeFigures:
    nodes: int
    forced_run_s: float  # every node run (--force), end to end: the lake, the plane, the history
    unchanged_run_s: float  # the same pipeline again: every node left unchanged, end to end
    unchanged_nodes: int  # of `nodes`, left unchanged by the second run (all of them, or the kit has a defect)


def _changes(kit: Kit, address: str, nodes: int) -> ChangeFigures:
    import time

    from ducklake_kit.lake import Lake
    from ducklake_kit.pipelines import flow

    ep = kit.platform.endpoints()
    with Lake(ep) as lake:
        lake.run(f"CREATE SCHEMA IF NOT EXISTS {CHANGES_SCHEMA}")
    pipeline = build(changes_source(nodes), "<bench changes>", name="bench_changes")
    times, runs = [], []
    for force in (True, False):
        t0 = time.perf_counter()
        outcome = flow.run(pipeline, address, ep, flow.Options(force=force), platform_name=kit.platform.name)
        times.append(time.perf_counter() - t0)
        runs.append(outcome.run)
    if not runs[0].ok:
        raise KitError("a benchmark node failed in the change-aware pair", "run `workers` to see the workers' state")
    unchanged = sum(1 for n in runs[1].nodes if n.status == "unchanged")
    return ChangeFigures(nodes, round(times[0], 3), round(times[1], 3), unchanged)


INCREMENTAL_QUERY = f"SELECT day, count(*) AS trips, sum(fare) AS fares FROM {CHANGES_SCHEMA}.events GROUP BY day"


def _month_rows(month: int, rows: int) -> str:
    """`rows` events spread over month `month` (0: January 2024), one day each, deterministic."""
    return (
        f"SELECT (DATE '2024-01-01' + INTERVAL ({month}) MONTH + INTERVAL (i % 28) DAY)::DATE AS day, "
        f"(i % 97)::DECIMAL(18, 2) AS fare FROM range({rows}) t(i)"
    )


@dataclass
class IncrementalFigures:
    months_before: int  # months in the source when the node was built in full
    month_rows: int
    full_run_s: float  # the node built in full (every month), end to end
    incremental_run_s: float  # after one more month: the node's incremental run, end to end
    mode: str  # what the second run did: incremental (or full: a defect here)
    rows_read_incremental: int  # source rows from the earliest new day on: what the incremental run read
    rows_full_rebuild: int  # source rows now: what a full rebuild reads
    ratio: float  # rows_read_incremental / rows_full_rebuild
    equals_full: bool  # the node's table equals its query run in full, EXCEPT ALL both ways


def _incremental(kit: Kit, address: str, months: int, month_rows: int) -> IncrementalFigures:
    import time

    from ducklake_kit.lake import Lake
    from ducklake_kit.pipelines import flow

    ep = kit.platform.endpoints()
    first = " UNION ALL ".join(_month_rows(m, month_rows) for m in range(months))
    with Lake(ep) as lake:
        lake.run(f"CREATE SCHEMA IF NOT EXISTS {CHANGES_SCHEMA}")
        lake.run(f"CREATE OR REPLACE TABLE {CHANGES_SCHEMA}.events AS {first}")
    source = (
        f"-- id: daily\n-- kind: incremental_by_time(day)\n"
        f"CREATE OR REPLACE TABLE {CHANGES_SCHEMA}.daily AS {INCREMENTAL_QUERY};"
    )
    pipeline = build(source, "<bench incremental>", name="bench_incremental")
    t0 = time.perf_counter()
    full = flow.run(pipeline, address, ep, flow.Options(force=True), platform_name=kit.platform.name).run
    full_s = time.perf_counter() - t0
    with Lake(ep) as lake:
        lake.run(f"INSERT INTO {CHANGES_SCHEMA}.events {_month_rows(months, month_rows)}")
    t0 = time.perf_counter()
    again = flow.run(pipeline, address, ep, platform_name=kit.platform.name).run
    incremental_s = time.perf_counter() - t0
    node = again.node("daily")
    if not (full.ok and again.ok):
        raise KitError(
            f"the incremental node failed ({node.error or node.reason})", "run `workers` to see the workers' state"
        )
    record = node.incremental or {}
    with Lake(ep) as lake:
        since = record.get("from")
        read, total = lake.con.execute(
            f"SELECT count(*) FILTER (day >= CAST(? AS DATE)), count(*) FROM {CHANGES_SCHEMA}.events",
            [since or "9999-12-31"],
        ).fetchone()
        only_table, only_full = lake.con.execute(
            f"SELECT (SELECT count(*) FROM (FROM {CHANGES_SCHEMA}.daily EXCEPT ALL {INCREMENTAL_QUERY})), "
            f"(SELECT count(*) FROM ({INCREMENTAL_QUERY} EXCEPT ALL FROM {CHANGES_SCHEMA}.daily))"
        ).fetchone()
    return IncrementalFigures(
        months,
        month_rows,
        round(full_s, 3),
        round(incremental_s, 3),
        str(record.get("mode")),
        read,
        total,
        round(read / total, 4) if total else 0.0,
        only_table == 0 and only_full == 0,
    )


BY_KEY_QUERY = (
    f"SELECT account, count(*) AS entries, sum(amount) AS total FROM {CHANGES_SCHEMA}.ledger GROUP BY account"
)


@dataclass
class ByKeyFigures:
    keys: int  # accounts in the ledger when the node was built in full
    source_rows: int  # ledger rows then
    changed_keys: int  # accounts the change touched: half of them existing, half new
    full_run_s: float
    incremental_run_s: float
    mode: str  # what the second run did: incremental (or full: a defect here)
    rows_merged: int  # rows the incremental run wrote to the table (DuckLake's change feed of its snapshot)
    rows_full_rebuild: int  # rows a full rebuild writes: the table's rows now
    ratio: float  # rows_merged / rows_full_rebuild
    equals_full: bool  # the table equals its query run in full, EXCEPT ALL both ways


def _by_key(kit: Kit, address: str, keys: int, changed: int) -> ByKeyFigures:
    """A node `-- kind: incremental_by_key(account)` summing a ledger per account, built in full; then rows are
    appended for `changed` accounts (half existing, half new) and the node run again: the rows its MERGE wrote
    against the rows a full rebuild writes."""
    import time

    from ducklake_kit.lake import Lake
    from ducklake_kit.pipelines import flow

    ep = kit.platform.endpoints()
    rows = keys * 10
    half = max(changed // 2, 1)
    with Lake(ep) as lake:
        lake.run(f"CREATE SCHEMA IF NOT EXISTS {CHANGES_SCHEMA}")
        lake.run(
            f"CREATE OR REPLACE TABLE {CHANGES_SCHEMA}.ledger AS SELECT i % {keys} AS account, "
            f"(i % 89)::DECIMAL(18, 2) AS amount FROM range({rows}) t(i)"
        )
    source = (
        f"-- id: balances\n-- kind: incremental_by_key(account)\n"
        f"CREATE OR REPLACE TABLE {CHANGES_SCHEMA}.balances AS {BY_KEY_QUERY};"
    )
    pipeline = build(source, "<bench by key>", name="bench_by_key")
    t0 = time.perf_counter()
    full = flow.run(pipeline, address, ep, flow.Options(force=True), platform_name=kit.platform.name).run
    full_s = time.perf_counter() - t0
    with Lake(ep) as lake:  # `half` existing accounts get a row, `half` new accounts appear
        lake.run(
            f"INSERT INTO {CHANGES_SCHEMA}.ledger SELECT CASE WHEN i < {half} THEN i ELSE {keys} + i END, 1 "
            f"FROM range({2 * half}) t(i)"
        )
    t0 = time.perf_counter()
    again = flow.run(pipeline, address, ep, platform_name=kit.platform.name).run
    incremental_s = time.perf_counter() - t0
    node = again.node("balances")
    if not (full.ok and again.ok) or node.snapshot_id is None:
        raise KitError(
            f"the incremental_by_key node failed ({node.error or node.reason})",
            "run `workers` to see the workers' state",
        )
    with Lake(ep) as lake:
        snap = int(node.snapshot_id)
        merged, total, only_table, only_full = lake.con.execute(
            f"SELECT (SELECT count(*) FROM ducklake_table_changes('{lake.alias}', '{CHANGES_SCHEMA}', 'balances', "
            f"{snap}, {snap}) WHERE change_type IN ('insert', 'update_postimage')), "
            f"(SELECT count(*) FROM {CHANGES_SCHEMA}.balances), "
            f"(SELECT count(*) FROM (FROM {CHANGES_SCHEMA}.balances EXCEPT ALL {BY_KEY_QUERY})), "
            f"(SELECT count(*) FROM ({BY_KEY_QUERY} EXCEPT ALL FROM {CHANGES_SCHEMA}.balances))"
        ).fetchone()
    return ByKeyFigures(
        keys,
        rows,
        2 * half,
        round(full_s, 3),
        round(incremental_s, 3),
        str((node.incremental or {}).get("mode")),
        merged,
        total,
        round(merged / total, 5) if total else 0.0,
        only_table == 0 and only_full == 0,
    )


@dataclass
class PipelineBench:
    machine: Machine
    workers: int
    independent: int
    chain: int
    rows_per_node: int
    parallel: DagFigures
    serial: DagFigures
    speedup_vs_serial: float
    scheduling_nodes: int
    scheduling_ms_per_node: float
    order_held: bool  # the parallel run's order held: every node started after its dependencies finished
    changes: ChangeFigures | None = None  # a forced run and an unchanged one of a small lake DAG, end to end
    incremental: IncrementalFigures | None = None  # an incremental_by_time node after one more month
    by_key: ByKeyFigures | None = None  # an incremental_by_key node after a few accounts changed

    @property
    def goals(self) -> dict[str, bool]:
        return {
            f"makespan <= {GOAL_VS_BOUND} x bound": self.parallel.vs_bound <= GOAL_VS_BOUND,
            f"scheduling < {GOAL_SCHEDULING_MS:g} ms a node": self.scheduling_ms_per_node < GOAL_SCHEDULING_MS,
        }

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["machine"] = self.machine.as_dict()
        out["goals"] = self.goals
        return out


def _order_held(pipeline: Pipeline, r: PipelineRun) -> bool:
    at = {n.id: n for n in r.nodes}
    return all(at[e.child].started_at >= at[e.parent].finished_at for e in pipeline.edges)


def _run_ok(pipeline: Pipeline, wp, choice: RunChoice = EVERY_NODE) -> PipelineRun:
    r = run(pipeline, wp, choice=choice)
    failed = [f"{n.id}: {n.error or n.reason}" for n in r.nodes if n.status != "ok"]
    if failed:
        raise KitError(f"a benchmark node failed ({failed[0]})", "run `workers` to see the workers' state")
    return r


@dataclass(frozen=True)
class DagShape:
    """The benchmark's DAG: `independent` nodes and a chain of `chain`, each about `node_s` seconds of work; and a
    chain of `scheduling_nodes` trivial nodes for the scheduling cost."""

    independent: int = 12
    chain: int = 4
    node_s: float = 0.4
    scheduling_nodes: int = 50
    lake_nodes: int = 8  # the change-aware pair's DAG
    months: int = 6  # the incremental node's source, in months, before one more is appended
    month_rows: int = 100_000
    keys: int = 50_000  # the incremental_by_key node's accounts (10 ledger rows each)
    changed_keys: int = 500  # accounts changed before its second run (half existing, half new)


def bench_pipeline(
    kit: Kit, *, workers: int = 2, shape: DagShape = DagShape(), json_path: Path | None = None
) -> PipelineBench:
    from ducklake_kit.workers import WorkerPlane
    from ducklake_kit.workers import plane as plane_mod
    from ducklake_kit.workers.client import name_order

    independent, chain, node_s, scheduling_nodes = shape.independent, shape.chain, shape.node_s, shape.scheduling_nodes
    if workers < 1 or independent < 0 or chain < 1:
        raise KitError(
            "the pipeline benchmark needs at least one worker and a chain of at least one node", "use --workers >= 1"
        )
    load_before = load_average()
    ep, say = kit.platform.endpoints(), kit.say
    with plane_mod.borrowed(kit.state, ep, workers, kit.scheduler) as status, WorkerPlane(status.address, ep) as wp:
        names = sorted(wp.names(), key=name_order)[:workers]
        if len(names) < workers:
            raise KitError(
                f"the Dask cluster at {status.address} has {len(names)} workers, the run needs {workers}",
                f"start more workers there, or run with --workers {len(names)}",
            )
        say("calibrating one node on w1")
        probe = wp.run(busy_sql(ROWS_PER_S // 2), worker=names[0])
        if not probe.ok:
            raise KitError(f"the calibration query failed ({probe.error.line()})", "run `workers`")
        rows = max(10_000, int(node_s * (ROWS_PER_S // 2) / max(probe.statements[0].seconds, 1e-3)))
        dag = build(dag_source(independent, chain, rows), "<bench dag>", name="bench_dag")
        only = set(dag.nodes)
        say(
            f"the DAG: {independent} independent nodes + a chain of {chain}, about {node_s}s each, on {workers} workers"
        )
        parallel = _run_ok(
            dag, wp, RunChoice(only=only, among=names)
        )  # on exactly `workers` workers, whatever else runs
        say("the same DAG serially (every node pinned to one worker)")
        serial_dag = build(dag_source(independent, chain, rows), "<bench dag>", name="bench_dag_serial")
        for node in serial_dag.nodes.values():
            node.pin = names[0]
        serial = _run_ok(serial_dag, wp)
        say(f"scheduling cost: a chain of {scheduling_nodes} trivial nodes")
        trivial = build(chain_source(scheduling_nodes), "<bench chain>", name="bench_chain")
        chained = _run_ok(trivial, wp, RunChoice(among=names))
        say(f"change-aware runs: {shape.lake_nodes} lake tables run with --force, then again unchanged")
        changes = _changes(kit, status.address, shape.lake_nodes)
        say(f"incremental: {shape.months} months of events built in full, then one more month")
        incremental = _incremental(kit, status.address, shape.months, shape.month_rows)
        say(f"incremental_by_key: {shape.keys:,} accounts built in full, then {shape.changed_keys} changed")
        by_key = _by_key(kit, status.address, shape.keys, shape.changed_keys)
    par, ser = figures(dag, parallel, workers), figures(serial_dag, serial, 1)
    own = sum(_seconds(n) for n in chained.nodes)
    per_node_ms = (makespan(chained) - own) / max(scheduling_nodes - 1, 1) * 1000
    out = PipelineBench(
        Machine.since(load_before),
        workers,
        independent,
        chain,
        rows,
        par,
        ser,
        round(ser.makespan_s / par.makespan_s, 3),
        scheduling_nodes,
        round(per_node_ms, 3),
        _order_held(dag, parallel) and _order_held(trivial, chained),
        changes,
        incremental,
        by_key,
    )
    write_outputs(out, json_path, None)
    return out
