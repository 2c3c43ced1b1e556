"""Lineage: which table was built from which (table level), and which column from which (column level, a thin layer
over `sqlglot.lineage`), for the statements of a pipeline. Through joins, CTEs, subqueries and set operations:
sqlglot resolves every column to the table it comes from, given the tables' columns (`Schema`).

A statement builds a table when it creates it from a query or inserts, updates or merges into it; its parents are
the tables it reads. `SELECT *` is expanded with the schema; a column computed from no table (`count(*)`, a
literal) has no column lineage.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.lineage import lineage as sqlglot_lineage
from sqlglot.optimizer.qualify import qualify

from ducklake_kit.errors import first_line
from ducklake_kit.pipelines.tables import DIALECT, TableRef, TableUse, resolve

# catalog -> schema -> table -> column -> type, sqlglot's nested mapping
Schema = dict[str, dict[str, dict[str, dict[str, str]]]]


@dataclass(frozen=True, order=True)
class TableEdge:
    child: TableRef
    parent: TableRef


@dataclass(frozen=True, order=True)
class ColumnEdge:
    child: TableRef
    child_column: str
    parent: TableRef
    parent_column: str


def builds(use: TableUse) -> TableRef | None:
    """The table a statement builds from other tables, if it does."""
    stmt = use.tree
    if stmt is None or len(use.writes) != 1:
        return None
    if isinstance(stmt, exp.Create) and use.creates and stmt.expression is not None:
        return next(iter(use.writes))
    if isinstance(stmt, (exp.Insert, exp.Update, exp.Merge)):
        return next(iter(use.writes))
    return None


def table_edges(use: TableUse) -> list[TableEdge]:
    child = builds(use)
    if child is None:
        return []
    return sorted(TableEdge(child, parent) for parent in use.reads if parent != child)


def qualified_tables(query: exp.Expression) -> exp.Expression:
    """A copy of the statement with every table name written in full (catalog.schema.table), CTE names left
    alone."""
    ctes = {c.alias_or_name.lower() for c in query.find_all(exp.CTE)}

    def full(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier):
            if not node.db and not node.catalog and node.name.lower() in ctes:
                return node
            ref = resolve(node)
            node = node.copy()
            node.set("catalog", exp.to_identifier(ref.catalog))
            node.set("db", exp.to_identifier(ref.schema))
            node.set("this", exp.to_identifier(ref.name))
        return node

    return query.copy().transform(full)


def column_edges(use: TableUse, schema: Schema, child_columns: list[str] | None = None) -> list[ColumnEdge]:
    """Column lineage of a statement that builds a table from a query (CREATE ... AS SELECT, INSERT ... SELECT).
    `child_columns`: the built table's columns, to map an INSERT's query positionally when it names no columns.
    Raises ValueError when sqlglot cannot resolve it (an unknown table or column)."""
    child = builds(use)
    stmt = use.tree
    if child is None or stmt is None or not isinstance(stmt, (exp.Create, exp.Insert)):
        return []
    query = stmt.expression
    if not isinstance(query, exp.Query):
        return []
    try:
        query = qualify(qualified_tables(query), schema=schema, dialect=DIALECT, validate_qualify_columns=False)
        outputs = list(query.named_selects)
        names = outputs
        if isinstance(stmt, exp.Insert):
            if isinstance(stmt.this, exp.Schema):
                names = [c.name for c in stmt.this.expressions]
            elif child_columns:
                names = child_columns[: len(outputs)]
        edges = set()
        for out, name in zip(outputs, names):
            for node in sqlglot_lineage(out, query, schema=schema, dialect=DIALECT).walk():
                if node.downstream or not isinstance(node.source, exp.Table):
                    continue
                if not isinstance(node.source.this, exp.Identifier):  # range(...), read_parquet(...): no table
                    continue
                parent = resolve(node.source)
                column = _real_name(schema, parent, _column_name(node.name))
                edges.add(ColumnEdge(child, _real_name(schema, child, name, child_columns), parent, column))
    except (SqlglotError, KeyError) as exc:
        raise ValueError(first_line(exc)) from None
    return sorted(edges)


def columns_read(use: TableUse, schema: Schema) -> dict[TableRef, set[str]] | None:
    """The columns (lower case) the statement reads of each table it reads, anywhere in it (SELECT list, WHERE,
    joins, GROUP BY, subqueries); `*` when a star is left that the schema could not expand. None when sqlglot cannot
    tell (an unknown column, a statement it cannot qualify): then assume it reads every column."""
    from sqlglot.optimizer.scope import traverse_scope

    stmt = use.tree
    if stmt is None:
        return None
    query = stmt.expression if isinstance(stmt, (exp.Create, exp.Insert)) else stmt
    if not isinstance(query, exp.Query):
        return None
    if any(p.is_star for select in query.find_all(exp.Select) for p in select.expressions):
        # a star reads every column, those a change adds too (which the schema before the change does not have)
        return {t: {"*"} for t in use.reads}
    try:
        query = qualify(qualified_tables(query), schema=schema, dialect=DIALECT, validate_qualify_columns=False)
        out: dict[TableRef, set[str]] = {}
        for scope in traverse_scope(query):
            for table in scope.tables:
                if isinstance(table.this, exp.Identifier) and scope.sources.get(table.alias_or_name) is table:
                    out.setdefault(resolve(table), set())
            for column in scope.columns:
                source, where = None, scope
                while where is not None and source is None:
                    source = where.sources.get(column.table)
                    where = where.parent
                if source is None:
                    return None
                if isinstance(source, exp.Table) and isinstance(source.this, exp.Identifier):
                    out.setdefault(resolve(source), set()).add(column.name.lower())
    except (SqlglotError, KeyError, ValueError):
        return None
    return out


def _column_name(sql: str) -> str:
    """The column of a lineage node's name (`"t"."max. wv (m/s)"`): parsed, since a quoted name may hold dots."""
    column = sqlglot.parse_one(sql, dialect=DIALECT)
    return column.name if isinstance(column, exp.Column) else sql


def _real_name(schema: Schema, table: TableRef, column: str, columns: list[str] | None = None) -> str:
    """The column as the table spells it ("T (degC)"): sqlglot folds unquoted names to lower case, DuckDB keeps the
    case a column was created with and matches names without it. The name as given when the table is not known."""
    known = columns or schema.get(table.catalog, {}).get(table.schema, {}).get(table.name, {})
    return next((c for c in known if c.lower() == column.lower()), column)
