"""Statements whose effect outlives them on the connection that runs them, as sqlglot parses them: what pipelines
(a node runs alone, on any worker) and steps (a worker's connection is shared by every task) must agree on.

`session_statement` names the kind (BEGIN, COMMIT, ROLLBACK, USE, SET, RESET, ATTACH, DETACH) or None. DuckDB's own
parser turns `PRAGMA name = value` into a SET, and sqlglot has no node for RESET (it falls back to a Command): both
are named here too.
"""

from __future__ import annotations

from sqlglot import exp

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
