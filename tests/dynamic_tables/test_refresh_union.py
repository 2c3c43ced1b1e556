"""UNION ALL, UNION, SELECT DISTINCT and WITH clauses refreshed incrementally, proven as the other shapes are:
after every refresh of a random stream of inserts, updates and deletes (NULL keys and values, many duplicate rows,
both sides of a join, a branch's last copy of a row deleted while another branch still has it) the table equals
its query run in full (EXCEPT ALL both ways), and every refresh was INCREMENTAL. Lives in the schema `dt_tests`."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ducklake_kit.dynamic_tables import plan as planner
from ducklake_kit.dynamic_tables.metadata import NO_DATA, SUCCEEDED, Metadata
from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from tests.dynamic_tables.test_refresh import INCREMENTAL, Env, S

FACTS, MORE, DIMS = f"lake.{S}.ufacts", f"lake.{S}.umore", f"lake.{S}.udims"
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

keys = st.one_of(st.none(), st.integers(0, 4))
values = st.one_of(st.none(), st.sampled_from(["0.50", "1.50", "2.25"]))  # few values: many duplicate rows
words = st.one_of(st.none(), st.sampled_from(["a", "b", "c"]))
table = st.sampled_from([FACTS, MORE])
ops = st.one_of(
    st.tuples(
        st.just("insert"), table, st.lists(st.tuples(keys, st.integers(0, 3), values, words), min_size=1, max_size=4)
    ),
    st.tuples(st.just("move_key"), table, st.integers(0, 4), keys),  # rows with id % 5 = n get another key
    st.tuples(st.just("set_value"), table, st.integers(0, 4), values),
    st.tuples(st.just("set_word"), table, st.integers(0, 4), words),
    st.tuples(st.just("delete"), table, st.integers(0, 4)),
    st.tuples(st.just("delete_one_copy"), table, keys, words),  # one of several equal (k, w) rows goes
    st.tuples(st.just("rename_region"), st.integers(0, 3), words),
    st.tuples(st.just("delete_dim"), st.integers(0, 3)),
    st.tuples(st.just("insert_dim"), st.integers(0, 3), words),
    st.just(("refresh",)),
)


def apply(env: Env, op: tuple) -> None:
    kind = op[0]
    if kind == "insert":
        t = op[1]
        start = env.sql(f"SELECT coalesce(max(id), 0) + 1 FROM {t}")[0][0]
        rows = [[start + i, k, d, v, w] for i, (k, d, v, w) in enumerate(op[2])]
        env.lake.con.executemany(f"INSERT INTO {t} VALUES (?, ?, ?, ?::DECIMAL(9, 2), ?)", rows)
    elif kind == "move_key":
        env.sql(f"UPDATE {op[1]} SET k = ? WHERE id % 5 = ?", [op[3], op[2]])
    elif kind == "set_value":
        env.sql(f"UPDATE {op[1]} SET v = ?::DECIMAL(9, 2) WHERE id % 5 = ?", [op[3], op[2]])
    elif kind == "set_word":
        env.sql(f"UPDATE {op[1]} SET w = ? WHERE id % 5 = ?", [op[3], op[2]])
    elif kind == "delete":
        env.sql(f"DELETE FROM {op[1]} WHERE id % 5 = ?", [op[2]])
    elif kind == "delete_one_copy":
        env.sql(
            f"DELETE FROM {op[1]} WHERE id = (SELECT min(id) FROM {op[1]} "
            "WHERE k IS NOT DISTINCT FROM ? AND w IS NOT DISTINCT FROM ?)",
            [op[2], op[3]],
        )
    elif kind == "rename_region":
        env.sql(f"UPDATE {DIMS} SET region = ? WHERE id = ?", [op[2], op[1]])
    elif kind == "delete_dim":
        env.sql(f"DELETE FROM {DIMS} WHERE id = ?", [op[1]])
    elif kind == "insert_dim":
        env.sql(f"INSERT INTO {DIMS} VALUES (?, ?)", [op[1], op[2]])


def refresh_and_prove(env: Env) -> None:
    batch = env.refresh(*NAMES)
    for r in batch.refreshes:
        assert r.status in (SUCCEEDED, NO_DATA), (r.name, r.error)
        assert r.status == NO_DATA or r.mode == INCREMENTAL, (r.name, r.mode, r.reason)
    for name in NAMES:
        env.equal(name)


@pytest.fixture(scope="module")
def env(stack):
    ep = stack.platform.endpoints()
    with Lake(ep) as lake, Metadata(ep) as meta:
        e = Env(lake, meta)
        e.drop_all()
        lake.con.execute(f"CREATE SCHEMA IF NOT EXISTS lake.{S}")
        yield e
        e.drop_all()


@pytest.fixture(scope="module")
def unions(env):
    for t in (FACTS, MORE):
        env.sql(f"CREATE OR REPLACE TABLE {t} (id INTEGER, k INTEGER, d INTEGER, v DECIMAL(9, 2), w VARCHAR)")
    env.sql(f"CREATE OR REPLACE TABLE {DIMS} (id INTEGER, region VARCHAR)")
    env.sql(f"INSERT INTO {DIMS} VALUES (0, 'a'), (1, 'b'), (2, NULL), (3, 'a')")
    env.sql(f"INSERT INTO {FACTS} VALUES (1, 1, 0, 1.50, 'a'), (2, NULL, 1, 2.25, NULL), (3, 1, 0, 1.50, 'a')")
    env.sql(f"INSERT INTO {MORE} VALUES (1, 1, 0, 1.50, 'a'), (2, 3, 2, NULL, 'b')")
    for name, query in TABLES.items():
        env.create(f"CREATE DYNAMIC TABLE {S}.{name} TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL AS {query}")
    for name in NAMES:
        env.equal(name)
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
    assert (r.mode, r.reason, r.rows_inserted, r.rows_deleted) == (
        INCREMENTAL,
        "inserts appended (1 of 2 branches changed)",
        1,
        0,
    )
    two.sql(f"DELETE FROM lake.{S}.ua WHERE k = 1")  # two of the four (1, 'x') go: the other branch's two stay
    [r] = two.refresh(name).refreshes
    assert (r.mode, r.reason) == (INCREMENTAL, "1 affected distinct rows recomputed (1 of 2 branches changed)")
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
    assert (r.reason, r.rows_inserted) == ("inserts added where new (1 of 2 branches changed)", 1)
    two.sql(f"DELETE FROM lake.{S}.ua WHERE k = 1")  # all three copies in ua go; ub's copy keeps the row
    two.refresh(name)
    assert rows(two, name) == [(1, "x"), (2, None), (3, "z"), (None, "y")]
    two.sql(f"DELETE FROM lake.{S}.ub WHERE k = 1")  # the last copy
    [r] = two.refresh(name).refreshes
    assert (r.mode, r.rows_deleted, r.rows_inserted) == (INCREMENTAL, 1, 0)
    assert rows(two, name) == [(2, None), (3, "z"), (None, "y")]
    two.equal(name)


@pytest.mark.parametrize(
    "query, reason",
    [
        ("SELECT k FROM {S}.ua INTERSECT SELECT k FROM {S}.ub", "SET_OPERATION"),
        ("SELECT k FROM {S}.ua UNION ALL SELECT k FROM {S}.ub UNION SELECT k FROM {S}.ua", "SET_OPERATION"),
        ("SELECT k FROM {S}.ua UNION ALL SELECT k FROM {S}.ub LIMIT 3", "LIMIT"),
        ("SELECT DISTINCT ON (k) k, w FROM {S}.ua ORDER BY k, w", "DISTINCT"),
        ("WITH c AS (SELECT k, count(*) AS n FROM {S}.ua GROUP BY k) SELECT k, n FROM c WHERE n > 1", "WITH_CLAUSE"),
        ("SELECT k, count(*) AS n FROM (SELECT k FROM {S}.ua UNION ALL SELECT k FROM {S}.ub) GROUP BY k", "SUBQUERY"),
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
