"""UNION ALL, UNION, SELECT DISTINCT and WITH clauses refreshed incrementally, proven as the other shapes are:
after every refresh of a random stream of inserts, updates and deletes (NULL keys and values, many duplicate rows,
both sides of a join, a branch's last copy of a row deleted while another branch still has it) the table equals
its query run in full (EXCEPT ALL both ways), and every refresh was INCREMENTAL. Lives in the schema `dt_tests`."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ducklake_kit.dynamic_tables import counts
from ducklake_kit.dynamic_tables import plan as planner
from ducklake_kit.dynamic_tables.metadata import NO_DATA, SUCCEEDED
from ducklake_kit.errors import KitError
from tests.dynamic_tables.oracle import apply, created, ops, sources
from tests.dynamic_tables.test_refresh import INCREMENTAL, Env, S

TABLES = {
    # UNION ALL of rows branches: the same (k, v, w) often comes from both, and twice from one
    "u_rows": f"SELECT k, v, w FROM {S}.ufacts WHERE v IS NULL OR v > 1 UNION ALL SELECT k, v, w FROM {S}.umore",
    # a branch that is a join, and a branch that is a plain read of another table
    "u_join": f"SELECT f.k, d.region AS w FROM {S}.ufacts AS f JOIN {S}.udims AS d ON f.d = d.id "
    f"UNION ALL SELECT k, w FROM {S}.umore",
    # a UNION ALL of aggregates over the same keys: one group key, a row from each branch
    "u_aggs": f"SELECT k, count(*) AS n, sum(v) AS s FROM {S}.ufacts GROUP BY k "
    f"UNION ALL SELECT k, count(*), sum(v) FROM {S}.umore GROUP BY k",
    # rows and an aggregate in one union, and a branch read twice (a self-union)
    "u_mixed": f"SELECT k, w FROM {S}.ufacts UNION ALL SELECT k, max(w) FROM {S}.umore GROUP BY k "
    f"UNION ALL SELECT k, w FROM {S}.ufacts WHERE k > 2",
    # a window branch (the latest row per key) beside a plain one
    "u_window": f"SELECT k, w FROM {S}.ufacts QUALIFY row_number() OVER (PARTITION BY k ORDER BY id DESC) = 1 "
    f"UNION ALL SELECT k, w FROM {S}.umore",
    # a DISTINCT branch inside a UNION ALL
    "u_distinct_branch": f"SELECT DISTINCT k FROM {S}.ufacts UNION ALL SELECT k FROM {S}.umore",
    # UNION (distinct) and SELECT DISTINCT: multiplicity, one copy kept until the last goes
    "u_set": f"SELECT k, w FROM {S}.ufacts UNION SELECT k, w FROM {S}.umore",
    "distinct": f"SELECT DISTINCT k, w FROM {S}.ufacts",
    "distinct_join": f"SELECT DISTINCT d.region, f.w FROM {S}.ufacts AS f JOIN {S}.udims AS d ON f.d = d.id",
    # WITH clauses, inlined into the query they mean
    "cte_agg": f"WITH c AS (SELECT k, v * 2 AS v2 FROM {S}.ufacts WHERE v IS NOT NULL) "
    "SELECT k, sum(v2) AS s, count(*) AS n FROM c GROUP BY k",
    "cte_join": f"WITH f AS (SELECT id, k, d FROM {S}.ufacts WHERE k IS NOT NULL), r AS (SELECT * FROM {S}.udims) "
    "SELECT f.k, r.region FROM f JOIN r ON f.d = r.id",
    "cte_union": f"WITH c AS (SELECT k, w FROM {S}.ufacts) SELECT k, w FROM c UNION ALL SELECT k, w FROM c WHERE k > 1",
    "cte_distinct": f"WITH m AS (SELECT k, w FROM {S}.umore WHERE w IS DISTINCT FROM 'c') SELECT DISTINCT w FROM m",
}
NAMES = [f"{S}.{n}" for n in TABLES]
# the tables kept through multiplicity counts, each with its branches as a UNION ALL written out by hand (DISTINCT
# dropped): the side table must hold exactly these rows' counts, NULLs included, and no row whose count is 0
COUNTED = {
    "u_set": f"SELECT k, w FROM lake.{S}.ufacts UNION ALL SELECT k, w FROM lake.{S}.umore",
    "distinct": f"SELECT k, w FROM lake.{S}.ufacts",
    "distinct_join": f"SELECT d.region, f.w FROM lake.{S}.ufacts AS f JOIN lake.{S}.udims AS d ON f.d = d.id",
    "cte_distinct": f"SELECT w FROM lake.{S}.umore WHERE w IS DISTINCT FROM 'c'",
}


def counts_equal(env: Env, name: str, every_copy: str) -> None:
    """The side table of `name` against its branches' rows counted here (EXCEPT ALL both ways)."""
    side = counts.side_table(env.lake.alias, env.meta.get(f"{S}.{name}"))
    truth = f"SELECT *, count(*) AS {counts.COUNT} FROM ({every_copy}) AS __a GROUP BY ALL"
    for a, b in ((f"SELECT * FROM {side}", truth), (truth, f"SELECT * FROM {side}")):
        assert env.sql(f"SELECT count(*) FROM ({a} EXCEPT ALL {b})") == [(0,)], (name, a, b)


def refresh_and_prove(env: Env) -> None:
    """`prove`, and each counted table's incremental refresh went through its counts, which are right."""
    for r in env.refresh(*NAMES).refreshes:
        assert r.status in (SUCCEEDED, NO_DATA), (r.name, r.error)
        assert r.status == NO_DATA or r.mode == INCREMENTAL, (r.name, r.mode, r.reason)
        table = r.name.split(".")[1]
        if table in COUNTED and r.status == SUCCEEDED:
            assert r.reason.startswith("multiplicity counts: "), (r.name, r.reason)
            counts_equal(env, table, COUNTED[table])
    for name in NAMES:
        env.equal(name)


@pytest.fixture(scope="module")
def unions(env):
    sources(
        env,
        dims="(0, 'a'), (1, 'b'), (2, NULL), (3, 'a')",
        facts="(1, 1, 0, 1.50, 'a'), (2, NULL, 1, 2.25, NULL), (3, 1, 0, 1.50, 'a')",
        more="(1, 1, 0, 1.50, 'a'), (2, 3, 2, NULL, 'b')",
    )
    created(env, TABLES)
    yield env
    env.drop_all()


def test_unions_distinct_and_ctes_are_planned_incremental(unions):
    plans = {d.name: d for d in unions.meta.all() if d.name in NAMES}
    assert {n: plans[n].plan_kind for n in NAMES} == {
        **{f"{S}.{n}": planner.UNION for n in TABLES if n.startswith(("u_", "distinct"))},
        f"{S}.cte_agg": planner.AGGREGATE,
        f"{S}.cte_join": planner.ROWS,
        f"{S}.cte_union": planner.UNION,
        f"{S}.cte_distinct": planner.UNION,
    }
    assert plans[f"{S}.u_mixed"].plan.startswith("union: UNION ALL of 3 branches (rows, aggregate, rows)")
    assert plans[f"{S}.distinct"].plan.startswith("union: SELECT DISTINCT of 1 branch (rows)")
    assert plans[f"{S}.u_window"].plan.startswith("union: UNION ALL of 2 branches (window, rows)")
    assert "inserts merged into their groups" in plans[f"{S}.cte_agg"].plan


@settings(max_examples=15, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ops, min_size=1, max_size=6))
def test_every_union_refresh_equals_a_full_recompute(unions, stream):
    for op in stream:
        if op[0] == "refresh":
            refresh_and_prove(unions)
        else:
            apply(unions, op)
    refresh_and_prove(unions)


# ---- each path once, by hand: what it did, not only that it came out right ----------------------------------------


@pytest.fixture
def two(env):
    env.drop_all()
    for t in ("ua", "ub"):
        env.sql(f"CREATE OR REPLACE TABLE lake.{S}.{t} (k INTEGER, w VARCHAR)")
    env.sql(f"INSERT INTO lake.{S}.ua VALUES (1, 'x'), (1, 'x'), (NULL, 'y')")
    env.sql(f"INSERT INTO lake.{S}.ub VALUES (1, 'x'), (2, NULL)")
    yield env
    env.drop_all()


def rows(env: Env, name: str) -> list:
    return env.sql(f"SELECT * FROM lake.{name} ORDER BY ALL")


def test_a_union_all_appends_inserts_of_the_changed_branch_only(two):
    name = f"{S}.both"
    two.create(
        f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' AS SELECT k, w FROM {S}.ua UNION ALL SELECT k, w FROM {S}.ub"
    )
    two.sql(f"INSERT INTO lake.{S}.ub VALUES (1, 'x')")
    [r] = two.refresh(name).refreshes
    adaptive = " (ADAPTIVE chose incremental: "  # the table is ADAPTIVE (the default): its choice follows what it did
    assert (r.mode, r.reason.partition(adaptive)[0], r.rows_inserted, r.rows_deleted) == (
        INCREMENTAL,
        "inserts appended (1 of 2 branches changed)",
        1,
        0,
    )
    two.sql(f"DELETE FROM lake.{S}.ua WHERE k = 1")  # two of the four (1, 'x') go: the other branch's two stay
    [r] = two.refresh(name).refreshes
    assert (r.mode, r.reason.partition(adaptive)[0]) == (
        INCREMENTAL,
        "1 affected distinct rows recomputed (1 of 2 branches changed)",
    )
    assert rows(two, name) == [(1, "x"), (1, "x"), (2, None), (None, "y")]
    two.equal(name)


def test_distinct_keeps_a_row_until_its_last_copy_goes(two):
    name = f"{S}.set"
    two.create(
        f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL AS "
        f"SELECT k, w FROM {S}.ua UNION SELECT k, w FROM {S}.ub"
    )
    assert rows(two, name) == [(1, "x"), (2, None), (None, "y")]
    two.sql(f"INSERT INTO lake.{S}.ua VALUES (1, 'x'), (3, 'z')")  # one new row, one already there
    [r] = two.refresh(name).refreshes
    side = counts.side_table(two.lake.alias, two.meta.get(name))
    assert r.reason.startswith(
        "multiplicity counts: 2 rows' counts changed, 1 rows added, 0 removed (1 of 2 branches changed; the counts "
        "built at snapshot "
    )
    assert r.rows_inserted == 1
    assert rows(two, side.removeprefix('"lake".')) == [(1, "x", 4), (2, None, 1), (3, "z", 1), (None, "y", 1)]
    two.sql(f"DELETE FROM lake.{S}.ua WHERE k = 1")  # all three copies in ua go; ub's copy keeps the row
    [r] = two.refresh(name).refreshes
    assert (r.reason, r.rows_deleted, r.rows_inserted) == (
        "multiplicity counts: 1 rows' counts changed, 0 rows added, 0 removed (1 of 2 branches changed)",
        0,
        0,
    )
    assert rows(two, name) == [(1, "x"), (2, None), (3, "z"), (None, "y")]
    two.sql(f"DELETE FROM lake.{S}.ub WHERE k = 1")  # the last copy
    [r] = two.refresh(name).refreshes
    assert (r.mode, r.rows_deleted, r.rows_inserted) == (INCREMENTAL, 1, 0)
    assert rows(two, name) == [(2, None), (3, "z"), (None, "y")]
    assert rows(two, side.removeprefix('"lake".')) == [(2, None, 1), (3, "z", 1), (None, "y", 1)]  # no 0 kept
    two.equal(name)
    two.sql(f"DELETE FROM lake.{S}.ua WHERE k IS NULL")  # a NULL key's last copy
    [r] = two.refresh(name).refreshes
    assert (r.rows_deleted, rows(two, name)) == (1, [(2, None), (3, "z")])
    two.create(
        f"CREATE OR REPLACE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' AS SELECT k FROM {S}.ua UNION SELECT k FROM {S}.ub"
    )
    gone = side.removeprefix('"lake".').replace('"', "").split(".")
    assert not two.sql(
        "SELECT 1 FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?", gone
    )  # the replaced definition's counts went with it


@pytest.mark.parametrize(
    "query, reason",
    [
        ("SELECT k FROM {S}.ua INTERSECT SELECT k FROM {S}.ub", "SET_OPERATION"),
        ("SELECT k FROM {S}.ua UNION ALL SELECT k FROM {S}.ub UNION SELECT k FROM {S}.ua", "SET_OPERATION"),
        ("SELECT k FROM {S}.ua UNION ALL SELECT k FROM {S}.ub LIMIT 3", "LIMIT"),
        ("SELECT DISTINCT ON (k) k, w FROM {S}.ua ORDER BY k, w", "DISTINCT"),
        # an aggregating CTE joined to a table; an aggregate over a UNION (distinct): test_refresh_derived has the
        # incremental ones (an aggregating CTE read alone, an aggregate over a UNION ALL)
        (
            "WITH c AS (SELECT k, count(*) AS n FROM {S}.ua GROUP BY k) SELECT c.k, n FROM c JOIN {S}.ub AS b ON c.k = b.k",
            "WITH_CLAUSE",
        ),
        ("SELECT k, count(*) AS n FROM (SELECT k FROM {S}.ua UNION SELECT k FROM {S}.ub) GROUP BY k", "SUBQUERY"),
    ],
)
def test_what_stays_full_says_why_and_incremental_is_refused(two, query, reason):
    text = query.format(S=S)
    with pytest.raises(KitError, match=f"cannot be refreshed incrementally: {reason}"):
        two.create(f"CREATE DYNAMIC TABLE {S}.no TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL AS {text}")
    two.create(f"CREATE DYNAMIC TABLE {S}.no TARGET_LAG = '1 hour' AS {text}")
    d = two.meta.get(f"{S}.no")
    assert (d.plan_kind, d.reason) == (planner.FULL, reason)
    two.sql(f"INSERT INTO lake.{S}.ua VALUES (1, 'q')")
    [r] = two.refresh(f"{S}.no").refreshes
    assert r.status == SUCCEEDED and r.reason.startswith(reason)
    two.equal(f"{S}.no")
