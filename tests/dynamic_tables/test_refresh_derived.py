"""Queries over one derived table refreshed incrementally, proven by the oracle: an aggregate over a UNION ALL (of
rows branches, of a join, of aggregates), rows filtered from a UNION ALL, and WITH clauses that aggregate (inlined
into a derived table: rows filtered from groups, groups of groups). After every refresh of a random stream of
inserts, updates and deletes (NULL keys and values, many duplicate rows) the table equals its query run in full
(EXCEPT ALL both ways), and every refresh was INCREMENTAL. Shares the tables and change streams of
test_refresh_union."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ducklake_kit.dynamic_tables import plan as planner
from tests.dynamic_tables.oracle import apply, created, ops, prove, sources
from tests.dynamic_tables.test_refresh import S

TABLES = {
    "a_union": f"SELECT k, count(*) AS n, sum(v) AS s FROM (SELECT k, v FROM {S}.ufacts UNION ALL "
    f"SELECT k, v FROM {S}.umore) AS u GROUP BY k",
    "a_union_join": f"SELECT region, count(*) AS n, max(w) AS w FROM (SELECT d.region, f.w FROM {S}.ufacts AS f "
    f"JOIN {S}.udims AS d ON f.d = d.id UNION ALL SELECT w, w FROM {S}.umore) AS u GROUP BY region",
    "a_union_aggs": f"SELECT k, sum(n) AS n FROM (SELECT k, count(*) AS n FROM {S}.ufacts GROUP BY k UNION ALL "
    f"SELECT k, count(*) FROM {S}.umore GROUP BY k) AS u GROUP BY k",
    "rows_union": f"SELECT u.k, u.w FROM (SELECT k, w FROM {S}.ufacts UNION ALL SELECT k, w FROM {S}.umore) AS u "
    "WHERE u.k > 1 OR u.w IS NULL",
    "cte_groups": f"WITH c AS (SELECT k, count(*) AS n, sum(v) AS s FROM {S}.ufacts GROUP BY k) "
    "SELECT k, n, s FROM c WHERE n > 1",
    "cte_histogram": f"WITH c AS (SELECT k, count(*) AS n FROM {S}.umore GROUP BY k) "
    "SELECT n, count(*) AS groups FROM c GROUP BY n",
    "cte_join_groups": f"WITH c AS (SELECT d.region, sum(f.v) AS s, count(*) AS n FROM {S}.ufacts AS f "
    f"JOIN {S}.udims AS d ON f.d = d.id GROUP BY d.region) SELECT region, s FROM c WHERE n < 3",
}
NAMES = [f"{S}.{n}" for n in TABLES]


@pytest.fixture(scope="module")
def derived(env):
    sources(
        env,
        dims="(0, 'a'), (1, 'b'), (2, NULL), (3, 'a')",
        facts="(1, 1, 0, 1.50, 'a'), (2, NULL, 1, 2.25, NULL), (3, 1, 0, 1.50, 'a')",
        more="(1, 1, 0, 1.50, 'a'), (2, 3, 2, NULL, 'b')",
    )
    created(env, TABLES)
    yield env
    env.drop_all()


def test_queries_over_a_derived_table_are_planned_incremental(derived):
    plans = {d.name: d for d in derived.meta.all() if d.name in NAMES}
    assert {n: plans[n].plan_kind for n in NAMES} == {
        f"{S}.{n}": planner.ROWS
        if n.startswith("rows") or n in ("cte_groups", "cte_join_groups")
        else planner.AGGREGATE
        for n in TABLES
    }
    assert plans[f"{S}.a_union_aggs"].plan.startswith(
        "aggregate by k over a derived table (UNION ALL of 2 branches: aggregate, aggregate)"
    )
    assert plans[f"{S}.cte_groups"].plan.startswith("rows over a derived table (a query: aggregate)")


@settings(max_examples=10, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ops, min_size=1, max_size=6))
def test_every_refresh_over_a_derived_table_equals_a_full_recompute(derived, stream):
    for op in stream:
        if op[0] == "refresh":
            prove(derived, NAMES)
        else:
            apply(derived, op)
    prove(derived, NAMES)
