"""Any query at a chosen snapshot (the Lake page): every lake table the query reads gets `AT (VERSION => n)`, found
and rewritten by sqlglot (DuckDB's dialect), never by a regex. Left as they are: the query's own CTE names, table
functions (`range(3)`, `read_parquet(...)`, `ducklake_snapshots('lake')`), a table that already names its own
version, and a worker's local tables (`local.x`, not in the lake, so without snapshots)."""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from ducklake_kit.errors import KitError

NOT_THE_LAKE = {"local", "memory", "system", "temp"}


def at_snapshot(text: str, snapshot: int) -> str:
    """`text` (one query) with each lake table it reads pinned at `snapshot`."""
    try:
        snapshot = int(snapshot)
        statements = [s for s in sqlglot.parse(text, read="duckdb") if s is not None]
    except (ValueError, TypeError):
        raise KitError(f"'{snapshot}' is not a snapshot id", "choose a snapshot of the timeline") from None
    except sqlglot.errors.ParseError as exc:
        raise KitError(f"the query does not parse ({str(exc).splitlines()[0]})", "fix the SQL") from None
    if snapshot < 0:
        raise KitError(f"'{snapshot}' is not a snapshot id", "choose a snapshot of the timeline")
    if len(statements) != 1 or not isinstance(statements[0], exp.Query):
        raise KitError(
            "a query at a snapshot is one SELECT (reading the lake as it was cannot change it)",
            "give one SELECT, e.g. SELECT count(*) FROM trips",
        )
    tree = statements[0]
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for table in tree.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier) or table.args.get("when") is not None:
            continue  # a table function, or a table read at a version of its own
        parts = [p.lower() for p in (table.catalog, table.db) if p]
        if not parts and table.name.lower() in ctes:
            continue
        if parts and parts[0] in NOT_THE_LAKE:
            continue
        table.set(
            "when",
            exp.HistoricalData(this="AT", kind="VERSION", expression=exp.Literal.number(snapshot)),
        )
    return tree.sql(dialect="duckdb")
