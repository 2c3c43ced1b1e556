"""Dynamic tables' life: create (the table and its first refresh, then its definition), alter, drop, and
refreshes of many tables in dependency order (graphlib), where a failed table's dependents are skipped with the
reason and the others go on."""

from __future__ import annotations

import graphlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import duckdb

from ducklake_kit.dynamic_tables import counts as multiplicity
from ducklake_kit.dynamic_tables import ddl, rewrite
from ducklake_kit.dynamic_tables import plan as planner
from ducklake_kit.dynamic_tables.catalog import columns_of, reflected, snapshot_time, source_schema
from ducklake_kit.dynamic_tables.metadata import (
    ACTIVE,
    FAILED,
    SKIPPED,
    SUCCEEDED,
    SUSPENDED,
    Definition,
    Metadata,
    Refresh,
)
from ducklake_kit.dynamic_tables.refresh import (
    FULL,
    INLINE_ROWS,
    LOCK_WAIT_S,
    Refresher,
    lock_key,
    named,
    new_definition_id,
    parse_query,
    sql,
    target,
)
from ducklake_kit.errors import KitError, first_line
from ducklake_kit.lake import Lake, StatementResult
from ducklake_kit.lake.locks import advisory_lock
from ducklake_kit.lake.sql import quote_ident, quote_literal, schema_exists
from ducklake_kit.lake.transactions import commit_with

SUSPEND_AFTER_FAILURES = 5  # consecutive failed refreshes that suspend a table (ALTER ... RESUME starts it again)


def _exists(lake: Lake, name: str) -> bool:
    return bool(columns_of(lake, name))  # DuckDB's names are case-insensitive: `Trips` is `trips`


def get(meta: Metadata, name: str) -> Definition:
    name = name if "." in name else f"main.{name}"
    d = meta.get(name.lower())
    if d is None:
        known = ", ".join(x.name for x in meta.all()) or "none yet"
        raise KitError(
            f"there is no dynamic table {name} (dynamic tables: {known})",
            "create it with `dynamic create FILE` or list them with `dynamic list`",
        )
    return d


def upstream(meta: Metadata, name: str) -> set[str]:
    """Every dynamic table `name` reads, directly or through others."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        d = meta.get(todo.pop())
        for dep in d.depends_on if d else []:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


@contextmanager
def _locked(lake: Lake, name: str):
    """The table's advisory lock, as a refresh holds it: no refresh of an old definition runs meanwhile."""
    busy = KitError(f"dynamic table {name} is being refreshed for over {LOCK_WAIT_S} s", "wait for it, and try again")
    with advisory_lock(lake.endpoints, lock_key(name), timeout_s=LOCK_WAIT_S, busy=busy):
        yield


def create(lake: Lake, meta: Metadata, stmt: ddl.CreateDynamicTable) -> Refresh | None:
    """Create the table (filled at once unless INITIALIZE = ON_SCHEDULE) and record its definition, under the
    table's lock. Nothing is written when the statement is refused."""
    with _locked(lake, stmt.name):
        return _create(lake, meta, stmt)


def _refresh_upstream(lake: Lake, meta: Metadata, stmt: ddl.CreateDynamicTable) -> None:
    """A table filled at create from dynamic tables reads them refreshed first (upstream first), as Snowflake does:
    built from tables that reflect different snapshots, it would equal its query over them but not over the lake.
    (A writer committing between two of these refreshes can still leave them a snapshot apart.)"""
    read = [s for s in planner.all_sources(stmt.select, lake.alias) if s != stmt.name and meta.get(s) is not None]
    if not read or stmt.initialize != "ON_CREATE":
        return
    failed = refresh_many(lake, meta, read, trigger="downstream").failed
    if failed:
        raise KitError(
            f"dynamic table {stmt.name} reads {failed[0].name}, whose refresh failed: {failed[0].error}",
            f"see `dynamic history {failed[0].name}`, fix it, then create {stmt.name} again",
        )


def _create(lake: Lake, meta: Metadata, stmt: ddl.CreateDynamicTable) -> Refresh | None:
    name = stmt.name
    old = meta.get(name)
    if old is not None and not stmt.or_replace:
        raise KitError(f"dynamic table {name} exists", "write CREATE OR REPLACE DYNAMIC TABLE, or `dynamic drop` it")
    if old is None and _exists(lake, name):
        raise KitError(f"{name} is a table of the lake, not a dynamic table", "choose another name")
    for source in planner.all_sources(stmt.select, lake.alias):
        if not _exists(lake, source):
            raise KitError(
                f"dynamic table {name} reads {source}, which does not exist in the lake",
                'create or load it first (`sql "SHOW ALL TABLES"` lists the tables)',
            )
        if source == name:
            raise KitError(f"dynamic table {name} reads itself", "read other tables")
    _refresh_upstream(lake, meta, stmt)
    now = lake.current_snapshot()
    pinned = rewrite.pinned(stmt.select, lake.alias, now)
    try:
        described = lake.con.execute(f"DESCRIBE {sql(pinned)}").fetchall()
    except duckdb.Error as exc:
        raise KitError(
            f"the query of dynamic table {name} fails: {first_line(exc)}", "fix the SELECT after AS"
        ) from None
    columns = [r[0] for r in described]
    if len({c.lower() for c in columns}) != len(columns):
        raise KitError(
            f"the query of dynamic table {name} gives two columns of one name ({', '.join(columns)})",
            "give each column its own alias",
        )
    types = {r[0]: r[1] for r in described}
    if stmt.immutable_where is not None:
        try:
            lake.con.execute(f"DESCRIBE SELECT * FROM ({sql(pinned)}) AS __t WHERE {stmt.immutable_where}").fetchall()
        except duckdb.Error as exc:
            raise KitError(
                f"the IMMUTABLE WHERE of dynamic table {name} does not bind over its columns "
                f"({', '.join(columns)}): {first_line(exc)}",
                "name the dynamic table's own columns in it",
            ) from None
    plan = planner.analyze(stmt.select, columns, lake.alias, types=types, schema=source_schema(lake, stmt.select))
    if stmt.refresh_mode == "INCREMENTAL" and not plan.incremental:
        raise KitError(
            f"dynamic table {name} cannot be refreshed incrementally: {plan.explain()}",
            "use REFRESH_MODE = ADAPTIVE (a full refresh) or rewrite the query",
        )
    sources = plan.sources
    depends_on = [s for s in sources if meta.get(s) is not None]
    for dep in depends_on:
        if name in upstream(meta, dep) | {dep}:
            raise KitError(f"dynamic table {name} would read itself through {dep}", "break the cycle")
    if old is not None:
        blockers = meta.dependents(name)
        if blockers:
            raise KitError(f"dynamic table {name} is read by {', '.join(blockers)}", "drop or replace those first")
    d = Definition(
        name=name,
        definition_id=new_definition_id(),
        query=stmt.query,
        ddl=stmt.text.strip(),
        lag_seconds=stmt.lag.seconds,
        refresh_mode=stmt.refresh_mode,
        initialize=stmt.initialize,
        status=ACTIVE,
        plan_kind=plan.kind,
        plan=plan.explain(),
        reason=plan.reason,
        columns=columns,
        consecutive_failures=0,
        data_snapshot=None,
        data_timestamp=None,
        created_at=datetime.now(UTC),
        updated_at=datetime.now(UTC),
        sources=dict.fromkeys(sources),
        depends_on=depends_on,
        immutable_where=stmt.immutable_where,
    )
    query = sql(named(pinned, columns))
    if stmt.initialize == "ON_SCHEDULE":
        query = f"SELECT * FROM ({query}) AS __q LIMIT 0"
    schema, _table = name.split(".")
    started = datetime.now(UTC)
    counts = []

    def make(con: duckdb.DuckDBPyConnection) -> None:
        if not schema_exists(con, lake.alias, schema):
            con.execute(f"CREATE SCHEMA {quote_ident(lake.alias)}.{quote_ident(schema)}")
        con.execute(f"CREATE OR REPLACE TABLE {target(lake, name)} AS {query}")
        if old is not None:  # the replaced definition's multiplicity counts (if it kept any)
            con.execute(multiplicity.drop_sql(lake.alias, old))
        counts.append(int(con.execute(f"SELECT count(*) FROM {target(lake, name)}").fetchone()[0]))

    read = now if stmt.initialize == "ON_CREATE" else None
    made = commit_with(
        lake,
        make,
        f"dynamic table {name}: created",
        extra={"dynamic_table": name, "definition": d.definition_id, "read": read, "mode": FULL, "trigger": "create"},
    )
    try:
        # its own data-inlining limit (refresh.INLINE_ROWS): a setting in the catalog, no snapshot (DuckLake refuses
        # it for a table made in the same transaction)
        lake.con.execute(
            f"CALL {quote_ident(lake.alias)}.set_option('data_inlining_row_limit', {INLINE_ROWS}, "
            f"schema => {quote_literal(schema)}, table_name => {quote_literal(_table)})"
        )
        meta.create(d, replace=old is not None)
    except Exception:  # a table nobody knows is a dynamic table would block the name: take it back
        commit_with(
            lake,
            lambda con: con.execute(f"DROP TABLE IF EXISTS {target(lake, name)}"),
            f"dynamic table {name}: creation undone (its definition could not be recorded)",
        )
        raise
    if read is None:
        return None
    finished = datetime.now(UTC)
    return meta.record(
        Refresh(
            name,
            d.definition_id,
            "create",
            SUCCEEDED,
            started,
            finished,
            duration_ms=round((finished - started).total_seconds() * 1000, 1),
            mode=FULL,
            reason="INITIAL: created",
            rows_inserted=counts[0],
            rows_deleted=0,
            snapshots_read=dict.fromkeys(sources, now),
            read_snapshot=now,
            commit_snapshot=made.snapshot_id,
            data_timestamp=snapshot_time(lake, now),
        )
    )


def drop(lake: Lake, meta: Metadata, name: str, *, if_exists: bool = False) -> bool:
    """Drop the table and its definition; False when it did not exist and `if_exists`."""
    try:
        d = get(meta, name)
    except KitError:
        if if_exists:
            return False
        raise
    readers = meta.dependents(d.name)
    if readers:
        raise KitError(f"dynamic table {d.name} is read by {', '.join(readers)}", "drop those first")
    with _locked(lake, d.name):
        if _exists(lake, d.name):

            def dropped(con: duckdb.DuckDBPyConnection) -> None:
                con.execute(f"DROP TABLE {target(lake, d.name)}")
                con.execute(multiplicity.drop_sql(lake.alias, d))  # its multiplicity counts, if it kept any

            commit_with(lake, dropped, f"dynamic table {d.name}: dropped")
        meta.drop(d.name)
    return True


def alter(lake: Lake, meta: Metadata, stmt: ddl.AlterDynamicTable) -> list[Refresh]:
    d = get(meta, stmt.name)
    if stmt.action == "SUSPEND":
        meta.set(d.name, status=SUSPENDED)
    elif stmt.action == "RESUME":
        meta.set(d.name, status=ACTIVE, consecutive_failures=0)
    elif stmt.action == "SET_LAG":
        meta.set(d.name, lag_seconds=stmt.lag.seconds)
    else:
        return refresh_many(lake, meta, [d.name]).refreshes
    return []


@dataclass
class Batch:
    """The refreshes of one `refresh_many`, in the order they ran (skipped tables included)."""

    refreshes: list[Refresh] = field(default_factory=list)

    @property
    def failed(self) -> list[Refresh]:
        return [r for r in self.refreshes if r.status == FAILED]


def refresh_many(
    lake: Lake,
    meta: Metadata,
    names: list[str] | None = None,
    *,
    trigger: str = "manual",
    refresher: Refresher | None = None,
    include_suspended: bool = True,
) -> Batch:
    """Refresh `names` (all when None) and the dynamic tables they read, upstream first; each in its own
    transaction. A table whose upstream failed is skipped (recorded with the reason); the others go on."""
    if refresher is None:
        with Refresher(lake, meta) as own:
            return refresh_many(lake, meta, names, trigger=trigger, refresher=own, include_suspended=include_suspended)
    every = {d.name: d for d in meta.all()}
    asked = set(every) if names is None else {get(meta, n).name for n in names}
    chosen = set(asked)
    for n in list(chosen):
        chosen |= upstream(meta, n)
    graph = graphlib.TopologicalSorter({n: [x for x in every[n].depends_on if x in chosen] for n in chosen})
    batch = Batch()
    broken: dict[str, str] = {}  # table -> why its dependents are skipped
    for n in refresher.report.track(list(graph.static_order()), "refreshing dynamic tables", "tables"):
        d = every[n]
        now = datetime.now(UTC)
        bad = [x for x in d.depends_on if x in broken]
        if bad or (d.status == SUSPENDED and not include_suspended):
            why = f"upstream dynamic table {bad[0]} {broken[bad[0]]}" if bad else "suspended"
            batch.refreshes.append(meta.record(Refresh(n, d.definition_id, trigger, SKIPPED, now, now, reason=why)))
            broken[n] = "was skipped"
            continue
        r = refresher.refresh(d, trigger if names is None or n in asked else "downstream")
        batch.refreshes.append(r)
        if r.status == FAILED:
            broken[n] = "failed"
            if meta.get(n).consecutive_failures >= SUSPEND_AFTER_FAILURES:
                meta.set(n, status=SUSPENDED)
                r.reason = f"suspended after {SUSPEND_AFTER_FAILURES} consecutive failures (ALTER ... RESUME)"
                meta.note(r, r.reason)
    return batch


def not_comparable(meta: Metadata, name: str) -> str | None:
    """Why the table cannot be compared with its query run in full (None: it can). A query of the clock (now(),
    current_date, ...) answers differently at every run, so a difference says nothing about the refresh; so does a
    random one (refused at create since issue 29; older definitions may still hold one)."""
    d = get(meta, name)
    query = parse_query(d)
    random = ddl.random_calls(query, d.query)
    if random:
        return f"not comparable: calls {', '.join(random)} (a new answer on every run)"
    clock = ddl.time_calls(query, d.query)
    if clock:
        return f"not comparable: depends on the time ({', '.join(clock)})"
    return None


def check(lake: Lake, meta: Metadata, name: str) -> tuple[int, int]:
    """(rows of the table not in its query run in full at the snapshot it read, rows of that query not in the
    table), compared with EXCEPT ALL both ways: (0, 0) when the table is right. With IMMUTABLE WHERE, the rows
    matching it are left out on both sides (they keep what they were; the caller may compare them with a copy)."""
    d = get(meta, name)
    snapshot = reflected(lake, d)
    if snapshot is None:
        raise KitError(f"dynamic table {d.name} was never refreshed", f"run `dynamic refresh {d.name}`")
    full = sql(named(rewrite.pinned(parse_query(d), lake.alias, snapshot), d.columns))
    tgt = target(lake, d.name)
    if d.immutable_where is not None:  # the mutable region only: the immutable one keeps what it was
        full = f"SELECT * FROM ({full}) AS __q WHERE ({d.immutable_where}) IS NOT TRUE"
        tgt = f"(SELECT * FROM {tgt} WHERE ({d.immutable_where}) IS NOT TRUE)"
    only_table = lake.scalar(f"SELECT count(*) FROM (SELECT * FROM {tgt} EXCEPT ALL ({full}))")
    only_query = lake.scalar(f"SELECT count(*) FROM (({full}) EXCEPT ALL SELECT * FROM {tgt})")
    return int(only_table), int(only_query)


def execute(lake: Lake, meta: Metadata, stmt: ddl.Statement) -> StatementResult:
    """One dynamic-table statement, as `sql` runs it: its answer as a statement result."""
    if isinstance(stmt, ddl.ShowDynamicTables):
        rows = [(d.name, d.status, d.lag, d.refresh_mode, d.plan_kind, d.data_snapshot) for d in meta.all()]
        return StatementResult("SHOW", ["name", "status", "target_lag", "refresh_mode", "plan", "data_snapshot"], rows)
    if isinstance(stmt, ddl.CreateDynamicTable):
        first = create(lake, meta, stmt)
        return StatementResult(
            "CREATE",
            ["name", "rows", "plan"],
            [(stmt.name, first.rows_inserted if first else 0, meta.get(stmt.name).plan)],
        )
    if isinstance(stmt, ddl.DropDynamicTable):
        dropped = drop(lake, meta, stmt.name, if_exists=stmt.if_exists)
        return StatementResult("DROP", ["name", "dropped"], [(stmt.name, dropped)])
    refreshes = alter(lake, meta, stmt)
    failed = [r for r in refreshes if r.status == FAILED]
    if failed:
        raise KitError(f"refresh of {failed[0].name} failed: {failed[0].error}", "see `dynamic history`")
    d = get(meta, stmt.name)
    return StatementResult(
        "ALTER",
        ["name", "status", "target_lag", "refreshed"],
        [(d.name, d.status, d.lag, ", ".join(f"{r.name} {r.status}" for r in refreshes) or None)],
    )


def run_text(lake: Lake, meta: Metadata, text: str) -> list[StatementResult]:
    """Run `text`, which holds dynamic-table statements (see `ddl.has_dynamic`), in order; plain SQL among them runs
    as `Lake.run` would."""
    results: list[StatementResult] = []
    for part, tokens in ddl.split_statements(text):
        results += (
            [execute(lake, meta, ddl.parse_statement(part, tokens))] if ddl.is_dynamic(tokens) else lake.run(part)
        )
    return results
