"""LEFT, RIGHT and FULL OUTER JOINs refreshed incrementally, proven by the oracle: random streams on the kept tables
and on the optional sides (a dimension's row deleted so its facts become NULL-padded, a new one matching padded
facts, duplicate dimension ids, NULL join keys; for a FULL JOIN, padding on either side), after every refresh the
table equals its query run in full (EXCEPT ALL both ways) and the refresh was INCREMENTAL. Shares the tables and
change streams of test_refresh_union."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ducklake_kit.dynamic_tables import plan as planner
from ducklake_kit.errors import KitError
from tests.dynamic_tables.oracle import apply, created, ops, prove, sources
from tests.dynamic_tables.test_refresh import INCREMENTAL, Env, S

TABLES = {
    "l_rows": f"SELECT f.id, f.k, d.region FROM {S}.ufacts AS f LEFT JOIN {S}.udims AS d ON f.d = d.id",
    # the anti-join pattern: facts without a dimension row
    "l_anti": f"SELECT f.id, f.k FROM {S}.ufacts AS f LEFT JOIN {S}.udims AS d ON f.d = d.id WHERE d.id IS NULL",
    "l_agg": f"SELECT d.region, count(*) AS n, count(d.id) AS matched, sum(f.v) AS s "
    f"FROM {S}.ufacts AS f LEFT OUTER JOIN {S}.udims AS d ON f.d = d.id GROUP BY d.region",
    # many to many between two fact tables, NULL keys never matching
    "l_agg_k": f"SELECT f.k, count(m.id) AS n, max(m.w) AS w FROM {S}.ufacts AS f LEFT JOIN {S}.umore AS m "
    "ON f.k = m.k GROUP BY f.k",
    # a chain: the second LEFT JOIN hangs off the first's optional side
    "l_chain": f"SELECT f.id, d.region, m.w FROM {S}.ufacts AS f LEFT JOIN {S}.udims AS d ON f.d = d.id "
    f"LEFT JOIN {S}.umore AS m ON d.id = m.d",
    # an inner join and a LEFT JOIN whose condition reads both earlier tables, null-safely
    "l_mixed": f"SELECT f.k, d.region, m.v FROM {S}.ufacts AS f JOIN {S}.udims AS d ON f.d = d.id "
    f"LEFT JOIN {S}.umore AS m ON m.k IS NOT DISTINCT FROM f.k AND m.w = d.region",
    # a self-join: both sides change at once
    "l_self": f"SELECT a.id, a.k, b.id AS later FROM {S}.umore AS a LEFT JOIN {S}.umore AS b "
    "ON a.k = b.k AND a.id < b.id",
    # RIGHT JOIN as the first join: the LEFT JOIN of its tables swapped, a LEFT JOIN after it
    "r_chain": f"SELECT d.id AS did, d.region, f.id, m.w FROM {S}.ufacts AS f RIGHT JOIN {S}.udims AS d "
    f"ON f.d = d.id LEFT JOIN {S}.umore AS m ON m.k = f.k",
    "r_agg": f"SELECT d.region, count(f.id) AS n, sum(f.v) AS s FROM {S}.ufacts AS f RIGHT OUTER JOIN "
    f"{S}.udims AS d ON f.d = d.id GROUP BY d.region",
    # FULL OUTER JOINs: many to many with NULL keys, a WHERE after the join, an aggregate, a self-join
    "x_rows": f"SELECT f.id, f.w, m.id AS mid, m.v FROM {S}.ufacts AS f FULL OUTER JOIN {S}.umore AS m "
    "ON f.k = m.k AND f.w = m.w",
    "x_where": f"SELECT f.id, d.id AS did, d.region FROM {S}.ufacts AS f FULL JOIN {S}.udims AS d ON f.d = d.id "
    "WHERE d.region IS DISTINCT FROM 'c'",
    "x_agg": f"SELECT coalesce(f.k, m.k) AS k, count(f.id) AS nf, count(m.id) AS nm, sum(m.v) AS s "
    f"FROM {S}.ufacts AS f FULL JOIN {S}.umore AS m ON f.k = m.k GROUP BY coalesce(f.k, m.k)",
    "x_self": f"SELECT a.id, b.id AS bid FROM {S}.umore AS a FULL JOIN {S}.umore AS b ON a.k = b.k AND a.id < b.id",
}
NAMES = [f"{S}.{n}" for n in TABLES]


def refresh_and_prove(env: Env) -> None:
    prove(env, NAMES)


@pytest.fixture(scope="module")
def outer(env):
    sources(
        env,
        dims="(0, 'a'), (1, 'b'), (2, NULL), (0, 'c')",
        facts="(1, 1, 0, 1.50, 'a'), (2, NULL, 1, 2.25, NULL), (3, 1, 3, 1.50, 'a')",
        more="(1, 1, 0, 1.50, 'a'), (2, 3, 2, NULL, 'b'), (3, 1, 1, 0.50, 'b')",
    )
    created(env, TABLES)
    yield env
    env.drop_all()


def test_outer_joins_are_planned_incremental(outer):
    plans = {d.name: d for d in outer.meta.all() if d.name in NAMES}
    assert {n: plans[n].plan_kind for n in NAMES} == {
        f"{S}.{n}": planner.AGGREGATE if "_agg" in n else planner.ROWS for n in TABLES
    }
    assert plans[f"{S}.l_rows"].plan.startswith("rows over LEFT JOINs")
    assert plans[f"{S}.r_chain"].plan.startswith("rows over LEFT JOINs")  # RIGHT JOIN: its tables swapped
    assert plans[f"{S}.x_rows"].plan.startswith("rows over a FULL OUTER JOIN: the rows of the first table and of")
    assert "inserts recompute their groups (an outer join" in plans[f"{S}.l_agg"].plan


@settings(max_examples=10, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ops, min_size=1, max_size=6))
def test_every_outer_join_refresh_equals_a_full_recompute(outer, stream):
    for op in stream:
        if op[0] == "refresh":
            refresh_and_prove(outer)
        else:
            apply(outer, op)
    refresh_and_prove(outer)


def test_a_padded_row_gives_way_to_a_match_and_comes_back_when_it_goes(env):
    env.drop_all()
    env.sql(f"CREATE OR REPLACE TABLE lake.{S}.la (id INTEGER, d INTEGER)")
    env.sql(f"CREATE OR REPLACE TABLE lake.{S}.lb (id INTEGER, name VARCHAR)")
    env.sql(f"INSERT INTO lake.{S}.la VALUES (1, 10), (2, 20), (3, NULL)")
    env.sql(f"INSERT INTO lake.{S}.lb VALUES (10, 'ten')")
    name = f"{S}.padded"
    env.create(
        f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL AS "
        f"SELECT a.id, b.name FROM {S}.la AS a LEFT JOIN {S}.lb AS b ON a.d = b.id"
    )
    got = lambda: env.sql(f"SELECT * FROM lake.{name} ORDER BY ALL")  # noqa: E731
    assert got() == [(1, "ten"), (2, None), (3, None)]
    env.sql(f"INSERT INTO lake.{S}.lb VALUES (20, 'twenty'), (20, 'vingt')")  # 2's padding goes: two matches
    [r] = env.refresh(name).refreshes
    assert (r.mode, r.rows_deleted, r.rows_inserted) == (INCREMENTAL, 1, 2), r.reason
    assert got() == [(1, "ten"), (2, "twenty"), (2, "vingt"), (3, None)]
    env.sql(f"DELETE FROM lake.{S}.lb WHERE id = 20")  # and comes back
    [r] = env.refresh(name).refreshes
    assert (r.mode, r.rows_deleted, r.rows_inserted) == (INCREMENTAL, 2, 1), r.reason
    assert got() == [(1, "ten"), (2, None), (3, None)]
    env.equal(name)
    env.drop_all()


@pytest.mark.parametrize(
    "join",
    [
        "JOIN {S}.lb AS c ON a.id = c.id RIGHT JOIN {S}.lb AS b ON a.d = b.id",  # a RIGHT JOIN after the first join
        "FULL JOIN {S}.lb AS b ON a.d = b.id FULL JOIN {S}.lb AS c ON b.id = c.id",  # three tables
        "SEMI JOIN {S}.lb AS b ON a.d = b.id",  # DuckDB's own syntax (EXISTS is incremental)
    ],
)
def test_other_outer_joins_stay_full_and_incremental_is_refused(env, join):
    env.drop_all()
    env.sql(f"CREATE OR REPLACE TABLE lake.{S}.la (id INTEGER, d INTEGER)")
    env.sql(f"CREATE OR REPLACE TABLE lake.{S}.lb (id INTEGER, name VARCHAR)")
    reason = "OUTER_JOIN"
    query = f"SELECT a.id FROM {S}.la AS a {join.format(S=S)}"
    with pytest.raises(KitError, match=f"cannot be refreshed incrementally: {reason}"):
        env.create(f"CREATE DYNAMIC TABLE {S}.no TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL AS {query}")
    env.create(f"CREATE DYNAMIC TABLE {S}.no TARGET_LAG = '1 hour' AS {query}")
    assert (env.meta.get(f"{S}.no").plan_kind, env.meta.get(f"{S}.no").reason) == (planner.FULL, reason)
    env.drop_all()
