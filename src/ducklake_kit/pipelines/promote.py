"""`pipeline promote ENV`: prod serves the environment's tables, in ONE DuckLake snapshot, copying no data.

sqlmesh builds every model version into a physical table keyed by its fingerprint and makes each environment's names
views over those tables; promoting is swapping views. Here the environment's tables are built under their own names
(`dev__marts.daily`, see environments.py), so a promote, in one transaction:

- renames each table the environment holds to its physical name, `dev__marts.daily__v<N>`, N the snapshot that last
  changed it (its version: the same table content is the same name; a rename moves no data in DuckLake, only the
  catalog's row);
- makes prod's name a view over it: `CREATE OR REPLACE VIEW marts.daily AS SELECT * FROM dev__marts.daily__v<N>`;
- records each table in `pipeline_promotions` (env, table, physical, what prod's name was before, the snapshot).

After it, dev holds none of those tables (its next run reads them from prod, whose views serve the same rows, and
builds its nodes again: their outputs are gone from dev). A physical table is prod's data from then on: it stays in
the `dev__` schema (DuckDB cannot move a table between schemas) and must not be dropped while a view reads it.

A prod name that is a real table holds data a view would replace: promote refuses it with one line, and
`--migrate` (once, explicitly) renames such a table aside in the same snapshot, to `marts.daily__prod_v<N>`, its data
kept and still queryable; from then on the name is a view. A prod name that is a view the kit did not make is
refused the same way (it is the user's). An environment whose last run of any pipeline failed or skipped a node
is refused: its tables are not a whole pipeline's; so is one whose table changed after its last recorded run (a run
stopped midway commits its finished nodes, and records its history only at its end). A promote holds the run lock
of each of the environment's pipelines: a run of it waits for no promote and no promote for a run; the second is
refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlglot import exp

from ducklake_kit.errors import KitError
from ducklake_kit.lake import LAKE, Lake
from ducklake_kit.lake.sql import table_exists
from ducklake_kit.lake.transactions import commit_once
from ducklake_kit.pipelines import environments
from ducklake_kit.pipelines.audits import table_sql
from ducklake_kit.pipelines.changes import versions
from ducklake_kit.pipelines.environments import PROMOTIONS
from ducklake_kit.pipelines.tables import DIALECT, TableRef

PROMOTIONS_COLUMNS = (
    "env VARCHAR NOT NULL, table_name VARCHAR NOT NULL, physical VARCHAR NOT NULL, was VARCHAR, promoted_at TIMESTAMPTZ"
)


@dataclass(frozen=True)
class Promoted:
    table: str  # prod's name
    physical: str  # the table prod's view reads now
    was: str  # what prod's name was: absent, a view over X, a table moved to Y (--migrate)

    def as_dict(self) -> dict[str, Any]:
        return {"table": self.table, "physical": self.physical, "was": self.was}


@dataclass
class Promotion:
    env: str
    snapshot_id: int | None
    tables: list[Promoted] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"env": self.env, "snapshot_id": self.snapshot_id, "tables": [t.as_dict() for t in self.tables]}


def _name(schema: str, table: str) -> str:
    return f"{exp.to_identifier(schema, quoted=True).sql(DIALECT)}.{exp.to_identifier(table, quoted=True).sql(DIALECT)}"


def failed_nodes(lake: Lake, env: str) -> list[tuple[str, str, str, str]]:
    """(pipeline, run, node, status) of each node the last run of each of the environment's pipelines failed or
    skipped."""
    if not table_exists(lake.con, lake.alias, "main", "pipeline_runs"):
        return []
    return lake.con.execute(
        f"""WITH last AS (
            SELECT pipeline, run_id FROM {lake.alias}.main.pipeline_runs WHERE ends_with(pipeline, ?)
            QUALIFY row_number() OVER (PARTITION BY pipeline ORDER BY started_at DESC, run_id DESC) = 1)
        SELECT n.pipeline, n.run_id, n.node_id, n.status FROM {lake.alias}.main.pipeline_nodes n
        JOIN last USING (pipeline, run_id) WHERE n.status IN ('failed', 'skipped') ORDER BY 1, 3""",
        [f"@{env}"],
    ).fetchall()


def env_pipelines(lake: Lake, env: str) -> list[str]:
    """The names (`<pipeline>@<env>`) of every pipeline the environment's history has a run of."""
    if not table_exists(lake.con, lake.alias, "main", "pipeline_runs"):
        return []
    rows = lake.con.execute(
        f"SELECT DISTINCT pipeline FROM {lake.alias}.main.pipeline_runs WHERE ends_with(pipeline, ?) ORDER BY 1",
        [f"@{env}"],
    ).fetchall()
    return [r[0] for r in rows]


def _refuse_unrecorded(lake: Lake, env: str, now: dict[str, str]) -> None:
    """A table of the environment that changed after its last recorded run is not a whole run's output: a run killed
    after some nodes committed (its history is written at its end), or a write by hand. Refused, naming it."""
    last = -1
    if table_exists(lake.con, lake.alias, "main", "pipeline_runs"):
        row = lake.con.execute(  # the snapshot that wrote the history row (DuckLake's virtual column)
            f"SELECT max(snapshot_id) FROM {lake.alias}.main.pipeline_runs WHERE ends_with(pipeline, ?)", [f"@{env}"]
        ).fetchone()
        last = int(row[0]) if row and row[0] is not None else -1
    for t in sorted(environments.built(lake, env)):
        dev = str(environments.to_env(env, t))
        changed = int(now.get(dev, "0"))
        if not t.is_schema and changed > last:
            since = f"its last recorded run (snapshot {last})" if last >= 0 else "any recorded run of it"
            raise KitError(
                f"{dev} changed at snapshot {changed}, after {since}: a run of environment {env} was stopped "
                "before it ended, or the table was written by hand, so its tables are not a whole run's",
                f"run it again (`pipeline run FILE --env {env}`), then promote",
            )


def promoted(lake: Lake) -> dict[str, tuple[str, str]]:
    """prod table -> (env, physical table) of its latest promotion."""
    if not table_exists(lake.con, lake.alias, "main", PROMOTIONS):
        return {}
    rows = lake.con.execute(
        f"SELECT table_name, env, physical FROM {lake.alias}.main.{PROMOTIONS} "
        "QUALIFY row_number() OVER (PARTITION BY table_name ORDER BY promoted_at DESC) = 1"
    ).fetchall()
    return {t: (e, p) for t, e, p in rows}


def table_kinds(lake: Lake) -> dict[str, str]:
    """Every lake table and view -> 'BASE TABLE' or 'VIEW'."""
    rows = lake.con.execute(
        "SELECT table_schema, table_name, table_type FROM information_schema.tables WHERE table_catalog = ?",
        [lake.alias],
    ).fetchall()
    return {str(TableRef(LAKE, s.lower(), t.lower())): kind for s, t, kind in rows}


def promote(lake: Lake, env: str, *, migrate: bool = False) -> Promotion:
    """Make prod serve the environment's tables (see the module's text). Raises KitError, changing nothing, for an
    environment with a failed node or no table, a table of it changed after its last recorded run, a table of it
    that is a view, and a prod name that holds a real table (without `migrate`) or a view the kit did not make.
    The caller holds the run lock of each of the environment's pipelines (flow.promote), so no run of it writes
    meanwhile."""
    environments.check_env(env)
    failed = failed_nodes(lake, env)
    if failed:
        pipeline, run_id, node, status = failed[0]
        raise KitError(
            f"environment {env} has a {status} node: {node} of pipeline {pipeline} (run {run_id}), so its tables "
            "are not a whole pipeline's",
            f"fix it and run again (`pipeline run FILE --env {env} --from-failed`), then promote",
        )
    kinds, now, mine = table_kinds(lake), versions(lake), promoted(lake)
    _refuse_unrecorded(lake, env, now)
    physical_names = {p for _e, p in mine.values()}
    tables = sorted(
        t
        for t in environments.built(lake, env)
        if not t.is_schema and str(environments.to_env(env, t)) not in physical_names
    )
    if not tables:
        raise KitError(f"environment {env} holds no table to promote", f"build one: `pipeline run FILE --env {env}`")
    plan: list[tuple[TableRef, TableRef, str, str]] = []  # prod, env table, physical name, what prod's name was
    for prod in tables:
        dev = environments.to_env(env, prod)
        if kinds.get(str(dev)) != "BASE TABLE":
            raise KitError(
                f"{dev} is a view; promote moves tables", "build it as a table (CREATE TABLE ... AS), or drop it"
            )
        version = now.get(str(dev), "0")
        physical = f"{prod.name}__v{version}"
        kind = kinds.get(str(prod))
        if kind is None:
            was = "absent"
        elif kind == "VIEW" and str(prod) in mine:
            was = f"a view over {mine[str(prod)][1]}"
        elif kind == "VIEW":
            raise KitError(
                f"prod's {prod} is a view the kit did not make", f"drop it or rename it, then `pipeline promote {env}`"
            )
        elif not migrate:
            raise KitError(
                f"prod's {prod} is a table holding data, which a promote would replace with a view",
                f"run `pipeline promote {env} --migrate` once: it renames prod's tables aside (<name>__prod_v<N>, "
                "their data kept) in the same snapshot, and prod's names are views from then on",
            )
        else:
            was = f"a table, moved to {prod.schema}.{prod.name}__prod_v{now.get(str(prod), '0')}"
        plan.append((prod, dev, physical, was))

    rows: list[list[Any]] = []

    def work(con) -> None:
        con.execute(f"CREATE TABLE IF NOT EXISTS {lake.alias}.main.{PROMOTIONS} ({PROMOTIONS_COLUMNS})")
        for prod, dev, physical, was in plan:
            con.execute(f"CREATE SCHEMA IF NOT EXISTS {exp.to_identifier(prod.schema, quoted=True).sql(DIALECT)}")
            if was.startswith("a table"):
                aside = f"{prod.name}__prod_v{now.get(str(prod), '0')}"
                con.execute(
                    f"ALTER TABLE {table_sql(prod)} RENAME TO {exp.to_identifier(aside, quoted=True).sql(DIALECT)}"
                )
            con.execute(
                f"ALTER TABLE {table_sql(dev)} RENAME TO {exp.to_identifier(physical, quoted=True).sql(DIALECT)}"
            )
            # no catalog in the view's text: it binds in the reader's lake, whatever the lake is attached as
            con.execute(
                f"CREATE OR REPLACE VIEW {_name(prod.schema, prod.name)} AS SELECT * FROM {_name(dev.schema, physical)}"
            )
        rows[:] = [
            [env, str(prod), str(TableRef(LAKE, dev.schema, physical)), was, datetime.now(UTC).isoformat()]
            for prod, dev, physical, was in plan
        ]
        con.executemany(f"INSERT INTO {lake.alias}.main.{PROMOTIONS} VALUES (?, ?, ?, ?, ?)", rows)

    made = commit_once(
        lake,
        work,
        f"pipeline promote {env}: prod serves {len(plan)} table(s) of {env}",
        extra={"promote": env, "env": env},
    )
    return Promotion(env, made.snapshot_id, [Promoted(r[1], r[2], r[3]) for r in rows])
