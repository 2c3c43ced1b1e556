"""The dynamic-table language and the planner, without services: every statement form, every refusal as one line,
and for each query shape the plan (with its named reason) and the keys traced to the sources' own columns."""

from __future__ import annotations

import pytest
import sqlglot

from ducklake_kit.dynamic_tables import ddl, rewrite
from ducklake_kit.dynamic_tables import plan as planner


def one(text: str):
    [stmt] = ddl.parse(text)
    return stmt


def test_create_with_every_property():
    s = one(
        "CREATE OR REPLACE DYNAMIC TABLE Sales.Daily TARGET_LAG = '5 minutes' REFRESH_MODE = incremental "
        "INITIALIZE = ON_SCHEDULE AS SELECT d, sum(x) AS s FROM t GROUP BY d"
    )
    assert (s.name, s.lag.seconds, s.refresh_mode, s.initialize, s.or_replace) == (
        "sales.daily",
        300,
        "INCREMENTAL",
        "ON_SCHEDULE",
        True,
    )
    assert s.query == "SELECT d, sum(x) AS s FROM t GROUP BY d"
    assert isinstance(s.select, sqlglot.exp.Select)


def test_defaults_downstream_and_main_schema():
    s = one("create dynamic table daily target_lag = downstream as select 1 as one")
    assert (s.name, s.lag.downstream, s.refresh_mode, s.initialize, s.or_replace) == (
        "main.daily",
        True,
        "ADAPTIVE",
        "ON_CREATE",
        False,
    )
    assert str(s.lag) == "DOWNSTREAM"


def test_semicolons_and_comments_inside_the_query_are_not_separators():
    text = """CREATE DYNAMIC TABLE a TARGET_LAG = '1 hour' AS SELECT 'x;y' AS s -- a comment; with a semicolon
              FROM t;
              /* ; */ CREATE DYNAMIC TABLE b TARGET_LAG = '2 days' AS SELECT 2 AS two;"""
    a, b = ddl.parse(text)
    assert a.name == "main.a" and "'x;y'" in a.query and a.query.rstrip().endswith("FROM t")
    assert (b.name, b.lag.seconds, str(b.lag)) == ("main.b", 2 * 86400, "2 days")


@pytest.mark.parametrize(
    "text, action, lag",
    [
        ("ALTER DYNAMIC TABLE s.x SUSPEND", "SUSPEND", None),
        ("alter dynamic table x resume", "RESUME", None),
        ("ALTER DYNAMIC TABLE x REFRESH", "REFRESH", None),
        ("ALTER DYNAMIC TABLE x SET TARGET_LAG = '30 seconds'", "SET_LAG", 30),
    ],
)
def test_alter(text, action, lag):
    s = one(text)
    assert isinstance(s, ddl.AlterDynamicTable) and s.action == action
    assert (s.lag.seconds if s.lag else None) == lag


def test_drop_and_show():
    assert one("DROP DYNAMIC TABLE IF EXISTS s.x") == ddl.DropDynamicTable("s.x", True)
    assert one("SHOW DYNAMIC TABLES") == ddl.ShowDynamicTables()


def test_is_dynamic_tells_dynamic_ddl_from_other_sql():
    assert ddl.has_dynamic("SELECT 1; CREATE DYNAMIC TABLE x TARGET_LAG = '1 minute' AS SELECT 1 AS a")
    assert not ddl.has_dynamic("CREATE TABLE dynamic (x INT); SELECT 'CREATE DYNAMIC TABLE'")
    assert not ddl.has_dynamic("CREATE OR REPLACE TABLE t AS SELECT 1")


@pytest.mark.parametrize(
    "text, message",
    [
        ("CREATE DYNAMIC TABLE x AS SELECT 1", "dynamic table main.x has no TARGET_LAG"),
        ("CREATE DYNAMIC TABLE x TARGET_LAG = '5 fortnights' AS SELECT 1", "TARGET_LAG '5 fortnights' is not a lag"),
        ("CREATE DYNAMIC TABLE x TARGET_LAG = '0 minutes' AS SELECT 1", "TARGET_LAG '0 minutes' is not a lag"),
        ("CREATE DYNAMIC TABLE x TARGET_LAG = 5 AS SELECT 1", "TARGET_LAG = 5 is not a lag"),
        ("CREATE DYNAMIC TABLE x TARGET_LAG = '\u00b2 days' AS SELECT 1", "TARGET_LAG '\u00b2 days' is not a lag"),
        (
            "CREATE DYNAMIC TABLE x TARGET_LAG = '24856 days' AS SELECT 1",
            "TARGET_LAG '24856 days' is too long: the longest lag is 24855 days",
        ),
        (
            "CREATE DYNAMIC TABLE x TARGET_LAG = '1 minute' REFRESH_MODE = LAZY AS SELECT 1",
            "REFRESH_MODE = LAZY is not a mode",
        ),
        (
            "CREATE DYNAMIC TABLE x TARGET_LAG = '1 minute' TARGET_LAG = '2 minutes' AS SELECT 1",
            "TARGET_LAG is given twice",
        ),
        ("CREATE DYNAMIC TABLE x TARGET_LAG = '1 minute' WAREHOUS = w AS SELECT 1", "unknown property 'WAREHOUS'"),
        ("CREATE DYNAMIC TABLE x TARGET_LAG = '1 minute' AS", "has no query after AS"),
        ("CREATE DYNAMIC TABLE x TARGET_LAG = '1 minute' AS SELECT FROM WHERE (", "does not parse"),
        ("CREATE DYNAMIC TABLE x TARGET_LAG = '1 minute' AS DELETE FROM t", "is defined by a DELETE statement"),
        ("CREATE DYNAMIC TABLE a.b.c TARGET_LAG = '1 minute' AS SELECT 1", "'a.b.c' is not a dynamic table name"),
        (
            "CREATE DYNAMIC TABLE lake.a.b.c TARGET_LAG = '1 minute' AS SELECT 1",
            "'lake.a.b.c' is not a dynamic table name",
        ),
        ("CREATE DYNAMIC TABLE other.main.t TARGET_LAG = '1 minute' AS SELECT 1", "'other.main.t' is not a dynamic"),
        ("ALTER DYNAMIC TABLE x EXPLODE", "expected SET TARGET_LAG but found 'EXPLODE'"),
        ("DROP DYNAMIC TABLE x y", "unexpected 'y'"),
        ("SELECT 1", "`SELECT 1` is not a dynamic-table statement"),
        ("", "no statement given"),
    ],
)
def test_bad_statements_are_one_clear_line(text, message):
    with pytest.raises(ddl.DdlError) as info:
        ddl.parse(text)
    line = info.value.line()
    assert message in line and "Try:" in line and "\n" not in line


@pytest.mark.parametrize(
    "query, named",
    [
        ("SELECT g, random() AS r FROM t", "random()"),
        ("SELECT id FROM t WHERE id < RANDOM() * 1000", "RANDOM()"),
        ("SELECT id, gen_random_uuid()::VARCHAR AS u FROM t", "gen_random_uuid()"),
        ("WITH c AS (SELECT id, uuid() AS u FROM t) SELECT id, u FROM c", "uuid()"),
        ("SELECT id FROM t WHERE id IN (SELECT id FROM u WHERE uuidv7() IS NOT NULL)", "uuidv7()"),
        ("SELECT setseed(0.5) AS s, id FROM t", "setseed()"),
    ],
)
def test_random_functions_are_refused_wherever_they_are_and_named(query, named):
    # issue 29: such tables were accepted, then every `dynamic refresh --check` exited 1 forever
    with pytest.raises(ddl.DdlError) as info:
        ddl.parse(f"CREATE DYNAMIC TABLE x TARGET_LAG = '1 hour' AS {query}")
    line = info.value.line()
    assert line.startswith(f"Error: the query of dynamic table main.x calls {named}, which is not deterministic")
    assert "Try:" in line and "\n" not in line


def test_functions_of_the_clock_are_accepted_and_found_in_the_order_written():
    [stmt] = ddl.parse(
        "CREATE DYNAMIC TABLE x TARGET_LAG = '1 hour' AS SELECT g, now() AS seen FROM t "
        "WHERE d <= current_date AND id IN (SELECT id FROM u WHERE ts < get_current_timestamp())"
    )
    assert ddl.time_calls(stmt.select, stmt.query) == ["now()", "current_date", "get_current_timestamp()"]
    assert ddl.random_calls(stmt.select, stmt.query) == []


# ---- the planner ---------------------------------------------------------------------------------------------


def plan_of(
    query: str,
    names: list[str] | None = None,
    *,
    types: dict[str, str] | None = None,
    columns: set[str] | None = frozenset(),
) -> planner.Plan:
    """The plan, the result's column names being the select items' own unless given (DuckDB names them in the kit);
    `columns`: the sources' column names (the kit reads them from the catalog)."""
    parsed = sqlglot.parse_one(query, read="duckdb")
    if names is None:
        names = [s.alias_or_name for s in parsed.selects] if isinstance(parsed, sqlglot.exp.Select) else ["a"]
    return planner.analyze(parsed, names, "lake", types=types, source_columns=columns)


@pytest.mark.parametrize(
    "query, reason",
    [
        ("SELECT a FROM t INTERSECT SELECT a FROM u", "SET_OPERATION"),
        ("SELECT a FROM t UNION ALL SELECT a FROM u UNION SELECT a FROM v", "SET_OPERATION"),
        ("WITH c AS (SELECT a FROM t) SELECT a FROM c", "WITH_CLAUSE"),  # without the sources' columns
        ("SELECT a FROM t WHERE a > (SELECT max(a) FROM u)", "SUBQUERY"),  # IN (SELECT ...) is a semi-join
        ("SELECT a, row_number() OVER (ORDER BY a) AS r FROM t", "WINDOW_WITHOUT_PARTITION_BY"),
        (
            "SELECT a, rank() OVER (PARTITION BY a) AS r, rank() OVER (PARTITION BY b) AS q FROM t",
            "WINDOW_WITHOUT_PARTITION_BY",
        ),
        ("SELECT b, row_number() OVER (PARTITION BY a ORDER BY b) AS r FROM t", "WINDOW_PARTITION_NOT_SELECTED"),
        (
            "SELECT a, sum(b) AS s, rank() OVER (PARTITION BY a ORDER BY sum(b)) AS r FROM t GROUP BY a",
            "WINDOW_FUNCTION",
        ),
        ("SELECT DISTINCT ON (a) a, b FROM t ORDER BY a, b", "DISTINCT"),
        ("SELECT a FROM t LIMIT 5", "LIMIT"),
        ("SELECT * FROM t RIGHT JOIN u ON t.a = u.a", "OUTER_JOIN"),  # swapped, `*` would reorder the columns
        ("SELECT t.a FROM t JOIN v ON t.a = v.a RIGHT JOIN u ON t.a = u.a", "OUTER_JOIN"),
        ("SELECT t.a FROM t FULL OUTER JOIN u ON t.a = u.a FULL JOIN v ON u.a = v.a", "OUTER_JOIN"),
        ("SELECT a FROM t LEFT JOIN u USING (a) UNION ALL SELECT a FROM u", "OUTER_JOIN"),
        ("SELECT t.a FROM t ANTI JOIN u ON t.a = u.a", "OUTER_JOIN"),
        ("SELECT a, random() AS r FROM t", "NONDETERMINISTIC_FUNCTION"),
        ("SELECT a, now() AS r FROM t", "NONDETERMINISTIC_FUNCTION"),
        ("SELECT a FROM read_parquet('x.parquet')", "TABLE_FUNCTION"),
        ("SELECT a, sum(b) AS s FROM t GROUP BY ROLLUP (a)", "GROUPING_SETS"),
        ("SELECT sum(b) AS s FROM t GROUP BY a", "GROUP_KEY_NOT_SELECTED"),
        ("SELECT count(*) AS n FROM t", "GLOBAL_AGGREGATE"),
        ("SELECT sum(v) AS s, count(*) AS n FROM t GROUP BY ALL", "GLOBAL_AGGREGATE"),
        ("SELECT a FROM t USING SAMPLE 5", "SAMPLE"),
    ],
)
def test_shapes_refreshed_in_full_have_a_named_reason(query, reason):
    p = plan_of(query)
    assert (p.kind, p.reason) == (planner.FULL, reason)
    assert reason in p.explain()


def test_a_right_join_is_planned_as_the_left_join_of_its_tables_swapped():
    p = plan_of("SELECT u.a, t.b FROM t RIGHT JOIN u ON t.a = u.a LEFT JOIN v ON v.a = t.b")
    assert (p.kind, [o.source for o in p.occurrences]) == (planner.ROWS, ["main.u", "main.t", "main.v"])
    assert p.outer and p.explain().startswith("rows over LEFT JOINs (a RIGHT JOIN with its two tables swapped)")
    assert p.query.sql() == "SELECT u.a, t.b FROM u LEFT JOIN t ON t.a = u.a LEFT JOIN v ON v.a = t.b"


def test_keys_are_traced_through_aliases_ordinals_and_expressions():
    p = plan_of(
        "SELECT z.borough AS b, date_trunc('day', t.pickup) AS day, sum(t.fare) AS s, count(*) AS n "
        "FROM trips AS t JOIN zones AS z ON t.zone = z.id GROUP BY 1, day",
        ["b", "day", "s", "n"],
        columns={"pickup", "fare", "zone", "id", "borough"},
    )
    assert p.kind == planner.AGGREGATE
    assert [(k.column, k.expr.sql("duckdb")) for k in p.keys] == [
        ("b", "z.borough"),
        ("day", "DATE_TRUNC('DAY', t.pickup)"),
    ]
    assert [(o.source, o.ref) for o in p.occurrences] == [("main.trips", "t"), ("main.zones", "z")]
    assert [(m.column, m.function) for m in p.merge] == [("s", "sum"), ("n", "count")]


def test_group_by_expression_matches_the_selected_expression():
    p = plan_of("SELECT k % 3 AS bucket, max(v) AS m FROM s.facts GROUP BY k % 3", ["bucket", "m"])
    assert [(k.column, k.expr.sql("duckdb")) for k in p.keys] == [("bucket", "k % 3")]
    assert p.sources == ["s.facts"]


def test_group_by_all_takes_the_non_aggregates():
    p = plan_of("SELECT a, b, min(c) AS m FROM t GROUP BY ALL", ["a", "b", "m"])
    assert [k.column for k in p.keys] == ["a", "b"]


def test_a_group_by_name_that_is_a_column_means_the_column_not_the_alias():
    """DuckDB groups `SELECT k % 3 AS k ... GROUP BY k` by the column k: the key is not in the result."""
    p = plan_of("SELECT k % 3 AS k, sum(v) AS s FROM t GROUP BY k", columns={"k", "v"})
    assert (p.kind, p.reason) == (planner.FULL, "GROUP_KEY_NOT_SELECTED")
    assert (
        plan_of("SELECT k % 3 AS bucket, sum(v) AS s FROM t GROUP BY bucket", columns={"k", "v"}).kind
        == planner.AGGREGATE
    )


def test_sources_of_a_full_plan_include_subqueries_and_ctes():
    p = plan_of("WITH x AS (SELECT k FROM s.u) SELECT k FROM x WHERE k IN (SELECT k FROM t)")
    assert (p.kind, p.sources) == (planner.FULL, ["main.t", "s.u"])


@pytest.mark.parametrize(
    "query, message",
    [
        ("SELECT k FROM t AT (VERSION => 2)", "at a version of its own"),
        ('SELECT k FROM "x.y"', "a name with a dot in it"),
    ],
)
def test_sources_the_kit_cannot_keep_fresh_are_refused(query, message):
    with pytest.raises(ddl.DdlError, match=message):
        plan_of(query)


def test_a_parenthesized_query_and_a_dotted_name():
    assert one("CREATE DYNAMIC TABLE x TARGET_LAG = '1 hour' AS (SELECT 1 AS a)").select.sql() == "SELECT 1 AS a"
    with pytest.raises(ddl.DdlError, match="is not a dynamic table name"):
        ddl.parse("CREATE DYNAMIC TABLE \"a.b\" TARGET_LAG = '1 hour' AS SELECT 1 AS a")


@pytest.mark.parametrize(
    "query, why",
    [
        ("SELECT a, max(b, 2) AS x FROM t GROUP BY a", "x is not a plain SUM, COUNT, MIN or MAX of one argument"),
        ("SELECT a, avg(b) AS x FROM t GROUP BY a", "x is not a plain SUM, COUNT, MIN or MAX"),
        ("SELECT a, sum(b) / count(*) AS x FROM t GROUP BY a", "x is not a plain SUM"),
        ("SELECT a, count(DISTINCT b) AS x FROM t GROUP BY a", "x aggregates DISTINCT values"),
        ("SELECT a, sum(b) AS x FROM t GROUP BY a HAVING sum(b) > 1", "HAVING"),
    ],
)
def test_aggregates_that_cannot_merge_inserts_still_refresh_incrementally(query, why):
    p = plan_of(query, ["a", "x"])
    assert p.kind == planner.AGGREGATE and p.merge is None and p.merge_reason.startswith(why)


def test_a_floating_point_sum_is_not_merged():
    p = plan_of(
        "SELECT a, sum(b) AS s, max(b) AS m FROM t GROUP BY a", types={"a": "INTEGER", "s": "DOUBLE", "m": "DOUBLE"}
    )
    assert p.kind == planner.AGGREGATE and p.merge is None and p.merge_reason.startswith("s sums floating point")


def test_a_table_of_another_catalog_is_refused():
    with pytest.raises(ddl.DdlError, match="not a table of the lake"):
        plan_of("SELECT a FROM other.main.t", ["a"])


def test_pinned_reads_every_table_at_the_snapshot_but_not_ctes():
    q = sqlglot.parse_one("WITH c AS (SELECT a FROM s.t) SELECT * FROM c JOIN u AS x ON c.a = x.a", read="duckdb")
    out = rewrite.pinned(q, "lake", 7).sql("duckdb")
    assert "lake.s.t AS t AT (VERSION => 7)" in out and "lake.main.u AS x AT (VERSION => 7)" in out
    assert "FROM c JOIN" in out
    assert planner.all_sources(q, "lake") == ["main.u", "s.t"]


SCHEMA = {"main.t": {"a": "INTEGER", "b": "INTEGER"}, "s.u": {"a": "INTEGER", "c": "VARCHAR"}}


@pytest.mark.parametrize(
    "query, kind, how",
    [
        ("SELECT a, b FROM t UNION ALL SELECT a, 1 FROM s.u", planner.UNION, "UNION ALL of 2 branches (rows, rows)"),
        ("SELECT a FROM t UNION SELECT a FROM s.u", planner.UNION, "UNION of 2 branches (rows, rows)"),
        ("SELECT DISTINCT a, b FROM t", planner.UNION, "SELECT DISTINCT of 1 branch (rows)"),
        (
            "SELECT a, sum(b) AS s FROM t GROUP BY a UNION ALL SELECT a, count(*) FROM s.u GROUP BY a",
            planner.UNION,
            "UNION ALL of 2 branches (aggregate, aggregate)",
        ),
        (
            "SELECT a, b, sum(b) OVER (PARTITION BY a ORDER BY b) AS running FROM t",
            planner.WINDOW,
            "window partitioned by a",
        ),
        (
            "SELECT * FROM t QUALIFY row_number() OVER (PARTITION BY a ORDER BY b DESC) = 1",
            planner.WINDOW,
            "window partitioned by a",
        ),
        (
            "WITH c AS (SELECT a, b * 2 AS d FROM t WHERE b > 0) SELECT a, sum(d) AS s FROM c GROUP BY a",
            planner.AGGREGATE,
            "aggregate by a",
        ),
        (
            "WITH c AS (SELECT * FROM t), z AS (SELECT a, c AS w FROM s.u) SELECT c.b, z.w FROM c JOIN z ON c.a = z.a",
            planner.ROWS,
            "rows",
        ),
    ],
)
def test_unions_distinct_windows_and_inlined_ctes_are_incremental(query, kind, how):
    parsed = sqlglot.parse_one(query, read="duckdb")
    names = [
        s.alias_or_name for s in (parsed.selects if isinstance(parsed, sqlglot.exp.Select) else parsed.this.selects)
    ]
    if names == ["*"]:  # DuckDB names what a star gives
        names = list(SCHEMA["main.t"])
    p = planner.analyze(parsed, names, "lake", schema=SCHEMA)
    assert p.kind == kind and how in p.explain(), p.explain()


def test_an_inlined_cte_reads_the_sources_columns_not_its_own_names():
    """c.k is u.a under another name: merged into the reader, `k` must become the source's `a` (qualified), never a
    bare `k` that could bind to another table's column of that name."""
    p = planner.analyze(
        sqlglot.parse_one("WITH c AS (SELECT a AS k FROM s.u) SELECT k, t.b FROM c JOIN t ON c.k = t.a", read="duckdb"),
        ["k", "b"],
        "lake",
        schema=SCHEMA,
    )
    assert p.kind == planner.ROWS
    assert p.query.sql("duckdb") == "SELECT u.a AS k, t.b AS b FROM s.u AS u JOIN main.t AS t ON u.a = t.a"


@pytest.mark.parametrize(
    "query",
    [
        "WITH c AS (SELECT * EXCLUDE (b) FROM t) SELECT a FROM c",
        "WITH c AS (SELECT a, list_transform([b], x -> x + 1) AS m FROM t) SELECT a, m FROM c",
        "WITH c AS (SELECT COLUMNS('a|b') FROM t) SELECT a FROM c",
        "WITH RECURSIVE c AS (SELECT 1 AS a UNION ALL SELECT a + 1 FROM c WHERE a < 3) SELECT a FROM c",
    ],
)
def test_a_with_clause_in_duckdbs_own_column_syntax_or_recursive_is_not_inlined(query):
    p = planner.analyze(sqlglot.parse_one(query, read="duckdb"), ["a"], "lake", schema=SCHEMA)
    assert (p.kind, p.reason) == (planner.FULL, "WITH_CLAUSE")
