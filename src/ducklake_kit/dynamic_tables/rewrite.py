"""The queries a refresh runs, written by rewriting the planned query's sqlglot tree (never by pasting text
together): every lake table pinned `AT (VERSION => n)` (`pinned`), one occurrence read from a temporary table of
changes (`term`: the delta rule, T1..T(i-1) at the old snapshot, the change of Ti, T(i+1)..Tn at the new one),
the first table's rows a change reaches through an outer or semi/anti join (`preserved_rows`,
`reached_by_subquery`), the mutable region of IMMUTABLE WHERE (`mutable_only`) and the affected keys
(`key_select`, `restricted`). What shape a query has, and so which of these a refresh needs, is `plan`'s."""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from ducklake_kit.dynamic_tables.ddl import DIALECT
from ducklake_kit.dynamic_tables.plan import (
    AGGREGATE,
    ROWS,
    Key,
    Plan,
    _from_tables,
    semi_conjuncts,
    semi_subquery,
    source_name,
)
from ducklake_kit.lake import Lake
from ducklake_kit.lake.sql import quote_ident


def sql(e: exp.Expression) -> str:
    """The SQL DuckDB runs for a tree."""
    return e.sql(DIALECT)


def target(lake: Lake, name: str) -> str:
    """Dynamic table `schema.table` in the lake, quoted."""
    schema, table = name.split(".")
    return f"{quote_ident(lake.alias)}.{quote_ident(schema)}.{quote_ident(table)}"


def _pinned_table(t: exp.Table, lake_alias: str, snapshot: int) -> exp.Table:
    schema, name = source_name(t, lake_alias).split(".")
    new = exp.Table(
        this=exp.to_identifier(name),
        db=exp.to_identifier(schema),
        catalog=exp.to_identifier(lake_alias),
        when=exp.HistoricalData(this="AT", kind="VERSION", expression=exp.Literal.number(snapshot)),
    )
    new.set("alias", exp.TableAlias(this=exp.to_identifier(t.alias_or_name)))
    return new


def temp_table(name: str, ref: str) -> exp.Table:
    """A temporary table standing in for a source, under the name the query's columns use for it."""
    new = exp.Table(this=exp.to_identifier(name), db=exp.to_identifier("main"), catalog=exp.to_identifier("temp"))
    new.set("alias", exp.TableAlias(this=exp.to_identifier(ref)))
    return new


def pinned(query: exp.Expression, lake_alias: str, snapshot: int) -> exp.Expression:
    """The query with every lake table read AT (VERSION => snapshot)."""
    ctes = {c.alias_or_name.lower() for c in query.find_all(exp.CTE)}

    def pin(node: exp.Expression) -> exp.Expression:
        if (
            isinstance(node, exp.Table)
            and isinstance(node.this, exp.Identifier)
            and not (not node.db and node.name.lower() in ctes)
        ):
            return _pinned_table(node, lake_alias, snapshot)
        return node

    return query.copy().transform(pin)


def term(
    select: exp.Select,
    lake_alias: str,
    bound: dict[int, exp.Table],
    before: int,
    after: int,
    same: dict[int, exp.Table] | None = None,
) -> exp.Select:
    """The query with occurrence i read from `bound[i]` (a temporary table of changes), the occurrences before
    the first bound one at snapshot `before` and the others at snapshot `after`; `same[i]`: a temporary table
    holding occurrence i's rows at both snapshots (a source unchanged between them), read instead."""
    out = select.copy()
    out.set("order", None)  # terms are joined with UNION ALL; the order of a table's rows means nothing anyway
    first = min(bound)
    same = same or {}
    for i, t in enumerate(_from_tables(out)):
        if i in bound:
            new = bound[i]
        elif i in same:
            new = same[i]
        else:
            new = _pinned_table(t, lake_alias, before if i < first else after)
        t.replace(new)
    _pin_subqueries(out, lake_alias, after)
    return out


def _pin_subqueries(select: exp.Select, lake_alias: str, at: int, skip: exp.Expression | None = None) -> None:
    """The lake tables of the semi/anti joins' subqueries read AT (VERSION => at), in place (`skip`: one left as is)."""
    for c in semi_conjuncts(select):
        for t in _from_tables(semi_subquery(c)):
            if t is not skip and isinstance(t, exp.Table) and t.catalog.lower() != "temp":
                t.replace(_pinned_table(t, lake_alias, at))


# how a partial aggregate of the rows grouped before the joins is combined after them (`eager`)
COMBINED = {exp.Sum: exp.Sum, exp.Count: exp.Sum, exp.Min: exp.Min, exp.Max: exp.Max}


def partial(select: exp.Select, plan: Plan, index: int, table: exp.Expression) -> exp.Select:
    """The rows of `table` (standing for occurrence `index`, under its name) aggregated as `eager` groups them:
    `SELECT its named columns, each aggregate of the select list AS __dt_p<i> FROM table GROUP BY those columns`."""
    ref = table.alias_or_name
    keys = {k.column for k in plan.keys}
    grouped = [exp.column(c, ref, quoted=True) for c in plan.eager[index]]
    items = [exp.alias_(g.copy(), c, quoted=True) for g, c in zip(grouped, plan.eager[index])]
    for i, (name, item) in enumerate(zip(plan.columns, select.selects)):
        if name not in keys:
            items.append(exp.alias_(item.unalias().copy(), f"__dt_p{i}", quoted=True))
    return exp.select(*items).from_(table.copy()).group_by(*grouped)


def eager(term_select: exp.Select, plan: Plan, index: int, grouped: bool = False) -> exp.Select | None:
    """A delta term (`term`) whose occurrence `index` reads a temporary table of inserted rows, with those rows
    aggregated before the joins (`Plan.eager`): the table becomes its `partial` under the same name (or, `grouped`,
    already holds it: the refresh read the inserts that way), and each aggregate of the select list combines the
    partial ones (SUM and COUNT summed, MIN/MAX again). The same groups and values; None when the plan has no such
    grouping for that occurrence."""
    if index not in plan.eager:
        return None
    out = term_select.copy()
    table = _from_tables(out)[index]
    ref = table.alias_or_name
    if not grouped:
        inner = partial(out, plan, index, table)
        table.replace(exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier(ref))))
    keys = {k.column for k in plan.keys}
    for i, (name, item) in enumerate(zip(plan.columns, out.selects)):
        if name not in keys:
            agg = item.unalias()
            agg.replace(COMBINED[type(agg)](this=exp.column(f"__dt_p{i}", ref, quoted=True)))
    return out


def one_sided(select: exp.Select, side: str) -> exp.Select:
    """The query with its FULL JOIN made a LEFT (the first table's rows kept) or RIGHT one (the second's)."""
    out = select.copy()
    for j in out.args.get("joins") or []:
        if (j.args.get("side") or "").upper() == "FULL":
            j.set("side", side)
    return out


def reached_by_subquery(
    select: exp.Select, lake_alias: str, conjunct: int, bound: exp.Table, at: int, columns: list
) -> exp.Select:
    """The rows of the query's first table (projected on `columns`, the joins as written, every table at snapshot
    `at`) whose result rows the rows of `bound` (a temporary table standing for the table of semi/anti conjunct
    number `conjunct`) may change: those it correlates with (EXISTS; IN: a value equal to x). NOT IN also reaches
    every row whose x is NULL (it passes only while the subquery is empty) and, when a changed row's value is NULL
    (which makes NOT IN pass no row), every row."""
    out = select.copy()
    for arg in ("group", "having", "order", "limit", "offset", "distinct", "qualify"):
        out.set(arg, None)
    c = semi_conjuncts(out)[conjunct]
    sub = semi_subquery(c).copy()
    [table] = _from_tables(sub)
    table.replace(bound)
    core = c.this if isinstance(c, exp.Not) else c
    core = core.this if isinstance(core, exp.Paren) else core
    if isinstance(core, exp.Exists):
        reached: exp.Expression = exp.Exists(this=sub)
    else:
        x = core.this.copy()
        reached = exp.In(this=x, query=exp.Subquery(this=sub))
        if isinstance(c, exp.Not):
            nulls = sub.copy()
            value = nulls.selects[0].unalias().copy()
            nulls.set("expressions", [exp.Literal.number(1)])
            nulls = nulls.where(exp.Is(this=value, expression=exp.Null()))
            reached = exp.or_(reached, exp.Is(this=x.copy(), expression=exp.Null()), exp.Exists(this=nulls))
    out.set("where", exp.Where(this=reached))
    for t in _from_tables(out):
        t.replace(_pinned_table(t, lake_alias, at))
    _pin_subqueries(out, lake_alias, at)
    out.set("expressions", [c.copy() for c in columns])
    return out


def preserved_rows(
    select: exp.Select, lake_alias: str, bound: tuple[int, exp.Table], at: int, columns: list
) -> exp.Select:
    """The rows of the query's first table (projected on `columns`) whose result rows hold a row of `bound` (index,
    temporary table) standing for that occurrence: its join made INNER, the other joins as written, the others read
    at snapshot `at`. WHERE is dropped: a superset of the rows is harmless, while a filter such as `b.id IS NULL`
    (rows without a match) would hide exactly the rows whose padding a new match removes."""
    index, table = bound
    out = select.copy()
    for arg in ("group", "having", "order", "limit", "offset", "where", "distinct", "qualify"):
        out.set(arg, None)
    join = out.args["joins"][max(index, 1) - 1]  # index 0: the second table's rows, reached through the first's
    join.set("side", None)
    join.set("kind", None)
    for i, t in enumerate(_from_tables(out)):
        t.replace(table if i == index else _pinned_table(t, lake_alias, at))
    out.set("expressions", [c.copy() for c in columns])
    return out


def mutable_only(select: exp.Select, condition: str, plan: Plan) -> exp.Select:
    """The query restricted to the rows IMMUTABLE WHERE's `condition` (over the table's columns) does not hold for,
    the condition read through each column's expression over the sources, so that a refresh neither reads nor
    recomputes the immutable region (whose rows it never writes anyway). Only where that is the same rows: a
    projection (`rows`), or an aggregate whose condition reads only group keys (whole groups go); otherwise, or
    when a column is not a plain select item, the query as it is."""
    if plan.kind not in (ROWS, AGGREGATE) or plan.derived or len(select.selects) != len(plan.columns):
        return select
    items = {n.lower(): s.unalias() for n, s in zip(plan.columns, select.selects)}
    if any(isinstance(e, (exp.Star, exp.Columns)) for e in items.values()):
        return select
    allowed = {k.column.lower() for k in plan.keys} if plan.kind == AGGREGATE else set(items)
    cond = sqlglot.parse_one(condition, read=DIALECT)
    if any(c.table or c.name.lower() not in allowed for c in cond.find_all(exp.Column)):
        return select

    def through(node: exp.Expression) -> exp.Expression:
        return exp.Paren(this=items[node.name.lower()].copy()) if isinstance(node, exp.Column) else node

    held = exp.Is(this=exp.Paren(this=cond.transform(through)), expression=exp.true())
    return select.copy().where(exp.Not(this=exp.Paren(this=held)))


def key_column(i: int) -> str:
    """The name of key i in a table of affected keys: never a name the query's own columns use, so a key's
    unqualified columns still mean the query's tables inside the EXISTS of `restricted`."""
    return f"__k{i}"


def key_select(select: exp.Select, keys: list[Key]) -> exp.Select:
    """The query's rows reduced to its group keys (columns __k0, __k1, ...), one row per key."""
    out = select.copy()
    for arg in ("group", "having", "order", "limit", "offset", "qualify"):
        out.set(arg, None)
    out.set("expressions", [exp.alias_(k.expr.copy(), key_column(i), quoted=True) for i, k in enumerate(keys)])
    out.set("distinct", exp.Distinct())
    return out


def restricted(select: exp.Select, keys: list[Key], keys_table: str) -> exp.Select:
    """The query limited, before grouping, to the groups listed in temporary table `keys_table`."""
    match = exp.and_(
        *[
            exp.NullSafeEQ(this=k.expr.copy(), expression=exp.column(key_column(i), "__k", quoted=True))
            for i, k in enumerate(keys)
        ]
    )
    sub = exp.select("1").from_(temp_table(keys_table, "__k")).where(match)
    return select.copy().where(exp.Exists(this=sub))
