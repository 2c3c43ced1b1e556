"""How a dynamic table's query can be kept fresh, decided once from its sqlglot tree, and the queries a refresh
runs, written by rewriting that tree (never by pasting text together).

Shapes (`Plan.kind`):
- `aggregate`: SELECT keys..., aggregates... FROM lake tables [INNER JOIN ...] [WHERE] GROUP BY keys [HAVING].
  Incremental: the groups any source's changes touch (the affected keys, from the pre-images read against the
  old snapshot and the post-images against the new one) are deleted and computed again. When every change is an
  insert and every aggregate is SUM/COUNT/MIN/MAX (no HAVING), the groups are instead merged with the aggregates
  of the new rows alone, without reading the base tables' old rows.
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
(the usual delta rule), which is what `term` builds."""

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
    "SUBQUERY": "a subquery",
    "WINDOW_FUNCTION": "a window function over GROUP BY, beside an aggregate, or over a named WINDOW",
    "DISTINCT": "SELECT DISTINCT",
    "LIMIT": "LIMIT / OFFSET",
    "OUTER_JOIN": "a RIGHT or FULL outer, semi, anti, ASOF or lateral join (or a LEFT JOIN in a union)",
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
    outer: bool = False  # ROWS/AGGREGATE: LEFT JOINs; each result row belongs to one row of the first table

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

    def explain(self) -> str:
        if self.kind == FULL:
            return f"{self.reason}: {REASONS[self.reason]}"
        if self.kind == ROWS and self.outer:
            return (
                "rows over LEFT JOINs: the rows of the first table a change reaches (its own, or through a matching "
                "row) have their result rows, NULL-padded ones included, replaced"
            )
        if self.kind == ROWS:
            return "rows: inserts appended, other changes replace the affected rows"
        if self.kind == UNION:
            shape = "SELECT DISTINCT" if len(self.branches) == 1 else f"UNION{'' if self.distinct else ' ALL'}"
            kinds = ", ".join(b.kind for b in self.branches)
            added = "added when new" if self.distinct else "appended"
            return (
                f"union: {shape} of {len(self.branches)} branch{'es' if len(self.branches) > 1 else ''} ({kinds}), "
                f"each from its own sources' changes; inserts into rows branches {added}, other changes replace "
                "the affected rows"
            )
        how = (
            "inserts merged into their groups (" + ", ".join(f"{m.column}: {m.function}" for m in self.merge) + ")"
            if self.merge is not None
            else f"inserts recompute their groups ({self.merge_reason})"
        )
        over = " over LEFT JOINs" if self.outer else ""
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
    for node in query.walk():
        if node is not query and isinstance(node, (exp.Select, exp.Subquery)):
            raise _Full("SUBQUERY")
        if isinstance(node, exp.TableSample):
            raise _Full("SAMPLE")
        if isinstance(node, NONDETERMINISTIC) or (
            isinstance(node, exp.Anonymous) and str(node.this).lower() in NONDETERMINISTIC_NAMES
        ):
            raise _Full("NONDETERMINISTIC_FUNCTION")
    for join in query.args.get("joins") or []:
        if (
            (join.args.get("side") or "LEFT").upper() != "LEFT"  # RIGHT, FULL: the first table's rows may be padded
            or join.args.get("kind") in ("SEMI", "ANTI")
            or join.args.get("method")
            or isinstance(join.this, exp.Lateral)
        ):
            raise _Full("OUTER_JOIN")
    return query


def _outer(select: exp.Select) -> bool:
    return any(j.args.get("side") for j in select.args.get("joins") or [])


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
        branches, distinct = _union_branches(query)
        if branches is not None:
            plans = [_branch(b, names, lake_alias, types, source_columns) for b in branches]
            occ = [o for b in plans for o in b.occurrences]
            return Plan(
                UNION, occurrences=occ, columns=names, read=read, query=query, branches=plans, distinct=distinct
            )
        out = _select_plan(_check_shape(query), names, lake_alias, types, source_columns)
        out.read = read
        return out
    except _Full as full:
        return Plan(FULL, full.reason, [], names, read=read)


def _select_plan(
    select: exp.Select, names: list[str], lake_alias: str, types: dict | None, source_columns: set[str] | None
) -> Plan:
    occ = occurrences(select, lake_alias)
    if any(isinstance(n, exp.Window) for n in select.walk()):
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
        return Plan(ROWS, occurrences=occ, columns=names, query=select, outer=_outer(select))
    if any(isinstance(s, exp.Star) or isinstance(s.unalias(), exp.Star) for s in select.selects) or len(
        select.selects
    ) != len(names):
        raise _Full("STAR_WITH_AGGREGATE")
    keys = _group_keys(select, names, source_columns)
    merge, why = _merge_columns(select, names, keys, types)
    if _outer(select):
        merge, why = None, "a LEFT JOIN: a new row on its optional side can take the place of a NULL-padded one"
    return Plan(
        AGGREGATE,
        occurrences=occ,
        columns=names,
        keys=keys,
        merge=merge,
        merge_reason=why,
        query=select,
        outer=_outer(select),
    )


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
    selects = [out] if isinstance(out, exp.Select) else list(out.find_all(exp.Select))
    if any(isinstance(t, exp.Subquery) for sel in selects for t in _from_tables(sel)):
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


# ---- rewriting -----------------------------------------------------------------------------------------------


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


def term(select: exp.Select, lake_alias: str, bound: dict[int, exp.Table], before: int, after: int) -> exp.Select:
    """The query with occurrence i read from `bound[i]` (a temporary table of changes), the occurrences before
    the first bound one at snapshot `before` and the others at snapshot `after`."""
    out = select.copy()
    out.set("order", None)  # terms are joined with UNION ALL; the order of a table's rows means nothing anyway
    first = min(bound)
    for i, t in enumerate(_from_tables(out)):
        new = bound[i] if i in bound else _pinned_table(t, lake_alias, before if i < first else after)
        t.replace(new)
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
    join = out.args["joins"][index - 1]
    join.set("side", None)
    join.set("kind", None)
    for i, t in enumerate(_from_tables(out)):
        t.replace(table if i == index else _pinned_table(t, lake_alias, at))
    out.set("expressions", [c.copy() for c in columns])
    return out


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
