"""A table whose refreshes delete and insert the groups they recompute gains a data file each time; past
COMPACT_FILES the refresh compacts it (a commit of its own, carrying the kit's token). Proven on the real lake: the
file count stays bounded where it would have grown by one per refresh, the table and a table that reads its change
feed (whose range then spans the compactions' rewrites) both equal their queries run in full after every refresh,
every refresh INCREMENTAL."""

from __future__ import annotations

import json

import pytest

from ducklake_kit.dynamic_tables.metadata import SUCCEEDED
from ducklake_kit.dynamic_tables.refresh import COMPACT_FILES, INCREMENTAL
from tests.dynamic_tables.oracle import schema_env
from tests.dynamic_tables.test_refresh import S

FACTS = f"lake.{S}.cfacts"
GROUPS, TOUCHED = 50, 20  # each append touches 20 of the 50 groups: > DuckLake's inlining limit (10), so each merge
# writes a data file, and deletes part of older ones (a file whose rows are all deleted is dropped whole)
APPENDS = 12  # without compaction the table would reach 13 files


@pytest.fixture(scope="module")
def env(stack):
    with schema_env(stack) as e:
        yield e


def live_files(env, table: str) -> int:
    return env.sql(f"SELECT count(*) FROM ducklake_list_files('lake', '{table}', schema => '{S}')")[0][0]


def test_a_merged_table_is_compacted_and_stays_equal_to_its_query(env):
    env.sql(f"CREATE OR REPLACE TABLE {FACTS} AS SELECT i % {GROUPS} AS k, i AS v FROM range(200) AS t(i)")
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
