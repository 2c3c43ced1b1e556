"""Check a load against the source, computed independently: DuckDB reads the raw object in the `raw` bucket
(not the Spark transforms) and its figures must equal what the lake holds for that source file.

For each loaded file:
- rows: source rows == trips rows + quarantine rows (nothing lost, nothing duplicated)
- money: sum(total_amount) over the source == over trips + quarantine, in exact DECIMAL cents
- wall clock: sum of pickup epoch microseconds (exact integers) over the source == over the lake (no time-zone shift anywhere)
- per month: rows by pickup month in the source == rows by pickup month in trips + quarantine
- partitions: every accepted trip's pickup lies in the file's month (others are quarantined)
"""

from __future__ import annotations

from ducklake_kit.checks import CheckRun
from ducklake_kit.lake import Lake
from ducklake_kit.taxi.reference import UnreadableSource, source_select
from ducklake_kit.taxi.load import QUARANTINE, TRIPS, FileResult


def verify_file(lake: Lake, fr: FileResult, load_id: str, checks: CheckRun) -> None:
    """Compare the rows this load (load_id) took from this file with the raw object it landed."""
    name = fr.source.path.name
    # the raw object conformed by DuckDB (reference.source_select: the same reading the query checks use, so the
    # two checks cannot drift apart), never by the Spark code under test
    try:
        rel = f"({source_select(lake.con, fr.raw_uri, fr.source.period)})"
    except UnreadableSource as exc:  # this file's checks fail, with the reason and the fix; the others go on
        checks.true(f"{name}: the reference reader can read the raw object", False,
                    expected="readable", actual=exc.line())
        return
    pickup, total = "pickup_at", "total_amount"
    src = lake.con.execute(
        f"SELECT count(*), sum(CAST({total} AS DECIMAL(18, 2))), sum(epoch_us({pickup})) FROM {rel}").fetchone()
    lake_side = lake.con.execute(
        f"SELECT count(*), sum(CAST(total_amount AS DECIMAL(18, 2))), sum(epoch_us(pickup_at)) FROM "
        f"(SELECT total_amount, pickup_at FROM {TRIPS} WHERE source_file = $1 AND load_id = $2 UNION ALL "
        f" SELECT total_amount, pickup_at FROM {QUARANTINE} WHERE source_file = $1 AND load_id = $2)", [name, load_id]).fetchone()
    checks.equal(f"{name}: rows in source == trips + quarantine", lake_side[0], src[0])
    checks.equal(f"{name}: sum(total_amount) in cents", lake_side[1], src[1])
    checks.equal(f"{name}: sum of pickup wall-clock microseconds", lake_side[2], src[2])

    by_month_src = lake.con.execute(
        f"SELECT strftime({pickup}, '%Y-%m') AS m, count(*) FROM {rel} GROUP BY m ORDER BY m NULLS FIRST").fetchall()
    by_month_lake = lake.con.execute(
        f"SELECT strftime(pickup_at, '%Y-%m') AS m, count(*) FROM (SELECT pickup_at FROM {TRIPS} WHERE source_file = $1 "
        f"AND load_id = $2 UNION ALL SELECT pickup_at FROM {QUARANTINE} WHERE source_file = $1 AND load_id = $2) "
        "GROUP BY m ORDER BY m NULLS FIRST", [name, load_id]).fetchall()
    checks.equal(f"{name}: rows per pickup month", by_month_lake, by_month_src)
    if fr.source.month:
        outside = lake.scalar(
            f"SELECT count(*) FROM {TRIPS} WHERE source_file = ? AND load_id = ? AND NOT (pickup_year = ? AND pickup_month = ?)",
            [name, load_id, fr.source.year, fr.source.month])
        checks.equal(f"{name}: accepted trips outside {fr.source.period}", outside, 0)
