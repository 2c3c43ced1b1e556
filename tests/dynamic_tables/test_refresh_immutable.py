"""IMMUTABLE WHERE: the rows of a dynamic table matching the condition are never recomputed (Snowflake's
immutability constraints). Proven by the oracle over random insert/update/delete streams: after every refresh the
mutable region (the rows where the condition is not true) equals the query's run in full (EXCEPT ALL both ways,
`manage.check`), the immutable region equals the copy taken after the table was created (EXCEPT ALL both ways:
nothing of it updated, deleted or added), and the refresh was INCREMENTAL. Shares the tables and change streams of
test_refresh_union."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ducklake_kit.dynamic_tables.metadata import NO_DATA, SUCCEEDED
from tests.dynamic_tables.oracle import apply, ops, prove, sources
from tests.dynamic_tables.test_refresh import INCREMENTAL, Env, S

TABLES = {  # name: (IMMUTABLE WHERE, query)
    "i_agg": ("(k < 2)", f"SELECT k, count(*) AS n, sum(v) AS s FROM {S}.ufacts GROUP BY k"),
    # Snowflake's example: a dimension changes, only the facts of the mutable region are read again
    "i_left": ("(id <= 3)", f"SELECT f.id, f.k, d.region FROM {S}.ufacts AS f LEFT JOIN {S}.udims AS d ON f.d = d.id"),
    "i_rows": ("(w = 'a')", f"SELECT id, k, w FROM {S}.umore"),
    # inserts into SUM/COUNT groups are not merged into a frozen group's row: its groups are recomputed
    "i_merge": ("(w IS NULL)", f"SELECT w, count(*) AS n, sum(v) AS s FROM {S}.umore GROUP BY w"),
}
NAMES = [f"{S}.{n}" for n in TABLES]


def frozen_equal(env: Env, name: str) -> None:
    """The immutable region is the copy taken after create, row for row."""
    cond = TABLES[name.split(".")[1]][0]
    copy = f"temp.main.frozen_{name.split('.')[1]}"
    for a, b in ((f"lake.{name}", copy), (copy, f"lake.{name}")):
        extra = env.sql(f"SELECT count(*) FROM (SELECT * FROM {a} WHERE {cond} EXCEPT ALL SELECT * FROM {b})")
        assert extra == [(0,)], f"{name}'s immutable region changed"


def refresh_and_prove(env: Env) -> None:
    prove(env, NAMES)  # the mutable regions equal their queries' (manage.check), INCREMENTAL
    for name in NAMES:
        frozen_equal(env, name)


@pytest.fixture(scope="module")
def immutable(env):
    sources(
        env,
        dims="(0, 'a'), (1, 'b'), (2, NULL), (0, 'c')",
        facts="(1, 1, 0, 1.50, 'a'), (2, NULL, 1, 2.25, NULL), (3, 1, 3, 1.50, 'a'), (4, 2, 1, 0.50, 'b')",
        more="(1, 1, 0, 1.50, 'a'), (2, 3, 2, NULL, 'b'), (3, 1, 1, 0.50, NULL)",
    )
    for name, (cond, query) in TABLES.items():
        env.create(
            f"CREATE DYNAMIC TABLE {S}.{name} TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL "
            f"IMMUTABLE WHERE {cond} AS {query}"
        )
        env.sql(f"CREATE OR REPLACE TEMP TABLE frozen_{name} AS SELECT * FROM lake.{S}.{name} WHERE {cond}")
    for name in NAMES:
        env.equal(name)
    yield env
    env.drop_all()


def test_the_condition_is_stored_and_shown(immutable):
    d = immutable.meta.get(f"{S}.i_agg")
    assert d.immutable_where == "(k < 2)"
    assert immutable.sql("SELECT count(*) FROM temp.main.frozen_i_agg") == [(1,)]  # the k = 1 group is frozen


@settings(max_examples=10, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ops, min_size=1, max_size=6))
def test_every_refresh_keeps_the_immutable_region_and_recomputes_the_rest(immutable, stream):
    for op in stream:
        if op[0] == "refresh":
            refresh_and_prove(immutable)
        else:
            apply(immutable, op)
    refresh_and_prove(immutable)


def test_a_frozen_row_keeps_its_value_while_the_query_moves_on(env):
    env.drop_all()
    env.sql(f"CREATE OR REPLACE TABLE lake.{S}.ia (id INTEGER, d INTEGER)")
    env.sql(f"CREATE OR REPLACE TABLE lake.{S}.ib (id INTEGER, name VARCHAR)")
    env.sql(f"INSERT INTO lake.{S}.ia VALUES (1, 10), (2, 10), (3, 20)")
    env.sql(f"INSERT INTO lake.{S}.ib VALUES (10, 'ten'), (20, 'twenty')")
    name = f"{S}.frozen"
    env.create(
        f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' IMMUTABLE WHERE (id = 1) AS "
        f"SELECT a.id, b.name FROM {S}.ia AS a LEFT JOIN {S}.ib AS b ON a.d = b.id"
    )
    env.sql(f"UPDATE lake.{S}.ib SET name = 'TEN' WHERE id = 10")  # the dimension changes under rows 1 and 2
    env.sql(f"INSERT INTO lake.{S}.ia VALUES (1, 20)")  # a new row matching the condition: not added
    [r] = env.refresh(name).refreshes
    assert (r.status, r.mode) == (SUCCEEDED, INCREMENTAL), r.error
    # only the mutable region is read again: row 2 as it was and is (rows 1 are not recomputed, nor counted)
    assert r.reason.startswith("2 affected distinct rows recomputed"), r.reason
    assert env.sql(f"SELECT * FROM lake.{name} ORDER BY ALL") == [(1, "ten"), (2, "TEN"), (3, "twenty")]
    env.equal(name)  # the mutable region is the query's
    env.sql(f"DELETE FROM lake.{S}.ia WHERE id = 1")  # gone from the source, kept in the table
    [r] = env.refresh(name).refreshes
    assert r.status in (SUCCEEDED, NO_DATA) and env.sql(f"SELECT count(*) FROM lake.{name} WHERE id = 1") == [(1,)]
    env.drop_all()
