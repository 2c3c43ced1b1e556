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
- `full`: anything else, with a named reason (`REASONS`); AUTO refreshes it in full, INCREMENTAL refuses it.

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

AGGREGATE, ROWS, FULL = "aggregate", "rows", "full"
# why a query is refreshed in full (Databricks-style codes, shown by `dynamic show`)
REASONS = {
    "SET_OPERATION": "UNION / INTERSECT / EXCEPT",
    "WITH_CLAUSE": "a WITH clause (common table expression)",
    "SUBQUERY": "a subquery",
    "WINDOW_FUNCTION": "a window function",
    "DISTINCT": "SELECT DISTINCT",
    "LIMIT": "LIMIT / OFFSET",
    "OUTER_JOIN": "an outer, semi, anti, ASOF or lateral join",
    "NONDETERMINISTIC_FUNCTION": "a non-deterministic function",
    "TABLE_FUNCTION": "a table function or a file in FROM (not a table of the lake)",
    "GROUPING_SETS": "GROUPING SETS / ROLLUP / CUBE",
    "GROUP_KEY_NOT_SELECTED": "a GROUP BY key that is not a column of the result",
    "GLOBAL_AGGREGATE": "an aggregate without GROUP BY",
    "STAR_WITH_AGGREGATE": "SELECT * with GROUP BY",
    "QUALIFY": "QUALIFY",
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

    @property
    def sources(self) -> list[str]:
        return self.read or sorted({o.source for o in self.occurrences})

    @property
    def incremental(self) -> bool:
        return self.kind != FULL

    def explain(self) -> str:
        if self.kind == FULL:
            return f"{self.reason}: {REASONS[self.reason]}"
        if self.kind == ROWS:
            return "rows: inserts appended, other changes replace the affected rows"
        how = (
            "inserts merged into their groups (" + ", ".join(f"{m.column}: {m.function}" for m in self.merge) + ")"
            if self.merge is not None
            else f"inserts recompute their groups ({self.merge_reason})"
        )
        return f"aggregate by {', '.join(k.column for k in self.keys)}: affected groups recomputed; {how}"


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
    if query.args.get("qualify"):
        raise _Full("QUALIFY")
    for node in query.walk():
        if node is not query and isinstance(node, (exp.Select, exp.Subquery)):
            raise _Full("SUBQUERY")
        if isinstance(node, exp.Window):
            raise _Full("WINDOW_FUNCTION")
        if isinstance(node, exp.TableSample):
            raise _Full("SAMPLE")
        if isinstance(node, NONDETERMINISTIC) or (
            isinstance(node, exp.Anonymous) and str(node.this).lower() in NONDETERMINISTIC_NAMES
        ):
            raise _Full("NONDETERMINISTIC_FUNCTION")
    for join in query.args.get("joins") or []:
        if (
            join.args.get("side")
            or join.args.get("kind") in ("SEMI", "ANTI")
            or join.args.get("method")
            or isinstance(join.this, exp.Lateral)
        ):
            raise _Full("OUTER_JOIN")
    return query


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
) -> Plan:
    """The plan of `query` (parsed by sqlglot), whose result has the columns `names` (as DuckDB names them) of
    `types` (column -> DuckDB type), reading tables whose columns are `source_columns` (lower case)."""
    read = all_sources(query, lake_alias)
    try:
        select = _check_shape(query)
        occ = occurrences(select, lake_alias)
        if not select.args.get("group"):
            if any(_is_aggregate(s) for s in select.selects) or select.args.get("having"):
                raise _Full("GLOBAL_AGGREGATE")
            return Plan(ROWS, occurrences=occ, columns=names, read=read)
        if any(isinstance(s, exp.Star) or isinstance(s.unalias(), exp.Star) for s in select.selects) or len(
            select.selects
        ) != len(names):
            raise _Full("STAR_WITH_AGGREGATE")
        keys = _group_keys(select, names, source_columns)
        merge, why = _merge_columns(select, names, keys, types)
        return Plan(AGGREGATE, occurrences=occ, columns=names, keys=keys, merge=merge, merge_reason=why, read=read)
    except _Full as full:
        return Plan(FULL, full.reason, [], names, read=read)


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


def key_column(i: int) -> str:
    """The name of key i in a table of affected keys: never a name the query's own columns use, so a key's
    unqualified columns still mean the query's tables inside the EXISTS of `restricted`."""
    return f"__k{i}"


def key_select(select: exp.Select, keys: list[Key]) -> exp.Select:
    """The query's rows reduced to its group keys (columns __k0, __k1, ...), one row per key."""
    out = select.copy()
    for arg in ("group", "having", "order", "limit", "offset"):
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
