"""The oracle the incremental shapes' tests share (UNION/DISTINCT/WITH, LEFT JOIN, windows): three source tables
in the schema `dt_tests` (facts, more facts, dimensions) with NULL keys and many duplicate rows, a hypothesis stream
of inserts, updates and deletes over them, and the proof after each refresh: every table equals its query run in
full (EXCEPT ALL both ways, `Env.equal`) and every refresh that found changes was INCREMENTAL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import strategies as st

from ducklake_kit.dynamic_tables.metadata import NO_DATA, SUCCEEDED, Metadata
from ducklake_kit.lake import Lake
from tests.dynamic_tables.test_refresh import INCREMENTAL, Env, S

FACTS, MORE, DIMS = f"lake.{S}.ufacts", f"lake.{S}.umore", f"lake.{S}.udims"

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


def prove(env: Env, names: list[str]) -> None:
    """Refresh `names` and prove each equals its query run in full, every refresh that found changes INCREMENTAL."""
    batch = env.refresh(*names)
    for r in batch.refreshes:
        assert r.status in (SUCCEEDED, NO_DATA), (r.name, r.error)
        assert r.status == NO_DATA or r.mode == INCREMENTAL, (r.name, r.mode, r.reason)
    for name in names:
        env.equal(name)


@contextmanager
def schema_env(stack) -> Iterator[Env]:
    """An `Env` on the stack's lake and metadata, the schema made and everything dropped before and after."""
    ep = stack.platform.endpoints()
    with Lake(ep) as lake, Metadata(ep) as meta:
        e = Env(lake, meta)
        e.drop_all()
        lake.con.execute(f"CREATE SCHEMA IF NOT EXISTS lake.{S}")
        yield e
        e.drop_all()


def sources(env: Env, dims: str, facts: str, more: str) -> None:
    """The three source tables afresh, with the given rows (SQL VALUES lists)."""
    for t in (FACTS, MORE):
        env.sql(f"CREATE OR REPLACE TABLE {t} (id INTEGER, k INTEGER, d INTEGER, v DECIMAL(9, 2), w VARCHAR)")
    env.sql(f"CREATE OR REPLACE TABLE {DIMS} (id INTEGER, region VARCHAR)")
    env.sql(f"INSERT INTO {DIMS} VALUES {dims}")
    env.sql(f"INSERT INTO {FACTS} VALUES {facts}")
    env.sql(f"INSERT INTO {MORE} VALUES {more}")


def created(env: Env, tables: dict[str, str]) -> list[str]:
    """Each query as an INCREMENTAL dynamic table of the schema, proven equal to its query at once; their names."""
    for name, query in tables.items():
        env.create(f"CREATE DYNAMIC TABLE {S}.{name} TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL AS {query}")
    names = [f"{S}.{n}" for n in tables]
    for name in names:
        env.equal(name)
    return names
