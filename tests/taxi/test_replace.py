"""`load --mode replace` touches exactly the periods it names (issue 29): replacing one month of a three-month load
keeps the other two months' rows, quarantine and load_log rows, and the load's checks prove it, a check per period
it did not name, which fails when a replace takes more (the old delete of a whole earlier load)."""

from __future__ import annotations

import pytest

from ducklake_kit.checks import CheckRun
from ducklake_kit.lake import Lake
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.taxi import flow
from ducklake_kit.taxi.load import LOAD_LOG, QUARANTINE, TRIPS, FileResult, LoadResult, Replaced, ddl_statements
from ducklake_kit.taxi.sources import SourceFile
from ducklake_kit.taxi.verify import NO_LOG_ROW, replace_kept_other_periods

pytestmark = [pytest.mark.integration]
MONTHS = "2014-01..2014-03"  # months no other test loads (the tests share one lake)
ROWS = 1500


def _kept(checks: CheckRun) -> dict[str, bool]:
    """The replace checks by period: period -> passed."""
    prefix, suffix = "replace left ", " as it was: rows and fingerprints of trips, quarantine and load_log"
    return {
        c.name[len(prefix) : -len(suffix)]: c.passed
        for c in checks.checks
        if c.name.startswith(prefix) and c.name.endswith(suffix)
    }


def _by_file(lake: Lake, schema: str = "main", like: str = "%2014-0%") -> dict[str, tuple]:
    """source_file -> (trips rows, trips row hashes, quarantine rows, quarantine row hashes, its load_log rows), read
    here with plain SQL on the current lake (not the check's time travel)."""
    out = {}
    for (name,) in lake.con.execute(
        f"SELECT DISTINCT source_file FROM {schema}.{LOAD_LOG} WHERE source_file LIKE ? ORDER BY 1", [like]
    ).fetchall():
        figures = tuple(
            x
            for tbl in (TRIPS, QUARANTINE)
            for x in lake.con.execute(
                f"SELECT count(*), sum(hash(t)::HUGEINT) FROM {schema}.{tbl} AS t WHERE source_file = ?", [name]
            ).fetchone()
        )
        log = lake.con.execute(
            f"SELECT load_id, period, rows_read, rows_accepted, rows_rejected, data_files FROM "
            f"{schema}.{LOAD_LOG} WHERE source_file = ? ORDER BY load_id",
            [name],
        ).fetchall()
        out[name] = (*figures, log)
    return out


@pytest.mark.spark
def test_replacing_one_month_of_a_three_month_load_keeps_the_other_two(stack):
    first, checks = flow.load_checked(
        Kit.on(stack.platform, stack.state),
        flow.LoadSpec(source="synthetic", months=MONTHS, rows_per_month=ROWS, seed=5),
    )
    assert checks.ok, [c.as_dict() for c in checks.failed]
    jan, feb, mar = (f.source.path.name for f in first.files)
    with Lake(stack.platform.endpoints()) as lake:
        before = _by_file(lake)
    assert [[r[:3] for r in before[n][4]] for n in (jan, feb, mar)] == [
        [(first.load_id, "2014-01", ROWS)],
        [(first.load_id, "2014-02", ROWS)],
        [(first.load_id, "2014-03", ROWS)],
    ]

    result, checks = flow.load_checked(
        Kit.on(stack.platform, stack.state),
        flow.LoadSpec(source="synthetic", months="2014-02", rows_per_month=ROWS // 3, seed=6, mode="replace"),
    )
    assert checks.ok, [c.as_dict() for c in checks.failed]
    assert result.replaced == [Replaced(first.load_id, feb, "2014-02")]
    kept = _kept(checks)
    # the months it did not name are listed (the shared lake's other periods too), the month it named is not
    assert kept.get("2014-01") is True and kept.get("2014-03") is True and "2014-02" not in kept
    with Lake(stack.platform.endpoints()) as lake:
        after = _by_file(lake)
    # January and March: the same rows, quarantine and load_log row (still the first load's, still true)
    assert (after[jan], after[mar]) == (before[jan], before[mar])
    # February: this load's rows alone, one load_log row
    assert after[feb][0] + after[feb][2] == ROWS // 3 and [r[:3] for r in after[feb][4]] == [
        (result.load_id, "2014-02", ROWS // 3)
    ]


def test_the_check_fails_when_a_replace_takes_more_than_it_names(stack, tmp_path):
    """Without Spark, in a schema of its own: hand-made commits that do what a replace's commit does. The per-file
    delete passes; the old delete of a whole earlier load, or a changed row in another period, fails that period."""
    schema = "replace_check_test"
    name = {p: f"yellow_tripdata_{p}.parquet" for p in ("2014-01", "2014-02", "2014-03")}

    def load(lake: Lake, load_id: str, period: str, deletes: list[str]) -> LoadResult:
        """One commit, as `_commit` makes it: the deletes, then two trips and one quarantine row and the log row."""
        src = SourceFile(tmp_path / name[period], "synthetic", 2014, int(period[-2:]), f"sha-{load_id}-{period}", 3)
        lake.con.execute("BEGIN TRANSACTION")
        for stmt in deletes:
            lake.con.execute(stmt)
        for tbl, n in ((TRIPS, 2), (QUARANTINE, 1)):
            lake.con.execute(
                f"INSERT INTO {schema}.{tbl} (vendor_id, total_amount, load_id, source_file) "
                f"SELECT i, i * 1.5, ?, ? FROM range({n}) r(i)",
                [load_id, src.path.name],
            )
        lake.con.execute(
            f"INSERT INTO {schema}.{LOAD_LOG} (load_id, source_file, sha256, period, rows_read) VALUES (?, ?, ?, ?, 3)",
            [load_id, src.path.name, src.sha256, period],
        )
        lake.con.execute("COMMIT")
        return LoadResult(
            load_id,
            "replace",
            "test",
            files=[FileResult(src, status="loaded", load_id=load_id)],
            snapshot_id=lake.current_snapshot(),
        )

    def check(lake: Lake, result: LoadResult) -> dict[str, bool]:
        checks = CheckRun()
        replace_kept_other_periods(lake, result, checks, schema)
        return _kept(checks)

    def per_file(load_id: str, period: str) -> list[str]:  # the new commit's deletes: that file's rows only
        return [
            f"DELETE FROM {schema}.{t} WHERE load_id = '{load_id}' AND source_file = '{name[period]}'"
            for t in (TRIPS, QUARANTINE, LOAD_LOG)
        ]

    with Lake(stack.platform.endpoints()) as lake:
        lake.run(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        for stmt in ddl_statements(schema):
            lake.run(stmt)
        lake.run(f"INSERT INTO {schema}.{TRIPS} (vendor_id) VALUES (9)")  # a row no load wrote: kept too
        # one load of three months, as `all` makes it
        lake.con.execute("BEGIN TRANSACTION")
        for period in name:
            for tbl in (TRIPS, QUARANTINE):
                lake.con.execute(
                    f"INSERT INTO {schema}.{tbl} (vendor_id, load_id, source_file) VALUES (1, 'l1', ?)", [name[period]]
                )
            lake.con.execute(
                f"INSERT INTO {schema}.{LOAD_LOG} (load_id, source_file, sha256, period) VALUES ('l1', ?, ?, ?)",
                [name[period], f"sha-l1-{period}", period],
            )
        lake.con.execute("COMMIT")

        # the new commit: February's file of l1 swapped out, January and March kept
        assert check(lake, load(lake, "l2", "2014-02", per_file("l1", "2014-02"))) == {
            "2014-01": True,
            "2014-03": True,
            NO_LOG_ROW: True,
        }
        # the old commit (`DELETE ... WHERE load_id = ?` for every load that held the period): replacing March takes
        # l1 whole, so January goes too, and the check for January fails
        old = [f"DELETE FROM {schema}.{t} WHERE load_id = 'l1'" for t in (TRIPS, QUARANTINE, LOAD_LOG)]
        assert check(lake, load(lake, "l3", "2014-03", old)) == {"2014-02": True, NO_LOG_ROW: True, "2014-01": False}
        # the same number of rows but one changed: the fingerprint fails that period
        changed = [
            *per_file("l3", "2014-03"),
            f"UPDATE {schema}.{TRIPS} SET total_amount = 99 WHERE load_id = 'l2' AND vendor_id = 0",
        ]
        assert check(lake, load(lake, "l4", "2014-03", changed)) == {"2014-02": False, NO_LOG_ROW: True}
        lake.run(f"DROP SCHEMA {schema} CASCADE")
