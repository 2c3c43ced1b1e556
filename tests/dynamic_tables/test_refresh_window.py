"""Window functions with PARTITION BY, and QUALIFY over them (Snowflake's SCD-1 dedup), refreshed incrementally:
the partitions a change touches are recomputed. Proven by the oracle over random streams (NULL partition keys,
rows moving between partitions, ties broken deterministically so that the full recompute has one answer); shares
the tables and change streams of test_refresh_union."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ducklake_kit.dynamic_tables import plan as planner
from ducklake_kit.errors import KitError
from tests.dynamic_tables.oracle import apply, created, ops, prove, sources
from tests.dynamic_tables.test_refresh import INCREMENTAL, Env, S

TABLES = {
    "w_rank": f"SELECT id, k, v, row_number() OVER (PARTITION BY k ORDER BY v, id) AS rn, "
    f"sum(v) OVER (PARTITION BY k) AS total FROM {S}.ufacts",
    # the SCD-1 pattern: the latest row per key
    "w_latest": f"SELECT * FROM {S}.umore QUALIFY row_number() OVER (PARTITION BY k ORDER BY id DESC) = 1",
    # keys that have more than one row: a partition's rows come and go with its size
    "w_dups": f"SELECT k, w, id FROM {S}.umore QUALIFY count(*) OVER (PARTITION BY k) > 1",
    # partitioned by a column of the joined dimension, a running value
    "w_join": f"SELECT f.id, d.region, lag(f.v) OVER (PARTITION BY d.region ORDER BY f.id) AS prev_v "
    f"FROM {S}.ufacts AS f JOIN {S}.udims AS d ON f.d = d.id",
    # over a LEFT JOIN, two windows of one partitioning, a WHERE
    "w_left": f"SELECT f.k, d.region, f.id, count(*) OVER (PARTITION BY f.k) AS n, "
    f"max(d.region) OVER (PARTITION BY f.k) AS top FROM {S}.ufacts AS f LEFT JOIN {S}.udims AS d ON f.d = d.id "
    "WHERE f.id % 2 = 1 OR f.k IS NULL",
}
NAMES = [f"{S}.{n}" for n in TABLES]


def refresh_and_prove(env: Env) -> None:
    prove(env, NAMES)


@pytest.fixture(scope="module")
def windows(env):
    sources(
        env,
        dims="(0, 'a'), (1, 'b'), (2, NULL), (3, 'a')",
        facts="(1, 1, 0, 1.50, 'a'), (2, NULL, 1, 2.25, NULL), (3, 1, 3, 1.50, 'a')",
        more="(1, 1, 0, 1.50, 'a'), (2, 3, 2, NULL, 'b'), (3, 1, 1, 0.50, 'b')",
    )
    created(env, TABLES)
    yield env
    env.drop_all()


def test_partitioned_windows_are_planned_incremental(windows):
    plans = {d.name: d for d in windows.meta.all() if d.name in NAMES}
    assert {n: plans[n].plan_kind for n in NAMES} == dict.fromkeys(NAMES, planner.WINDOW)
    assert plans[f"{S}.w_latest"].plan.startswith("window partitioned by k: the partitions a change touches")
    assert plans[f"{S}.w_left"].plan.startswith("window partitioned by k over LEFT JOINs")


@settings(max_examples=15, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ops, min_size=1, max_size=6))
def test_every_window_refresh_equals_a_full_recompute(windows, stream):
    for op in stream:
        if op[0] == "refresh":
            refresh_and_prove(windows)
        else:
            apply(windows, op)
    refresh_and_prove(windows)


def test_the_latest_row_per_key_follows_inserts_and_deletes(env):
    env.drop_all()
    t = f"lake.{S}.events"
    env.sql(f"CREATE OR REPLACE TABLE {t} (id INTEGER, k VARCHAR, v INTEGER)")
    env.sql(f"INSERT INTO {t} VALUES (1, 'x', 10), (2, 'x', 20), (3, 'y', 30), (4, NULL, 40)")
    name = f"{S}.latest"
    env.create(
        f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL AS "
        f"SELECT * FROM {S}.events QUALIFY row_number() OVER (PARTITION BY k ORDER BY id DESC) = 1"
    )
    got = lambda: env.sql(f"SELECT * FROM lake.{name} ORDER BY id")  # noqa: E731
    assert got() == [(2, "x", 20), (3, "y", 30), (4, None, 40)]
    env.sql(f"INSERT INTO {t} VALUES (5, 'x', 50)")
    [r] = env.refresh(name).refreshes
    assert (r.mode, r.reason, r.rows_deleted, r.rows_inserted) == (
        INCREMENTAL,
        "1 affected partitions recomputed",
        1,
        1,
    )
    env.sql(f"DELETE FROM {t} WHERE id IN (5, 4)")  # x's previous latest is back; the NULL key's only row goes
    [r] = env.refresh(name).refreshes
    assert (r.mode, r.rows_deleted, r.rows_inserted) == (INCREMENTAL, 2, 1)
    assert got() == [(2, "x", 20), (3, "y", 30)]
    env.equal(name)
    env.drop_all()


@pytest.mark.parametrize(
    "query, reason",
    [
        ("SELECT k, row_number() OVER (ORDER BY id) AS r FROM {S}.events", "WINDOW_WITHOUT_PARTITION_BY"),
        ("SELECT id, rank() OVER (PARTITION BY k ORDER BY v) AS r FROM {S}.events", "WINDOW_PARTITION_NOT_SELECTED"),
    ],
)
def test_windows_without_a_selected_partition_stay_full(env, query, reason):
    env.drop_all()
    env.sql(f"CREATE OR REPLACE TABLE lake.{S}.events (id INTEGER, k VARCHAR, v INTEGER)")
    text = query.format(S=S)
    with pytest.raises(KitError, match=f"cannot be refreshed incrementally: {reason}"):
        env.create(f"CREATE DYNAMIC TABLE {S}.no TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL AS {text}")
    env.create(f"CREATE DYNAMIC TABLE {S}.no TARGET_LAG = '1 hour' AS {text}")
    assert (env.meta.get(f"{S}.no").plan_kind, env.meta.get(f"{S}.no").reason) == (planner.FULL, reason)
    env.drop_all()
