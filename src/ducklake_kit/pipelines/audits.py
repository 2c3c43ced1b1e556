"""Audits: checks of the table a node writes, run after its statement and before its dependents (sqlmesh's audits,
dbt's tests). Each is a query returning the table's offending rows; the node fails when one returns any.

    -- audit: not_null(col, ...)              rows where one of the columns is NULL
    -- audit: unique(col, ...)                rows whose value of the columns (NULLs aside) is there more than once
    -- audit: accepted_values(col, 'a', 'b')  rows whose col (not NULL) is none of the values
    -- audit: row_count > 0                   the table's row count, when the condition over `row_count` is false
    -- audit: sql_file('audits/x.sql')        the rows the file's query returns (a path from the pipeline file)

One header may list several (`-- audit: not_null(k), unique(k)`) and a node may have several `-- audit:` lines.
The header is parsed by sqlglot (as a SELECT list), so names are quoted as in SQL (`not_null("T (degC)")`).

An audit runs on the node's worker in the node's own task, after its statement: in the node's transaction when the
node commits one, so a failed audit rolls the node's write back (the table and the snapshot count are as before);
a node that writes a worker-local table runs without one, and its write stays. The check statement raises DuckDB's
own error (`error(...)`) with the audit and the number of offending rows, so the transaction cannot commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from ducklake_kit.pipelines.tables import DIALECT, TableRef, table_use

KINDS = ("not_null", "unique", "accepted_values", "row_count", "sql_file")
EXAMPLE = "not_null(col), unique(col), accepted_values(col, 'a', 'b'), row_count > 0, sql_file('audits/x.sql')"


class AuditError(ValueError):
    """An audit header that cannot be read: what is wrong and the fix."""

    def __init__(self, what: str, fix: str = f"write audits as {EXAMPLE}"):
        super().__init__(what)
        self.what, self.fix = what, fix


@dataclass(frozen=True)
class Audit:
    text: str  # as normalised by sqlglot: what plan, --json and the history show
    kind: str
    columns: tuple[exp.Expression, ...] = ()
    values: tuple[exp.Expression, ...] = ()
    condition: exp.Expression | None = None  # row_count's
    query: str | None = None  # sql_file's: the query as read
    path: str | None = None
    reads: frozenset[TableRef] = frozenset()  # sql_file's: the tables its query reads (the node waits for them)

    def offending(self, table: TableRef) -> str:
        """The query of the table's offending rows."""
        t = table_sql(table)
        cols = [c.sql(DIALECT) for c in self.columns]
        if self.kind == "not_null":
            return f"SELECT * FROM {t} WHERE " + " OR ".join(f"{c} IS NULL" for c in cols)
        if self.kind == "unique":
            keys = ", ".join(cols)
            present = " AND ".join(f"{c} IS NOT NULL" for c in cols)
            return f"SELECT {keys}, count(*) AS copies FROM {t} WHERE {present} GROUP BY {keys} HAVING count(*) > 1"
        if self.kind == "accepted_values":
            values = ", ".join(v.sql(DIALECT) for v in self.values)
            return f"SELECT * FROM {t} WHERE {cols[0]} IS NOT NULL AND {cols[0]} NOT IN ({values})"
        if self.kind == "row_count":
            assert self.condition is not None
            cond = self.condition.sql(DIALECT)
            return f"SELECT row_count FROM (SELECT count(*) AS row_count FROM {t}) WHERE NOT coalesce({cond}, false)"
        assert self.query is not None
        return self.query

    def check(self, table: TableRef) -> str:
        """A statement that returns 0 (`offending`) when the audit passes and raises DuckDB's error when it fails."""
        said = exp.Literal.string(f"audit {self.text} failed on {table}: ").sql(DIALECT)
        return (
            f"SELECT CASE WHEN n > 0 THEN error({said} || n || ' offending row(s), e.g. ' || example) "
            f"ELSE n END AS offending FROM (SELECT count(*) AS n, CAST(first(audit_rows) AS VARCHAR) AS example "
            f"FROM ({self.offending(table)}) AS audit_rows)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {"audit": self.text, "kind": self.kind, "file": self.path}


def table_sql(table: TableRef) -> str:
    return exp.table_(table.name, db=table.schema, catalog=table.catalog, quoted=True).sql(DIALECT)


def parse(header: str, folder: Path) -> list[Audit]:
    """The audits of one `-- audit:` header. `folder`: where `sql_file('...')` paths start (the pipeline file's folder).
    Raises AuditError."""
    try:
        tree = sqlglot.parse_one(f"SELECT {header}", read=DIALECT)
    except ParseError as exc:
        raise AuditError(f"audit '{header}' does not parse ({str(exc).splitlines()[0]})") from None
    if not isinstance(tree, exp.Select) or not tree.expressions:
        raise AuditError(f"audit '{header}' is no list of audits")
    return [_one(e, folder) for e in tree.expressions]


def _call(e: exp.Expression) -> tuple[str, list[exp.Expression]] | None:
    """(name, arguments) of a call; `unique(a, b)` parses as `unique AS (a, b)` (UNIQUE is a keyword)."""
    if isinstance(e, exp.Anonymous):
        return str(e.this).lower(), list(e.expressions)
    if isinstance(e, exp.Aliases) and isinstance(e.this, exp.Column) and e.this.name.lower() == "unique":
        return "unique", [exp.column(i.this, quoted=i.quoted) for i in e.expressions]
    return None


def _one(e: exp.Expression, folder: Path) -> Audit:
    if isinstance(e, exp.Predicate | exp.Not | exp.And | exp.Or) and {
        c.name.lower() for c in e.find_all(exp.Column)
    } == {"row_count"}:
        return Audit(e.sql(DIALECT), "row_count", condition=e)
    call = _call(e)
    if call is None:
        raise AuditError(f"'{e.sql(DIALECT)}' is no audit (known: {', '.join(KINDS)})")
    name, args = call
    text = f"{name}({', '.join(a.sql(DIALECT) for a in args)})"
    if name in ("not_null", "unique"):
        if not args or not all(isinstance(a, exp.Column) for a in args):
            raise AuditError(f"{text} takes one or more column names")
        return Audit(text, name, columns=tuple(args))
    if name == "accepted_values":
        if len(args) < 2 or not isinstance(args[0], exp.Column) or not all(_literal(v) for v in args[1:]):
            raise AuditError(f"{text} takes a column and one or more literal values")
        return Audit(text, name, columns=(args[0],), values=tuple(args[1:]))
    if name == "sql_file":
        if len(args) != 1 or not (isinstance(args[0], exp.Literal) and args[0].is_string):
            raise AuditError(f"{text} takes the path of one .sql file, quoted: sql_file('audits/x.sql')")
        return _file(text, args[0].this, folder)
    raise AuditError(f"'{name}' is no audit (known: {', '.join(KINDS)})")


def _literal(v: exp.Expression) -> bool:
    return isinstance(v, exp.Literal | exp.Boolean | exp.Null) or (
        isinstance(v, exp.Neg) and isinstance(v.this, exp.Literal)
    )


def _file(text: str, name: str, folder: Path) -> Audit:
    path = folder / name
    try:
        query = path.read_text(encoding="utf-8-sig").strip().rstrip(";").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise AuditError(f"{text}: cannot read {path} ({exc})", "give a path from the pipeline file's folder") from None
    try:
        trees = [t for t in sqlglot.parse(query, read=DIALECT) if t is not None]
    except ParseError as exc:
        raise AuditError(f"{text}: {path} does not parse ({str(exc).splitlines()[0]})", "write one query") from None
    if len(trees) != 1 or not isinstance(trees[0], exp.Query):
        raise AuditError(f"{text}: {path} must hold one query (its rows are the offending ones)", "write one SELECT")
    return Audit(text, "sql_file", query=query, path=str(path), reads=frozenset(table_use(query).reads))
