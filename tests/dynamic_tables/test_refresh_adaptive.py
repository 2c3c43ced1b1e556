"""ADAPTIVE refreshes, proven by the oracle: tables of every incremental shape (aggregate over a join, rows, UNION,
LEFT JOIN, window) made ADAPTIVE, a random stream of changes, and before each refresh a random crossover (0: every
change is over it, so full; infinity: incremental; 50 %: whichever the change's size says; `Cost.at`). After every refresh each
table equals its query run in full, and the mode is the one that crossover forces, with the choice in its reason:
switching between full and incremental refreshes in any order keeps the table right. Also the catalog's reading of
a change (`feed.changed`) against what was done, and a join whose unchanged sources read no change feed."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ducklake_kit.dynamic_tables import feed
from ducklake_kit.dynamic_tables.catalog import snapshots_since, table_ids_at
from ducklake_kit.dynamic_tables.cost import Cost
from ducklake_kit.dynamic_tables.metadata import ADAPTIVE, NO_DATA, SUCCEEDED
from ducklake_kit.dynamic_tables.refresh import FULL, Refresher, lock_key
from ducklake_kit.errors import KitError
from ducklake_kit.platforms import postgres
from tests.dynamic_tables.oracle import DIMS, FACTS, MORE, apply, ops, sources
from tests.dynamic_tables.test_refresh import INCREMENTAL, Env, S

TABLES = {
    "a_agg": f"SELECT d.region, count(*) AS n, sum(f.v) AS s, min(f.w) AS lo FROM {S}.ufacts AS f "
    f"JOIN {S}.udims AS d ON f.d = d.id GROUP BY d.region",
    "a_rows": f"SELECT f.id, f.k, f.w FROM {S}.ufacts AS f WHERE f.v IS NULL OR f.v > 1",
    "a_union": f"SELECT k, w FROM {S}.ufacts UNION SELECT k, w FROM {S}.umore",
    "a_left": f"SELECT f.id, f.k, d.region FROM {S}.ufacts AS f LEFT JOIN {S}.udims AS d ON f.d = d.id",
    "a_window": f"SELECT k, w FROM {S}.umore QUALIFY row_number() OVER (PARTITION BY k ORDER BY id DESC) = 1",
}
NAMES = [f"{S}.{n}" for n in TABLES]
CROSSOVERS = st.sampled_from([0.0, 0.5, float("inf")])


@pytest.fixture(scope="module")
def adaptive(env):
    sources(
        env,
        dims="(0, 'a'), (1, 'b'), (2, NULL)",
        facts="(1, 1, 0, 1.50, 'a'), (2, NULL, 1, 2.25, NULL), (3, 1, 3, 1.50, 'a')",
        more="(1, 1, 0, 1.50, 'a'), (2, 3, 2, NULL, 'b'), (3, 1, 1, 0.50, 'b')",
    )
    for name, query in TABLES.items():  # no REFRESH_MODE: ADAPTIVE is the default
        env.create(f"CREATE DYNAMIC TABLE {S}.{name} TARGET_LAG = '1 hour' AS {query}")
    yield env
    env.drop_all()


def refresh_and_prove(env: Env, crossover: float) -> None:
    with Refresher(env.lake, env.meta, cost=Cost.at(crossover), small_change=0) as refresher:
        done = [refresher.refresh(env.meta.get(name)) for name in NAMES]
    for name, r in zip(NAMES, done):
        assert r.status in (SUCCEEDED, NO_DATA), (name, r.error)
        if r.status == SUCCEEDED:
            forced = {0.0: FULL, float("inf"): INCREMENTAL}.get(crossover, r.mode)
            assert r.mode == forced, (name, crossover, r.mode, r.reason)
            assert f"ADAPTIVE chose {r.mode.lower()}: the change (~" in r.reason, r.reason
        env.equal(name)


def test_adaptive_is_the_default_and_every_shape_is_incremental_capable(adaptive):
    for name in NAMES:
        d = adaptive.meta.get(name)
        assert d.refresh_mode == ADAPTIVE and d.plan_kind != "full", (name, d.plan_kind, d.reason)


@settings(max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(ops, st.tuples(st.just("adaptive"), CROSSOVERS)), min_size=1, max_size=6), CROSSOVERS)
def test_every_adaptive_refresh_full_or_incremental_equals_a_full_recompute(adaptive, stream, last):
    for op in stream:
        if op[0] == "adaptive":
            refresh_and_prove(adaptive, op[1])
        elif op[0] != "refresh":
            apply(adaptive, op)
    refresh_and_prove(adaptive, last)


def test_the_catalog_tells_inserts_from_other_changes_and_a_join_reads_only_changed_sources(adaptive):
    e = adaptive
    e.sql(f"INSERT INTO {DIMS} VALUES (50, 'r')")  # a dimension row of its own (the stream before may have left any)
    refresh_and_prove(e, float("inf"))  # every table up to date
    now = e.lake.current_snapshot()
    ids = {t: table_ids_at(e.lake, t.removeprefix("lake."), (now, now))[1] for t in (FACTS, MORE, DIMS)}
    start = e.lake.current_snapshot() + 1
    e.sql(f"INSERT INTO {FACTS} VALUES (100, 2, 50, 1.50, 'c')")
    seen = feed.changed(e.lake, start, e.lake.current_snapshot())
    assert (seen.of(ids[FACTS]), seen.of(ids[MORE]), seen.of(ids[DIMS])) == (feed.INSERTS, feed.NONE, feed.NONE)
    assert seen.same_schema
    # the aggregate over facts JOIN dims reads the insertions of facts only, and no feed of dims
    refresher = e.refresher  # the module's own (closed with it)
    read: list[tuple[str, str]] = []
    real = refresher._changes

    def spy(source, *args):
        read.append((source, args[-1]))
        return real(source, *args)

    real_partial = refresher._inserted_partial

    def spy_partial(source, *args):  # a source whose inserts are read aggregated (`_folded`): its insertions alone
        read.append((source, feed.INSERTS))
        return real_partial(source, *args)

    refresher._changes, refresher._inserted_partial = spy, spy_partial
    try:
        r = refresher.refresh(e.meta.get(f"{S}.a_agg"))
    finally:
        del refresher._changes, refresher._inserted_partial  # the class's own again
    assert (r.status, r.mode) == (SUCCEEDED, INCREMENTAL) and r.reason.startswith("inserts merged into 1 groups"), r
    assert sorted(read) == [(f"{S}.udims", feed.NONE), (f"{S}.ufacts", feed.INSERTS)]
    e.equal(f"{S}.a_agg")
    # the size of a change, from the catalog's file counts: 50 rows in one file (over the inlining limit of 10)
    start = e.lake.current_snapshot() + 1
    e.sql(f"INSERT INTO {FACTS} SELECT 1000 + i, i % 3, 50, 1.50, 'd' FROM range(50) AS r(i)")
    tables = [ids[FACTS], ids[DIMS]]
    est = feed.size(e.lake, tables, start, e.lake.current_snapshot())
    assert (
        est.changed == 50
        and est.rows <= e.sql(f"SELECT (SELECT count(*) FROM {FACTS}) + (SELECT count(*) FROM {DIMS})")[0][0]
    )
    start = e.lake.current_snapshot() + 1
    e.sql(f"DELETE FROM {FACTS} WHERE id >= 1000")
    assert feed.size(e.lake, tables, start, e.lake.current_snapshot()).changed == 50  # removed: counted too
    # the same size read by PostgreSQL in the refresh's first catalog query (`snapshots_since`), from `start` on
    now = e.lake.current_snapshot()
    seen, folded = snapshots_since(e.lake, start - 1, now, tables)
    assert [s.id for s in seen] == list(range(start, now + 1))
    assert folded == feed.size(e.lake, tables, start, now) and folded.changed == 50
    assert snapshots_since(e.lake, start - 1, now)[1] is None
    refresh_and_prove(e, float("inf"))
    # a delete, an update, and a column added: each is another kind of change
    start = e.lake.current_snapshot() + 1
    e.sql(f"DELETE FROM {FACTS} WHERE id = 100")
    e.sql(f"INSERT INTO {DIMS} VALUES (7, 'q')")
    e.sql(f"UPDATE {DIMS} SET region = 'z' WHERE id = 7")
    seen = feed.changed(e.lake, start, e.lake.current_snapshot())
    assert (seen.of(ids[FACTS]), seen.of(ids[DIMS]), seen.of(ids[MORE])) == (feed.ANY, feed.ANY, feed.NONE)
    assert seen.same_schema
    e.sql(f"ALTER TABLE {MORE} ADD COLUMN extra INTEGER")
    seen = feed.changed(e.lake, start, e.lake.current_snapshot())
    assert not seen.same_schema and seen.of(ids[MORE]) == feed.ANY
    refresh_and_prove(e, float("inf"))
    e.sql(f"ALTER TABLE {MORE} DROP COLUMN extra")
    refresh_and_prove(e, float("inf"))


def test_a_refreshers_lock_session_excludes_others_while_held_and_holds_nothing_after(adaptive):
    """The refreshes' advisory locks live on a session the Refresher keeps (no new connection per refresh): another
    session cannot take a table's lock while a refresh holds it, and can once the refresh is over."""
    env = adaptive
    key = lock_key(f"{S}.a_agg")
    other = postgres.connect(env.lake.endpoints.pg)
    try:
        with Refresher(env.lake, env.meta) as refresher:
            with refresher._locked(key, KitError("busy", "wait")):
                assert other.execute("SELECT pg_try_advisory_lock(%s)", [key]).fetchone()[0] is False
            assert other.execute("SELECT pg_try_advisory_lock(%s)", [key]).fetchone()[0] is True
            other.execute("SELECT pg_advisory_unlock(%s)", [key])
            first = refresher._lock_conn
            for _ in range(2):  # two refreshes on one session, and nothing held after either
                env.sql(f"INSERT INTO {FACTS} VALUES (200, 1, 0, 1.50, 'a')")
                assert refresher.refresh(env.meta.get(NAMES[0])).status == SUCCEEDED
                assert other.execute("SELECT pg_try_advisory_lock(%s)", [key]).fetchone()[0] is True
                other.execute("SELECT pg_advisory_unlock(%s)", [key])
            assert refresher._lock_conn is first
        assert first.closed  # closed with the Refresher
    finally:
        other.close()
