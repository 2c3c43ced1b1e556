"""The tables a statement reads and writes, found by sqlglot through joins, CTEs, subqueries and set operations.

Names are resolved the way a worker's DuckDB resolves them (its default database is the lake, its worker-local
tables are in `local`): `trips`, `main.trips` and `lake.main.trips` are one lake table; `local.eph` (or
`local.main.eph`) is a worker-local table. A statement sqlglot cannot parse (DuckDB has statements it does not
know, such as `CALL`) reads and writes nothing as far as inference goes, and says so (`opaque`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from ducklake_kit.lake import LAKE
from ducklake_kit.workers.config import LOCAL_DB

DIALECT = "duckdb"
logging.getLogger("sqlglot").setLevel(logging.ERROR)  # its "falling back to a Command" warning: we report opaque


@dataclass(frozen=True, order=True)
class TableRef:
    """A table as a worker sees it: `catalog` is the lake's alias or `local` (worker-local)."""

    catalog: str
    schema: str
    name: str

    @property
    def local(self) -> bool:
        return self.catalog == LOCAL_DB

    def __str__(self) -> str:
        if self.catalog == LAKE:
            return self.name if self.schema == "main" else f"{self.schema}.{self.name}"
        if self.schema == "main":
            return f"{self.catalog}.{self.name}"
        return f"{self.catalog}.{self.schema}.{self.name}"


def resolve(table: exp.Table) -> TableRef:
    parts = [p.lower() for p in (table.catalog, table.db, table.name) if p]
    if len(parts) == 3:
        return TableRef(*parts)
    if len(parts) == 2:
        if parts[0] in (LAKE, LOCAL_DB):
            return TableRef(parts[0], "main", parts[1])
        return TableRef(LAKE, parts[0], parts[1])
    return TableRef(LAKE, "main", parts[0])


def parse_table_name(name: str) -> TableRef:
    """`trips`, `marts.daily`, `local.eph` as given on the command line."""
    try:
        table = sqlglot.parse_one(f"SELECT * FROM {name}", read=DIALECT).find(exp.Table)
    except ParseError:
        table = None
    if table is None or not isinstance(table.this, exp.Identifier):
        raise ValueError(f"'{name}' is not a table name")
    return resolve(table)


MAKE, CHANGE, READ, DROP = "make", "change", "read", "drop"  # what a statement does to a table, in the order
# a pipeline does them: a table is made, then changed, then read, then dropped


@dataclass
class TableUse:
    """What one statement does to tables."""

    writes: set[TableRef] = field(default_factory=set)  # creates, inserts into, updates, deletes from, drops
    reads: set[TableRef] = field(default_factory=set)
    creates: bool = False  # CREATE [OR REPLACE] TABLE/VIEW ... (AS SELECT): the write makes the table anew
    drops: bool = False  # DROP TABLE/VIEW: the write removes it
    opaque: str | None = None  # why nothing could be inferred (sqlglot does not parse it)
    tree: exp.Expression | None = None  # the parsed statement (column lineage reads it)

    def roles(self) -> dict[TableRef, str]:
        """Each table with what this statement does to it (MAKE, CHANGE, READ or DROP)."""
        write = DROP if self.drops else (MAKE if self.creates else CHANGE)
        out = {t: READ for t in self.reads}
        out.update({t: write for t in self.writes})
        return out


def _is_named(table: exp.Table) -> bool:
    return isinstance(table.this, exp.Identifier)  # not read_parquet(...), range(...), a table function


def _target(stmt: exp.Expression) -> exp.Table | None:
    node = stmt.this
    if isinstance(node, exp.Schema):  # INSERT INTO t (a, b) / CREATE TABLE t (a INT)
        node = node.this
    if isinstance(node, exp.Table):
        return node
    return stmt.find(exp.Table)  # DROP keeps its table elsewhere


def table_use(sql: str) -> TableUse:
    try:
        stmt = sqlglot.parse_one(sql, read=DIALECT)
    except ParseError as exc:
        return TableUse(opaque=f"sqlglot cannot parse it ({str(exc).splitlines()[0]})")
    if stmt is None or isinstance(stmt, exp.Command):
        return TableUse(opaque="sqlglot does not know this statement", tree=stmt)
    use = TableUse(tree=stmt)
    ctes = {c.alias_or_name.lower() for c in stmt.find_all(exp.CTE)}
    target: exp.Table | None = None
    if isinstance(stmt, exp.Create):
        kind = str(stmt.args.get("kind") or "").upper()
        if kind in ("TABLE", "VIEW"):
            target, use.creates = _target(stmt), True
    elif isinstance(stmt, (exp.Insert, exp.Update, exp.Delete, exp.Merge, exp.Alter, exp.TruncateTable)):
        target = _target(stmt)
    elif isinstance(stmt, exp.Drop) and str(stmt.args.get("kind") or "").upper() in ("TABLE", "VIEW"):
        target, use.drops = _target(stmt), True
    elif isinstance(stmt, exp.Copy) and stmt.args.get("kind"):  # COPY t FROM 'file' (kind True) writes t
        target = _target(stmt)
    if target is not None and _is_named(target):
        use.writes.add(resolve(target))
    for table in stmt.find_all(exp.Table):
        if table is target or not _is_named(table):
            continue
        if not table.db and not table.catalog and table.name.lower() in ctes:
            continue
        use.reads.add(resolve(table))
    if isinstance(stmt, (exp.Update, exp.Delete, exp.Merge)):
        use.reads |= use.writes  # they read the rows they change
    return use
