"""The canonical `trips` schema and the known source variants that conform to it.

One name per concept: every layer (Spark, DuckLake, queries, notebooks) says `pickup_at`, `pu_location_id`,
`ratecode_id`, ... as below, never the source spellings (`tpep_pickup_datetime`, `PULocationID`,
`rate_code_id`, ...). The pickup and dropoff times are named `pickup_at` / `dropoff_at` because they are
NYC local wall-clock times of any source (the `tpep_` prefix names one vendor system, and the BigQuery
export calls them `pickup_datetime`).

Timestamps are TIMESTAMP_NTZ in Spark (DuckDB/DuckLake `TIMESTAMP`): the wall clock the taximeter showed,
never shifted by a time zone. Money and distance are DOUBLE, exactly as every source stores them, so sums
in the lake equal sums over the source files. Codes (vendor, rate code, payment type, zones, passengers)
are INT whatever width or floating type the source used (the TLC files drift between int32, int64 and double).

This module has no Spark or I/O dependency: `transforms.py` builds Spark types from `spark_type`, the
generator uses the Arrow types of `TLC_ERAS`, the loader can use `duckdb_type`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from difflib import get_close_matches

import pyarrow as pa

from ducklake_kit.errors import KitError


@dataclass(frozen=True)
class CanonicalColumn:
    name: str
    spark_type: str  # Spark DDL type name
    duckdb_type: str  # the DuckLake column type
    meaning: str


_INT = ("INT", "INTEGER")
_DOUBLE = ("DOUBLE", "DOUBLE")
_TS = ("TIMESTAMP_NTZ", "TIMESTAMP")
_STRING = ("STRING", "VARCHAR")


def _col(name: str, types: tuple[str, str], meaning: str) -> CanonicalColumn:
    return CanonicalColumn(name, types[0], types[1], meaning)


CANONICAL_COLUMNS: tuple[CanonicalColumn, ...] = (
    _col("vendor_id", _INT, "1 Creative Mobile Technologies, 2 Curb Mobility, 6 Myle Technologies, 7 Helix"),
    _col("pickup_at", _TS, "meter engaged, NYC local wall-clock time"),
    _col("dropoff_at", _TS, "meter disengaged, NYC local wall-clock time"),
    _col("passenger_count", _INT, "driver-entered; null in the Flex Fare block"),
    _col("trip_distance", _DOUBLE, "miles, from the taximeter"),
    _col("ratecode_id", _INT, "1 Standard, 2 JFK, 3 Newark, 4 Nassau/Westchester, 5 Negotiated, 6 Group, 99 unknown"),
    _col("store_and_fwd_flag", _STRING, "Y: held in the vehicle before sending, N: sent at once"),
    _col("pu_location_id", _INT, "pickup taxi zone (1..265, see the zone lookup)"),
    _col("do_location_id", _INT, "dropoff taxi zone (1..265)"),
    _col("payment_type", _INT, "0 Flex Fare, 1 Credit card, 2 Cash, 3 No charge, 4 Dispute, 5 Unknown, 6 Voided"),
    _col("fare_amount", _DOUBLE, "time-and-distance fare, USD"),
    _col("extra", _DOUBLE, "rush hour and overnight surcharges, USD"),
    _col("mta_tax", _DOUBLE, "MTA tax, USD"),
    _col("tip_amount", _DOUBLE, "credit card tips; cash tips are not recorded"),
    _col("tolls_amount", _DOUBLE, "USD"),
    _col("improvement_surcharge", _DOUBLE, "USD"),
    _col("total_amount", _DOUBLE, "charged to the passenger, without cash tips, USD"),
    _col("congestion_surcharge", _DOUBLE, "NYS congestion surcharge, USD; null where the source has none"),
    _col("airport_fee", _DOUBLE, "pickups at JFK and LaGuardia, USD; null where the source has none"),
    _col("cbd_congestion_fee", _DOUBLE, "MTA Congestion Relief Zone toll (from 2025-01-05), USD; null before 2025"),
)
CANONICAL_NAMES: tuple[str, ...] = tuple(c.name for c in CANONICAL_COLUMNS)
CANONICAL_TYPES: dict[str, str] = {c.name: c.spark_type for c in CANONICAL_COLUMNS}


@dataclass(frozen=True)
class SourceVariant:
    """A known shape of trip records: which source column becomes which canonical column.

    Canonical columns absent from `mapping` arrive as typed nulls. `ignored` columns are known, carry
    nothing the canonical schema keeps, and are dropped. `timestamp_note` says how the source's
    timestamps are to be read (they are always NYC wall clock).
    """

    name: str
    description: str
    mapping: tuple[tuple[str, str], ...]  # (source column, canonical column), in source order
    ignored: tuple[str, ...] = ()
    timestamp_note: str = "naive NYC local wall-clock time"

    @property
    def source_columns(self) -> frozenset[str]:
        return frozenset([s for s, _ in self.mapping] + list(self.ignored))

    @property
    def missing_canonical(self) -> tuple[str, ...]:
        """Canonical columns this variant does not carry (filled with typed nulls)."""
        have = {c for _, c in self.mapping}
        return tuple(n for n in CANONICAL_NAMES if n not in have)


_TLC_PREFIX = (
    ("VendorID", "vendor_id"),
    ("tpep_pickup_datetime", "pickup_at"),
    ("tpep_dropoff_datetime", "dropoff_at"),
    ("passenger_count", "passenger_count"),
    ("trip_distance", "trip_distance"),
    ("RatecodeID", "ratecode_id"),
    ("store_and_fwd_flag", "store_and_fwd_flag"),
    ("PULocationID", "pu_location_id"),
    ("DOLocationID", "do_location_id"),
    ("payment_type", "payment_type"),
    ("fare_amount", "fare_amount"),
    ("extra", "extra"),
    ("mta_tax", "mta_tax"),
    ("tip_amount", "tip_amount"),
    ("tolls_amount", "tolls_amount"),
    ("improvement_surcharge", "improvement_surcharge"),
    ("total_amount", "total_amount"),
    ("congestion_surcharge", "congestion_surcharge"),
)

TLC_2025 = SourceVariant(
    "tlc_2025",
    "TLC yellow Parquet from 2025: 20 columns, `Airport_fee` and `cbd_congestion_fee`",
    _TLC_PREFIX + (("Airport_fee", "airport_fee"), ("cbd_congestion_fee", "cbd_congestion_fee")),
)
TLC_2024 = SourceVariant(
    "tlc_2024",
    "TLC yellow Parquet 2023-2024: 19 columns with `Airport_fee`",
    _TLC_PREFIX + (("Airport_fee", "airport_fee"),),
)
TLC_2022 = SourceVariant(
    "tlc_2022",
    "older TLC yellow Parquet (2022 and before): 19 columns with lower-case `airport_fee`, int64 IDs, "
    "double passenger_count and RatecodeID",
    _TLC_PREFIX + (("airport_fee", "airport_fee"),),
)
GX_SNAKE_CASE = SourceVariant(
    "gx_snake_case",
    "great_expectations' yellow CSV samples 2018-2020: 18 snake_case columns, no airport or CBD fee",
    (
        ("vendor_id", "vendor_id"),
        ("pickup_datetime", "pickup_at"),
        ("dropoff_datetime", "dropoff_at"),
        ("passenger_count", "passenger_count"),
        ("trip_distance", "trip_distance"),
        ("rate_code_id", "ratecode_id"),
        ("store_and_fwd_flag", "store_and_fwd_flag"),
        ("pickup_location_id", "pu_location_id"),
        ("dropoff_location_id", "do_location_id"),
        ("payment_type", "payment_type"),
        ("fare_amount", "fare_amount"),
        ("extra", "extra"),
        ("mta_tax", "mta_tax"),
        ("tip_amount", "tip_amount"),
        ("tolls_amount", "tolls_amount"),
        ("improvement_surcharge", "improvement_surcharge"),
        ("total_amount", "total_amount"),
        ("congestion_surcharge", "congestion_surcharge"),
    ),
)
BIGQUERY = SourceVariant(
    "bigquery",
    "BigQuery public TLC table export (bigquery-public-data.new_york_taxi_trips): `imp_surcharge`, "
    "`rate_code`, no congestion_surcharge",
    (
        ("vendor_id", "vendor_id"),
        ("pickup_datetime", "pickup_at"),
        ("dropoff_datetime", "dropoff_at"),
        ("passenger_count", "passenger_count"),
        ("trip_distance", "trip_distance"),
        ("rate_code", "ratecode_id"),
        ("store_and_fwd_flag", "store_and_fwd_flag"),
        ("payment_type", "payment_type"),
        ("fare_amount", "fare_amount"),
        ("extra", "extra"),
        ("mta_tax", "mta_tax"),
        ("tip_amount", "tip_amount"),
        ("tolls_amount", "tolls_amount"),
        ("imp_surcharge", "improvement_surcharge"),
        ("airport_fee", "airport_fee"),
        ("total_amount", "total_amount"),
        ("pickup_location_id", "pu_location_id"),
        ("dropoff_location_id", "do_location_id"),
    ),
    # the export's own partition columns; the canonical partition keys are derived from pickup_at
    ignored=("data_file_year", "data_file_month"),
    timestamp_note="labelled `+00:00` (UTC) but really NYC local wall-clock time: the label is dropped, "
    "the clock reading kept",
)
CANONICAL = SourceVariant(
    "canonical",
    "already canonical (the lake's own column names): conform is a type check",
    tuple((n, n) for n in CANONICAL_NAMES),
)

VARIANTS: dict[str, SourceVariant] = {
    v.name: v for v in (TLC_2025, TLC_2024, TLC_2022, GX_SNAKE_CASE, BIGQUERY, CANONICAL)
}


def get_variant(variant: str | SourceVariant) -> SourceVariant:
    """A variant by name (or the variant itself)."""
    if isinstance(variant, SourceVariant):
        return variant
    try:
        return VARIANTS[variant]
    except KeyError:
        raise KitError(f"unknown source variant {variant!r}", f"use one of: {', '.join(VARIANTS)}") from None


def detect_variant(columns: Iterable[str], source: str | None = None) -> SourceVariant:
    """The variant whose column set is exactly `columns` (order ignored, names case-sensitive).

    Case matters because it is what tells 2024 (`Airport_fee`) from 2022 (`airport_fee`). An unknown
    set raises a KitError naming the closest variant and the missing and unexpected columns.
    """
    cols = list(columns)
    where = f" in {source}" if source else ""
    dups = sorted({c for c in cols if cols.count(c) > 1})
    if dups:
        raise KitError(
            f"duplicate column names{where}: {', '.join(dups)}", "give every column of the file a distinct name"
        )
    have = frozenset(cols)
    for v in VARIANTS.values():
        if have == v.source_columns:
            return v

    def distance(v: SourceVariant) -> tuple[int, int]:
        return (len(v.source_columns ^ have), -len(v.source_columns & have))

    best = min(VARIANTS.values(), key=distance)
    missing = sorted(best.source_columns - have)
    unexpected = sorted(have - best.source_columns)
    parts = []
    if missing:
        parts.append("missing " + ", ".join(missing))
    if unexpected:
        hints = []
        for u in unexpected:
            close = get_close_matches(u, list(best.source_columns - have), n=1, cutoff=0.4)
            hints.append(f"{u} (did you mean {close[0]}?)" if close else u)
        parts.append("unexpected " + ", ".join(hints))
    raise KitError(
        f"unknown trips schema{where} ({len(cols)} columns): closest known variant is {best.name}, {'; '.join(parts)}",
        f"rename the columns to one of the known variants ({', '.join(VARIANTS)}); "
        "they are listed in ducklake_kit.taxi.schema.VARIANTS",
    )


# --- The exact Arrow schemas of TLC yellow files by era (what the synthetic generator writes) ----------

_TLC_MONEY = (
    "fare_amount",
    "extra",
    "mta_tax",
    "tip_amount",
    "tolls_amount",
    "improvement_surcharge",
    "total_amount",
    "congestion_surcharge",
)


def _tlc_arrow_schema(id_type: pa.DataType, airport_fee_name: str, cbd: bool) -> pa.Schema:
    fields = [
        pa.field("VendorID", id_type),
        pa.field("tpep_pickup_datetime", pa.timestamp("us")),
        pa.field("tpep_dropoff_datetime", pa.timestamp("us")),
        pa.field("passenger_count", pa.float64()),
        pa.field("trip_distance", pa.float64()),
        pa.field("RatecodeID", pa.float64()),
        pa.field("store_and_fwd_flag", pa.string()),
        pa.field("PULocationID", id_type),
        pa.field("DOLocationID", id_type),
        pa.field("payment_type", pa.int64()),
        *(pa.field(n, pa.float64()) for n in _TLC_MONEY),
        pa.field(airport_fee_name, pa.float64()),
    ]
    if cbd:
        fields.append(pa.field("cbd_congestion_fee", pa.float64()))
    return pa.schema(fields)


# 2025: the schema of the real 2025 files (checked against the 2025-02 sample: int32 IDs, timestamp[us],
# double passenger_count/RatecodeID). 2024: the same without cbd_congestion_fee. 2022: lower-case
# airport_fee and int64 IDs (timestamps taken as [us] like the later eras: Spark cannot read [ns]).
TLC_ERAS: dict[str, pa.Schema] = {
    "2025": _tlc_arrow_schema(pa.int32(), "Airport_fee", cbd=True),
    "2024": _tlc_arrow_schema(pa.int32(), "Airport_fee", cbd=False),
    "2022": _tlc_arrow_schema(pa.int64(), "airport_fee", cbd=False),
}
ERA_VARIANT: dict[str, SourceVariant] = {"2025": TLC_2025, "2024": TLC_2024, "2022": TLC_2022}


def era_for(year: int) -> str:
    """The TLC schema era of a month's official file: 2025+, 2023-2024, 2022 and before."""
    if year >= 2025:
        return "2025"
    if year >= 2023:
        return "2024"
    return "2022"
