"""What a pipeline run leaves in the lake, so a user can query it with SQL: `pipeline_runs`, `pipeline_nodes`,
`lineage_tables` and `lineage_columns` (in the lake's `main` schema), written in ONE transaction after the run.

Lineage rows are replaced per (pipeline, node): re-running a pipeline updates them instead of adding copies.
Times are UTC (TIMESTAMPTZ).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ducklake_kit.errors import first_line
from ducklake_kit.lake import Lake
from ducklake_kit.lake.sql import table_exists
from ducklake_kit.lake.transactions import commit_once
from ducklake_kit.pipelines.changes import Previous
from ducklake_kit.pipelines.dag import Pipeline
from ducklake_kit.pipelines.lineage import ColumnEdge, Schema, TableEdge, column_edges, table_edges
from ducklake_kit.pipelines.runner import FAILED, OK, SKIPPED, UNCHANGED, PipelineRun
from ducklake_kit.pipelines.tables import TableRef, parse_table_name
from ducklake_kit.workers.config import LOCAL_DB

TABLES = {
    "pipeline_runs": "run_id VARCHAR NOT NULL, pipeline VARCHAR NOT NULL, file VARCHAR, status VARCHAR, "
    "started_at TIMESTAMPTZ, finished_at TIMESTAMPTZ, nodes_ok INTEGER, nodes_failed INTEGER, "
    "nodes_skipped INTEGER, selector VARCHAR, nodes_unchanged INTEGER",
    "pipeline_nodes": "run_id VARCHAR NOT NULL, pipeline VARCHAR NOT NULL, node_id VARCHAR NOT NULL, status VARCHAR, "
    "worker VARCHAR, started_at TIMESTAMPTZ, finished_at TIMESTAMPTZ, duration_ms DOUBLE, "
    "error VARCHAR, reason VARCHAR, snapshot_id BIGINT, sql VARCHAR, why VARCHAR, fingerprint VARCHAR, "
    "sql_hash VARCHAR, inputs VARCHAR, outputs VARCHAR, audits VARCHAR, incremental VARCHAR, key VARCHAR",
    "lineage_tables": "child VARCHAR NOT NULL, parent VARCHAR NOT NULL, pipeline VARCHAR NOT NULL, "
    "node_id VARCHAR NOT NULL, run_id VARCHAR, snapshot_id BIGINT, location VARCHAR, "
    "parent_location VARCHAR",
    "lineage_columns": "child VARCHAR NOT NULL, child_column VARCHAR NOT NULL, parent VARCHAR NOT NULL, "
    "parent_column VARCHAR NOT NULL, pipeline VARCHAR NOT NULL, node_id VARCHAR NOT NULL, "
    "run_id VARCHAR",
}


@dataclass(frozen=True)
class NodeTableEdge:
    """A table lineage edge as a node recorded it: where the child and the parent live (`lake`, or a worker)."""

    node: str
    edge: TableEdge
    location: str
    parent_location: str


@dataclass(frozen=True)
class NodeColumnEdge:
    node: str
    edge: ColumnEdge


class ColumnLink(NamedTuple):
    """One recorded column lineage edge, as `pipeline lineage --columns` reads it back."""

    child: str
    child_column: str
    parent: str
    parent_column: str


@dataclass
class Lineage:
    """The lineage of a run's successful nodes, with the worker each local table lives on."""

    tables: list[NodeTableEdge] = field(default_factory=list)
    columns: list[NodeColumnEdge] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _location(table: TableRef, worker: str | None) -> str:
    return (worker or "?") if table.local else "lake"


def run_lineage(pipeline: Pipeline, run: PipelineRun, schema: Schema, workers_of_local: dict[TableRef, str]) -> Lineage:
    """Table and column lineage of the nodes that succeeded. `schema`: the columns of every table involved (see
    `current_schema`); `workers_of_local`: which worker holds a worker-local table read from earlier runs."""
    out = Lineage()
    where = dict(workers_of_local)
    for node_run in run.nodes:
        if node_run.status != OK:
            continue
        node = pipeline.nodes[node_run.id]
        for t in node.use.writes:
            if t.local:
                where[t] = node_run.worker or "?"
        edges = table_edges(node.use)
        for edge in edges:
            out.tables.append(
                NodeTableEdge(
                    node.id,
                    edge,
                    _location(edge.child, where.get(edge.child, node_run.worker)),
                    _location(edge.parent, where.get(edge.parent, node_run.worker)),
                )
            )
        if not edges:
            continue
        child = edges[0].child
        columns = list(schema.get(child.catalog, {}).get(child.schema, {}).get(child.name, {}))
        try:
            out.columns += [NodeColumnEdge(node.id, e) for e in column_edges(node.use, schema, columns)]
        except Exception as exc:  # noqa: BLE001 - the node ran; lineage sqlglot cannot trace is reported, not fatal
            out.warnings.append(f"node {node.id}: no column lineage ({first_line(exc)})")
    return out


def current_schema(lake: Lake, local: dict[str, list[tuple]] | None = None) -> Schema:
    """The lake's tables and columns now, plus worker-local ones: `local` maps a worker to rows of (schema, table,
    column, type) that its `information_schema` gave."""
    schema: Schema = {}
    rows = lake.con.execute(
        "SELECT table_catalog, table_schema, table_name, column_name, data_type "
        "FROM information_schema.columns WHERE table_catalog = ?",
        [lake.alias],
    ).fetchall()
    for worker_rows in (local or {}).values():
        rows += [(LOCAL_DB, *r) for r in worker_rows]
    for catalog, schema_name, table, column, dtype in rows:  # columns as spelled: lineage records them so
        schema.setdefault(catalog.lower(), {}).setdefault(schema_name.lower(), {}).setdefault(table.lower(), {})[
            column
        ] = dtype
    return schema


LOCAL_COLUMNS_SQL = (
    f"SELECT table_schema, table_name, column_name, data_type FROM information_schema.columns "
    f"WHERE table_catalog = '{LOCAL_DB}' ORDER BY table_name, ordinal_position"
)


def _iso(t) -> Any:
    return t.isoformat() if t else None


def record(lake: Lake, pipeline: Pipeline, run: PipelineRun, lineage: Lineage) -> int | None:
    """Write the run, its nodes and its lineage in one transaction; the snapshot it made."""
    run_row = [
        run.run_id,
        run.pipeline,
        run.file,
        run.status,
        _iso(run.started_at),
        _iso(run.finished_at),
        run.count(OK),
        run.count(FAILED),
        run.count(SKIPPED),
        run.selector,
        run.count(UNCHANGED),
    ]
    node_rows = [
        [
            run.run_id,
            run.pipeline,
            n.id,
            n.status,
            n.worker,
            _iso(n.started_at),
            _iso(n.finished_at),
            n.duration_ms,
            n.error,
            n.reason,
            n.snapshot_id,
            n.sql,
            n.why,
            n.fingerprint,
            n.sql_hash,
            json.dumps(n.inputs) if n.inputs is not None else None,
            json.dumps(n.outputs) if n.outputs is not None else None,
            json.dumps(n.audits) if n.audits else None,
            json.dumps(n.incremental) if n.incremental else None,
            json.dumps(list(pipeline.nodes[n.id].key)) if n.id in pipeline.nodes and pipeline.nodes[n.id].key else None,
        ]
        for n in run.nodes
    ]
    snapshots = {n.id: n.snapshot_id for n in run.nodes}
    table_rows = [
        [
            str(t.edge.child),
            str(t.edge.parent),
            run.pipeline,
            t.node,
            run.run_id,
            snapshots.get(t.node),
            t.location,
            t.parent_location,
        ]
        for t in lineage.tables
    ]
    column_rows = [
        [
            str(c.edge.child),
            c.edge.child_column,
            str(c.edge.parent),
            c.edge.parent_column,
            run.pipeline,
            c.node,
            run.run_id,
        ]
        for c in lineage.columns
    ]
    rebuilt = sorted({n.id for n in run.nodes if n.status == OK})

    def write(con) -> None:
        _create_tables(lake, con)
        _insert(con, f"{lake.alias}.main.pipeline_runs", [run_row], "pipeline_runs")
        _insert(con, f"{lake.alias}.main.pipeline_nodes", node_rows, "pipeline_nodes")
        for name in ("lineage_tables", "lineage_columns"):
            # a node's lineage as of this run replaces what an earlier run recorded; nodes the file no longer has
            # leave none behind
            for node in rebuilt:
                con.execute(
                    f"DELETE FROM {lake.alias}.main.{name} WHERE pipeline = ? AND node_id = ?", [run.pipeline, node]
                )
            con.execute(
                f"DELETE FROM {lake.alias}.main.{name} WHERE pipeline = ? AND NOT list_contains(?, node_id)",
                [run.pipeline, sorted(pipeline.nodes)],
            )
        _insert(con, f"{lake.alias}.main.lineage_tables", table_rows)
        _insert(con, f"{lake.alias}.main.lineage_columns", column_rows)

    # tried again when it did not land (a concurrent writer won the commit race), never written twice
    return commit_once(
        lake,
        write,
        f"pipeline {run.pipeline}: history of run {run.run_id}",
        extra={"pipeline_history": run.run_id} | ({"env": pipeline.env} if pipeline.env else {}),
    ).snapshot_id


def _create_tables(lake: Lake, con) -> None:
    """The history tables, and the columns later versions of the kit added to them (a lake an older kit wrote)."""
    for name, columns in TABLES.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {lake.alias}.main.{name} ({columns})")
    have = {
        f"{t}.{c}"
        for t, c in con.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_catalog = ? AND table_schema = 'main'",
            [lake.alias],
        ).fetchall()
    }
    for name, columns in TABLES.items():
        for column in _columns(columns):
            if f"{name}.{column[0]}" not in have:
                con.execute(f"ALTER TABLE {lake.alias}.main.{name} ADD COLUMN {column[0]} {column[1]}")


def _columns(spec: str) -> list[tuple[str, str]]:
    """(name, type) of each column of a TABLES entry."""
    out = []
    for part in spec.split(","):
        name, _, rest = part.strip().partition(" ")
        out.append((name, rest.removesuffix(" NOT NULL")))
    return out


def _insert(con, table: str, rows: list[list[Any]], name: str | None = None) -> None:
    if not rows:
        return
    named = f" ({', '.join(c for c, _ in _columns(TABLES[name]))})" if name else ""
    con.executemany(f"INSERT INTO {table}{named} VALUES ({', '.join('?' * len(rows[0]))})", rows)


def last_run(lake: Lake, pipeline: str) -> tuple[str, dict[str, str]] | None:
    """(run id, node -> status) of the pipeline's latest run, or None when it never ran."""
    if not table_exists(lake.con, lake.alias, "main", "pipeline_runs"):
        return None
    row = lake.con.execute(
        f"SELECT run_id FROM {lake.alias}.main.pipeline_runs WHERE pipeline = ? "
        "ORDER BY started_at DESC, run_id DESC LIMIT 1",
        [pipeline],
    ).fetchone()
    if row is None:
        return None
    nodes = lake.con.execute(
        f"SELECT node_id, status FROM {lake.alias}.main.pipeline_nodes WHERE run_id = ?", [row[0]]
    ).fetchall()
    return row[0], dict(nodes)


def previous(lake: Lake, pipeline: str) -> dict[str, Previous]:
    """Each node's last decided record (its latest run that ran it, failed it, skipped it or left it unchanged)."""
    if not table_exists(lake.con, lake.alias, "main", "pipeline_nodes"):
        return {}
    have = {
        r[0]
        for r in lake.con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_catalog = ? AND table_schema = 'main' "
            "AND table_name = 'pipeline_nodes'",
            [lake.alias],
        ).fetchall()
    }
    fp = "n.sql_hash, n.inputs, n.outputs, n.fingerprint" if "outputs" in have else "NULL, NULL, NULL, NULL"
    rows = lake.con.execute(
        f"""SELECT n.node_id, n.run_id, n.status, n.sql, {fp}, n.error,
            max(CASE WHEN n.status = 'ok' THEN n.run_id END) OVER (PARTITION BY n.node_id) AS last_ok
        FROM {lake.alias}.main.pipeline_nodes n JOIN {lake.alias}.main.pipeline_runs r USING (run_id)
        WHERE n.pipeline = ?
        QUALIFY row_number() OVER (PARTITION BY n.node_id ORDER BY r.started_at DESC, n.run_id DESC) = 1""",
        [pipeline],
    ).fetchall()
    load = lambda text: json.loads(text) if text is not None else None  # noqa: E731
    return {
        node: Previous(run_id, status, sql, sql_hash, load(inputs), load(outputs), error, last_ok, fingerprint)
        for node, run_id, status, sql, sql_hash, inputs, outputs, fingerprint, error, last_ok in rows
    }


def local_tables_on(lake: Lake) -> dict[TableRef, str]:
    """Where earlier runs left worker-local tables (their latest lineage rows say which worker)."""
    if not table_exists(lake.con, lake.alias, "main", "lineage_tables"):
        return {}
    rows = lake.con.execute(
        f"SELECT child, location FROM {lake.alias}.main.lineage_tables "
        f"WHERE child LIKE '{LOCAL_DB}.%' AND location <> 'lake'"
    ).fetchall()
    return {parse_table_name(child): loc for child, loc in rows}


@dataclass
class UpstreamEdge:
    child: str
    parent: str
    pipeline: str
    node_id: str
    location: str
    parent_location: str


def upstream(lake: Lake, table: str) -> list[UpstreamEdge]:
    """Every lineage edge above `table` (its parents, theirs, ...), each once."""
    if not table_exists(lake.con, lake.alias, "main", "lineage_tables"):
        return []
    rows = lake.con.execute(
        f"""
        WITH RECURSIVE up(child, parent, pipeline, node_id, location, parent_location) AS (
            SELECT child, parent, pipeline, node_id, location, parent_location
            FROM {lake.alias}.main.lineage_tables WHERE child = ?
            UNION
            SELECT l.child, l.parent, l.pipeline, l.node_id, l.location, l.parent_location
            FROM {lake.alias}.main.lineage_tables l JOIN up ON l.child = up.parent)
        SELECT DISTINCT * FROM up ORDER BY child, parent""",
        [table],
    ).fetchall()
    return [UpstreamEdge(*r) for r in rows]


def upstream_columns(lake: Lake, table: str) -> list[ColumnLink]:
    """(child, child column, parent, parent column) for every column lineage edge above `table`."""
    if not table_exists(lake.con, lake.alias, "main", "lineage_columns"):
        return []
    return [
        ColumnLink(*r)
        for r in lake.con.execute(
            f"""
        WITH RECURSIVE up(child, child_column, parent, parent_column) AS (
            SELECT child, child_column, parent, parent_column FROM {lake.alias}.main.lineage_columns WHERE child = ?
            UNION
            SELECT l.child, l.child_column, l.parent, l.parent_column
            FROM {lake.alias}.main.lineage_columns l JOIN up ON l.child = up.parent AND l.child_column = up.parent_column)
        SELECT DISTINCT * FROM up ORDER BY 1, 2, 3, 4""",
            [table],
        ).fetchall()
    ]
