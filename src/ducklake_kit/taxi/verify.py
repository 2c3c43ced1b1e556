"""Check a load against the source, computed independently: DuckDB reads the raw object in the `raw` bucket
(not the Spark transforms) and its figures must equal what the lake holds for that source file.

For each loaded file:
- rows: source rows == trips rows + quarantine rows (nothing lost, nothing duplicated)
- money: sum(total_amount) over the source == over trips + quarantine, in exact DECIMAL cents
- wall clock: sum of pickup epoch microseconds (exact integers) over the source == over the lake (no time-zone shift anywhere)
- per month: rows by pickup month in the source == rows by pickup month in trips + quarantine
- partitions: every accepted trip's pickup lies in the file's month (others are quarantined)

And for a load in mode replace, which touches exactly what it names (`replace_kept_other_periods`): every period it
did not name holds, at the load's snapshot, the same rows in trips, quarantine and load_log (count and fingerprint)
as at the snapshot before it.
"""

from __future__ import annotations

import duckdb

from ducklake_kit.checks import CheckRun
from ducklake_kit.lake import Lake
from ducklake_kit.lake.sql import quote_literal
from ducklake_kit.taxi.load import LOAD_LOG, QUARANTINE, TRIPS, FileResult, LoadResult
from ducklake_kit.taxi.reference import UnreadableSource, source_select

NO_LOG_ROW = "(rows no load_log row names)"  # rows written by hand, not by a load: a replace must keep them too


def verify_file(lake: Lake, fr: FileResult, load_id: str, checks: CheckRun) -> None:
    """Compare the rows this load (load_id) took from this file with the raw object it landed."""
    name = fr.source.path.name
    # the raw object conformed by DuckDB (reference.source_select: the same reading the query checks use, so the
    # two checks cannot drift apart), never by the Spark code under test
    try:
        rel = f"({source_select(lake.con, fr.raw_uri, fr.source.period)})"
    except UnreadableSource as exc:  # this file's checks fail, with the reason and the fix; the others go on
        checks.true(
            f"{name}: the reference reader can read the raw object", False, expected="readable", actual=exc.line()
        )
        return
    pickup, total = "pickup_at", "total_amount"
    src = lake.con.execute(
        f"SELECT count(*), sum(CAST({total} AS DECIMAL(18, 2))), sum(epoch_us({pickup})) FROM {rel}"
    ).fetchone()
    lake_side = lake.con.execute(
        f"SELECT count(*), sum(CAST(total_amount AS DECIMAL(18, 2))), sum(epoch_us(pickup_at)) FROM "
        f"(SELECT total_amount, pickup_at FROM {TRIPS} WHERE source_file = $1 AND load_id = $2 UNION ALL "
        f" SELECT total_amount, pickup_at FROM {QUARANTINE} WHERE source_file = $1 AND load_id = $2)",
        [name, load_id],
    ).fetchone()
    checks.equal(f"{name}: rows in source == trips + quarantine", lake_side[0], src[0])
    checks.equal(f"{name}: sum(total_amount) in cents", lake_side[1], src[1])
    checks.equal(f"{name}: sum of pickup wall-clock microseconds", lake_side[2], src[2])

    by_month_src = lake.con.execute(
        f"SELECT strftime({pickup}, '%Y-%m') AS m, count(*) FROM {rel} GROUP BY m ORDER BY m NULLS FIRST"
    ).fetchall()
    by_month_lake = lake.con.execute(
        f"SELECT strftime(pickup_at, '%Y-%m') AS m, count(*) FROM (SELECT pickup_at FROM {TRIPS} WHERE source_file = $1 "
        f"AND load_id = $2 UNION ALL SELECT pickup_at FROM {QUARANTINE} WHERE source_file = $1 AND load_id = $2) "
        "GROUP BY m ORDER BY m NULLS FIRST",
        [name, load_id],
    ).fetchall()
    checks.equal(f"{name}: rows per pickup month", by_month_lake, by_month_src)
    if fr.source.month:
        outside = lake.scalar(
            f"SELECT count(*) FROM {TRIPS} WHERE source_file = ? AND load_id = ? AND NOT (pickup_year = ? AND pickup_month = ?)",
            [name, load_id, fr.source.year, fr.source.month],
        )
        checks.equal(f"{name}: accepted trips outside {fr.source.period}", outside, 0)


def replace_kept_other_periods(lake: Lake, result: LoadResult, checks: CheckRun, schema_name: str = "main") -> None:
    """One check per period a replace did not name: at the load's snapshot, the rows of that period's files in trips
    and quarantine, and its load_log rows, are the ones of the snapshot just before it (count and fingerprint).

    Computed from the lake alone, by time travel to the two snapshots, not from the load's plan: the difference between
    them is exactly what this load's one snapshot changed, whoever else committed before or after it. A row belongs
    to the period its file was logged with before the load. Named are the periods of the files loaded now and the
    contents of those files (a replace also swaps out the same file loaded under another period, e.g. 'any')."""
    if result.snapshot_id is None:
        return  # nothing loaded, nothing changed
    loaded = [f for f in result.files if f.status == "loaded" and f.load_id == result.load_id]
    named = {f.source.period for f in loaded if f.source.period != "any"}
    contents = sorted({f.source.sha256 for f in loaded})
    after = int(result.snapshot_id)
    row = lake.con.execute(
        f"SELECT max(snapshot_id) FROM ducklake_snapshots({quote_literal(lake.alias)}) WHERE snapshot_id < ?", [after]
    ).fetchone()
    if row is None or row[0] is None:
        return  # the lake's first snapshot: there was nothing before it
    before = int(row[0])
    states = {v: _period_rows(lake, schema_name, before, v, result.load_id, contents) for v in (before, after)}
    for period in sorted((set(states[before]) | set(states[after])) - named):
        checks.equal(
            f"replace left {period} as it was: rows and fingerprints of trips, quarantine and load_log",
            states[after].get(period, {}),
            states[before].get(period, {}),
        )


def _period_rows(
    lake: Lake, q: str, logged_at: int, version: int, load_id: str, contents: list[str]
) -> dict[str, dict[str, list]]:
    """period -> table -> [rows, sum of row hashes] at `version`, a row's period being its file's in load_log at
    `logged_at`; without this load's own rows and the files of the given contents."""
    log = f"(SELECT load_id, source_file, period, sha256 FROM {q}.{LOAD_LOG} AS l AT (VERSION => {int(logged_at)}))"
    keep = "r.load_id IS DISTINCT FROM $1 AND (log.sha256 IS NULL OR NOT list_contains($2, log.sha256))"
    out: dict[str, dict[str, list]] = {}
    for tbl in (TRIPS, QUARANTINE, LOAD_LOG):
        try:
            rows = lake.con.execute(
                f"SELECT coalesce(log.period, {quote_literal(NO_LOG_ROW)}), count(*), sum(r.h) FROM "
                f"(SELECT load_id, source_file, hash(t)::HUGEINT AS h FROM {q}.{tbl} AS t AT (VERSION => {int(version)})) AS r "
                f"LEFT JOIN {log} AS log USING (load_id, source_file) WHERE {keep} GROUP BY 1",
                [load_id, contents],
            ).fetchall()
        except duckdb.CatalogException:  # the table did not exist at that version (the first load; a dropped table)
            rows = []
        for period, n, h in rows:
            out.setdefault(period, {})[tbl] = [int(n), str(h)]
    return out
