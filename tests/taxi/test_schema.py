"""The canonical schema, the variant table and variant detection (no Spark)."""

from __future__ import annotations

import csv

import pyarrow as pa
import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.taxi import schema
from ducklake_kit.taxi.schema import detect_variant

TLC_2025_HEADER = [
    "VendorID", "tpep_pickup_datetime", "tpep_dropoff_datetime", "passenger_count", "trip_distance",
    "RatecodeID", "store_and_fwd_flag", "PULocationID", "DOLocationID", "payment_type", "fare_amount",
    "extra", "mta_tax", "tip_amount", "tolls_amount", "improvement_surcharge", "total_amount",
    "congestion_surcharge", "Airport_fee", "cbd_congestion_fee",
]  # fmt: skip
GX_HEADER = [
    "vendor_id",
    "pickup_datetime",
    "dropoff_datetime",
    "passenger_count",
    "trip_distance",
    "rate_code_id",
    "store_and_fwd_flag",
    "pickup_location_id",
    "dropoff_location_id",
    "payment_type",
    "fare_amount",
    "extra",
    "mta_tax",
    "tip_amount",
    "tolls_amount",
    "improvement_surcharge",
    "total_amount",
    "congestion_surcharge",
]
BIGQUERY_HEADER = [
    "vendor_id",
    "pickup_datetime",
    "dropoff_datetime",
    "passenger_count",
    "trip_distance",
    "rate_code",
    "store_and_fwd_flag",
    "payment_type",
    "fare_amount",
    "extra",
    "mta_tax",
    "tip_amount",
    "tolls_amount",
    "imp_surcharge",
    "airport_fee",
    "total_amount",
    "pickup_location_id",
    "dropoff_location_id",
    "data_file_year",
    "data_file_month",
]


def test_canonical_columns_and_types():
    assert [(c.name, c.spark_type) for c in schema.CANONICAL_COLUMNS] == [
        ("vendor_id", "INT"), ("pickup_at", "TIMESTAMP_NTZ"), ("dropoff_at", "TIMESTAMP_NTZ"),
        ("passenger_count", "INT"), ("trip_distance", "DOUBLE"), ("ratecode_id", "INT"),
        ("store_and_fwd_flag", "STRING"), ("pu_location_id", "INT"), ("do_location_id", "INT"),
        ("payment_type", "INT"), ("fare_amount", "DOUBLE"), ("extra", "DOUBLE"), ("mta_tax", "DOUBLE"),
        ("tip_amount", "DOUBLE"), ("tolls_amount", "DOUBLE"), ("improvement_surcharge", "DOUBLE"),
        ("total_amount", "DOUBLE"), ("congestion_surcharge", "DOUBLE"), ("airport_fee", "DOUBLE"),
        ("cbd_congestion_fee", "DOUBLE"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("columns", "expected"),
    [
        (TLC_2025_HEADER, "tlc_2025"),
        (TLC_2025_HEADER[:-1], "tlc_2024"),
        (TLC_2025_HEADER[:-2] + ["airport_fee"], "tlc_2022"),
        (GX_HEADER, "gx_snake_case"),
        (BIGQUERY_HEADER, "bigquery"),
        (list(reversed(BIGQUERY_HEADER)), "bigquery"),  # order does not matter
        (list(schema.CANONICAL_NAMES), "canonical"),
    ],
)
def test_detect_variant(columns, expected):
    assert detect_variant(columns).name == expected


def test_every_variant_maps_to_canonical_names_only_once():
    for v in schema.VARIANTS.values():
        targets = [c for _, c in v.mapping]
        assert len(targets) == len(set(targets)), v.name
        assert set(targets) <= set(schema.CANONICAL_NAMES), v.name
    assert schema.BIGQUERY.missing_canonical == ("congestion_surcharge", "cbd_congestion_fee")
    assert schema.GX_SNAKE_CASE.missing_canonical == ("airport_fee", "cbd_congestion_fee")
    assert schema.TLC_2024.missing_canonical == ("cbd_congestion_fee",)


def test_unknown_schema_names_missing_and_unexpected_columns():
    cols = [c for c in TLC_2025_HEADER if c != "tip_amount"] + ["tip", "surprise"]
    with pytest.raises(KitError) as e:
        detect_variant(cols, source="s3://raw/x.parquet")
    msg = e.value.line()
    assert msg.startswith(
        "Error: unknown trips schema in s3://raw/x.parquet (21 columns): closest known variant is tlc_2025"
    )
    assert "missing tip_amount" in msg
    assert "unexpected surprise, tip (did you mean tip_amount?)" in msg
    assert "Try: rename the columns to one of the known variants" in msg


def test_case_matters_and_duplicates_are_refused():
    with pytest.raises(KitError, match="missing VendorID; unexpected vendorid"):
        detect_variant(["vendorid"] + TLC_2025_HEADER[1:])
    with pytest.raises(KitError, match="duplicate column names: extra"):
        detect_variant(TLC_2025_HEADER + ["extra"])
    with pytest.raises(KitError, match="unknown source variant 'tlc_1999'"):
        schema.get_variant("tlc_1999")


def test_era_arrow_schemas():
    s25 = schema.TLC_ERAS["2025"]
    assert s25.names == TLC_2025_HEADER
    assert [str(t) for t in s25.types] == [
        "int32", "timestamp[us]", "timestamp[us]", "double", "double", "double", "string", "int32", "int32",
        "int64", "double", "double", "double", "double", "double", "double", "double", "double", "double", "double",
    ]  # fmt: skip
    assert schema.TLC_ERAS["2024"].equals(s25.remove(19))
    s22 = schema.TLC_ERAS["2022"]
    assert s22.names == TLC_2025_HEADER[:-2] + ["airport_fee"]
    for name in ("VendorID", "PULocationID", "DOLocationID", "payment_type"):
        assert s22.field(name).type == pa.int64()
    for name in ("passenger_count", "RatecodeID"):
        assert s22.field(name).type == pa.float64()
    assert [schema.era_for(y) for y in (2019, 2022, 2023, 2024, 2025, 2026)] == [
        "2022",
        "2022",
        "2024",
        "2024",
        "2025",
        "2025",
    ]


def test_real_sample_headers_are_detected(sample):
    import pyarrow.parquet as pq

    expected = {
        "yellow_tripdata_2025-02_random5000.parquet": "tlc_2025",
        "yellow_tripdata_2025-01_head10000.parquet": "tlc_2025",
        "bigquery_tlc_yellow_trips_2022_random10000.csv": "bigquery",
    }
    for name, variant in expected.items():
        path = sample(name)
        if path.suffix == ".parquet":
            cols = pq.ParquetFile(path).schema_arrow.names
        else:
            with open(path, newline="") as f:
                cols = next(csv.reader(f))
        assert detect_variant(cols).name == variant, name
    gx = sorted(sample("gx_yellow_tripdata_samples_2018-2020").glob("*.csv"))
    assert len(gx) == 36
    for path in gx:
        with open(path, newline="") as f:
            assert detect_variant(next(csv.reader(f))).name == "gx_snake_case", path.name
