"""The trip transforms: pure `DataFrame -> DataFrame` functions, configuration passed in, no I/O.

    raw = read_trips(spark, path)              # edge: reads a file, detects its variant
    trips = conform(raw.df, raw.variant)       # canonical names and types, wall-clock TIMESTAMP_NTZ
    trips = flag_quality(trips, 2025, 1)       # + reject_reason (null = good row)
    trips = derive(trips, read_zones(spark, zone_csv))  # + partition keys, hour, weekday, duration, zone names

Only `read_trips` and `read_zones` touch storage; everything else builds a plan and is tested with literal rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ducklake_kit.errors import KitError
from ducklake_kit.taxi.schema import CANONICAL_COLUMNS, SourceVariant, detect_variant, get_variant

_SPARK_TYPES: dict[str, T.DataType] = {
    "INT": T.IntegerType(),
    "DOUBLE": T.DoubleType(),
    "TIMESTAMP_NTZ": T.TimestampNTZType(),
    "STRING": T.StringType(),
}
TRIPS_SCHEMA = T.StructType([T.StructField(c.name, _SPARK_TYPES[c.spark_type], True) for c in CANONICAL_COLUMNS])

ZONES_SCHEMA = T.StructType(
    [
        T.StructField("location_id", T.IntegerType(), True),
        T.StructField("borough", T.StringType(), True),
        T.StructField("zone", T.StringType(), True),
        T.StructField("service_zone", T.StringType(), True),
    ]
)

# Session settings the reading edge relies on. Spark cannot read INT64 TIMESTAMP(NANOS) Parquet columns
# (some re-written TLC files have them) unless it reads them as epoch-nanosecond longs, which
# `conform` turns into wall-clock timestamps; naive Parquet timestamps must come in as TIMESTAMP_NTZ.
SPARK_CONF: dict[str, str] = {
    "spark.sql.legacy.parquet.nanosAsLong": "true",
    "spark.sql.parquet.inferTimestampNTZ.enabled": "true",
}


def _ntz(value: datetime) -> Column:
    """A TIMESTAMP_NTZ literal. (`F.lit(datetime)` would make a TIMESTAMP in the Python process's time
    zone, and casting it to NTZ would then go through the session time zone: two shifts.)"""
    return F.expr(f"TIMESTAMP_NTZ'{value:%Y-%m-%d %H:%M:%S}'")


_EPOCH = datetime(1970, 1, 1)
# A zone or UTC label after the clock reading ("2022-03-02 15:25:57+00:00", "...Z", "... UTC").
_ZONE_LABEL = r"\s*(Z|UTC|[+-]\d{2}(:?\d{2})?)$"


def _wall_clock(c: Column, source_type: T.DataType) -> Column:
    """A source timestamp as TIMESTAMP_NTZ holding the clock reading the source wrote, whatever the
    session time zone. Every known source records NYC local time; some label it UTC, none means it."""
    if isinstance(source_type, T.TimestampNTZType):
        return c
    if isinstance(source_type, T.TimestampType):
        # An instant labelled UTC: its UTC reading is the clock reading. Casting to NTZ would instead
        # use the session time zone, and the session zone's DST repeats would make it ambiguous.
        return F.timestamp_add("MICROSECOND", F.unix_micros(c), _ntz(_EPOCH))
    if isinstance(source_type, T.LongType):
        # Epoch nanoseconds (Spark's nanosAsLong reading of INT64 TIMESTAMP(NANOS)); sub-microsecond
        # digits are dropped, as TIMESTAMP has microseconds.
        return F.timestamp_add("MICROSECOND", F.floor(c / 1000), _ntz(_EPOCH))
    if isinstance(source_type, T.StringType):
        return F.regexp_replace(F.trim(c), _ZONE_LABEL, "").cast(T.TimestampNTZType())
    if isinstance(source_type, T.DateType):
        return c.cast(T.TimestampNTZType())
    raise TypeError(f"cannot read a timestamp from a {source_type.simpleString()} column")


def _wall_clock_micros(start: Column, end: Column) -> Column:
    """end - start in microseconds, on the wall clock (TIMESTAMP_NTZ: no time zone, no DST jumps),
    as DuckDB computes `dropoff_at - pickup_at` on TIMESTAMP."""
    return F.timestamp_diff("MICROSECOND", start, end)


def _typed(c: Column, source_type: T.DataType, target: str) -> Column:
    if target == "TIMESTAMP_NTZ":
        return _wall_clock(c, source_type)
    if target == "INT" and isinstance(source_type, T.StringType):
        # CSV codes arrive as "1" or "1.0" (BigQuery's rate_code): through DOUBLE, which takes both.
        return c.cast(T.DoubleType()).cast(T.IntegerType())
    if target == "STRING":
        return c.cast(T.StringType())
    return c.cast(_SPARK_TYPES[target])


def conform(df: DataFrame, variant: str | SourceVariant) -> DataFrame:
    """Rename and cast a source DataFrame to the canonical trips schema (`TRIPS_SCHEMA`), in its order.

    Canonical columns the variant lacks become typed nulls; known extra columns are dropped. The column
    set must be exactly the variant's (detect it with `schema.detect_variant(df.columns)`); a mismatch
    raises a KitError naming the missing and unexpected columns. Values are cast with the session's
    rules: with ANSI mode (Spark 4's default) a malformed number fails the job rather than becoming null.
    """
    v = get_variant(variant)
    if frozenset(df.columns) != v.source_columns:
        found = detect_variant(df.columns).name  # raises for an unknown schema, naming the difference
        raise KitError(f"the columns are those of the {found} variant, not {v.name}", f"conform it as {found!r}")
    types = {f.name: f.dataType for f in df.schema.fields}
    source_of = {canon: src for src, canon in v.mapping}
    cols = []
    for c in CANONICAL_COLUMNS:
        src = source_of.get(c.name)
        if src is None:
            cols.append(F.lit(None).cast(_SPARK_TYPES[c.spark_type]).alias(c.name))
        else:
            cols.append(_typed(F.col(f"`{src}`"), types[src], c.spark_type).alias(c.name))
    return df.select(*cols)


# --- Quality --------------------------------------------------------------------------------------------

MAX_DISTANCE_MILES = 500.0
MAX_DURATION_S = 24 * 3600

# reject_reason codes, checked in this order; a row gets the first that applies (null: a good row).
# Nulls in passenger_count, ratecode_id, store_and_fwd_flag, congestion_surcharge and airport_fee (the
# Flex Fare block, payment_type 0), zero distance, passenger_count 0 and ratecode_id 99 are NOT rejects:
# they are how real trips are recorded.
QUALITY_RULES: dict[str, str] = {
    "missing_timestamp": "pickup_at or dropoff_at is null",
    "pickup_outside_period": "pickup_at is not in the month (or year) being loaded",
    "dropoff_before_pickup": "dropoff_at is earlier than pickup_at",
    "duration_over_24h": "the trip lasts more than 24 hours",
    "negative_amount": "fare_amount or total_amount is negative (refunds and voids)",
    "bad_distance": f"trip_distance is null, negative or over {MAX_DISTANCE_MILES:g} miles",
    "bad_location": "pu_location_id or do_location_id is null or not a zone id (1..265)",
}


def period_bounds(year: int, month: int | None = None) -> tuple[datetime, datetime]:
    """[start, end) of a month, or of a whole year when `month` is None."""
    if month is None:
        return datetime(year, 1, 1), datetime(year + 1, 1, 1)
    return datetime(year, month, 1), datetime(year + month // 12, month % 12 + 1, 1)


def flag_quality(df: DataFrame, year: int | None, month: int | None = None) -> DataFrame:
    """Add `reject_reason` (STRING): the first `QUALITY_RULES` code the row breaks, null for a good row.

    `year`/`month` is the period being loaded (a month's file); give only `year` for files that span a
    year, such as the BigQuery export, and None when the period is unknown (then no row breaks the period
    rule). Rows are kept, not dropped: the loader routes them by the flag.
    """
    pickup, dropoff = F.col("pickup_at"), F.col("dropoff_at")
    if year is None:
        outside = F.lit(False)
    else:
        start, end = period_bounds(year, month)
        outside = (pickup < _ntz(start)) | (pickup >= _ntz(end))
    duration_us = _wall_clock_micros(pickup, dropoff)

    def bad_zone(c: Column) -> Column:
        return c.isNull() | (c < 1) | (c > 265)

    checks = [
        ("missing_timestamp", pickup.isNull() | dropoff.isNull()),
        ("pickup_outside_period", outside),
        ("dropoff_before_pickup", dropoff < pickup),
        ("duration_over_24h", duration_us > MAX_DURATION_S * 1_000_000),
        ("negative_amount", (F.col("fare_amount") < 0) | (F.col("total_amount") < 0)),
        (
            "bad_distance",
            F.col("trip_distance").isNull()
            | (F.col("trip_distance") < 0)
            | (F.col("trip_distance") > MAX_DISTANCE_MILES),
        ),
        ("bad_location", bad_zone(F.col("pu_location_id")) | bad_zone(F.col("do_location_id"))),
    ]
    assert [c for c, _ in checks] == list(QUALITY_RULES)
    reason = F.lit(None).cast(T.StringType())
    for code, broken in reversed(checks):  # built inside out, so the first rule wins
        # a null comparison (e.g. a null fare) is not a broken rule: coalesce to False
        reason = F.when(F.coalesce(broken, F.lit(False)), F.lit(code)).otherwise(reason)
    return df.withColumn("reject_reason", reason)


# --- Derived columns ---------------------------------------------------------------------------------------

DERIVED_COLUMNS: tuple[tuple[str, str], ...] = (
    ("pickup_date", "DATE"),
    ("pickup_year", "INT"),  # partition key
    ("pickup_month", "INT"),  # partition key
    ("pickup_hour", "INT"),  # 0..23
    ("pickup_weekday", "INT"),  # ISO: 1 Monday .. 7 Sunday
    ("trip_duration_s", "BIGINT"),  # dropoff_at - pickup_at in whole seconds; negative when reversed
    ("pu_borough", "STRING"),
    ("pu_zone", "STRING"),
    ("do_borough", "STRING"),
    ("do_zone", "STRING"),
)


def derive(df: DataFrame, zones: DataFrame) -> DataFrame:
    """Add `DERIVED_COLUMNS`: calendar parts of pickup_at (wall clock, no time zone), the duration, and
    the pickup and dropoff zone and borough names from the zone lookup (`ZONES_SCHEMA`, one row per
    location_id; broadcast, it is 265 rows). Ids missing from the lookup get null names; no row is lost
    or duplicated as long as location_id is unique in `zones`."""
    pickup, dropoff = F.col("pickup_at"), F.col("dropoff_at")
    micros = _wall_clock_micros(pickup, dropoff)
    out = df.select(
        "*",
        F.to_date(pickup).alias("pickup_date"),
        F.year(pickup).alias("pickup_year"),
        F.month(pickup).alias("pickup_month"),
        F.hour(pickup).alias("pickup_hour"),
        (F.weekday(pickup) + 1).alias("pickup_weekday"),
        F.floor(micros / 1_000_000).cast(T.LongType()).alias("trip_duration_s"),
    )
    z = zones.select("location_id", "borough", "zone")
    pu = F.broadcast(
        z.select(
            F.col("location_id").alias("_pu_id"), F.col("borough").alias("pu_borough"), F.col("zone").alias("pu_zone")
        )
    )
    do = F.broadcast(
        z.select(
            F.col("location_id").alias("_do_id"), F.col("borough").alias("do_borough"), F.col("zone").alias("do_zone")
        )
    )
    out = out.join(pu, out["pu_location_id"] == pu["_pu_id"], "left")
    out = out.join(do, out["do_location_id"] == do["_do_id"], "left")
    return out.drop("_pu_id", "_do_id")


# --- Edge: reading files -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RawTrips:
    df: DataFrame
    variant: SourceVariant
    path: str


def read_trips(spark: SparkSession, path: str | Path) -> RawTrips:
    """Read one trips file (Parquet, or CSV with a header) as the source wrote it, and detect its variant.

    CSV columns are read as strings (no inference: `conform` owns the types). Sets `SPARK_CONF` on the
    session (idempotent). An unknown schema raises a KitError naming the missing/unexpected columns.
    """
    for k, v in SPARK_CONF.items():
        spark.conf.set(k, v)
    p = str(path)
    if p.lower().endswith((".csv", ".csv.gz")):
        df = spark.read.option("header", True).option("inferSchema", False).option("mode", "FAILFAST").csv(p)
    else:
        df = spark.read.parquet(p)
    return RawTrips(df, detect_variant(df.columns, source=p), p)


def read_zones(spark: SparkSession, path: str | Path) -> DataFrame:
    """The zone lookup CSV (`LocationID,Borough,Zone,service_zone`) as `ZONES_SCHEMA`."""
    return spark.read.option("header", True).option("mode", "FAILFAST").schema(ZONES_SCHEMA).csv(str(path))
