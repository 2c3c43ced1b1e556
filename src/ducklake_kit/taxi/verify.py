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

from ..checks import CheckRun
from ..lake import Lake
from . import schema
from .load import QUARANTINE, TRIPS, FileResult


def _source_relation(raw_uri: str, columns: list[str]) -> tuple[str, str, str]:
    """SQL for the raw object and the expressions for its pickup time and total amount (source spellings)."""
    variant = schema.detect_variant(columns)
    source_of = {canon: src for src, canon in variant.mapping}
    pickup, total = f'"{source_of["pickup_at"]}"', f'"{source_of["total_amount"]}"'
    if raw_uri.lower().endswith(".csv"):
        rel = f"read_csv('{raw_uri}', header = true, all_varchar = true)"
        # BigQuery labels local wall-clock times '+00:00': keep the wall clock, drop the label
        pickup = f"CAST(regexp_replace({pickup}, '\\s*([+-]\\d\\d:?\\d\\d|Z|UTC)$', '') AS TIMESTAMP)"
        total = f"CAST({total} AS DOUBLE)"
    else:
        rel = f"read_parquet('{raw_uri}')"
        pickup = f"CAST({pickup} AS TIMESTAMP)"
    return rel, pickup, total


def _columns(lake: Lake, raw_uri: str) -> list[str]:
    rel = f"read_csv('{raw_uri}', header = true, all_varchar = true)" if raw_uri.lower().endswith(".csv") else f"read_parquet('{raw_uri}')"
    return [r[0] for r in lake.con.execute(f"DESCRIBE SELECT * FROM {rel}").fetchall()]


def verify_file(lake: Lake, fr: FileResult, load_id: str, checks: CheckRun) -> None:
    """Compare the rows this load (load_id) took from this file with the raw object it landed."""
    name = fr.source.path.name
    rel, pickup, total = _source_relation(fr.raw_uri, _columns(lake, fr.raw_uri))
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
