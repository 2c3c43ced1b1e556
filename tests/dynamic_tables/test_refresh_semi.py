"""Semi and anti joins ([NOT] EXISTS, [NOT] IN over one table, as conditions of the WHERE) refreshed incrementally,
proven by the oracle: random streams on the outer table and on the subqueries' tables (NULL keys and values, a NULL
entering or leaving a NOT IN list, a subquery becoming empty, self anti-joins), after every refresh the table equals
its query run in full (EXCEPT ALL both ways) and the refresh was INCREMENTAL. Shares the tables and change streams
of test_refresh_union."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ducklake_kit.dynamic_tables import plan as planner
from ducklake_kit.errors import KitError
from tests.dynamic_tables.oracle import apply, created, ops, prove, sources
from tests.dynamic_tables.test_refresh import INCREMENTAL, S

TABLES = {
    "s_exists": f"SELECT f.id, f.k FROM {S}.ufacts AS f "
    f"WHERE EXISTS (SELECT 1 FROM {S}.udims AS d WHERE d.id = f.d AND d.region IS NOT NULL)",
    "s_not_exists": f"SELECT f.id, f.w FROM {S}.ufacts AS f WHERE NOT EXISTS (SELECT 1 FROM {S}.umore AS m "
    "WHERE m.k = f.k)",
    "s_in": f"SELECT id, k FROM {S}.ufacts WHERE d IN (SELECT id FROM {S}.udims WHERE region <> 'c') AND k > 0",
    # NOT IN's NULLs: a NULL in the list (umore.k often is) passes no row; a NULL d passes only an empty list
    "s_not_in": f"SELECT id, k, d FROM {S}.ufacts WHERE d NOT IN (SELECT k FROM {S}.umore WHERE w IS DISTINCT FROM 'a')",
    "s_agg": f"SELECT f.k, count(*) AS n, sum(f.v) AS s FROM {S}.ufacts AS f WHERE NOT EXISTS "
    f"(SELECT 1 FROM {S}.udims AS d WHERE d.id = f.d) AND f.k IN (SELECT k FROM {S}.umore) GROUP BY f.k",
    # the subquery correlated with a joined table, not the first one
    "s_join": f"SELECT f.id, d.region FROM {S}.ufacts AS f JOIN {S}.udims AS d ON f.d = d.id "
    f"WHERE NOT EXISTS (SELECT 1 FROM {S}.umore AS m WHERE m.w = d.region)",
    # a self anti-join: the last row of each key
    "s_self": f"SELECT a.id, a.k FROM {S}.umore AS a WHERE NOT EXISTS (SELECT 1 FROM {S}.umore AS b "
    "WHERE b.k = a.k AND b.id > a.id)",
    "s_not_in_agg": f"SELECT k, count(*) AS n FROM {S}.umore WHERE w NOT IN (SELECT region FROM {S}.udims) GROUP BY k",
}
NAMES = [f"{S}.{n}" for n in TABLES]


@pytest.fixture(scope="module")
def semi(env):
    sources(
        env,
        dims="(0, 'a'), (1, 'b'), (2, NULL), (0, 'c')",
        facts="(1, 1, 0, 1.50, 'a'), (2, NULL, 1, 2.25, NULL), (3, 1, 3, 1.50, 'a'), (4, 2, NULL, 0.50, 'b')",
        more="(1, 1, 0, 1.50, 'a'), (2, 3, 2, NULL, 'b'), (3, 1, 1, 0.50, 'b')",
    )
    created(env, TABLES)
    yield env
    env.drop_all()


def test_semi_and_anti_joins_are_planned_incremental(semi):
    plans = {d.name: d for d in semi.meta.all() if d.name in NAMES}
    assert {n: plans[n].plan_kind for n in NAMES} == {
        f"{S}.{n}": planner.AGGREGATE if "agg" in n else planner.ROWS for n in TABLES
    }
    assert plans[f"{S}.s_not_in"].plan.startswith("rows over semi/anti joins (NOT IN)")
    assert plans[f"{S}.s_agg"].plan.startswith("aggregate by k over semi/anti joins (NOT EXISTS, IN)")


@settings(max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ops, min_size=1, max_size=6))
def test_every_semi_and_anti_join_refresh_equals_a_full_recompute(semi, stream):
    for op in stream:
        if op[0] == "refresh":
            prove(semi, NAMES)
        else:
            apply(semi, op)
    prove(semi, NAMES)


def test_a_null_in_a_not_in_list_empties_the_result_and_its_removal_brings_it_back(env):
    env.drop_all()
    env.sql(f"CREATE OR REPLACE TABLE lake.{S}.na (id INTEGER, d INTEGER)")
    env.sql(f"CREATE OR REPLACE TABLE lake.{S}.nb (id INTEGER)")
    env.sql(f"INSERT INTO lake.{S}.na VALUES (1, 10), (2, 20), (3, NULL)")
    env.sql(f"INSERT INTO lake.{S}.nb VALUES (10)")
    name = f"{S}.not_in"
    env.create(
        f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL AS "
        f"SELECT id FROM {S}.na WHERE d NOT IN (SELECT id FROM {S}.nb)"
    )
    got = lambda: [r[0] for r in env.sql(f"SELECT id FROM lake.{name} ORDER BY id")]  # noqa: E731
    assert got() == [2]
    env.sql(f"INSERT INTO lake.{S}.nb VALUES (NULL)")  # x NOT IN (10, NULL) is never true
    [r] = env.refresh(name).refreshes
    assert (r.mode, r.rows_deleted, r.rows_inserted, got()) == (INCREMENTAL, 1, 0, []), r.reason
    env.sql(f"DELETE FROM lake.{S}.nb")  # an empty list: every row passes, the NULL d too
    [r] = env.refresh(name).refreshes
    assert (r.mode, r.rows_deleted, r.rows_inserted, got()) == (INCREMENTAL, 0, 3, [1, 2, 3]), r.reason
    env.equal(name)
    env.drop_all()


@pytest.mark.parametrize(
    "where, reason",
    [
        ("k IN (SELECT k FROM {S}.na GROUP BY k)", "SUBQUERY"),  # an aggregate in the subquery
        ("k > (SELECT max(k) FROM {S}.na)", "SUBQUERY"),  # a scalar subquery
        ("k = 1 OR EXISTS (SELECT 1 FROM {S}.na AS n WHERE n.k = a.k)", "SUBQUERY"),  # not a condition of its own
    ],
)
def test_other_subqueries_stay_full_and_incremental_is_refused(env, where, reason):
    env.drop_all()
    env.sql(f"CREATE OR REPLACE TABLE lake.{S}.na (id INTEGER, k INTEGER)")
    query = f"SELECT a.id FROM {S}.na AS a WHERE {where.format(S=S)}"
    with pytest.raises(KitError, match=f"cannot be refreshed incrementally: {reason}"):
        env.create(f"CREATE DYNAMIC TABLE {S}.no TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL AS {query}")
    env.drop_all()
