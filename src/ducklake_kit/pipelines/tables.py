"""The tables a statement reads and writes, found by sqlglot through joins, CTEs, subqueries and set operations.

Names are resolved the way a worker's DuckDB resolves them (its default database is the lake, its worker-local
tables are in `local`): `trips`, `main.trips` and `lake.main.trips` are one lake table; `local.eph` (or
`local.main.eph`) is a worker-local table. A statement sqlglot cannot parse (DuckDB has statements it does not
know, such as `CALL`) reads and writes nothing as far as inference goes, and says so (`opaque`). Statements that
cannot work as a node (BEGIN, USE, SET, a TEMP table) are `refused`. Schemas count too: `CREATE SCHEMA marts` makes
what `marts.daily` needs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError
from sqlglot.optimizer.scope import Scope, traverse_scope

from ducklake_kit.errors import first_line
from ducklake_kit.lake import LAKE
from ducklake_kit.lake.statements import session_statement
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

    @property
    def is_schema(self) -> bool:
        return self.name == ""

    def __str__(self) -> str:
        if self.is_schema:
            return f"schema {self.schema}" if self.catalog == LAKE else f"schema {self.catalog}.{self.schema}"
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


MAKE, CHANGE, READ, DROP = "make", "change", "read", "drop"  # what a statement does to a table (or a schema)

_KNOWN = (
    exp.Query,
    exp.Create,
    exp.Insert,
    exp.Update,
    exp.Delete,
    exp.Merge,
    exp.Alter,
    exp.Drop,
    exp.Copy,
    exp.TruncateTable,
    exp.Describe,
)


@dataclass
class TableUse:
    """What one statement does to tables and schemas: each with its roles (MAKE, CHANGE, DROP, READ)."""

    uses: dict[TableRef, set[str]] = field(default_factory=dict)
    creates: bool = False  # CREATE [OR REPLACE] TABLE/VIEW: the statement makes its target anew
    opaque: str | None = None  # why nothing could be inferred (sqlglot does not know the statement)
    refused: str | None = None  # why a pipeline cannot run it (a session or transaction statement, a TEMP table)
    tree: exp.Expression | None = None  # the parsed statement (column lineage reads it)

    def add(self, ref: TableRef, role: str) -> None:
        self.uses.setdefault(ref, set()).add(role)

    @property
    def writes(self) -> set[TableRef]:
        """Tables it makes, changes or drops (schemas left out)."""
        return {t for t, roles in self.uses.items() if roles - {READ} and not t.is_schema}

    @property
    def reads(self) -> set[TableRef]:
        return {t for t, roles in self.uses.items() if READ in roles and not t.is_schema}


def _is_named(table: exp.Table) -> bool:
    return isinstance(table.this, exp.Identifier)  # not read_parquet(...), range(...), a table function


def _target(stmt: exp.Expression) -> exp.Table | None:
    node = stmt.this
    if isinstance(node, exp.Schema):  # INSERT INTO t (a, b) / CREATE TABLE t (a INT)
        node = node.this
    if isinstance(node, exp.Table):
        return node
    return stmt.find(exp.Table)  # DROP keeps its table elsewhere


def cte_references(stmt: exp.Expression) -> set[int]:
    """The ids of the Table nodes that name a CTE (or another query) of their scope rather than a table: scoped, so
    `WITH trips AS (SELECT * FROM trips) ...` still reads the table trips inside the CTE."""
    roots = (
        [stmt]
        if isinstance(stmt, exp.Query)
        else [q for q in stmt.find_all(exp.Query) if q.find_ancestor(exp.Query) is None]
    )
    out: set[int] = set()
    for root in roots:
        for scope in traverse_scope(root):
            for table in scope.tables:
                if isinstance(scope.sources.get(table.alias_or_name), Scope):
                    out.add(id(table))
    return out


def _writes(stmt: exp.Expression) -> tuple[list[tuple[exp.Table, str]], bool]:
    """The tables a statement writes, each with its role; and whether it makes its target anew."""
    kind = str(stmt.args.get("kind") or "").upper()
    if isinstance(stmt, exp.Create) and kind in ("TABLE", "VIEW"):
        return [(_target(stmt), MAKE)], True
    if isinstance(stmt, exp.Drop) and kind in ("TABLE", "VIEW"):
        return [(_target(stmt), DROP)], False
    if isinstance(stmt, exp.Alter):
        renamed = [a for a in stmt.args.get("actions") or [] if isinstance(a, exp.AlterRename)]
        if renamed and isinstance(renamed[0].this, exp.Table):  # ALTER TABLE t RENAME TO u: t goes, u is made
            return [(_target(stmt), DROP), (renamed[0].this, MAKE)], False
        return [(_target(stmt), CHANGE)], False
    if isinstance(stmt, (exp.Insert, exp.Update, exp.Delete, exp.Merge, exp.TruncateTable)):
        return [(_target(stmt), CHANGE)], False
    if isinstance(stmt, exp.Copy) and stmt.args.get("kind"):  # COPY t FROM 'file' (kind True) writes t
        return [(_target(stmt), CHANGE)], False
    return [], False


def _schema_of(ref: TableRef) -> TableRef | None:
    """The schema a lake table lives in, when it is one a pipeline may make (not main)."""
    return TableRef(ref.catalog, ref.schema, "") if ref.catalog == LAKE and ref.schema != "main" else None


def table_use(sql: str) -> TableUse:
    try:
        stmt = sqlglot.parse_one(sql, read=DIALECT)
    except ParseError as exc:
        return TableUse(opaque=f"sqlglot cannot parse it ({first_line(exc)})")
    word = session_statement(stmt)  # a node runs alone, on any worker: these cannot do what they say in a pipeline
    if word is not None:
        return TableUse(
            refused=f"{word} lasts only for one connection or transaction, and each node runs on its "
            "own (a node that changes the lake is already one transaction)",
            tree=stmt,
        )
    if stmt is None or not isinstance(stmt, _KNOWN):
        return TableUse(opaque="sqlglot does not know this statement", tree=stmt)
    use = TableUse(tree=stmt)
    if isinstance(stmt, exp.Create) and (
        stmt.find(exp.TemporaryProperty) or str(stmt.args.get("kind") or "").upper() == "MACRO"
    ):
        use.refused = (
            "a TEMP table or a MACRO lives in one connection, so another node (maybe on another worker) "
            "would not see it; use a worker-local table (`local.name`) pinned with `-- node: wN`"
        )
        return use
    if isinstance(stmt, (exp.Create, exp.Drop)) and str(stmt.args.get("kind") or "").upper() == "SCHEMA":
        schema = stmt.find(exp.Table)
        if schema is not None:
            parts = [p.lower() for p in (schema.catalog, schema.db) if p]
            catalog, name = (parts[0], parts[1]) if len(parts) == 2 else (LAKE, parts[0])
            use.add(TableRef(catalog, name, ""), MAKE if isinstance(stmt, exp.Create) else DROP)
        return use
    targets, use.creates = _writes(stmt)
    written = set()
    for table, role in targets:
        if table is not None and _is_named(table):
            use.add(resolve(table), role)
            written.add(id(table))
    try:
        ctes = cte_references(stmt)
    except Exception:  # noqa: BLE001 - a scope sqlglot cannot build: fall back to every CTE name of the statement
        names = {c.alias_or_name.lower() for c in stmt.find_all(exp.CTE)}
        ctes = {id(t) for t in stmt.find_all(exp.Table) if not t.db and not t.catalog and t.name.lower() in names}
    for table in stmt.find_all(exp.Table):
        if id(table) in written or id(table) in ctes or not _is_named(table):
            continue
        use.add(resolve(table), READ)
    if isinstance(stmt, (exp.Update, exp.Delete, exp.Merge)):
        for t in list(use.writes):
            use.add(t, READ)  # they read the rows they change
    for t in list(use.uses):
        schema = _schema_of(t)
        if schema is not None and not t.is_schema:
            use.add(schema, READ)  # a table in a schema needs the schema
    return use
