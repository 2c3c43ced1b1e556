"""Inserts merged into an aggregate over inner joins with the inserted rows aggregated before the joins (eager
aggregation, `Plan.eager`, `rewrite.eager`), proven by the oracle: random streams, mostly inserts (so most refreshes
take the insert merge), with NULL join keys, join keys no dimension row has, duplicate dimension ids (a fact row
then counts twice), a dimension updated or deleted between refreshes and many-to-many joins; after every refresh
the table equals its query run in full (EXCEPT ALL both ways) and the refresh was INCREMENTAL. Shares the tables of
test_refresh_union (`oracle`)."""

from __future__ import annotations

import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ducklake_kit.dynamic_tables import plan as planner
from ducklake_kit.dynamic_tables import rewrite
from ducklake_kit.dynamic_tables.ddl import DIALECT
from ducklake_kit.dynamic_tables.refresh import named
from tests.dynamic_tables.oracle import apply, created, keys, sources, values, words
from tests.dynamic_tables.test_refresh import INCREMENTAL, Env, S

EAGER = "aggregated before the joins"  # what a refresh's reason says when it took the path
TABLES = {
    # a star: one fact, a dimension with duplicate ids, a many-to-many join on a NULL-able key; every mergeable
    # aggregate, NULL values
    "e_star": f"SELECT d.region, m.w, count(*) AS n, count(f.v) AS nv, sum(f.v) AS s, min(f.v) AS lo, max(f.w) AS hi "
    f"FROM {S}.ufacts AS f JOIN {S}.udims AS d ON f.d = d.id JOIN {S}.umore AS m ON f.k = m.k GROUP BY d.region, m.w",
    # unqualified columns (each of one table only), a fact column as a group key, a WHERE on the fact
    "e_plain_names": f"SELECT k, region, count(*) AS n, sum(v) AS s, max(v) AS hi FROM {S}.ufacts JOIN {S}.udims "
    f"ON d = udims.id WHERE w IS DISTINCT FROM 'b' GROUP BY k, region",
    # a key computed from both tables; the join's condition an expression of the fact's columns
    "e_expr": f"SELECT coalesce(d.region, '?') || coalesce(f.w, '?') AS rw, count(*) AS n, sum(f.v) AS s "
    f"FROM {S}.ufacts AS f JOIN {S}.udims AS d ON coalesce(f.d, f.k) = d.id GROUP BY rw",
    # COUNT(*) alone: either table's inserts can be aggregated first (the dimension's too)
    "e_count": f"SELECT d.region, count(*) AS n FROM {S}.ufacts AS f JOIN {S}.udims AS d ON f.d = d.id "
    "GROUP BY d.region",
    # a self join: one insert gives two terms, only the one whose rows the SUM reads (b) aggregated first
    "e_self": f"SELECT a.w, count(*) AS n, sum(b.v) AS s FROM {S}.umore AS a JOIN {S}.umore AS b ON a.k = b.k "
    "GROUP BY a.w",
}
NAMES = [f"{S}.{n}" for n in TABLES]
join_keys = st.one_of(st.none(), st.integers(0, 4))  # 4: no dimension row has it
insert = st.tuples(
    st.just("insert"),
    st.sampled_from([f"lake.{S}.ufacts", f"lake.{S}.umore"]),
    st.lists(st.tuples(keys, join_keys, values, words), min_size=1, max_size=4),
)
ops = st.one_of(  # inserts most often: a refresh after inserts alone takes the path
    *[insert] * 6,
    st.tuples(st.just("insert_dim"), st.integers(0, 3), words),  # a duplicate id, often
    st.tuples(st.just("rename_region"), st.integers(0, 3), words),  # a dimension updated between refreshes
    st.tuples(st.just("delete_dim"), st.integers(0, 3)),
    st.tuples(st.just("move_key"), st.sampled_from([f"lake.{S}.ufacts", f"lake.{S}.umore"]), st.integers(0, 4), keys),
    *[st.just(("refresh",))] * 3,
)
used: list[str] = []  # the tables whose refreshes took the path, over the module's streams


@pytest.fixture(scope="module")
def star(env):
    sources(
        env,
        dims="(0, 'a'), (1, 'b'), (2, NULL), (0, 'c')",
        facts="(1, 1, 0, 1.50, 'a'), (2, NULL, 1, 2.25, NULL), (3, 1, 3, 1.50, 'a'), (4, 2, NULL, 0.50, 'b')",
        more="(1, 1, 0, 1.50, 'a'), (2, 3, 2, NULL, 'b'), (3, 1, 1, 0.50, 'b'), (4, NULL, 1, 0.50, 'c')",
    )
    created(env, TABLES)
    yield env
    env.drop_all()


def refresh_and_prove(env: Env) -> None:
    batch = env.refresh(*NAMES)
    for r in batch.refreshes:
        assert r.error is None, (r.name, r.error)
        assert r.mode in (None, INCREMENTAL), (r.name, r.mode, r.reason)
        if EAGER in (r.reason or ""):
            used.append(r.name)
    for name in NAMES:
        env.equal(name)


def test_the_path_is_planned_for_the_tables_whose_aggregates_read_one_table(star):
    plans = {d.name: d.plan for d in star.meta.all() if d.name in NAMES}
    assert plans[f"{S}.e_star"].endswith("; inserts into f aggregated before the joins")
    assert plans[f"{S}.e_plain_names"].endswith("; inserts into ufacts aggregated before the joins")
    assert plans[f"{S}.e_count"].endswith("; inserts into f, d aggregated before the joins")
    assert plans[f"{S}.e_self"].endswith("; inserts into b aggregated before the joins")


@settings(max_examples=20, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ops, min_size=1, max_size=8))
def test_every_eager_refresh_equals_a_full_recompute(star, stream):
    for op in stream:
        if op[0] == "refresh":
            refresh_and_prove(star)
        else:
            apply(star, op)
    refresh_and_prove(star)


def test_fact_inserts_take_the_path_and_stay_right(star):
    """Inserts alone, several rows per group and NULL join keys among them, after the streams above (the dimension's
    duplicate ids as they left them): every table took the path, and equals its query. The streams took it too."""
    assert used, "no refresh of the random streams took the path"
    rows = [
        [1, 0, "1.25", "a"],
        [1, 0, "2.00", "a"],
        [None, 1, None, "b"],
        [1, None, "0.50", None],
        [3, 0, "9.99", "c"],
    ]
    rows += [[1, 3, "0.25", "b"], [1, 3, "0.75", "b"], [2, 4, "1.00", "a"], [1, 0, "1.25", "a"]]
    apply(star, ("insert", f"lake.{S}.ufacts", rows))
    used.clear()
    refresh_and_prove(star)
    assert sorted(used) == sorted(set(NAMES) - {f"{S}.e_self"})  # umore got no insert


def test_the_rewrite_groups_before_the_joins_and_combines_after():
    """The term's SQL: the inserted rows grouped by the columns the joins and keys read, the aggregates combined."""
    query = sqlglot.parse_one(
        f"SELECT d.region, count(*) AS n, count(f.v) AS c, sum(f.v) AS s, min(f.v) AS lo FROM {S}.f AS f "
        f"JOIN {S}.d AS d ON f.d = d.id WHERE f.w > 'a' GROUP BY d.region",
        read=DIALECT,
    )
    names = ["region", "n", "c", "s", "lo"]
    plan = planner.analyze(query, names, "lake", types={"s": "DECIMAL(38,2)"})
    assert plan.eager == {0: ["d", "w"]}
    term = rewrite.term(named(plan.query, names), "lake", {0: rewrite.temp_table("__post", "f")}, 1, 2)
    out = rewrite.sql(rewrite.eager(term, plan, 0))
    assert (
        'FROM (SELECT "f"."d" AS "d", "f"."w" AS "w", COUNT(*) AS "__dt_p1", COUNT(f.v) AS "__dt_p2", '
        'SUM(f.v) AS "__dt_p3", MIN(f.v) AS "__dt_p4" FROM temp.main.__post AS f GROUP BY "f"."d", "f"."w") AS f'
    ) in out
    assert (
        'SUM("f"."__dt_p1") AS "n", SUM("f"."__dt_p2") AS "c", SUM("f"."__dt_p3") AS "s", MIN("f"."__dt_p4") AS "lo"'
        in out
    )
    assert rewrite.eager(term, plan, 1) is None  # the dimension's inserts: its columns feed no aggregate


@pytest.mark.parametrize(
    "query, why",
    [
        (
            f"SELECT d.region, sum(f.v * d.id) AS s FROM {S}.f AS f JOIN {S}.d AS d ON f.d = d.id GROUP BY d.region",
            "an aggregate reads two tables",
        ),
        (
            f"SELECT d.region, count(DISTINCT f.v) AS s FROM {S}.f AS f JOIN {S}.d AS d ON f.d = d.id GROUP BY d.region",
            "DISTINCT",
        ),
        (f"SELECT d.region, avg(f.v) AS s FROM {S}.f AS f JOIN {S}.d AS d ON f.d = d.id GROUP BY d.region", "AVG"),
        (
            f"SELECT d.region, sum(f.v) AS s FROM {S}.f AS f LEFT JOIN {S}.d AS d ON f.d = d.id GROUP BY d.region",
            "outer",
        ),
        (f"SELECT region, sum(v) AS s FROM {S}.f JOIN {S}.d USING (id) GROUP BY region", "USING"),
        (
            f"SELECT f.k, sum(v) AS s FROM {S}.f AS f JOIN {S}.f AS g ON f.k = g.k GROUP BY f.k",
            "a self join, unqualified",
        ),
        (f"SELECT f.k, sum(f.v) AS s FROM {S}.f AS f GROUP BY f.k", "one table"),
        (
            f"SELECT d.region, sum(f.v) AS s FROM {S}.f AS f JOIN {S}.d AS d ON f.d = d.id GROUP BY d.region HAVING sum(f.v) > 1",
            "HAVING",
        ),
    ],
)
def test_no_eager_path_where_it_would_not_be_exact(query, why):
    schema = {f"{S}.f": {"id": "INTEGER", "k": "INTEGER", "d": "INTEGER", "v": "DECIMAL(9,2)"}}
    schema[f"{S}.d"] = {"id": "INTEGER", "region": "VARCHAR"}
    parsed = sqlglot.parse_one(query, read=DIALECT)
    names = [s.alias_or_name for s in parsed.selects]
    plan = planner.analyze(parsed, names, "lake", types={"s": "DECIMAL(38,2)"}, schema=schema)
    assert plan.eager == {}, why
