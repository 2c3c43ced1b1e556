"""Environments: a pipeline run in `dev` builds its tables beside prod's, never in them (sqlmesh's virtual
environments, made with DuckLake's schemas).

`pipeline run FILE --env dev` writes every lake table (and schema) a node writes into `dev__<schema>` (`marts.daily`
becomes `dev__marts.daily`, `main.t` becomes `dev__main.t`), and reads a table from dev where dev has it (a node of
this run writes it, or an earlier dev run left it), else from prod. The names are rewritten on sqlglot's tree of
each statement (tables and columns qualified with a schema; CTE names and worker-local tables are left alone), so
the rest of the kit sees an ordinary pipeline: its fingerprints, change-aware decisions, audits, incremental nodes
and lineage are those of the dev tables. The run is recorded as pipeline `<name>@dev` (its own history, its own
lock), and every commit it makes names the environment in its commit_extra_info.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from ducklake_kit.errors import KitError
from ducklake_kit.lake import LAKE, Lake
from ducklake_kit.lake.sql import table_exists
from ducklake_kit.lake.transactions import commit_once
from ducklake_kit.pipelines.audits import Audit, table_sql
from ducklake_kit.pipelines.dag import Node, Pipeline, duckdb_refuses
from ducklake_kit.pipelines.incremental import parse as parse_kind
from ducklake_kit.pipelines.sqlfile import PipelineError
from ducklake_kit.pipelines.tables import DIALECT, MAKE, TableRef, cte_references, resolve, table_use

PROMOTIONS = "pipeline_promotions"  # what `pipeline promote` made prod serve (see promote.py)
SEP = "__"  # dev__marts: the environment, then the prod schema
PROD = "prod"


def check_env(env: str) -> str:
    """An environment's name: lower-case letters, digits and _, not `prod` (prod is the lake's own schemas)."""
    if not (env.isidentifier() and env == env.lower() and SEP not in env and not env.startswith("_")) or env == PROD:
        raise KitError(
            f"'{env}' cannot name an environment",
            "use lower-case letters, digits and single underscores, e.g. --env dev (prod is the lake's own schemas)",
        )
    return env


def env_schema(env: str, schema: str) -> str:
    return f"{env}{SEP}{schema}"


def prod_schema(env: str, schema: str) -> str | None:
    """The prod schema an env schema stands for (None: the schema is not one of `env`'s)."""
    prefix = f"{env}{SEP}"
    return schema[len(prefix) :] if schema.startswith(prefix) and len(schema) > len(prefix) else None


def to_env(env: str, ref: TableRef) -> TableRef:
    return TableRef(ref.catalog, env_schema(env, ref.schema), ref.name)


def built(lake: Lake, env: str) -> set[TableRef]:
    """The prod names of the tables and views the environment holds now (`dev__marts.daily` -> `marts.daily`), and
    of its schemas."""
    rows = lake.con.execute(
        "SELECT schema_name, '' FROM duckdb_schemas() WHERE database_name = ? UNION ALL "
        "SELECT table_schema, table_name FROM information_schema.tables WHERE table_catalog = ?",
        [lake.alias, lake.alias],
    ).fetchall()
    out = set()
    for schema, name in rows:
        prod = prod_schema(env, schema.lower())
        if prod is not None:
            out.add(TableRef(LAKE, prod, name.lower()))
    return out


def named(pipeline: Pipeline, env: str) -> Pipeline:
    """The pipeline as recorded in `env`: `<name>@<env>` (its history, lineage and lock are the environment's)."""
    return dataclasses.replace(pipeline, name=f"{pipeline.name}@{env}", env=env)


def written(pipeline: Pipeline, only: set[str] | None = None) -> set[TableRef]:
    """The lake tables and schemas the nodes of `only` (default: all) write or make."""
    out: set[TableRef] = set()
    for node in pipeline.nodes.values():
        if only is None or node.id in only:
            out |= {t for t in node.use.writes if not t.local}
            out |= {t for t, roles in node.use.uses.items() if t.is_schema and MAKE in roles and not t.local}
    return out


def rewrite(pipeline: Pipeline, in_dev: set[TableRef], only: set[str] | None = None) -> Pipeline:
    """The pipeline with its names in `pipeline.env`: every table and schema a node writes, and every table it reads
    that dev holds (`in_dev`, prod names) or a node of this run (`only`) writes, is the env's; any other table it
    reads stays prod's. Node ids, edges, pins and headers are unchanged (the mapping is one per table, so the
    inferred edges are too)."""
    env = pipeline.env
    assert env is not None
    to_dev = written(pipeline, only) | in_dev
    schemas_to_dev = {t.schema for t in to_dev if t.is_schema}

    def rename(ref: TableRef) -> TableRef | None:
        if ref.local or ref.catalog != LAKE:
            return None
        if ref in to_dev or (ref.is_schema and ref.schema in schemas_to_dev):
            return to_env(env, ref)
        return None

    nodes = {}
    for node in pipeline.nodes.values():
        writes = {t for t in node.use.writes if not t.local} | {
            t for t, r in node.use.uses.items() if t.is_schema and r - {"read"} and not t.local
        }
        mine = lambda ref, w=writes: to_env(env, ref) if ref in w else rename(ref)  # noqa: E731
        nodes[node.id] = _node_in(node, pipeline.file, mine)
    return dataclasses.replace(pipeline, nodes=nodes)


def _node_in(node: Node, file: str, rename: Callable[[TableRef], TableRef | None]) -> Node:
    tree = node.use.tree
    if tree is None or node.use.opaque:
        raise PipelineError(
            file,
            node.line,
            f"node {node.id} cannot run in an environment: sqlglot cannot read which tables it uses, so they "
            "cannot be named in the environment",
            "write it as a statement sqlglot reads, or run the pipeline without --env",
        )
    sql = rename_sql(tree, rename)
    refused = duckdb_refuses(sql)
    if refused:
        raise PipelineError(
            file, node.line, f"node {node.id}, renamed for the environment, does not parse ({refused})", "report it"
        )
    use = table_use(sql)
    audited = (rename(node.audited) or node.audited) if node.audited else None
    audits = [_audit_in(a, rename) for a in node.audits]
    kind = parse_kind(node.kind.text, node.id, use) if node.kind is not None else None
    return dataclasses.replace(node, sql=sql, use=use, audited=audited, audits=audits, kind=kind)


def _audit_in(audit: Audit, rename: Callable[[TableRef], TableRef | None]) -> Audit:
    if audit.query is None:
        return audit
    import sqlglot

    query = rename_sql(sqlglot.parse_one(audit.query, read=DIALECT), rename)
    return dataclasses.replace(audit, query=query, reads=frozenset(table_use(query).reads))


def rename_sql(tree: exp.Expression, rename: Callable[[TableRef], TableRef | None]) -> str:
    """The statement with each table (and schema) `rename` maps written under its new name; CTE names are left
    alone (scoped: `WITH t AS (SELECT * FROM t)` still renames the table inside), and so is a column qualified with
    its table's schema (`marts.daily.x`)."""
    tree = tree.copy()
    ctes = cte_references(tree)
    moved: dict[tuple[str, str], str] = {}  # (schema, table) -> the new schema, for columns that name the schema
    for table in list(tree.find_all(exp.Table)):
        if id(table) in ctes:
            continue
        if not isinstance(table.this, exp.Identifier):  # CREATE/DROP SCHEMA s: a Table with only its db
            if table.this is None and table.args.get("db") is not None:
                catalog = table.catalog.lower() if table.catalog else LAKE
                new = rename(TableRef(catalog, table.db.lower(), ""))
                if new is not None:
                    table.set("db", exp.to_identifier(new.schema))
            continue
        ref = resolve(table)
        new = rename(ref)
        if new is None:
            continue
        moved[(ref.schema, ref.name)] = new.schema
        table.set("db", exp.to_identifier(new.schema))
        if not table.catalog and ref.catalog != LAKE:
            table.set("catalog", exp.to_identifier(ref.catalog))
    for column in tree.find_all(exp.Column):
        if column.args.get("db") is not None and column.table:
            new_schema = moved.get((column.db.lower(), column.table.lower()))
            if new_schema is not None:
                column.set("db", exp.to_identifier(new_schema))
    return tree.sql(dialect=DIALECT)


def make_schemas(lake: Lake, pipeline: Pipeline, run_id: str) -> int | None:
    """Create the env schemas the run's tables go to and no node of the file makes (`dev__main` for a table in
    main), in one commit that names the pipeline, the environment and the run; None when none is missing."""
    made_by_nodes = {t.schema for t in written(pipeline) if t.is_schema}
    needed = sorted({t.schema for t in written(pipeline) if not t.is_schema} - made_by_nodes)
    have = {
        r[0].lower()
        for r in lake.con.execute(
            "SELECT schema_name FROM duckdb_schemas() WHERE database_name = ?", [lake.alias]
        ).fetchall()
    }
    missing = [s for s in needed if s not in have]
    if not missing:
        return None

    def work(con) -> None:
        for schema in missing:
            con.execute(f"CREATE SCHEMA IF NOT EXISTS {exp.to_identifier(schema).sql(DIALECT)}")

    return commit_once(
        lake,
        work,
        f"pipeline {pipeline.name}: schemas {', '.join(missing)} (run {run_id})",
        extra={"pipeline": pipeline.name, "env": pipeline.env, "run": run_id},
    ).snapshot_id


@dataclass
class TableDiff:
    """One table of an environment against prod's table of the same name."""

    table: str  # prod's name (marts.daily)
    env_table: str  # the environment's (dev__marts.daily)
    prod_rows: int | None  # None: prod has no such table
    env_rows: int
    key: list[str] = field(default_factory=list)  # from the `-- key:` header of the node that built it
    columns_added: list[str] = field(default_factory=list)  # in the environment, not in prod
    columns_removed: list[str] = field(default_factory=list)
    only_in_env: int | None = None  # rows (as a multiset, EXCEPT ALL) when both have the same columns
    only_in_prod: int | None = None
    added: int | None = None  # keys only in the environment (with a key)
    removed: int | None = None  # keys only in prod
    changed: int | None = None  # keys in both whose rows differ (in the columns both have)
    examples: dict[str, list[str]] = field(default_factory=dict)  # up to 5 keys of each kind

    @property
    def same(self) -> bool:
        return (
            self.prod_rows is not None
            and not self.columns_added
            and not self.columns_removed
            and self.only_in_env == 0
            and self.only_in_prod == 0
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "env_table": self.env_table,
            "prod_rows": self.prod_rows,
            "env_rows": self.env_rows,
            "same": self.same,
            "key": self.key,
            "columns_added": self.columns_added,
            "columns_removed": self.columns_removed,
            "only_in_env": self.only_in_env,
            "only_in_prod": self.only_in_prod,
            "added": self.added,
            "removed": self.removed,
            "changed": self.changed,
            "examples": self.examples,
        }


@dataclass
class EnvDiff:
    env: str
    tables: list[TableDiff]

    def as_dict(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "tables": [t.as_dict() for t in self.tables],
            "differ": sum(1 for t in self.tables if not t.same),
        }


EXAMPLES = 5


def diff(lake: Lake, env: str) -> EnvDiff:
    """Every table the environment holds against prod's of the same name: row counts, the columns only one has, the
    rows only one has (EXCEPT ALL both ways, when the columns are the same) and, for a table whose node has a `-- key:`,
    the keys added, removed and changed. Raises KitError when the environment holds no table."""
    check_env(env)
    keys = _keys(lake, env)
    physical = promoted_tables(lake, env)
    out = []
    for ref in sorted(t for t in built(lake, env) if not t.is_schema):
        dev = to_env(env, ref)
        if str(dev) in physical:
            continue
        out.append(_table_diff(lake, ref, dev, keys.get(str(dev), [])))
    if not out:
        raise KitError(f"environment {env} holds no table", f"build one: `pipeline run FILE --env {env}`")
    return EnvDiff(env, out)


def _columns(lake: Lake, ref: TableRef) -> list[str]:
    return [
        r[0]
        for r in lake.con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_catalog = ? AND lower(table_schema) = ? "
            "AND lower(table_name) = ? ORDER BY ordinal_position",
            [lake.alias, ref.schema, ref.name],
        ).fetchall()
    ]


def _q(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql(DIALECT)


def _table_diff(lake: Lake, prod: TableRef, dev: TableRef, key: list[str]) -> TableDiff:
    p, d = table_sql(prod), table_sql(dev)
    env_rows = lake.con.execute(f"SELECT count(*) FROM {d}").fetchone()[0]
    prod_cols, dev_cols = _columns(lake, prod), _columns(lake, dev)
    out = TableDiff(str(prod), str(dev), None, env_rows, key)
    if not prod_cols:
        return out
    out.prod_rows = lake.con.execute(f"SELECT count(*) FROM {p}").fetchone()[0]
    lower_prod, lower_dev = {c.lower() for c in prod_cols}, {c.lower() for c in dev_cols}
    out.columns_added = [c for c in dev_cols if c.lower() not in lower_prod]
    out.columns_removed = [c for c in prod_cols if c.lower() not in lower_dev]
    common = [c for c in dev_cols if c.lower() in lower_prod]
    if not out.columns_added and not out.columns_removed:
        cols = ", ".join(map(_q, common))
        for attr, a, b in (("only_in_env", d, p), ("only_in_prod", p, d)):
            n = lake.con.execute(f"SELECT count(*) FROM (SELECT {cols} FROM {a} EXCEPT ALL SELECT {cols} FROM {b})")
            setattr(out, attr, n.fetchone()[0])
    if key and all(k.lower() in lower_prod and k.lower() in lower_dev for k in key):
        _keyed(lake, out, (d, p), key, [c for c in common if c.lower() not in {k.lower() for k in key}])
    return out


def _keyed(lake: Lake, out: TableDiff, tables: tuple[str, str], key: list[str], values: list[str]) -> None:
    """Keys added, removed and changed: a full outer join on the key (NULL matches NULL), the other columns compared
    as one row value."""
    d, p = tables
    ks = ", ".join(map(_q, key))
    row = "struct_pack(" + ", ".join(f"{_q(c)} := {_q(c)}" for c in values) + ")" if values else "0"
    on = " AND ".join(f"d.{_q(k)} IS NOT DISTINCT FROM p.{_q(k)}" for k in key)
    shown = (
        f"CAST(coalesce(d.{_q(key[0])}, p.{_q(key[0])}) AS VARCHAR)"
        if len(key) == 1
        else "CAST(struct_pack("
        + ", ".join(f"{_q(k)} := coalesce(d.{_q(k)}, p.{_q(k)})" for k in key)
        + ") AS VARCHAR)"
    )
    kinds = {
        "added": "p.here IS NULL",
        "removed": "d.here IS NULL",
        "changed": "d.here AND p.here AND d.row IS DISTINCT FROM p.row",
    }
    picks = ", ".join(
        f"count(*) FILTER (WHERE {c}), (list({shown} ORDER BY {shown}) FILTER (WHERE {c}))[1:{EXAMPLES}]"
        for c in kinds.values()
    )
    got = lake.con.execute(
        f"WITH d AS (SELECT {ks}, {row} AS row, true AS here FROM {d}), "
        f"p AS (SELECT {ks}, {row} AS row, true AS here FROM {p}) "
        f"SELECT {picks} FROM d FULL OUTER JOIN p ON {on}"
    ).fetchone()
    for i, name in enumerate(kinds):
        setattr(out, name, got[2 * i])
        out.examples[name] = list(got[2 * i + 1] or [])


def _keys(lake: Lake, env: str) -> dict[str, list[str]]:
    """env table -> the key its node's `-- key:` header named, at that node's latest run in the environment."""
    if "pipeline_nodes.key" not in _history_columns(lake):
        return {}
    rows = lake.con.execute(
        f"""SELECT n.key, n.outputs FROM {lake.alias}.main.pipeline_nodes n
        JOIN {lake.alias}.main.pipeline_runs r USING (run_id)
        WHERE ends_with(n.pipeline, ?) AND n.status IN ('ok', 'unchanged')
        QUALIFY row_number() OVER (PARTITION BY n.pipeline, n.node_id ORDER BY r.started_at DESC, n.run_id DESC) = 1""",
        [f"@{env}"],
    ).fetchall()
    out: dict[str, list[str]] = {}
    for key, outputs in rows:
        if key and outputs:
            for table in json.loads(outputs):
                out[table] = json.loads(key)
    return out


def _history_columns(lake: Lake) -> set[str]:
    return {
        f"{t}.{c}"
        for t, c in lake.con.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_catalog = ? "
            "AND table_schema = 'main'",
            [lake.alias],
        ).fetchall()
    }


def promoted_tables(lake: Lake, env: str) -> set[str]:
    """The environment's tables that a promote made prod's physical tables (`dev__marts.daily__v12`: they hold
    prod's data now; see promote.py)."""
    if not table_exists(lake.con, lake.alias, "main", PROMOTIONS):
        return set()
    rows = lake.con.execute(f"SELECT physical FROM {lake.alias}.main.{PROMOTIONS} WHERE env = ?", [env]).fetchall()
    return {r[0] for r in rows}
