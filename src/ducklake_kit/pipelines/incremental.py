"""Incremental nodes (`-- kind:`): a node that rebuilds only what its source's new rows touch, instead of its whole
table (sqlmesh's INCREMENTAL_BY_TIME_RANGE and INCREMENTAL_BY_UNIQUE_KEY, dbt's incremental models).

    -- kind: incremental_by_time(day)    a CREATE OR REPLACE TABLE ... AS SELECT whose column `day` is a column of
                                         one table it reads (its time source), passed through (and grouped by)
    -- kind: incremental_by_key(k)       the same for a key column

The first run, and any run where more than the source's new rows could matter, builds the table in full (the node's
own statement). Otherwise (its SQL, its other inputs and its table are as its last run left them; only its source
changed), the change feed of the source since the version the last run read says what is new:

- by time: the earliest time among the rows inserted since (`lo`); the node's transaction deletes the table's rows
  from `lo` on and inserts the query's rows over the source's rows from `lo` on. Rows appended with any time, late
  ones included, are covered; a source that had rows deleted or updated is rebuilt in full, saying so.
- by key: the keys of every row inserted, deleted or updated since; the node's transaction MERGEs the query's rows
  for those keys (update the matched, insert the new) and DELETEs the keys the query no longer yields: a MERGE and a
  DELETE, since DuckLake's MERGE takes one action per match.

Either equals a full rebuild when the query is partitioned by its column: the rows of one time (one key) of the
table come from the source's rows of that time (that key) alone. The kit checks what it can see (the column is the
source's own, grouped by when the query aggregates, no window function) and the tests compare with a full rebuild by
EXCEPT ALL both ways.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from ducklake_kit.errors import first_line
from ducklake_kit.lake import Lake
from ducklake_kit.pipelines.audits import table_sql
from ducklake_kit.pipelines.tables import DIALECT, TableRef, TableUse, resolve

BY_TIME, BY_KEY = "incremental_by_time", "incremental_by_key"
KINDS = ("full", BY_TIME, BY_KEY)


class KindError(ValueError):
    def __init__(self, what: str, fix: str):
        super().__init__(what)
        self.what, self.fix = what, fix


@dataclass(frozen=True)
class Kind:
    name: str  # incremental_by_time or incremental_by_key
    column: str  # the table's column, as written
    target: TableRef
    source: TableRef  # the table the column comes from
    source_column: str
    query: exp.Query  # the node's SELECT

    @property
    def text(self) -> str:
        return f"{self.name}({self.column})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.name,
            "column": self.column,
            "source": str(self.source),
            "source_column": self.source_column,
        }

    def statements(self, since: int, until: int, lo: Any, nulls: bool = False) -> list[str]:
        """The node's transaction for an incremental run over the source's changes in snapshots [since, until]. By
        time: from `lo` on, and the NULL time too when `nulls` (rows with no time were appended: their group is
        made again)."""
        target, col = table_sql(self.target), exp.to_identifier(self.column, quoted=True).sql(DIALECT)
        src_col = exp.to_identifier(self.source_column, quoted=True).sql(DIALECT)
        if self.name == BY_TIME:
            bound = _literal(lo)
            also = " OR {c} IS NULL" if nulls else ""
            keep = f"{src_col} >= {bound}" + also.format(c=src_col)
            rows = self._over(f"SELECT * FROM {table_sql(self.source)} WHERE {keep}")
            return [f"DELETE FROM {target} WHERE {col} >= {bound}" + also.format(c=col), f"INSERT INTO {target} {rows}"]
        feed = changes_sql(self.source, since, until)
        # the keys of every changed row, a NULL key included (IN never matches NULL)
        changed = (
            "({c} IN (SELECT {s} FROM "
            + feed
            + ") OR ({c} IS NULL AND EXISTS (SELECT 1 FROM "
            + feed
            + " WHERE {s} IS NULL)))"
        )
        rows = self._over(f"SELECT * FROM {table_sql(self.source)} WHERE {changed.format(c=src_col, s=src_col)}")
        gone = (
            f"CASE WHEN {col} IS NULL THEN NOT EXISTS (SELECT 1 FROM ({rows}) WHERE {col} IS NULL) "
            f"ELSE {col} NOT IN (SELECT {col} FROM ({rows}) WHERE {col} IS NOT NULL) END"
        )
        return [
            f"MERGE INTO {target} AS target USING ({rows}) AS source ON target.{col} IS NOT DISTINCT FROM "
            f"source.{col} WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
            f"DELETE FROM {target} WHERE {changed.format(c=col, s=src_col)} AND {gone}",
        ]

    def _over(self, rows: str) -> str:
        """The node's query with its source table read through `rows` (the source's rows that matter)."""
        query = self.query.copy()
        for t in query.find_all(exp.Table):
            if _is(t, self.source):
                alias = t.alias or t.name
                t.replace(
                    exp.Subquery(
                        this=sqlglot.parse_one(rows, read=DIALECT), alias=exp.TableAlias(this=exp.to_identifier(alias))
                    )
                )
        return query.sql(DIALECT)


def changes_sql(table: TableRef, since: int, until: int) -> str:
    """The source's change feed in snapshots since..until (both included), as a relation."""
    return (
        f"ducklake_table_changes({_string(table.catalog)}, {_string(table.schema)}, {_string(table.name)}, "
        f"{int(since)}, {int(until)})"
    )


def _string(text: str) -> str:
    return exp.Literal.string(text).sql(DIALECT)


def _literal(value: Any) -> str:
    """A value of the source's time column as SQL (typed: a DATE compares as a DATE)."""
    if value is None:
        return "NULL"
    if isinstance(value, dt.datetime):
        return f"TIMESTAMP{'TZ' if value.tzinfo else ''} {_string(value.isoformat(sep=' '))}"
    if isinstance(value, dt.date):
        return f"DATE {_string(value.isoformat())}"
    if isinstance(value, bool | int | float):
        return repr(value)
    return _string(str(value))


def _is(t: exp.Table, ref: TableRef) -> bool:
    return isinstance(t.this, exp.Identifier) and resolve(t) == ref


def parse(header: str, node_id: str, use: TableUse) -> Kind | None:
    """The node's kind from its `-- kind:` header (None: full). Raises KindError for what cannot be incremental."""
    try:
        tree = sqlglot.parse_one(f"SELECT {header}", read=DIALECT)
    except ParseError as exc:
        raise KindError(f"kind '{header}' does not parse ({str(exc).splitlines()[0]})", _fix()) from None
    e = tree.expressions[0] if isinstance(tree, exp.Select) and len(tree.expressions) == 1 else None
    if isinstance(e, exp.Column) and e.name.lower() == "full":
        return None
    if not isinstance(e, exp.Anonymous) or str(e.this).lower() not in (BY_TIME, BY_KEY):
        raise KindError(f"'{header}' is no kind (known: {', '.join(KINDS)})", _fix())
    name = str(e.this).lower()
    if len(e.expressions) != 1 or not isinstance(e.expressions[0], exp.Column):
        raise KindError(f"{name} takes one column name", _fix())
    column = e.expressions[0].name
    stmt = use.tree
    if not (isinstance(stmt, exp.Create) and str(stmt.args.get("kind", "")).upper() == "TABLE"):
        raise KindError(f"node {node_id} is {name} but is no CREATE TABLE ... AS SELECT", "write it as one")
    query = stmt.expression
    if not isinstance(query, exp.Select):
        raise KindError(f"node {node_id} is {name} but its query is not one SELECT", "write it as one SELECT")
    target = resolve(stmt.this if isinstance(stmt.this, exp.Table) else stmt.this.this)
    if target.local:
        raise KindError(f"node {node_id}: a worker-local table cannot be {name}", "build a lake table")
    if query.find(exp.Window):
        raise KindError(
            f"node {node_id} is {name} but has a window function, whose rows may read other times or keys",
            "make it a full node (no -- kind:)",
        )
    proj = next((p for p in query.expressions if p.alias_or_name.lower() == column.lower()), None)
    inner = proj.unalias() if proj is not None else None
    if not isinstance(inner, exp.Column):
        raise KindError(
            f"node {node_id}: {name}({column}) needs {column} in its SELECT list as a column of the table it reads",
            f"select the source's column itself, e.g. t.{column}",
        )
    tables = [t for t in query.find_all(exp.Table) if isinstance(t.this, exp.Identifier)]
    scope = [t for t in tables if (t.alias_or_name == inner.table) or (not inner.table and len(tables) == 1)]
    if len(scope) != 1:
        raise KindError(
            f"node {node_id}: {name}({column}) cannot tell which table {column} comes from",
            f"qualify it with its table's name or alias (t.{inner.name})",
        )
    source = resolve(scope[0])
    if sum(1 for t in tables if resolve(t) == source) != 1:
        raise KindError(f"node {node_id}: {name} reads {source} more than once", "make it a full node")
    if query.find(exp.AggFunc) is not None:
        group = query.args.get("group")
        keys = [g.unalias() for g in group.expressions] if group is not None else []
        if not any(
            (isinstance(g, exp.Column) and g.name.lower() in (column.lower(), inner.name.lower())) for g in keys
        ):
            raise KindError(
                f"node {node_id} is {name}({column}) and aggregates, but does not GROUP BY {column}",
                f"group by {column}, so that its rows of one {column} come from the source's rows of that {column}",
            )
    return Kind(name, column, target, source, inner.name, query)


def _created_after(lake: Lake, table: TableRef, first: int) -> int | None:
    """The snapshot that made the table as it is now, when that is `first` or later (a CREATE OR REPLACE since)."""
    meta = f'"__ducklake_metadata_{lake.alias}"'
    row = lake.con.execute(
        f"SELECT t.begin_snapshot FROM {meta}.ducklake_table t JOIN {meta}.ducklake_schema s USING (schema_id) "
        "WHERE t.end_snapshot IS NULL AND s.end_snapshot IS NULL AND lower(s.schema_name) = ? "
        "AND lower(t.table_name) = ?",
        [table.schema, table.name],
    ).fetchone()
    return row[0] if row is not None and row[0] >= first else None


def _fix() -> str:
    return "write -- kind: incremental_by_time(column), incremental_by_key(column) or full"


@dataclass
class Choice:
    """What an incremental node's run does: `statements` (None: the node's own, in full) and why."""

    statements: list[str] | None
    why: str
    record: dict[str, Any]


def choose(lake: Lake, kind: Kind, since: str | None, until: str | None) -> Choice:
    """Incremental or full, from the source's change feed between the version the last run read (`since`) and the
    one now (`until`)."""
    base = kind.as_dict()
    if not (since and until and since.isdigit() and until.isdigit()):
        return Choice(None, "a full build: no earlier version of its source to start from", base | {"mode": "full"})
    first, last = int(since) + 1, int(until)
    replaced = _created_after(lake, kind.source, first)
    if replaced is not None:
        return Choice(
            None, f"a full build: {kind.source} was made again since (snapshot {replaced})", base | {"mode": "full"}
        )
    col = exp.to_identifier(kind.source_column, quoted=True).sql(DIALECT)
    try:
        lo, new, other, nulls = lake.con.execute(
            f"SELECT min({col}) FILTER (change_type = 'insert'), count(*) FILTER (change_type = 'insert'), "
            f"count(*) FILTER (change_type <> 'insert'), count(*) FILTER (change_type = 'insert' AND {col} IS NULL) "
            f"FROM {changes_sql(kind.source, first, last)}"
        ).fetchone()
    except Exception as exc:  # noqa: BLE001 - e.g. the source was replaced: its feed does not reach back
        return Choice(
            None,
            f"a full build: the change feed of {kind.source} cannot say ({first_line(exc)})",
            base | {"mode": "full"},
        )
    record = base | {"since_snapshot": first, "until_snapshot": last, "new_rows": new}
    if kind.name == BY_TIME and other:
        return Choice(
            None,
            f"a full build: {kind.source} had {other} row(s) deleted or updated since (only appends are incremental)",
            record | {"mode": "full"},
        )
    if kind.name == BY_TIME:
        record |= {"mode": "incremental", "from": str(lo) if lo is not None else None, "null_time_rows": nulls}
        return Choice(
            kind.statements(first, last, lo, nulls > 0),
            f"incremental: {new} new row(s) of {kind.source} from {kind.source_column} {lo}"
            + (f" and {nulls} with no {kind.source_column} (the NULL group made again)" if nulls else ""),
            record,
        )
    record |= {"mode": "incremental", "changed_rows": new + other}
    return Choice(
        kind.statements(first, last, None),
        f"incremental: the keys of {new + other} changed row(s) of {kind.source}",
        record,
    )
