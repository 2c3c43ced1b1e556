"""How a dynamic table's query can be kept fresh, decided once from its sqlglot tree (the queries a refresh runs are
written from the plan by `rewrite`).

Shapes (`Plan.kind`):
- `aggregate`: SELECT keys..., aggregates... FROM lake tables [INNER JOIN ...] [WHERE] GROUP BY keys [HAVING].
  Incremental: the groups any source's changes touch (the affected keys, from the pre-images read against the
  old snapshot and the post-images against the new one) are deleted and computed again. When every change is an
  insert and every aggregate is SUM/COUNT/MIN/MAX (no HAVING), the groups are instead merged with the aggregates
  of the new rows alone, without reading the base tables' old rows; over inner joins, the new rows of a table whose
  columns alone the aggregates read are aggregated before the joins (`eager`).
- `rows`: projections and filters over inner joins, no aggregate. Inserts are appended; otherwise the affected
  output rows (compared whole, null-safely) are deleted and read again.
- `union`: a UNION ALL or UNION of branches, each a `rows` or `aggregate` shape, or one SELECT DISTINCT. Each
  branch is maintained from its own sources' changes (a branch whose sources did not change adds no term). Inserts
  into branches without aggregates are appended (UNION ALL) or added when not there yet (UNION, DISTINCT);
  otherwise the affected result rows (compared whole: a rows branch's changed rows, an aggregate branch's rows of
  its affected groups, before and after) are deleted and read again from the whole query, so every copy of such a
  row is counted afresh across all branches: one duplicate deleted keeps the row, the last one removes it.
- `full`: anything else, with a named reason (`REASONS`); ADAPTIVE refreshes it in full, INCREMENTAL refuses it.

A WITH clause is inlined first (`inline_ctes`): each CTE becomes the derived table it names, and those that are
plain projections and filters merge into their reader (sqlglot's `merge_subqueries`, after `qualify` with the
sources' columns), so the query is planned as the query it means.

A query's tables are its *occurrences*: each `FROM`/`JOIN` table, in order. The rows a change adds to a join of
T1..Tn are the sum over i of T1..T(i-1) at the old snapshot, the change of Ti, and T(i+1)..Tn at the new one
(the usual delta rule), which is what `rewrite.term` builds."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from ducklake_kit.dynamic_tables.ddl import (
    DIALECT,
    RANDOM_FUNCTIONS,
    RANDOM_NAMES,
    TIME_FUNCTIONS,
    TIME_NAMES,
    DdlError,
)

AGGREGATE, ROWS, UNION, WINDOW, FULL = "aggregate", "rows", "union", "window", "full"
# why a query is refreshed in full (Databricks-style codes, shown by `dynamic show`)
REASONS = {
    "SET_OPERATION": "INTERSECT / EXCEPT, UNION BY NAME, or UNION mixed with UNION ALL",
    "WITH_CLAUSE": "a WITH clause that cannot be inlined (recursive, or a CTE with an aggregate, DISTINCT, LIMIT or "
    "window that another query reads)",
    "SUBQUERY": "a subquery (other than [NOT] EXISTS / [NOT] IN over one table, as a condition of the WHERE)",
    "WINDOW_FUNCTION": "a window function over GROUP BY, beside an aggregate, or over a named WINDOW",
    "DISTINCT": "SELECT DISTINCT",
    "LIMIT": "LIMIT / OFFSET",
    "OUTER_JOIN": "a RIGHT JOIN after the first join, a FULL JOIN of more than two tables, SEMI/ANTI JOIN syntax, an "
    "ASOF or lateral join, or an outer or semi/anti join in a union branch",
    "NONDETERMINISTIC_FUNCTION": "a non-deterministic function",
    "TABLE_FUNCTION": "a table function or a file in FROM (not a table of the lake)",
    "GROUPING_SETS": "GROUPING SETS / ROLLUP / CUBE",
    "GROUP_KEY_NOT_SELECTED": "a GROUP BY key that is not a column of the result",
    "GLOBAL_AGGREGATE": "an aggregate without GROUP BY",
    "STAR_WITH_AGGREGATE": "SELECT * with GROUP BY",
    "QUALIFY": "QUALIFY without a window function",
    "WINDOW_WITHOUT_PARTITION_BY": "a window function without PARTITION BY, or windows partitioned differently",
    "WINDOW_PARTITION_NOT_SELECTED": "a window's PARTITION BY key that is not a column of the result",
    "SAMPLE": "USING SAMPLE / TABLESAMPLE (a different sample each time)",
}
MERGEABLE = {exp.Sum: "sum", exp.Min: "min", exp.Max: "max", exp.Count: "count"}
# the random ones are refused at create (ddl); the clock's are refreshed in full
NONDETERMINISTIC = RANDOM_FUNCTIONS + TIME_FUNCTIONS
NONDETERMINISTIC_NAMES = RANDOM_NAMES | TIME_NAMES | {"currval"}


@dataclass(frozen=True)
class Occurrence:
    """One table of the query: where it sits in the FROM/JOIN list, its lake name, the name its columns use."""

    index: int
    source: str  # schema.table, lower case
    ref: str  # its alias, or its table name


@dataclass(frozen=True)
class Key:
    column: str  # the dynamic table's column
    expr: exp.Expression  # the same key over the sources' columns


@dataclass(frozen=True)
class MergeColumn:
    column: str
    function: str  # sum | count | min | max


@dataclass
class Plan:
    kind: str
    reason: str | None = None  # a REASONS code when kind is FULL
    occurrences: list[Occurrence] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)  # the result's columns, as the table has them
    keys: list[Key] = field(default_factory=list)  # AGGREGATE: the group keys
    merge: list[MergeColumn] | None = None  # AGGREGATE: when inserts can be merged, how each other column is
    merge_reason: str | None = None  # why inserts cannot be merged (AGGREGATE)
    read: list[str] = field(default_factory=list)  # every lake table the query reads, subqueries and CTEs included
    query: exp.Expression | None = None  # the query as planned (CTEs inlined); ROWS/AGGREGATE branches: the SELECT
    branches: list[Plan] = field(default_factory=list)  # UNION: each branch's plan (ROWS or AGGREGATE)
    distinct: bool = False  # UNION: the result has no duplicates (UNION, SELECT DISTINCT); ROWS branch: DISTINCT
    outer: bool = False  # ROWS/AGGREGATE: LEFT JOINs, a FULL JOIN or semi/anti joins (maintained through the
    # first table's rows a change reaches: each result row belongs to one row of it, or of the second (FULL JOIN))
    two_sided: bool = False  # a FULL OUTER JOIN of two tables: the second table's rows are preserved too
    semi: list[exp.Expression] = field(default_factory=list)  # the WHERE's [NOT] EXISTS / [NOT] IN conjuncts
    derived: bool = False  # ROWS/AGGREGATE over one derived table, whose UNION ALL branches (or one) are `branches`
    swapped: bool = False  # the query's first join was a RIGHT JOIN, planned as the LEFT JOIN of its tables swapped
    # AGGREGATE with `merge`, over inner joins: per occurrence whose columns alone the aggregates read, the columns of
    # it the rest of the query names (join conditions, WHERE, group keys): its inserted rows are grouped by them before
    # the joins (`rewrite.eager`), the aggregates combined after (SUM/COUNT summed, MIN/MAX again)
    eager: dict[int, list[str]] = field(default_factory=dict)

    @property
    def sources(self) -> list[str]:
        return self.read or sorted({o.source for o in self.occurrences})

    @property
    def keyed(self) -> bool:
        """Maintained by its keys: a GROUP BY's groups, or the partitions of its window functions."""
        return self.kind in (AGGREGATE, WINDOW)

    @property
    def incremental(self) -> bool:
        return self.kind != FULL

    def joins_named(self) -> str:
        """What makes the plan `outer`, in words."""
        what = ["a FULL OUTER JOIN"] if self.two_sided else []
        if not self.two_sided and self.query is not None and _has_side(self.query):
            what.append("LEFT JOINs (a RIGHT JOIN with its two tables swapped)" if self.swapped else "LEFT JOINs")
        if self.semi:
            what.append("semi/anti joins (" + ", ".join(_semi_name(c) for c in self.semi) + ")")
        return " and ".join(what)

    def explain(self) -> str:
        if self.kind == FULL:
            return f"{self.reason}: {REASONS[self.reason]}"
        if self.derived:
            n = len(self.branches)
            inner = f"UNION ALL of {n} branches" if n > 1 else "a query"
            by = f"aggregate by {', '.join(k.column for k in self.keys)}" if self.kind == AGGREGATE else "rows"
            return (
                f"{by} over a derived table ({inner}: {', '.join(b.kind for b in self.branches)}): the derived rows a "
                "change touches (an aggregate branch's affected groups), as they were and are, give the "
                + ("groups recomputed" if self.kind == AGGREGATE else "rows replaced")
            )
        if self.kind == ROWS and self.outer:
            return (
                f"rows over {self.joins_named()}: the rows of the first table{' and of the second' if self.two_sided else ''}"
                " a change reaches (their own, or through a matching row) have their result rows, NULL-padded ones "
                "included, replaced"
            )
        if self.kind == ROWS:
            return "rows: inserts appended, other changes replace the affected rows"
        if self.kind == UNION:
            shape = "SELECT DISTINCT" if len(self.branches) == 1 else f"UNION{'' if self.distinct else ' ALL'}"
            kinds = ", ".join(b.kind for b in self.branches)
            head = f"union: {shape} of {len(self.branches)} branch{'es' if len(self.branches) > 1 else ''} ({kinds})"
            if self.distinct and all(b.kind == ROWS and not b.outer and not b.derived for b in self.branches):
                return (
                    f"{head}, kept through multiplicity counts (a side table in the schema dynamic_counts): the "
                    "changed branches' delta terms add to or take from their rows' counts; a row is added when its "
                    "count leaves 0 and deleted when it returns there"
                )
            added = "added when new" if self.distinct else "appended"
            return (
                f"{head}, each from its own sources' changes; inserts into rows branches {added}, other changes "
                "replace the affected rows"
            )
        how = (
            "inserts merged into their groups (" + ", ".join(f"{m.column}: {m.function}" for m in self.merge) + ")"
            if self.merge is not None
            else f"inserts recompute their groups ({self.merge_reason})"
        )
        if self.eager:
            tables = ", ".join(self.occurrences[i].ref for i in sorted(self.eager))
            how += f"; inserts into {tables} aggregated before the joins"
        over = f" over {self.joins_named()}" if self.outer else ""
        if self.kind == WINDOW:
            return (
                f"window partitioned by {', '.join(k.column for k in self.keys)}{over}: the partitions a change "
                "touches are recomputed (QUALIFY included)"
            )
        return f"aggregate by {', '.join(k.column for k in self.keys)}{over}: affected groups recomputed; {how}"


def source_name(table: exp.Table, lake_alias: str) -> str:
    catalog, db = table.catalog, table.db
    if not catalog and db and db.lower() == lake_alias.lower():  # `lake.trips`: the lake's main.trips
        catalog, db = db, ""
    if catalog and catalog.lower() != lake_alias.lower():
        raise DdlError(
            f"the query reads {table.sql(DIALECT)}, which is not a table of the lake",
            f"a dynamic table reads tables of `{lake_alias}`: name them as table or schema.table",
        )
    if "." in table.name or "." in (db or ""):
        raise DdlError(
            f"the query reads {table.sql(DIALECT)}, a name with a dot in it",
            "name the lake's tables as table or schema.table, without dots inside a name",
        )
    if table.args.get("when") is not None:
        raise DdlError(
            f"the query reads {table.sql(DIALECT)} at a version of its own",
            "drop the AT (...) clause: a dynamic table reads every source as of each refresh",
        )
    return f"{(db or 'main').lower()}.{table.name.lower()}"


def occurrences(select: exp.Select, lake_alias: str) -> list[Occurrence]:
    out = []
    for i, t in enumerate(_from_tables(select)):
        if not isinstance(t, exp.Table) or not isinstance(t.this, exp.Identifier):
            raise _Full("TABLE_FUNCTION" if not isinstance(t, exp.Subquery) else "SUBQUERY")
        out.append(Occurrence(i, source_name(t, lake_alias), (t.alias_or_name).lower()))
    return out


class _Full(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _from_tables(select: exp.Select) -> list[exp.Expression]:
    """The FROM item and each JOIN's, in order (none for a SELECT without FROM)."""
    first = select.args.get("from_") or select.args.get("from")
    return ([first.this] if first is not None else []) + [j.this for j in select.args.get("joins") or []]


def _check_shape(query: exp.Expression) -> exp.Select:
    """The SELECT as it is planned (a RIGHT JOIN as the first join becomes a LEFT JOIN of its tables swapped), or
    _Full with the reason it cannot be maintained."""
    if isinstance(query, exp.SetOperation):
        raise _Full("SET_OPERATION")
    if not isinstance(query, exp.Select):
        raise _Full("SUBQUERY")
    if query.args.get("with_") or query.args.get("with"):
        raise _Full("WITH_CLAUSE")
    if query.args.get("distinct"):
        raise _Full("DISTINCT")
    if query.args.get("limit") or query.args.get("offset"):
        raise _Full("LIMIT")
    if query.args.get("qualify") and not any(isinstance(n, exp.Window) for n in query.args["qualify"].walk()):
        raise _Full("QUALIFY")
    semi = semi_conjuncts(query)
    for node in query.walk():
        if (
            node is not query
            and isinstance(node, (exp.Select, exp.Subquery))
            and not any(_inside(node, c) for c in semi)
        ):
            raise _Full("SUBQUERY")
        if isinstance(node, exp.TableSample):
            raise _Full("SAMPLE")
        if isinstance(node, NONDETERMINISTIC) or (
            isinstance(node, exp.Anonymous) and str(node.this).lower() in NONDETERMINISTIC_NAMES
        ):
            raise _Full("NONDETERMINISTIC_FUNCTION")
    query = _right_swapped(query)
    joins = query.args.get("joins") or []
    for join in joins:
        side = (join.args.get("side") or "LEFT").upper()
        if (
            (side == "RIGHT" or (side == "FULL" and (len(joins) > 1 or semi)))
            or join.args.get("kind") in ("SEMI", "ANTI")
            or join.args.get("method")
            or isinstance(join.this, exp.Lateral)
        ):
            raise _Full("OUTER_JOIN")
    return query


def _inside(node: exp.Expression, ancestor: exp.Expression) -> bool:
    parent = node.parent
    while parent is not None:
        if parent is ancestor:
            return True
        parent = parent.parent
    return False


def _right_swapped(select: exp.Select) -> exp.Select:
    """`a RIGHT JOIN b ON c ...` as `b LEFT JOIN a ON c ...`: the same rows (joins nest from the left, and columns
    are named by their tables), so the first table is again the one whose rows are all kept. A `*` would change the
    columns' order, so it stays a RIGHT JOIN (refused)."""
    joins = select.args.get("joins") or []
    if not joins or (joins[0].args.get("side") or "").upper() != "RIGHT":
        return select
    if any(isinstance(s.unalias(), (exp.Star, exp.Columns)) for s in select.selects):
        return select
    out = select.copy()
    first, join = _from_tables(out)[0], out.args["joins"][0]
    second = join.this
    first_copy, second_copy = first.copy(), second.copy()
    first.replace(second_copy)
    second.replace(first_copy)
    join.set("side", "LEFT")
    return out


def semi_conjuncts(select: exp.Select) -> list[exp.Expression]:
    """The conditions of the WHERE (top-level AND terms) that are semi or anti joins: [NOT] EXISTS (SELECT ... FROM
    one table [WHERE ...]) and x [NOT] IN (SELECT one column FROM one table [WHERE ...]). A subquery of another form
    is not listed (and refused by the caller)."""
    where = select.args.get("where")
    if where is None:
        return []
    out = []
    for c in where.this.flatten() if isinstance(where.this, exp.And) else [where.this]:
        core = c.this if isinstance(c, exp.Not) else c
        if isinstance(core, exp.Paren):
            core = core.this
        sub = None
        if isinstance(core, exp.Exists):
            sub = core.this
        elif isinstance(core, exp.In) and isinstance(core.args.get("query"), exp.Subquery):
            sub = core.args["query"].this
            if isinstance(core.this, exp.Tuple) or not isinstance(sub, exp.Select) or len(sub.selects) != 1:
                continue
        if isinstance(sub, exp.Select) and _simple_subquery(sub):
            out.append(c)
    return out


def _simple_subquery(sub: exp.Select) -> bool:
    """One lake table in FROM, no join, group, window, limit or nested subquery: its rows are the table's, filtered."""
    tables = _from_tables(sub)
    if len(tables) != 1 or not isinstance(tables[0], exp.Table) or not isinstance(tables[0].this, exp.Identifier):
        return False
    if any(sub.args.get(a) for a in ("group", "having", "qualify", "limit", "offset", "with_", "with", "windows")):
        return False
    return not any(
        isinstance(n, (exp.Select, exp.Subquery, exp.AggFunc, exp.Window, exp.TableSample)) and n is not sub
        for n in sub.walk()
    )


def semi_subquery(conjunct: exp.Expression) -> exp.Select:
    """The subquery of a semi/anti conjunct (one of `semi_conjuncts`)."""
    core = conjunct.this if isinstance(conjunct, exp.Not) else conjunct
    core = core.this if isinstance(core, exp.Paren) else core
    return core.this if isinstance(core, exp.Exists) else core.args["query"].this


def _semi_name(conjunct: exp.Expression) -> str:
    core = conjunct.this if isinstance(conjunct, exp.Not) else conjunct
    core = core.this if isinstance(core, exp.Paren) else core
    return ("NOT " if isinstance(conjunct, exp.Not) else "") + ("EXISTS" if isinstance(core, exp.Exists) else "IN")


def _has_side(select: exp.Select) -> bool:
    return any(j.args.get("side") for j in select.args.get("joins") or [])


def _outer(select: exp.Select) -> bool:
    return _has_side(select) or bool(semi_conjuncts(select))


def _two_sided(select: exp.Select) -> bool:
    return any((j.args.get("side") or "").upper() == "FULL" for j in select.args.get("joins") or [])


def _is_aggregate(node: exp.Expression) -> bool:
    return any(isinstance(n, exp.AggFunc) for n in node.walk())


def _group_keys(select: exp.Select, names: list[str], source_columns: set[str] | None) -> list[Key]:
    """`source_columns`: the names of every column of the query's tables (lower case); a GROUP BY name that is one
    of them means that column, as DuckDB reads it, even when a select item has it as its alias. None: unknown, and
    a GROUP BY name that is also an alias of another expression is refused."""
    group = select.args.get("group")
    items = [s.unalias() for s in select.selects]
    if group.args.get("all"):
        keys = [Key(names[i], items[i]) for i, e in enumerate(items) if not _is_aggregate(e)]
        if not keys:
            raise _Full("GLOBAL_AGGREGATE")
        return keys
    if any(group.args.get(k) for k in ("grouping_sets", "cube", "rollup")) or any(
        isinstance(g, (exp.Rollup, exp.Cube, exp.GroupingSets)) for g in group.expressions
    ):
        raise _Full("GROUPING_SETS")
    aliases = {s.alias.lower(): i for i, s in enumerate(select.selects) if s.alias}
    keys = []
    for g in group.expressions:
        if isinstance(g, exp.Literal) and not g.is_string and g.this.isdigit() and 0 < int(g.this) <= len(items):
            i = int(g.this) - 1
        elif isinstance(g, exp.Column) and not g.table and g.name.lower() in aliases and not any(e == g for e in items):
            if source_columns is None or g.name.lower() in source_columns:
                raise _Full("GROUP_KEY_NOT_SELECTED")  # the column, not the alias: it is not in the result
            i = aliases[g.name.lower()]
        else:
            matches = [i for i, e in enumerate(items) if e == g]
            if not matches:
                raise _Full("GROUP_KEY_NOT_SELECTED")
            i = matches[0]
        keys.append(Key(names[i], items[i]))
    return keys


FLOATING = {"DOUBLE", "FLOAT", "REAL"}


def _merge_columns(
    select: exp.Select, names: list[str], keys: list[Key], types: dict[str, str] | None
) -> tuple[list[MergeColumn] | None, str | None]:
    if select.args.get("having"):
        return None, "HAVING"
    key_columns = {k.column for k in keys}
    out = []
    for name, item in zip(names, select.selects):
        if name in key_columns:
            continue
        agg = item.unalias()
        function = MERGEABLE.get(type(agg))
        extra = {k: v for k, v in agg.args.items() if k not in ("this", "big_int") and v not in (None, [])}
        if function is None or extra:  # max(v, 2) is a list of the 2 largest, not mergeable by greatest()
            return None, f"{name} is not a plain SUM, COUNT, MIN or MAX of one argument"
        if isinstance(agg.this, exp.Distinct):
            return None, f"{name} aggregates DISTINCT values"
        if function == "sum" and (types or {}).get(name, "").upper() in FLOATING:
            return None, f"{name} sums floating point ({types[name]}): added month by month it rounds differently"
        out.append(MergeColumn(name, function))
    return out, None


def analyze(
    query: exp.Expression,
    names: list[str],
    lake_alias: str,
    *,
    types: dict[str, str] | None = None,
    source_columns: set[str] | None = None,
    schema: dict[str, dict[str, str]] | None = None,
) -> Plan:
    """The plan of `query` (parsed by sqlglot), whose result has the columns `names` (as DuckDB names them) of
    `types` (column -> DuckDB type), reading tables whose columns are `source_columns` (lower case); `schema`
    (source `schema.table` -> column -> type) is what a WITH clause is inlined with (without it, FULL)."""
    read = all_sources(query, lake_alias)
    if source_columns is None and schema is not None:
        source_columns = {c.lower() for cols in schema.values() for c in cols}
    try:
        query = inline_ctes(query, lake_alias, schema)
        if _derived_from(query) is not None:
            out = _derived_plan(query, names, lake_alias)
            out.read = read
            return out
        branches, distinct = _union_branches(query)
        if branches is not None:
            plans = [_branch(b, names, lake_alias, types, source_columns) for b in branches]
            occ = [o for b in plans for o in b.occurrences]
            return Plan(
                UNION, occurrences=occ, columns=names, read=read, query=query, branches=plans, distinct=distinct
            )
        checked = _check_shape(query)
        out = _select_plan(checked, names, lake_alias, types, source_columns)
        out.read, out.swapped = read, checked is not query
        out.eager = _eager(checked, out, schema)
        return out
    except _Full as full:
        return Plan(FULL, full.reason, [], names, read=read)


def _select_plan(
    select: exp.Select, names: list[str], lake_alias: str, types: dict | None, source_columns: set[str] | None
) -> Plan:
    occ = occurrences(select, lake_alias)
    semi, two_sided = semi_conjuncts(select), _two_sided(select)
    if any(isinstance(n, exp.Window) for n in select.walk()):
        if semi or two_sided:
            raise _Full("SUBQUERY" if semi else "OUTER_JOIN")
        return Plan(
            WINDOW,
            occurrences=occ,
            columns=names,
            keys=_partition_keys(select, names),
            merge_reason="window functions",
            query=select,
            outer=_outer(select),
        )
    if not select.args.get("group"):
        if any(_is_aggregate(s) for s in select.selects) or select.args.get("having"):
            raise _Full("GLOBAL_AGGREGATE")
        return Plan(
            ROWS, occurrences=occ, columns=names, query=select, outer=_outer(select), two_sided=two_sided, semi=semi
        )
    if any(isinstance(s, exp.Star) or isinstance(s.unalias(), exp.Star) for s in select.selects) or len(
        select.selects
    ) != len(names):
        raise _Full("STAR_WITH_AGGREGATE")
    keys = _group_keys(select, names, source_columns)
    merge, why = _merge_columns(select, names, keys, types)
    if semi:
        merge, why = None, "semi/anti joins: a new row of a subquery's table can add or remove result rows"
    if _outer(select) and not semi:
        merge, why = None, "an outer join: a new row on an optional side can take the place of a NULL-padded one"
    return Plan(
        AGGREGATE,
        occurrences=occ,
        columns=names,
        keys=keys,
        merge=merge,
        merge_reason=why,
        query=select,
        outer=_outer(select),
        two_sided=two_sided,
        semi=semi,
    )


class _Unresolved(Exception):
    """A column whose table cannot be told for sure (`_owner`)."""


def _owner(column: exp.Column, plan: Plan, schema: dict[str, dict[str, str]] | None) -> int | None:
    """The occurrence a column of the query belongs to: by its qualifier, or (unqualified) the one occurrence whose
    source has a column of that name; None for a name no source has (an alias of the select list). _Unresolved when
    that cannot be told: a dotted name, a qualifier that is no table of the query, a name two occurrences' sources
    have (a self join), a table's name used as a value, or an unqualified name without the sources' columns."""
    if column.args.get("db") or column.args.get("catalog") or not isinstance(column.this, exp.Identifier):
        raise _Unresolved
    refs = {o.ref: o.index for o in plan.occurrences}
    name = column.name.lower()
    if column.table:
        if column.table.lower() not in refs:
            raise _Unresolved
        return refs[column.table.lower()]
    if schema is None or name in refs:
        raise _Unresolved
    having = [o.index for o in plan.occurrences if name in {c.lower() for c in schema.get(o.source, {})}]
    if len(having) > 1:
        raise _Unresolved
    return having[0] if having else None


def _eager(select: exp.Select, plan: Plan, schema: dict[str, dict[str, str]] | None) -> dict[int, list[str]]:
    """`Plan.eager`: the occurrences whose inserted rows can be aggregated before the joins, and the columns of each
    its rows are grouped by. Exact over inner joins: a group of rows equal in every column the joins, the WHERE and
    the keys read matches the same rows of the other tables as each of its rows does, so each partial SUM or COUNT
    counts as often as its rows would have (a dimension's duplicate id doubles both), and MIN/MAX do not care.
    Only for the insert merge's aggregates (plain SUM/COUNT/MIN/MAX, no DISTINCT, no HAVING, no floating SUM) whose
    arguments read one occurrence's columns; none for a single table (nothing to aggregate before)."""
    if plan.kind != AGGREGATE or plan.merge is None or plan.outer or len(plan.occurrences) < 2 or plan.semi:
        return {}
    if any(j.args.get("using") or j.args.get("method") for j in select.args.get("joins") or []):
        return {}
    keys = {k.column for k in plan.keys}
    aggregates = [s.unalias() for n, s in zip(plan.columns, select.selects) if n not in keys]
    try:
        read = {_owner(c, plan, schema) for a in aggregates for c in a.find_all(exp.Column)}
        outside = [
            (c, _owner(c, plan, schema))
            for c in select.find_all(exp.Column)
            if not any(_inside(c, a) for a in aggregates)
        ]
    except _Unresolved:
        return {}
    if None in read or any(
        isinstance(n, (exp.Star, exp.Dot)) and not isinstance(n.parent, exp.Count) for n in select.walk()
    ):
        return {}
    out = {}
    for o in plan.occurrences:
        if read - {o.index}:
            continue
        named: dict[str, str] = {}
        for c, owner in outside:
            if owner == o.index:
                named.setdefault(c.name.lower(), c.name)
        if named:  # none: a table joined by no condition of its own columns (grouped by nothing, one row)
            out[o.index] = list(named.values())
    return out


def _derived_from(query: exp.Expression) -> exp.Subquery | None:
    """The derived table a SELECT reads as its only FROM item (no joins), if it does."""
    if not isinstance(query, exp.Select) or query.args.get("joins"):
        return None
    tables = _from_tables(query)
    return tables[0] if len(tables) == 1 and isinstance(tables[0], exp.Subquery) else None


def derived_branches(select: exp.Select) -> list[exp.Select]:
    """The SELECTs of the query's derived table, left to right (one, or the branches of its UNION ALL): the nodes of
    this tree, so that a caller can replace them."""
    out: list[exp.Select] = []

    def walk(node: exp.Expression) -> None:
        while isinstance(node, exp.Subquery) and not node.alias:
            node = node.this
        if isinstance(node, exp.SetOperation):
            walk(node.this)
            walk(node.expression)
        else:
            out.append(node)

    walk(_derived_from(select).this)
    return out


def _derived_plan(select: exp.Select, names: list[str], lake_alias: str) -> Plan:
    """A SELECT (rows, or an aggregate with GROUP BY) over one derived table whose query is a rows or aggregate
    shape, or a UNION ALL of them (an inlined WITH clause that aggregates becomes one)."""
    derived = _derived_from(select)
    stand_in = select.copy()
    _from_tables(stand_in)[0].replace(exp.to_table("__derived").as_(derived.alias_or_name or "__derived"))
    shape = _check_shape(stand_in)  # DISTINCT, LIMIT, other subqueries, non-determinism: refused as elsewhere
    if semi_conjuncts(shape) or any(isinstance(n, exp.Window) for n in shape.walk()):
        raise _Full("SUBQUERY")
    body = derived.this
    if isinstance(body, exp.Select):
        if body.args.get("distinct"):
            raise _Full("SUBQUERY")
        branches = [body]
    else:
        branches, distinct = _union_branches(body)
        if branches is None or distinct:
            raise _Full("SUBQUERY")  # a UNION (distinct) inside
    plans = []
    for b in branches:
        p = _select_plan(_check_shape(b), [f"__c{i}" for i in range(len(b.selects))], lake_alias, None, None)
        if p.kind not in (ROWS, AGGREGATE) or p.outer:
            raise _Full("SUBQUERY")
        plans.append(p)
    occ = [o for b in plans for o in b.occurrences]
    common = {"occurrences": occ, "columns": names, "query": select, "branches": plans, "derived": True}
    if not shape.args.get("group"):
        if any(_is_aggregate(s) for s in shape.selects) or shape.args.get("having"):
            raise _Full("GLOBAL_AGGREGATE")
        return Plan(ROWS, **common)
    if any(isinstance(s.unalias(), exp.Star) for s in shape.selects) or len(shape.selects) != len(names):
        raise _Full("STAR_WITH_AGGREGATE")
    keys = _group_keys(select, names, None)
    return Plan(AGGREGATE, keys=keys, merge_reason="an aggregate over a derived table", **common)


def _partition_keys(select: exp.Select, names: list[str]) -> list[Key]:
    """The keys of a query whose window functions (in the select list or QUALIFY) all have one PARTITION BY: each
    must be a column of the result (an item of the select list, or a column a `*` gives), so the table's rows of a
    partition can be found and replaced."""
    if select.args.get("group") or select.args.get("windows"):  # windows over groups; WINDOW w AS (...)
        raise _Full("WINDOW_FUNCTION")
    for agg in select.find_all(exp.AggFunc):
        if not agg.find_ancestor(exp.Window):
            raise _Full("WINDOW_FUNCTION")  # an aggregate beside the windows
    partitions = {
        tuple(sorted(p.sql(DIALECT) for p in w.args.get("partition_by") or [])) for w in select.find_all(exp.Window)
    }
    if len(partitions) != 1 or not next(iter(partitions)):
        raise _Full("WINDOW_WITHOUT_PARTITION_BY")
    items = [s.unalias() for s in select.selects]
    star = any(isinstance(e, exp.Star) for e in items)
    by_name = {n.lower(): n for n in names}
    keys = []
    for p in next(w for w in select.find_all(exp.Window)).args["partition_by"]:
        matches = [i for i, e in enumerate(items) if e == p]
        if matches and len(items) == len(names):
            keys.append(Key(names[matches[0]], p))
        elif star and isinstance(p, exp.Column) and p.name.lower() in by_name:
            keys.append(Key(by_name[p.name.lower()], p))
        else:
            raise _Full("WINDOW_PARTITION_NOT_SELECTED")
    return keys


def _union_branches(query: exp.Expression) -> tuple[list[exp.Select] | None, bool]:
    """The branches of a UNION [ALL] (flattened, left to right) and whether the result is distinct; a SELECT
    DISTINCT is one branch. (None, False) for any other query."""
    if isinstance(query, exp.Select):
        if query.args.get("distinct") is None:
            return None, False
        if query.args["distinct"].args.get("on") is not None:  # DISTINCT ON: one row per key, which one is chosen
            raise _Full("DISTINCT")
        return [query], True
    if not isinstance(query, exp.SetOperation):
        return None, False
    if query.args.get("limit") or query.args.get("offset"):
        raise _Full("LIMIT")
    if query.args.get("with_") or query.args.get("with"):
        raise _Full("WITH_CLAUSE")
    kinds: set[bool] = set()
    out: list[exp.Select] = []

    def walk(node: exp.Expression, top: bool = False) -> None:
        while isinstance(node, exp.Subquery) and not node.alias:
            node = node.this
        if isinstance(node, exp.SetOperation):
            if not isinstance(node, exp.Union) or node.args.get("by_name") or node.args.get("side"):
                raise _Full("SET_OPERATION")
            if node.args.get("limit") or node.args.get("offset"):
                raise _Full("LIMIT")
            if node.args.get("order") and not top:  # a branch's own ORDER BY (with a LIMIT, refused above)
                raise _Full("SUBQUERY")
            kinds.add(bool(node.args.get("distinct")))
            walk(node.this)
            walk(node.expression)
        elif isinstance(node, exp.Select):
            out.append(node)
        else:
            raise _Full("SUBQUERY")

    walk(query, top=True)
    if len(kinds) > 1:
        raise _Full("SET_OPERATION")
    return out, kinds.pop()


def _branch(
    select: exp.Select, names: list[str], lake_alias: str, types: dict | None, source_columns: set[str] | None
) -> Plan:
    """One branch of a union (its DISTINCT, if any, kept in its query and noted)."""
    bare = select.copy()
    distinct = bare.args.get("distinct")
    if distinct is not None and distinct.args.get("on") is not None:
        raise _Full("DISTINCT")
    bare.set("distinct", None)
    if len(select.selects) != len(names) and not any(isinstance(s.unalias(), exp.Star) for s in select.selects):
        raise _Full("SET_OPERATION")
    plan = _select_plan(_check_shape(bare), names, lake_alias, types, source_columns)
    if plan.outer:
        raise _Full("OUTER_JOIN")
    plan.query, plan.distinct = select, distinct is not None
    return plan


def inline_ctes(query: exp.Expression, lake_alias: str, schema: dict[str, dict[str, str]] | None) -> exp.Expression:
    """The query with its WITH clause inlined: every read of a CTE becomes the derived table it names, and derived
    tables that only project and filter merge into their reader. Without `schema` (the sources' columns) an
    unqualified column could not be told apart from another table's, so a WITH clause then stays (FULL)."""
    with_ = query.args.get("with_") or query.args.get("with")
    if with_ is None:
        return query
    if with_.args.get("recursive") or schema is None:
        raise _Full("WITH_CLAUSE")
    for n in query.walk():  # DuckDB's own column syntax, which qualify might read otherwise than DuckDB does
        if isinstance(n, (exp.Lambda, exp.Columns)) or (
            isinstance(n, exp.Star) and any(n.args.get(a) for a in ("except", "except_", "replace", "rename"))
        ):
            raise _Full("WITH_CLAUSE")
    from sqlglot.optimizer.merge_subqueries import merge_subqueries
    from sqlglot.optimizer.qualify import qualify

    bodies: dict[str, exp.Expression] = {}

    def inline(node: exp.Expression) -> exp.Expression:
        def swap(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.Table) and not n.db and not n.catalog and n.name.lower() in bodies:
                return exp.Subquery(
                    this=bodies[n.name.lower()].copy(), alias=exp.TableAlias(this=exp.to_identifier(n.alias_or_name))
                )
            if isinstance(n, exp.Table) and isinstance(n.this, exp.Identifier):  # a lake table: schema.table
                canonical = exp.to_table(source_name(n, lake_alias))
                canonical.set("alias", exp.TableAlias(this=exp.to_identifier(n.alias_or_name)))
                return canonical
            return n

        return node.transform(swap)

    for cte in with_.expressions:
        if cte.args.get("materialized") is not None or cte.args.get("alias").columns:
            raise _Full("WITH_CLAUSE")  # WITH c(x, y) AS ...: columns renamed by position
        bodies[cte.alias_or_name.lower()] = inline(cte.this.copy())
    out = query.copy()
    out.set("with_" if "with_" in out.args else "with", None)
    out = inline(out)
    if any(isinstance(n, exp.CTE) for n in out.walk()):
        raise _Full("WITH_CLAUSE")  # a WITH nested in a subquery
    nested: dict = {}
    for name, cols in schema.items():  # qualify needs the names only; the types stay DuckDB's business
        db, table = name.lower().split(".")
        nested.setdefault(db, {})[table] = {c.lower(): "UNKNOWN" for c in cols}
    try:
        out = qualify(
            out,
            dialect=DIALECT,
            schema=nested,
            validate_qualify_columns=False,
            quote_identifiers=False,
            identify=False,
        )
        out = merge_subqueries(out)
    except Exception as exc:  # sqlglot could not resolve it: planned as written, in full
        raise _Full("WITH_CLAUSE") from exc
    selects = list(out.find_all(exp.Select))  # a derived table is left only as the top SELECT's one FROM item
    top = _derived_from(out)
    if any(isinstance(t, exp.Subquery) and t is not top for sel in selects for t in _from_tables(sel)):
        raise _Full("WITH_CLAUSE")
    return out


def all_sources(query: exp.Expression, lake_alias: str) -> list[str]:
    """Every lake table the query reads, anywhere in it (CTE names excluded): what a full refresh pins."""
    ctes = {c.alias_or_name.lower() for c in query.find_all(exp.CTE)}
    out = set()
    for t in query.find_all(exp.Table):
        if isinstance(t.this, exp.Identifier) and not (not t.db and t.name.lower() in ctes):
            out.add(source_name(t, lake_alias))
    return sorted(out)
