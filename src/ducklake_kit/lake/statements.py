"""Statements whose effect outlives them on the connection that runs them, as sqlglot parses them: what pipelines
(a node runs alone, on any worker) and steps (a worker's connection is shared by every task) must agree on.

`token_decides` says whether a commit token in one catalog can decide the fate of a statement's commit.

`session_statement` names the kind (BEGIN, COMMIT, ROLLBACK, USE, SET, RESET, ATTACH, DETACH) or None. DuckDB's own
parser turns `PRAGMA name = value` into a SET, and sqlglot has no node for RESET (it falls back to a Command): both
are named here too.
"""

from __future__ import annotations

from typing import Any

import duckdb
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

SESSION = {
    exp.Transaction: "BEGIN",
    exp.Commit: "COMMIT",
    exp.Rollback: "ROLLBACK",
    exp.Use: "USE",
    exp.Set: "SET",
    exp.Attach: "ATTACH",
    exp.Detach: "DETACH",
}


def session_statement(stmt: exp.Expression | None) -> str | None:
    for kind, word in SESSION.items():
        if isinstance(stmt, kind):
            return word
    if isinstance(stmt, exp.Pragma) and isinstance(stmt.this, exp.EQ):
        return "SET"
    if isinstance(stmt, exp.Command) and str(stmt.this).upper() == "RESET":
        return "RESET"
    return None


def token_decides(view: Any, sql: str) -> bool:
    """Whether the token (in the catalog of `view`, a Lake or a view of one: typed loosely, since the Lake imports
    this module) can decide the fate of `sql`'s commit: every table it names is in
    that catalog (qualified with it, or unqualified while it is the default database). A commit to another catalog
    carries no token there, so a failure of it is never tried again. Text sqlglot cannot parse: False."""
    try:
        trees = [t for t in sqlglot.parse(sql, read="duckdb") if t is not None]
        databases = {r[0].lower() for r in view.con.execute("SELECT database_name FROM duckdb_databases()").fetchall()}
        default = str(view.con.execute("SELECT current_database()").fetchone()[0]).lower()
    except (ParseError, TokenError, duckdb.Error):
        return False
    for tree in trees:
        for table in tree.find_all(exp.Table):
            if not table.name:
                continue  # a table function (read_parquet(...)): no table of a catalog
            if table.catalog:
                where = table.catalog
            elif table.db and table.db.lower() in databases:
                where = table.db
            else:
                where = default
            if where.lower() != view.alias.lower():
                return False
    return True
