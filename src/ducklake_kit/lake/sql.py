"""SQL quoting and the catalog questions every layer asks ("does this table exist?"), written once.

Values go into SQL as parameters (`?`) wherever DuckDB accepts them; these are for the places it does not
(DDL, ATTACH, table functions' named arguments, file paths in a FROM clause)."""

from __future__ import annotations

from typing import Any

import duckdb

from ducklake_kit.errors import KitError


def quote_literal(value: Any) -> str:
    """A SQL string literal: 'it''s'."""
    return "'" + str(value).replace("'", "''") + "'"


def quote_ident(name: str) -> str:
    """A SQL identifier, always quoted (safe for any name, keywords included); inner double quotes doubled."""
    return '"' + str(name).replace('"', '""') + '"'


def qualified(*parts: str) -> str:
    """Each part quoted, joined with dots: ('timetravel', 'trips') gives "timetravel"."trips" in SQL."""
    return ".".join(quote_ident(p) for p in parts)


def split_name(name: str, default_schema: str = "main") -> tuple[str, str]:
    """'timetravel.trips' -> ('timetravel', 'trips'); 'trips' -> ('main', 'trips'). Plain names only: a table of
    the lake is named `table` or `schema.table` (no catalog prefix, no quotes)."""
    parts = name.split(".")
    if len(parts) > 2 or not all(parts) or any('"' in p for p in parts):
        raise KitError(
            f"'{name}' is not a table name of the lake", "name it as table or schema.table, e.g. timetravel.trips"
        )
    return (parts[0], parts[1]) if len(parts) == 2 else (default_schema, parts[0])


def table_exists(con: duckdb.DuckDBPyConnection, database: str, schema_name: str, table: str) -> bool:
    """Whether `database.schema.table` exists now (in the current snapshot, or the open transaction)."""
    row = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND schema_name = ? AND table_name = ?",
        [database, schema_name, table],
    ).fetchone()
    return bool(row and row[0])


def schema_exists(con: duckdb.DuckDBPyConnection, database: str, schema_name: str) -> bool:
    row = con.execute(
        "SELECT count(*) FROM duckdb_schemas() WHERE database_name = ? AND schema_name = ?", [database, schema_name]
    ).fetchone()
    return bool(row and row[0])


def tables(con: duckdb.DuckDBPyConnection, database: str, schema_name: str | None = None) -> list[tuple[str, str]]:
    """(schema, table) of every table of `database` (or of one schema), sorted."""
    sql = "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = ?"
    params: list[Any] = [database]
    if schema_name is not None:
        sql += " AND schema_name = ?"
        params.append(schema_name)
    return [(r[0], r[1]) for r in con.execute(sql + " ORDER BY 1, 2", params).fetchall()]
