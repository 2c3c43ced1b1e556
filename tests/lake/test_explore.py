"""What the console's Lake page shows, from the library: tables with row counts and columns, the snapshot timeline
with commit messages, the raw catalog tables read-only; each compared with PostgreSQL or DuckDB asked directly.
Everything here writes only the schema `explore_tests`."""

from __future__ import annotations

import psycopg
import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake, explore
from ducklake_kit.lake.transactions import commit
from ducklake_kit.platforms import postgres

SCHEMA = "explore_tests"


@pytest.fixture(scope="module")
def lake(stack):
    with Lake(stack.platform.endpoints()) as lk:
        lk.run(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}")
        commit(
            lk,
            [f"CREATE TABLE {SCHEMA}.t AS SELECT range AS id, range::VARCHAR AS s FROM range(1234)"],
            "explore: made t",
            extra={"who": "test_explore"},
        )
        yield lk


def test_tables_have_their_true_row_counts_and_columns(lake):
    found = {t.qualified: t for t in explore.tables(lake)}
    t = found[f"{SCHEMA}.t"]
    assert t.rows == lake.scalar(f"SELECT count(*) FROM {SCHEMA}.t") == 1234
    assert t.columns == [("id", "BIGINT"), ("s", "VARCHAR")]
    assert len(found) == lake.scalar("SELECT count(*) FROM duckdb_tables() WHERE database_name = 'lake'")


def test_the_timeline_is_the_catalogs_with_its_commit_messages(lake):
    snaps = explore.snapshots(lake)
    with postgres.connect(lake.endpoints.pg) as conn:
        ids = [r[0] for r in conn.execute("SELECT snapshot_id FROM ducklake_snapshot ORDER BY 1 DESC").fetchall()]
    assert [s.snapshot_id for s in snaps] == ids
    made = next(s for s in snaps if s.commit_message == "explore: made t")
    assert '"who": "test_explore"' in (made.commit_extra_info or "")
    assert made.changes.get("tables_created") == [f"{SCHEMA}.t"]


def test_catalog_tables_are_read_only_and_only_ducklakes(lake):
    names = explore.catalog_tables(lake)
    assert {"ducklake_snapshot", "ducklake_table", "ducklake_data_file"} <= set(names)
    got = explore.catalog_rows(lake, "ducklake_snapshot", limit=2)
    with postgres.connect(lake.endpoints.pg) as conn:
        assert got.total_rows == conn.execute("SELECT count(*) FROM ducklake_snapshot").fetchone()[0]
    assert len(got.rows) == 2 and got.columns[0] == "snapshot_id"
    with pytest.raises(KitError, match="not one of the catalog's ducklake_"):
        explore.catalog_rows(lake, "pg_authid")
    # the connection the page reads with refuses a write, whatever the SQL
    conn = explore._catalog(lake)
    with conn, pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        conn.execute("DELETE FROM ducklake_snapshot WHERE false")


def test_a_diff_is_what_changed_between_two_snapshots(lake):
    t = f"{SCHEMA}.d"
    lake.run(f"CREATE TABLE {t} AS SELECT range AS id, 'a' AS v FROM range(10)")
    before = lake.current_snapshot()
    lake.run(f"INSERT INTO {t} VALUES (100, 'new'), (101, 'new'); DELETE FROM {t} WHERE id < 3")
    lake.run(f"UPDATE {t} SET v = 'b' WHERE id = 5")
    after = lake.current_snapshot()
    got = explore.diff(lake, t, before, after)
    assert got.counts == {"delete": 3, "insert": 2, "update_postimage": 1, "update_preimage": 1}
    assert got.total_rows == 7 and got.columns[-2:] == ["id", "v"]

    # independently: the table at both snapshots, compared as multisets of rows
    def side(a: int, b: int) -> list[tuple]:
        return sorted(
            lake.con.execute(
                f"SELECT id, v FROM {t} AT (VERSION => {a}) EXCEPT ALL SELECT id, v FROM {t} AT (VERSION => {b})"
            ).fetchall()
        )

    added = sorted(r[-2:] for r in got.rows if r[2] in ("insert", "update_postimage"))
    removed = sorted(r[-2:] for r in got.rows if r[2] in ("delete", "update_preimage"))
    assert added == side(after, before) == [(5, "b"), (100, "new"), (101, "new")]
    assert removed == side(before, after) == [(0, "a"), (1, "a"), (2, "a"), (5, "a")]
    # an update's two images stand together, the preimage first
    images = [r[2] for r in got.rows if r[-2] == 5]
    assert images == ["update_preimage", "update_postimage"]


def test_a_diff_the_wrong_way_or_before_the_table_is_one_line(lake):
    with pytest.raises(KitError, match="from an earlier snapshot to a later one, not from 5 to 5"):
        explore.diff(lake, f"{SCHEMA}.t", 5, 5)
    with pytest.raises(KitError, match="does not exist") as exc:
        explore.diff(lake, f"{SCHEMA}.t", 0, 1)
    assert "\n" not in exc.value.line()
