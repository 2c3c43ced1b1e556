"""conform, flag_quality and derive on tiny literal rows, compared as whole DataFrames."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from ducklake_kit.errors import KitError
from ducklake_kit.taxi.transforms import conform, derive, flag_quality, read_trips

pytestmark = pytest.mark.spark

# The canonical schema, written out here (not imported) so that a change to it fails these tests.
CANONICAL_DDL = (
    "vendor_id INT, pickup_at TIMESTAMP_NTZ, dropoff_at TIMESTAMP_NTZ, passenger_count INT, trip_distance DOUBLE, "
    "ratecode_id INT, store_and_fwd_flag STRING, pu_location_id INT, do_location_id INT, payment_type INT, "
    "fare_amount DOUBLE, extra DOUBLE, mta_tax DOUBLE, tip_amount DOUBLE, tolls_amount DOUBLE, "
    "improvement_surcharge DOUBLE, total_amount DOUBLE, congestion_surcharge DOUBLE, airport_fee DOUBLE, "
    "cbd_congestion_fee DOUBLE"
)
TLC_2025_DDL = (
    "VendorID INT, tpep_pickup_datetime TIMESTAMP_NTZ, tpep_dropoff_datetime TIMESTAMP_NTZ, passenger_count DOUBLE, "
    "trip_distance DOUBLE, RatecodeID DOUBLE, store_and_fwd_flag STRING, PULocationID INT, DOLocationID INT, "
    "payment_type BIGINT, fare_amount DOUBLE, extra DOUBLE, mta_tax DOUBLE, tip_amount DOUBLE, tolls_amount DOUBLE, "
    "improvement_surcharge DOUBLE, total_amount DOUBLE, congestion_surcharge DOUBLE, Airport_fee DOUBLE, "
    "cbd_congestion_fee DOUBLE"
)
T0 = datetime(2025, 1, 1, 0, 15, 0)
T1 = datetime(2025, 1, 1, 0, 29, 30)


def canonical(spark, rows):
    return spark.createDataFrame(rows, CANONICAL_DDL)


# --- conform -----------------------------------------------------------------------------------------------


def test_conform_tlc_2025_renames_casts_and_keeps_the_null_block(spark):
    src = spark.createDataFrame(
        [
            (1, T0, T1, 1.0, 1.6, 1.0, "N", 229, 237, 1, 10.0, 3.5, 0.5, 3.0, 0.0, 1.0, 18.0, 2.5, 0.0, 0.0),
            # Flex Fare null block: five nulls and payment_type 0
            (2, T0, T1, None, 2.1, None, None, 132, 48, 0, 20.5, 0.0, 0.5, 4.0, 6.94, 1.0, 33.69, None, None, 0.75),
            # RatecodeID 99 and a refund
            (7, T1, T0, 0.0, 0.0, 99.0, "Y", 264, 265, 4, -5.0, -1.0, -0.5, 0.0, 0.0, -1.0, -7.5, 0.0, 0.0, 0.0),
        ],
        TLC_2025_DDL,
    )
    expected = canonical(
        spark,
        [
            (1, T0, T1, 1, 1.6, 1, "N", 229, 237, 1, 10.0, 3.5, 0.5, 3.0, 0.0, 1.0, 18.0, 2.5, 0.0, 0.0),
            (2, T0, T1, None, 2.1, None, None, 132, 48, 0, 20.5, 0.0, 0.5, 4.0, 6.94, 1.0, 33.69, None, None, 0.75),
            (7, T1, T0, 0, 0.0, 99, "Y", 264, 265, 4, -5.0, -1.0, -0.5, 0.0, 0.0, -1.0, -7.5, 0.0, 0.0, 0.0),
        ],
    )
    actual = conform(src, "tlc_2025")
    assert actual.schema.simpleString() == expected.schema.simpleString()  # names, order and types
    assertDataFrameEqual(actual, expected)


def test_conform_tlc_2022_int64_ids_lower_case_airport_fee(spark):
    src = spark.createDataFrame(
        [(2, T0, T1, 2.0, 12.63, 2.0, "N", 132, 181, 2, 52.0, 0.0, 0.5, 0.0, 6.55, 0.3, 62.6, 2.5, 1.25)],
        "VendorID BIGINT, tpep_pickup_datetime TIMESTAMP_NTZ, tpep_dropoff_datetime TIMESTAMP_NTZ, passenger_count DOUBLE, "
        "trip_distance DOUBLE, RatecodeID DOUBLE, store_and_fwd_flag STRING, PULocationID BIGINT, DOLocationID BIGINT, "
        "payment_type BIGINT, fare_amount DOUBLE, extra DOUBLE, mta_tax DOUBLE, tip_amount DOUBLE, tolls_amount DOUBLE, "
        "improvement_surcharge DOUBLE, total_amount DOUBLE, congestion_surcharge DOUBLE, airport_fee DOUBLE",
    )
    expected = canonical(
        spark, [(2, T0, T1, 2, 12.63, 2, "N", 132, 181, 2, 52.0, 0.0, 0.5, 0.0, 6.55, 0.3, 62.6, 2.5, 1.25, None)]
    )
    assertDataFrameEqual(conform(src, "tlc_2022"), expected)


def test_conform_bigquery_strings_drop_the_utc_label(spark):
    cols = [
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
    src = spark.createDataFrame(
        [
            (
                "2",
                "2022-03-02 15:25:57+00:00",
                "2022-03-02 16:13:13+00:00",
                "5",
                "12.630000000",
                "1.0",
                "N",
                "2",
                "43.000000000",
                "0E-9",
                "0.500000000",
                "0E-9",
                "0E-9",
                "0.300000000",
                "1.250000000",
                "45.050000000",
                "132",
                "181",
                "2022",
                "3",
            ),
            (
                "1",
                "2002-10-24 08:00:00+00:00",
                "2002-10-24 08:10:00+00:00",
                None,
                "0E-9",
                None,
                None,
                "1",
                "-2.500000000",
                "0E-9",
                "0.500000000",
                "0E-9",
                "0E-9",
                "0.300000000",
                None,
                "-1.700000000",
                "264",
                "264",
                "2022",
                "1",
            ),
        ],
        ", ".join(f"{c} STRING" for c in cols),
    )
    expected = canonical(
        spark,
        [
            (
                2,
                datetime(2022, 3, 2, 15, 25, 57),
                datetime(2022, 3, 2, 16, 13, 13),
                5,
                12.63,
                1,
                "N",
                132,
                181,
                2,
                43.0,
                0.0,
                0.5,
                0.0,
                0.0,
                0.3,
                45.05,
                None,
                1.25,
                None,
            ),
            (
                1,
                datetime(2002, 10, 24, 8, 0),
                datetime(2002, 10, 24, 8, 10),
                None,
                0.0,
                None,
                None,
                264,
                264,
                1,
                -2.5,
                0.0,
                0.5,
                0.0,
                0.0,
                0.3,
                -1.7,
                None,
                None,
                None,
            ),
        ],
    )
    assertDataFrameEqual(conform(src, "bigquery"), expected)


def test_conform_gx_snake_case_strings(spark):
    cols = [
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
    src = spark.createDataFrame(
        [
            (
                "1",
                "2019-01-15 03:36:12",
                "2019-01-15 03:42:19",
                "1",
                "1.0",
                "1",
                "N",
                "230",
                "48",
                "1",
                "6.5",
                "0.5",
                "0.5",
                "1.95",
                "0.0",
                "0.3",
                "9.75",
                None,
            ),
            (
                "2",
                "2019-02-07 15:48:06",
                "2019-02-07 16:00:40",
                "2",
                "1.3",
                "1",
                "N",
                "234",
                "211",
                "2",
                "9.0",
                "2.5",
                "0.5",
                "0",
                "0.0",
                "0.3",
                "14.76",
                "2.5",
            ),
        ],
        ", ".join(f"{c} STRING" for c in cols),
    )
    expected = canonical(
        spark,
        [
            (
                1,
                datetime(2019, 1, 15, 3, 36, 12),
                datetime(2019, 1, 15, 3, 42, 19),
                1,
                1.0,
                1,
                "N",
                230,
                48,
                1,
                6.5,
                0.5,
                0.5,
                1.95,
                0.0,
                0.3,
                9.75,
                None,
                None,
                None,
            ),
            (
                2,
                datetime(2019, 2, 7, 15, 48, 6),
                datetime(2019, 2, 7, 16, 0, 40),
                2,
                1.3,
                1,
                "N",
                234,
                211,
                2,
                9.0,
                2.5,
                0.5,
                0.0,
                0.0,
                0.3,
                14.76,
                2.5,
                None,
                None,
            ),
        ],
    )
    assertDataFrameEqual(conform(src, "gx_snake_case"), expected)


@pytest.mark.parametrize("time_zone", ["UTC", "America/New_York", "Asia/Kolkata", "Pacific/Chatham"], indirect=True)
def test_wall_clock_survives_any_session_time_zone(spark, time_zone, tmp_path):
    """2025-01-01 00:15:00 in the source is 2025-01-01 00:15:00 in the lake, however the source typed it:
    naive (NTZ), labelled UTC (TIMESTAMP), epoch nanoseconds (Parquet ns read as long) or text."""
    naive = datetime(2025, 1, 1, 0, 15, 0)
    utc_labelled = naive.replace(tzinfo=UTC)
    # A Parquet file with tz-aware (UTC) microseconds and one with naive nanoseconds, written by pyarrow.
    base = {c.split(" ")[0]: None for c in TLC_2025_DDL.split(", ")}
    files = {
        "utc": pa.array([utc_labelled], pa.timestamp("us", tz="UTC")),
        "ns": pa.array([naive], pa.timestamp("ns")),
    }
    expected_row = (None, naive, naive) + (None,) * 17
    expected = canonical(spark, [expected_row])
    for name, arr in files.items():
        cols = dict(base)
        cols["tpep_pickup_datetime"] = arr
        cols["tpep_dropoff_datetime"] = arr
        table = pa.table({k: (v if v is not None else pa.nulls(1, pa.float64())) for k, v in cols.items()})
        pq.write_table(table, tmp_path / f"{name}.parquet")
        raw = read_trips(spark, tmp_path / f"{name}.parquet")
        assertDataFrameEqual(
            conform(raw.df, raw.variant).select("pickup_at", "dropoff_at"), expected.select("pickup_at", "dropoff_at")
        )
    texts = spark.createDataFrame([("2025-01-01 00:15:00+00:00", "2025-01-01T00:15:00Z")], "a STRING, b STRING")
    ntz = spark.createDataFrame([(naive, naive)], "a TIMESTAMP_NTZ, b TIMESTAMP_NTZ")
    gx_like = texts.selectExpr(
        "'1' vendor_id",
        "a pickup_datetime",
        "b dropoff_datetime",
        *[
            f"CAST(NULL AS STRING) {c}"
            for c in [
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
        ],
    )
    got = conform(gx_like, "gx_snake_case").select("pickup_at", "dropoff_at")
    assertDataFrameEqual(got, ntz.toDF("pickup_at", "dropoff_at"))
    # and the derived calendar parts read the same clock
    assert got.selectExpr("hour(pickup_at) h", "day(pickup_at) d").collect() == [Row(h=0, d=1)]


def test_conform_refuses_a_mismatched_variant(spark):
    src = spark.createDataFrame([(1, "x")], "VendorID INT, other STRING")
    with pytest.raises(KitError, match="unknown trips schema.*missing"):
        conform(src, "tlc_2025")
    gx = spark.createDataFrame(
        [],
        ", ".join(
            f"{c} STRING"
            for c in [
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
        ),
    )
    with pytest.raises(KitError, match="those of the gx_snake_case variant, not bigquery"):
        conform(gx, "bigquery")


def test_read_trips_names_an_unknown_file_schema(spark, tmp_path):
    path = tmp_path / "odd.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(KitError, match=r"unknown trips schema in .*odd.csv \(2 columns\)"):
        read_trips(spark, path)


# --- flag_quality -----------------------------------------------------------------------------------------------


def _trip(
    pickup,
    dropoff,
    *,
    fare=10.0,
    total=15.0,
    dist=1.5,
    pu=161,
    do=237,
    passengers=1,
    ratecode=1,
    payment=1,
    congestion=2.5,
    airport=0.0,
):
    flag = None if passengers is None else "N"
    return (
        2,
        pickup,
        dropoff,
        passengers,
        dist,
        ratecode,
        flag,
        pu,
        do,
        payment,
        fare,
        1.0,
        0.5,
        2.0,
        0.0,
        1.0,
        total,
        congestion,
        airport,
        0.0,
    )


def test_flag_quality_rules_and_their_order(spark):
    d = datetime
    rows = [
        # good rows: an ordinary trip, the Flex Fare null block, zero distance, RatecodeID 99, 0 passengers,
        # a trip ending in the next month, the month's first and last second
        (_trip(d(2025, 1, 10, 8), d(2025, 1, 10, 8, 20)), None),
        (
            _trip(
                d(2025, 1, 10, 9),
                d(2025, 1, 10, 9, 20),
                passengers=None,
                ratecode=None,
                payment=0,
                congestion=None,
                airport=None,
            ),
            None,
        ),
        (_trip(d(2025, 1, 10, 9), d(2025, 1, 10, 9, 1), dist=0.0), None),
        (_trip(d(2025, 1, 11, 9), d(2025, 1, 11, 9, 30), ratecode=99, passengers=0), None),
        (_trip(d(2025, 1, 31, 23, 50), d(2025, 2, 1, 0, 10)), None),
        (_trip(d(2025, 1, 1), d(2025, 1, 1, 0, 5)), None),
        (_trip(d(2025, 1, 31, 23, 59, 59), d(2025, 2, 1, 0, 5)), None),
        (_trip(d(2025, 1, 12), d(2025, 1, 13), dist=499.99), None),  # exactly 24 h, 499.99 mi: still good
        # rejects
        (_trip(None, d(2025, 1, 10)), "missing_timestamp"),
        (_trip(d(2025, 1, 10), None, fare=-1.0), "missing_timestamp"),  # the first rule wins
        (_trip(d(2024, 12, 31, 23, 59, 59), d(2025, 1, 1, 0, 10)), "pickup_outside_period"),
        (_trip(d(2025, 2, 1), d(2025, 2, 1, 0, 10)), "pickup_outside_period"),
        (_trip(d(2002, 1, 10), d(2002, 1, 10, 0, 10)), "pickup_outside_period"),
        (_trip(d(2025, 1, 10, 10), d(2025, 1, 10, 9, 59)), "dropoff_before_pickup"),
        (_trip(d(2025, 1, 10), d(2025, 1, 11, 0, 0, 1)), "duration_over_24h"),
        (_trip(d(2025, 1, 10), d(2025, 1, 10, 0, 10), fare=-10.0, total=-15.0), "negative_amount"),
        (_trip(d(2025, 1, 10), d(2025, 1, 10, 0, 10), fare=0.0, total=-0.5), "negative_amount"),
        (_trip(d(2025, 1, 10), d(2025, 1, 10, 0, 10), dist=-0.1), "bad_distance"),
        (_trip(d(2025, 1, 10), d(2025, 1, 10, 0, 10), dist=500.01), "bad_distance"),
        (_trip(d(2025, 1, 10), d(2025, 1, 10, 0, 10), dist=None), "bad_distance"),
        (_trip(d(2025, 1, 10), d(2025, 1, 10, 0, 10), pu=None), "bad_location"),
        (_trip(d(2025, 1, 10), d(2025, 1, 10, 0, 10), do=266), "bad_location"),
        (_trip(d(2025, 1, 10), d(2025, 1, 10, 0, 10), pu=0), "bad_location"),
    ]
    src = canonical(spark, [r for r, _ in rows])
    expected = spark.createDataFrame([r + (reason,) for r, reason in rows], CANONICAL_DDL + ", reject_reason STRING")
    assertDataFrameEqual(flag_quality(src, 2025, 1), expected)


def test_flag_quality_for_a_whole_year(spark):
    rows = [
        (_trip(datetime(2022, 1, 1), datetime(2022, 1, 1, 0, 5)), None),
        (_trip(datetime(2022, 12, 31, 23), datetime(2022, 12, 31, 23, 5)), None),
        (_trip(datetime(2002, 10, 24, 8), datetime(2002, 10, 24, 8, 5)), "pickup_outside_period"),
    ]
    src = canonical(spark, [r for r, _ in rows])
    expected = spark.createDataFrame([r + (reason,) for r, reason in rows], CANONICAL_DDL + ", reject_reason STRING")
    assertDataFrameEqual(flag_quality(src, 2022), expected)


# --- derive -----------------------------------------------------------------------------------------------------


def test_derive_calendar_duration_and_zone_names(spark):
    zones = spark.createDataFrame(
        [(1, "EWR", "Newark Airport", "EWR"), (132, "Queens", "JFK Airport", "Airports"),
         (161, "Manhattan", "Midtown Center", "Yellow Zone"), (264, "Unknown", "N/A", "N/A")],
        "location_id INT, borough STRING, zone STRING, service_zone STRING",
    )  # fmt: skip
    d = datetime
    rows = [
        _trip(d(2025, 1, 5, 23, 50, 10), d(2025, 1, 6, 0, 20, 40), pu=132, do=161),  # Sunday, crosses midnight
        _trip(d(2025, 1, 6, 7, 0), d(2025, 1, 6, 6, 59), pu=161, do=1),  # Monday; reversed: negative duration
        _trip(d(2024, 3, 10, 1, 50), d(2024, 3, 10, 3, 10), pu=264, do=999),  # NYC DST day: wall clock, 80 min
        _trip(None, d(2025, 1, 6), pu=None, do=161),
        _trip(d(2025, 1, 6, 7, 0), d(2025, 1, 6, 7, 0), pu=161, do=161),  # two trips from the same zone:
        _trip(d(2025, 1, 6, 7, 0), d(2025, 1, 6, 7, 0), pu=161, do=161),  # both kept, once each
    ]
    derived = [
        (date(2025, 1, 5), 2025, 1, 23, 7, 1830, "Queens", "JFK Airport", "Manhattan", "Midtown Center"),
        (date(2025, 1, 6), 2025, 1, 7, 1, -60, "Manhattan", "Midtown Center", "EWR", "Newark Airport"),
        (date(2024, 3, 10), 2024, 3, 1, 7, 4800, "Unknown", "N/A", None, None),
        (None, None, None, None, None, None, None, None, "Manhattan", "Midtown Center"),
        (date(2025, 1, 6), 2025, 1, 7, 1, 0, "Manhattan", "Midtown Center", "Manhattan", "Midtown Center"),
        (date(2025, 1, 6), 2025, 1, 7, 1, 0, "Manhattan", "Midtown Center", "Manhattan", "Midtown Center"),
    ]
    expected = spark.createDataFrame(
        [r + x for r, x in zip(rows, derived)],
        CANONICAL_DDL + ", pickup_date DATE, pickup_year INT, pickup_month INT, pickup_hour INT, pickup_weekday INT, "
        "trip_duration_s BIGINT, pu_borough STRING, pu_zone STRING, do_borough STRING, do_zone STRING",
    )
    actual = derive(canonical(spark, rows), zones)
    assert actual.columns == expected.columns
    assertDataFrameEqual(actual, expected)
    plan = actual._jdf.queryExecution().executedPlan().toString()
    assert "BroadcastHashJoin" in plan or "BroadcastNestedLoopJoin" in plan
