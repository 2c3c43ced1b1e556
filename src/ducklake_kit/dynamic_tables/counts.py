"""Multiplicity counts: a UNION or SELECT DISTINCT table refreshed from its sources' changes alone.

A distinct result keeps a row while at least one copy of it comes from some branch. Which copies are left after a
change cannot be told from the change: the side table `lake.dynamic_counts."<schema>__<table>__<definition id>"`
keeps, for every row of the result, how many times the branches give it (column `__dt_count`; the branches read as
a UNION ALL with their own DISTINCT dropped: the union's set is the same). A refresh computes the change in those
counts from the delta terms of the changed branches (+1 per gained row, -1 per lost row, netted per row, NULLs
equal), adds it to the side table's counts, and writes the table only where a count went from 0 to more (the row
is added) or back to 0 (the row is deleted): no source is read whole.

The side table is written in the refresh's own transaction, so it always reflects the snapshot the table does. It
is built when an incremental refresh first needs it, from the sources at the snapshot the table reflects (once);
a full refresh drops it (the next incremental one builds it again); dropping or replacing the dynamic table drops
it. Only plans of rows branches qualify (`counted`): an aggregate, window, outer-join or derived branch, IMMUTABLE
WHERE and REFRESH_MODE = FULL keep the paths they had."""

from __future__ import annotations

from ducklake_kit.dynamic_tables import plan as planner
from ducklake_kit.dynamic_tables.metadata import Definition
from ducklake_kit.lake.sql import quote_ident

SCHEMA = "dynamic_counts"
COUNT = "__dt_count"


def counted(plan: planner.Plan, d: Definition) -> bool:
    """Whether the table is kept through multiplicity counts: a UNION or SELECT DISTINCT of rows branches (plain
    projections and inner joins), ADAPTIVE or INCREMENTAL, without IMMUTABLE WHERE."""
    return (
        plan.kind == planner.UNION
        and plan.distinct
        and all(b.kind == planner.ROWS and not b.outer and not b.derived for b in plan.branches)
        and d.refresh_mode != "FULL"
        and not d.immutable_where
    )


def side_name(d: Definition) -> str:
    """The side table's name in schema SCHEMA: one per definition (a replaced definition never reads its
    predecessor's)."""
    schema, table = d.name.split(".")
    return f"{schema}__{table}__{d.definition_id}"


def side_table(lake_alias: str, d: Definition) -> str:
    """The side table, qualified and quoted."""
    return f"{quote_ident(lake_alias)}.{quote_ident(SCHEMA)}.{quote_ident(side_name(d))}"


def drop_sql(lake_alias: str, d: Definition) -> str:
    return f"DROP TABLE IF EXISTS {side_table(lake_alias, d)}"


def branches_all(plan: planner.Plan) -> list[planner.Plan]:
    """The plan's branches with their own DISTINCT dropped: every copy counts."""
    out = []
    for b in plan.branches:
        query = b.query.copy()
        query.set("distinct", None)
        out.append(planner.Plan(**{**b.__dict__, "query": query, "distinct": False}))
    return out


def matched(left: str, right: str, columns: list[str]) -> str:
    """Rows of `left` and `right` equal on every column, NULLs equal."""
    return " AND ".join(f"{left}.{quote_ident(c)} IS NOT DISTINCT FROM {right}.{quote_ident(c)}" for c in columns)
