"""Side (c) of `bench --suite load`: the same source files conformed, flagged and derived by DuckDB alone, in one
process, written to the lake's S3 as Parquet laid out like the load's (accepted rows partitioned by pickup year and
month, rejected rows in one quarantine file per source file). The reference for what this machine can do.

The conform and the quality rules are the reference reader's (`taxi.reference.source_select`: the SQL the load's
checks already use), widened to every canonical column; the derived columns and the zone join are written here in
SQL, as `transforms.derive` computes them. Nothing is registered in the catalog: the files are the output.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ducklake_kit.lake.sql import quote_literal
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.taxi import schema
from ducklake_kit.taxi.load import PARTITION_KEYS, QUARANTINE, TRIPS, trips_columns
from ducklake_kit.taxi.reference import reference_connection, source_select
from ducklake_kit.taxi.sources import SourceFile

# transforms.DERIVED_COLUMNS, computed by DuckDB: calendar parts of the wall clock, whole seconds rounded down
# (Spark: floor(micros / 1e6)), ISO weekday (Spark: weekday + 1), zone names by a left join on the lookup
DERIVED_SQL: dict[str, str] = {
    "pickup_date": "CAST(f.pickup_at AS DATE)",
    "pickup_year": "CAST(year(f.pickup_at) AS INTEGER)",
    "pickup_month": "CAST(month(f.pickup_at) AS INTEGER)",
    "pickup_hour": "CAST(hour(f.pickup_at) AS INTEGER)",
    "pickup_weekday": "CAST(isodow(f.pickup_at) AS INTEGER)",
    "trip_duration_s": "CAST(floor((epoch_us(f.dropoff_at) - epoch_us(f.pickup_at)) / 1e6) AS BIGINT)",
    "pu_borough": "pu.borough",
    "pu_zone": "pu.zone",
    "do_borough": "dz.borough",
    "do_zone": "dz.zone",
}


@dataclass
class DuckDBLoad:
    """What side (c) wrote: one row count per table, the files (s3:// paths) and where they are."""

    rows_accepted: int = 0
    rows_rejected: int = 0
    files: list[str] = field(default_factory=list)
    prefix: str = ""  # every file is under it (the bench removes it afterwards)


def output_prefix(ep: Endpoints, folder: str) -> str:
    return f"{ep.data_path.rstrip('/')}/{folder}"


def duckdb_load(
    ep: Endpoints, files: list[SourceFile], zones_path: Path, folder: str, load_id: str, threads: int | None = None
) -> DuckDBLoad:
    """Conform, flag and derive `files` with one DuckDB (all cores unless `threads`), writing under
    `<data path>/<folder>/{trips,quarantine}/`."""
    prefix = output_prefix(ep, folder)
    trips_dir, quarantine_dir = f"{prefix}/{TRIPS}", f"{prefix}/{QUARANTINE}"
    canonical = {c.name: c.duckdb_type for c in schema.CANONICAL_COLUMNS}
    out = DuckDBLoad(prefix=prefix)
    con = reference_connection(ep)
    try:
        if threads:
            con.execute(f"SET threads = {int(threads)}")
        con.execute("SET preserve_insertion_order = false")  # the lake keeps no row order: lets COPY write in parallel
        con.execute(
            "CREATE TEMP TABLE zones AS SELECT LocationID AS location_id, Borough AS borough, Zone AS zone "
            f"FROM read_csv({quote_literal(str(zones_path))}, header = true)"
        )
        lake_cols = [c for c, _ in trips_columns()]
        for f in files:
            flagged = source_select(con, str(f.path), f.period, canonical)
            exprs = {
                **{c: f"f.{c}" for c in canonical},
                **DERIVED_SQL,
                "load_id": quote_literal(load_id),
                "source_file": quote_literal(f.path.name),
            }
            select = (
                f"SELECT {', '.join(f'{exprs[c]} AS {c}' for c in lake_cols)}, f.reject_reason FROM ({flagged}) f "
                "LEFT JOIN zones pu ON pu.location_id = f.pu_location_id "
                "LEFT JOIN zones dz ON dz.location_id = f.do_location_id"
            )
            name = f"duckdb-{load_id}-"
            # two passes over the source (accepted, then rejected) cost less than keeping the flagged rows in memory
            rows, written = con.execute(
                f"COPY (SELECT * EXCLUDE (reject_reason) FROM ({select}) WHERE reject_reason IS NULL) TO "
                f"{quote_literal(trips_dir)} (FORMAT parquet, PARTITION_BY ({', '.join(PARTITION_KEYS)}), "
                f"WRITE_PARTITION_COLUMNS true, FILENAME_PATTERN '{name}{{uuid}}', RETURN_FILES true, APPEND)"
            ).fetchone()
            out.rows_accepted += rows
            out.files += list(written or [])
            path = f"{quarantine_dir}/{name}{uuid.uuid4()}.parquet"
            rejected = con.execute(
                f"COPY (SELECT * FROM ({select}) WHERE reject_reason IS NOT NULL) TO "
                f"{quote_literal(path)} (FORMAT parquet)"
            ).fetchone()[0]
            out.rows_rejected += rejected
            out.files.append(path)  # written even when empty, as one file per source: removed with the prefix
    finally:
        con.close()
    return out
