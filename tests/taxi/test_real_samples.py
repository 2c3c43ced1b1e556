"""conform (and flag_quality, derive) on every variant in ../shared/tlc-samples.

Each expectation is built from the file independently: pyarrow or the csv module, the column mapping
written out below (not imported), plain Python types. Skipped when the samples are absent.
"""

from __future__ import annotations

import csv
from datetime import datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from ducklake_kit.taxi.transforms import conform, derive, flag_quality, read_trips, read_zones

pytestmark = pytest.mark.spark

CANONICAL_DDL = (
    "vendor_id INT, pickup_at TIMESTAMP_NTZ, dropoff_at TIMESTAMP_NTZ, passenger_count INT, trip_distance DOUBLE, "
    "ratecode_id INT, store_and_fwd_flag STRING, pu_location_id INT, do_location_id INT, payment_type INT, "
    "fare_amount DOUBLE, extra DOUBLE, mta_tax DOUBLE, tip_amount DOUBLE, tolls_amount DOUBLE, "
    "improvement_surcharge DOUBLE, total_amount DOUBLE, congestion_surcharge DOUBLE, airport_fee DOUBLE, "
    "cbd_congestion_fee DOUBLE"
)
INTS = {"vendor_id", "passenger_count", "ratecode_id", "pu_location_id", "do_location_id", "payment_type"}
ORDER = [c.split(" ")[0] for c in CANONICAL_DDL.split(", ")]
TLC = {
    "VendorID": "vendor_id", "tpep_pickup_datetime": "pickup_at", "tpep_dropoff_datetime": "dropoff_at",
    "passenger_count": "passenger_count", "trip_distance": "trip_distance", "RatecodeID": "ratecode_id",
    "store_and_fwd_flag": "store_and_fwd_flag", "PULocationID": "pu_location_id", "DOLocationID": "do_location_id",
    "payment_type": "payment_type", "fare_amount": "fare_amount", "extra": "extra", "mta_tax": "mta_tax",
    "tip_amount": "tip_amount", "tolls_amount": "tolls_amount", "improvement_surcharge": "improvement_surcharge",
    "total_amount": "total_amount", "congestion_surcharge": "congestion_surcharge", "Airport_fee": "airport_fee",
    "cbd_congestion_fee": "cbd_congestion_fee",
}  # fmt: skip
GX = {
    "vendor_id": "vendor_id", "pickup_datetime": "pickup_at", "dropoff_datetime": "dropoff_at",
    "passenger_count": "passenger_count", "trip_distance": "trip_distance", "rate_code_id": "ratecode_id",
    "store_and_fwd_flag": "store_and_fwd_flag", "pickup_location_id": "pu_location_id",
    "dropoff_location_id": "do_location_id", "payment_type": "payment_type", "fare_amount": "fare_amount",
    "extra": "extra", "mta_tax": "mta_tax", "tip_amount": "tip_amount", "tolls_amount": "tolls_amount",
    "improvement_surcharge": "improvement_surcharge", "total_amount": "total_amount",
    "congestion_surcharge": "congestion_surcharge",
}  # fmt: skip
BIGQUERY = {
    **{k: v for k, v in GX.items() if k not in ("rate_code_id", "improvement_surcharge", "congestion_surcharge")},
    "rate_code": "ratecode_id", "imp_surcharge": "improvement_surcharge", "airport_fee": "airport_fee",
}  # fmt: skip


def _canonical_row(values: dict) -> tuple:
    out = []
    for name in ORDER:
        v = values.get(name)
        if v is not None and name in INTS:
            v = int(float(v))  # "1.0" in the BigQuery rate_code, 1.0 in Parquet doubles
        elif v is not None and name not in ("pickup_at", "dropoff_at", "store_and_fwd_flag"):
            v = float(v)
        out.append(v)
    return tuple(out)


def _parquet_expected(path) -> list[tuple]:
    table = pq.read_table(path)
    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):  # ns -> us (a safe cast: fails if it would drop digits)
            table = table.set_column(i, field.name, table[field.name].cast(pa.timestamp("us")))
    rows = table.to_pylist()  # datetime.datetime, not pandas.Timestamp
    return [_canonical_row({TLC[k]: v for k, v in r.items()}) for r in rows]


def _csv_expected(path, mapping, stamp) -> list[tuple]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        values = {}
        for src, canon in mapping.items():
            v = r[src].strip() or None
            if v is not None and canon in ("pickup_at", "dropoff_at"):
                v = stamp(v)
            values[canon] = v
        out.append(_canonical_row(values))
    return out


def _conformed(spark, path, variant_name):
    raw = read_trips(spark, path)
    assert raw.variant.name == variant_name
    return conform(raw.df, raw.variant)


def test_tlc_2025_random_sample(spark, sample):
    path = sample("yellow_tripdata_2025-02_random5000.parquet")
    actual = _conformed(spark, path, "tlc_2025")
    assertDataFrameEqual(actual, spark.createDataFrame(_parquet_expected(path), CANONICAL_DDL))
    # known facts of this sample (README): 1,125 null passenger counts, vendors 1, 2 and 7
    assert actual.where("passenger_count IS NULL").count() == 1125
    assert sorted(r.vendor_id for r in actual.select("vendor_id").distinct().collect()) == [1, 2, 7]
    first = actual.where("pickup_at = TIMESTAMP_NTZ'2025-02-08 10:07:10' AND pu_location_id = 43").collect()
    assert first == [Row(vendor_id=2, pickup_at=datetime(2025, 2, 8, 10, 7, 10), dropoff_at=datetime(2025, 2, 8, 10, 11, 15),
                         passenger_count=1, trip_distance=0.88, ratecode_id=1, store_and_fwd_flag="N", pu_location_id=43,
                         do_location_id=238, payment_type=1, fare_amount=7.2, extra=0.0, mta_tax=0.5, tip_amount=2.0,
                         tolls_amount=0.0, improvement_surcharge=1.0, total_amount=10.7, congestion_surcharge=0.0,
                         airport_fee=0.0, cbd_congestion_fee=0.0)]  # fmt: skip


def test_tlc_2025_head_with_nanosecond_timestamps(spark, sample):
    path = sample("yellow_tripdata_2025-01_head10000.parquet")
    actual = _conformed(spark, path, "tlc_2025")
    assertDataFrameEqual(actual, spark.createDataFrame(_parquet_expected(path), CANONICAL_DDL))
    row0 = actual.where(
        "pickup_at = TIMESTAMP_NTZ'2025-01-01 00:18:38' AND vendor_id = 1 AND pu_location_id = 229"
    ).collect()
    assert [(r.dropoff_at, r.total_amount, r.congestion_surcharge) for r in row0] == [
        (datetime(2025, 1, 1, 0, 26, 59), 18.0, 2.5)
    ]


def test_tlc_2025_head_quality_flags(spark, sample):
    """The head of January starts on 2024-12-31: exactly those rows (and any other broken ones) are
    rejected. The expected reasons come from a plain-Python reading of the rules over pyarrow's rows."""
    path = sample("yellow_tripdata_2025-01_head10000.parquet")
    rows = _parquet_expected(path)

    def reason(r):
        c = dict(zip(ORDER, r))
        p, d = c["pickup_at"], c["dropoff_at"]
        if p is None or d is None:
            return "missing_timestamp"
        if not datetime(2025, 1, 1) <= p < datetime(2025, 2, 1):
            return "pickup_outside_period"
        if d < p:
            return "dropoff_before_pickup"
        if (d - p).total_seconds() > 86400:
            return "duration_over_24h"
        if (c["fare_amount"] is not None and c["fare_amount"] < 0) or (
            c["total_amount"] is not None and c["total_amount"] < 0
        ):
            return "negative_amount"
        if c["trip_distance"] is None or not 0 <= c["trip_distance"] <= 500:
            return "bad_distance"
        if any(c[k] is None or not 1 <= c[k] <= 265 for k in ("pu_location_id", "do_location_id")):
            return "bad_location"
        return None

    expected = spark.createDataFrame([r + (reason(r),) for r in rows], CANONICAL_DDL + ", reject_reason STRING")
    actual = flag_quality(_conformed(spark, path, "tlc_2025"), 2025, 1)
    assertDataFrameEqual(actual, expected)
    outside = sum(1 for r in rows if r[1] < datetime(2025, 1, 1))
    assert outside > 0 and actual.where("reject_reason = 'pickup_outside_period'").count() == outside


def test_bigquery_export(spark, sample):
    path = sample("bigquery_tlc_yellow_trips_2022_random10000.csv")

    def stamp(text):
        assert text.endswith("+00:00"), text  # the label the kit drops: the clock reading is NYC time
        return datetime.strptime(text[:19], "%Y-%m-%d %H:%M:%S")

    actual = _conformed(spark, path, "bigquery")
    assertDataFrameEqual(actual, spark.createDataFrame(_csv_expected(path, BIGQUERY, stamp), CANONICAL_DDL))
    first = actual.where(
        "pickup_at = TIMESTAMP_NTZ'2022-03-02 15:25:57' AND dropoff_at = TIMESTAMP_NTZ'2022-03-02 16:13:13'"
    )
    assert [(r.vendor_id, r.passenger_count, r.trip_distance, r.ratecode_id, r.airport_fee, r.improvement_surcharge,
             r.total_amount, r.pu_location_id, r.do_location_id, r.congestion_surcharge) for r in first.collect()] == [
        (2, 5, 12.63, 1, 1.25, 0.3, 45.05, 132, 181, None)]  # fmt: skip
    flagged = flag_quality(actual, 2022)
    assert [r.pickup_at.year for r in flagged.where("reject_reason = 'pickup_outside_period'").collect()] == [2002]


@pytest.mark.parametrize("month", ["2018-01", "2019-02", "2020-12"])  # 2019-02 has CRLF line ends
def test_great_expectations_samples(spark, sample, month):
    path = sample(f"gx_yellow_tripdata_samples_2018-2020/yellow_tripdata_sample_{month}.csv")
    actual = _conformed(spark, path, "gx_snake_case")
    stamp = lambda t: datetime.strptime(t, "%Y-%m-%d %H:%M:%S")  # noqa: E731
    assertDataFrameEqual(actual, spark.createDataFrame(_csv_expected(path, GX, stamp), CANONICAL_DDL))
    if month == "2019-02":
        got = actual.where("pickup_at = TIMESTAMP_NTZ'2019-02-07 15:48:06' AND pu_location_id = 234").collect()
        assert [(r.vendor_id, r.passenger_count, r.tip_amount, r.total_amount, r.congestion_surcharge, r.airport_fee) for r in got] == [
            (1, 2, 2.46, 14.76, 2.5, None)]  # fmt: skip


def test_derive_with_the_real_zone_lookup(spark, sample):
    zones = read_zones(spark, sample("taxi_zone_lookup.csv"))
    assert zones.count() == 265
    assert zones.where("location_id IN (1, 132, 138, 264, 265)").orderBy("location_id").collect() == [
        Row(location_id=1, borough="EWR", zone="Newark Airport", service_zone="EWR"),
        Row(location_id=132, borough="Queens", zone="JFK Airport", service_zone="Airports"),
        Row(location_id=138, borough="Queens", zone="LaGuardia Airport", service_zone="Airports"),
        Row(location_id=264, borough="Unknown", zone="N/A", service_zone="N/A"),
        Row(location_id=265, borough="N/A", zone="Outside of NYC", service_zone="N/A"),
    ]
    trips = _conformed(spark, sample("yellow_tripdata_2025-02_random5000.parquet"), "tlc_2025")
    derived = derive(trips, zones)
    assert derived.count() == 5000  # the lookup join neither drops nor duplicates trips
    got = (
        derived.where("pickup_at = TIMESTAMP_NTZ'2025-02-08 10:07:10' AND pu_location_id = 43")
        .select(
            "pickup_date",
            "pickup_year",
            "pickup_month",
            "pickup_hour",
            "pickup_weekday",
            "trip_duration_s",
            "pu_borough",
            "do_borough",
        )
        .collect()
    )
    assert got == [Row(pickup_date=datetime(2025, 2, 8).date(), pickup_year=2025, pickup_month=2, pickup_hour=10,
                       pickup_weekday=6, trip_duration_s=245, pu_borough="Manhattan", do_borough="Manhattan")]  # fmt: skip
    assert derived.where("pu_borough IS NULL OR do_borough IS NULL").count() == 0
