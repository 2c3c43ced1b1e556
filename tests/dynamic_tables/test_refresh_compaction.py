"""A table whose refreshes delete and insert more groups than its inlining limit gains a data file each time; past
COMPACT_FILES the refresh compacts it (a commit of its own, carrying the kit's token). Smaller refreshes write their
rows into the catalog (inlined); past COMPACT_INLINED such rows they are flushed and the table compacted the same way.
Proven on the real lake: the file count (the inlined rows) stays bounded where it would have grown with every refresh,
the table and a table that reads its change feed (whose range then spans the compactions' rewrites) both equal their
queries run in full after every refresh, every refresh INCREMENTAL."""

from __future__ import annotations

import json

from ducklake_kit.dynamic_tables import manage, refresh
from ducklake_kit.dynamic_tables.catalog import table_ids_at
from ducklake_kit.dynamic_tables.cost import Cost
from ducklake_kit.dynamic_tables.metadata import SUCCEEDED
from ducklake_kit.dynamic_tables.refresh import COMPACT_FILES, INCREMENTAL, INLINE_ROWS, Refresher
from tests.dynamic_tables.test_refresh import S

FACTS = f"lake.{S}.cfacts"
# each append touches TOUCHED of the GROUPS groups: more than a dynamic table's inlining limit, so each merge writes a
# data file, and deletes part of older ones (a file whose rows are all deleted is dropped whole)
TOUCHED = INLINE_ROWS + 100
GROUPS = TOUCHED + 400
APPENDS = 12  # without compaction the table would reach 13 files


def live_files(env, table: str) -> int:
    return env.sql(f"SELECT count(*) FROM ducklake_list_files('lake', '{table}', schema => '{S}')")[0][0]


def test_a_merged_table_is_compacted_and_stays_equal_to_its_query(env):
    env.sql(f"CREATE OR REPLACE TABLE {FACTS} AS SELECT i % {GROUPS} AS k, i AS v FROM range({GROUPS}) AS t(i)")
    for text in (
        f"CREATE DYNAMIC TABLE {S}.c_agg TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL AS "
        f"SELECT k, sum(v) AS s, count(*) AS n FROM {S}.cfacts GROUP BY k",
        f"CREATE DYNAMIC TABLE {S}.c_down TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL AS "
        f"SELECT k % 5 AS b, sum(s) AS s, count(*) AS groups FROM {S}.c_agg GROUP BY b",
    ):
        env.create(text)
    names = [f"{S}.c_agg", f"{S}.c_down"]
    files, compacted = [], []
    for i in range(APPENDS):
        env.sql(f"INSERT INTO {FACTS} SELECT (j + {i * 7}) % {GROUPS}, j * {i + 2} FROM range({TOUCHED}) AS t(j)")
        batch = env.refresh(*names)
        for r in batch.refreshes:
            assert r.status == SUCCEEDED and r.mode == INCREMENTAL, (r.name, r.status, r.mode, r.reason, r.error)
        agg = next(r for r in batch.refreshes if r.name == names[0])
        assert agg.rows_deleted == agg.rows_inserted == TOUCHED  # the statements' own counts, not the table's size
        compacted.append("data files compacted" in agg.reason)
        files.append(live_files(env, "c_agg"))
        for name in names:
            env.equal(name)
    # without compaction: 1 + APPENDS files; with it, never more than COMPACT_FILES after a refresh
    assert max(files) <= COMPACT_FILES and any(compacted), (files, compacted)
    made = env.sql(
        "SELECT commit_extra_info FROM lake.snapshots() WHERE commit_extra_info LIKE '%\"compacted\"%' "
        f"AND commit_extra_info LIKE '%{S}.c_agg%'"
    )
    assert len(made) == sum(compacted)
    for (info,) in made:
        extra = json.loads(info)
        assert extra["dynamic_table"] == names[0] and len(extra["commit"]) == 32 and "read" not in extra
    env.drop_all()
    env.sql(f"DROP TABLE {FACTS}")


def inlined_rows(env, table: str) -> int:
    """The table's rows in the catalog, live or not (every inlined-data table of it)."""
    names = env.sql(
        "SELECT d.table_name FROM __ducklake_metadata_lake.ducklake_inlined_data_tables d "
        "JOIN __ducklake_metadata_lake.ducklake_table t USING (table_id) "
        f"WHERE t.table_name = '{table}' AND t.end_snapshot IS NULL"
    )
    return sum(env.sql(f"SELECT count(*) FROM __ducklake_metadata_lake.{n}")[0][0] for (n,) in names)


def test_small_merges_are_inlined_then_flushed_and_compacted(env, monkeypatch):
    """Merges of 20 groups write no file (inlined rows and deletes); past COMPACT_INLINED (made 100 here, with a count
    after every refresh) the rows are flushed and the table compacted; the table and its reader stay equal to their
    queries, and the table's own rows kept in memory by the refresher (`Refresher.kept`) stay right across it."""
    monkeypatch.setattr(refresh, "COMPACT_INLINED", 100)
    monkeypatch.setattr(refresh, "COMPACT_CHECK", 1)
    env.sql(f"CREATE OR REPLACE TABLE {FACTS} AS SELECT i % 50 AS k, i AS v FROM range(200) AS t(i)")
    for text in (
        f"CREATE DYNAMIC TABLE {S}.i_agg TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL AS "
        f"SELECT k, sum(v) AS s, count(*) AS n FROM {S}.cfacts GROUP BY k",
        f"CREATE DYNAMIC TABLE {S}.i_down TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL AS "
        f"SELECT k % 5 AS b, sum(s) AS s, count(*) AS groups FROM {S}.i_agg GROUP BY b",
    ):
        env.create(text)
    names = [f"{S}.i_agg", f"{S}.i_down"]
    files, inlined, compacted = [], [], []
    for i in range(8):
        env.sql(f"INSERT INTO {FACTS} SELECT (j + {i * 7}) % 50, j * {i + 2} FROM range(20) AS t(j)")
        batch = env.refresh(*names)
        for r in batch.refreshes:
            assert r.status == SUCCEEDED and r.mode == INCREMENTAL, (r.name, r.status, r.mode, r.reason, r.error)
        agg = next(r for r in batch.refreshes if r.name == names[0])
        assert agg.rows_deleted == agg.rows_inserted == 20
        compacted.append("inlined rows and" in agg.reason)
        files.append(live_files(env, "i_agg"))
        inlined.append(inlined_rows(env, "i_agg"))
        # the counts the refresh reads in its commit's catalog query (`refresh.counts_sql`, PostgreSQL's own), with
        # the inlined-data tables it knows and with none: those of DuckDB's listing and of the catalog read here
        now = env.lake.current_snapshot()
        table_id = table_ids_at(env.lake, names[0], (now, now))[1]
        for known in (env.refresher._inlined_tables.get(table_id, []), []):
            env.refresher._inlined_tables[table_id] = known
            row = env.refresher._catalog(f"SELECT {refresh.counts_sql(table_id, now, known)}")
            counted = env.refresher._counts(table_id, now, row)
            assert (counted[0], counted[2]) == (files[-1], inlined[-1]), (known, counted, files, inlined)
        for name in names:
            env.equal(name)
    # each merge adds 20 rows to the catalog and ends 20: without the flush they would reach 8 x 20 = 160 (plus the
    # deletes of the file's rows); with it, the flushed rows leave the catalog and the table is one file again
    assert any(compacted) and max(files) == 1 and min(inlined) < 100, (files, inlined, compacted)
    assert inlined[0] == 20  # the first merge wrote no file: 20 inlined rows
    env.drop_all()
    env.sql(f"DROP TABLE {FACTS}")


def test_two_refreshers_take_turns_merging_into_one_table(env):
    """Each Refresher keeps the table's rows after its merge (`Refresher.kept`); the other's commit in between makes
    that copy stale, so the next merge reads the table again: every refresh equals the query run in full."""
    env.sql(f"CREATE OR REPLACE TABLE {FACTS} AS SELECT i % 30 AS k, i AS v FROM range(100) AS t(i)")
    env.create(
        f"CREATE DYNAMIC TABLE {S}.t_agg TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL AS "
        f"SELECT k, sum(v) AS s, count(*) AS n, min(v) AS lo FROM {S}.cfacts GROUP BY k"
    )
    with Refresher(env.lake, env.meta) as other:
        for i, refresher in enumerate([env.refresher, env.refresher, other, env.refresher, other, other]):
            # 15 rows: some groups touched (one of them new each time), under the inlining limit
            env.sql(f"INSERT INTO {FACTS} SELECT (j * 3 + {i}) % {30 + i}, j - {i} FROM range(15) AS t(j)")
            [r] = manage.refresh_many(env.lake, env.meta, [f"{S}.t_agg"], refresher=refresher).refreshes
            assert r.status == SUCCEEDED and r.mode == INCREMENTAL and "merged" in r.reason, (r.reason, r.error)
            env.equal(f"{S}.t_agg")
    env.drop_all()
    env.sql(f"DROP TABLE {FACTS}")


def test_a_full_refresh_after_merges_leaves_one_file(env):
    """Merges leave inlined deletes on the table's file; a full refresh then deletes every row, and DuckLake keeps
    that file, all its rows deleted: the refresh compacts it away (no file from before it, no delete file after)."""
    env.sql(f"CREATE OR REPLACE TABLE {FACTS} AS SELECT i % 40 AS k, i AS v FROM range(200) AS t(i)")
    env.create(
        f"CREATE DYNAMIC TABLE {S}.f_agg TARGET_LAG = '1 hour' AS "
        f"SELECT k, sum(v) AS s, count(*) AS n FROM {S}.cfacts GROUP BY k"
    )
    name = f"{S}.f_agg"
    for i in range(3):  # merged (ADAPTIVE, forced incremental): inlined rows and inlined deletes of its file
        env.sql(f"INSERT INTO {FACTS} SELECT (j * 3 + {i}) % 40, j FROM range(15) AS t(j)")
        [r] = env.refresh(name).refreshes
        assert r.mode == INCREMENTAL and "merged" in r.reason, (r.reason, r.error)
    env.sql(f"INSERT INTO {FACTS} SELECT j % 40, j FROM range(15) AS t(j)")
    with Refresher(env.lake, env.meta, cost=Cost.at(0), small_change=0) as full:  # ADAPTIVE chooses full
        [r] = manage.refresh_many(env.lake, env.meta, [name], refresher=full).refreshes
    assert r.status == SUCCEEDED and r.mode == "FULL" and "data files compacted" in r.reason, (r.reason, r.error)
    deletes = env.sql(
        f"SELECT count(*) FROM ducklake_list_files('lake', 'f_agg', schema => '{S}') WHERE delete_file IS NOT NULL"
    )[0][0]
    # the old file rewritten away (its inlined deletes read by the rewrite); the refresh's 40 rows are inlined
    assert (live_files(env, "f_agg"), deletes) == (0, 0)
    env.equal(name)
    env.drop_all()
    env.sql(f"DROP TABLE {FACTS}")
