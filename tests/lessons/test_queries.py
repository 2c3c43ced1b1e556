"""The named queries against the real stack: every answer equals the reference computed from the raw source
files, a hand-checkable literal month gives hand-computed answers, and a tampered lake or a wrong rule in the
reference makes the check fail."""

from __future__ import annotations

import json
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ducklake_kit.checks import CheckRun
from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.lessons import queries
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.taxi import flow, lesson_queries, reference
from ducklake_kit.taxi.schema import TLC_ERAS

SAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "tlc-samples"
GX = SAMPLES / "gx_yellow_tripdata_samples_2018-2020"
# one of each kind of source the reference must conform: nanosecond timestamps, a BigQuery CSV labelled
# +00:00 with a year-long period, a snake_case CSV; and the two months whose days average exactly half a cent
# (2018-06-16: 3.035 miles, 2019-03-31: $18.885), which the reference rounded the other way (issue 29)
REAL_SAMPLES = [
    SAMPLES / "yellow_tripdata_2025-01_head10000.parquet",
    SAMPLES / "bigquery_tlc_yellow_trips_2022_random10000.csv",
    GX / "yellow_tripdata_sample_2019-02.csv",  # CRLF lines but the last: issue 16
    GX / "yellow_tripdata_sample_2018-06.csv",
    GX / "yellow_tripdata_sample_2019-03.csv",
]
NAMES = [
    "q1_trips_by_vendor",
    "q2_avg_total_by_passenger_count",
    "q3_trips_by_passenger_count_and_year",
    "q4_trips_by_passenger_count_year_distance",
    "daily_summary",
    "top_pickup_zones",
    "hourly_demand_by_weekday",
    "tip_share_by_payment_type",
    "airport_trips",
]
LITERAL = "yellow_tripdata_2016-11_literal.parquet"  # a month no other test loads
QUARANTINE_CHECK = "quarantine reasons match the source"


def _trip(vendor, pickup, dropoff, pax, dist, rate, pu, do, pay, fare, tip, total):
    return {
        "VendorID": vendor,
        "tpep_pickup_datetime": datetime.fromisoformat(pickup),
        "tpep_dropoff_datetime": datetime.fromisoformat(dropoff),
        "passenger_count": pax,
        "trip_distance": dist,
        "RatecodeID": rate,
        "store_and_fwd_flag": None if pax is None else "N",
        "PULocationID": pu,
        "DOLocationID": do,
        "payment_type": pay,
        "fare_amount": fare,
        "extra": 0.0,
        "mta_tax": 0.5,
        "tip_amount": tip,
        "tolls_amount": 0.0,
        "improvement_surcharge": 0.3,
        "total_amount": total,
        "congestion_surcharge": None if pax is None else 2.5,
        "Airport_fee": None if pax is None else 0.0,
    }


# November 2016: the 7th is a Monday, the 8th a Tuesday. Four good trips, three rejects.
LITERAL_ROWS = [
    _trip(1, "2016-11-07 08:10:00", "2016-11-07 08:30:00", 1.0, 2.50, 1.0, 161, 237, 1, 12.00, 3.00, 20.00),
    _trip(
        2, "2016-11-07 08:45:00", "2016-11-07 09:40:00", 2.0, 17.30, 2.0, 132, 161, 1, 52.00, 15.00, 95.50
    ),  # from JFK, flat fare
    _trip(
        2, "2016-11-08 18:05:00", "2016-11-08 18:35:00", 1.0, 9.80, 1.0, 138, 237, 2, 30.00, 0.00, 38.30
    ),  # from LGA, cash
    _trip(
        1, "2016-11-08 23:50:00", "2016-11-09 00:25:00", None, 16.00, None, 237, 1, 0, 80.00, 10.00, 100.00
    ),  # to EWR, Flex Fare nulls
    _trip(
        2, "2016-11-09 10:00:00", "2016-11-09 10:10:00", 1.0, 1.00, 1.0, 0, 161, 4, -5.00, 0.00, -5.80
    ),  # negative AND bad zone
    _trip(
        1, "2016-10-31 23:55:00", "2016-11-01 00:10:00", 1.0, 3.00, 1.0, 161, 237, 1, 15.00, 2.00, 20.00
    ),  # before the month
    _trip(
        2, "2016-11-10 12:00:00", "2016-11-10 12:20:00", 3.0, 4.00, 1.0, 161, 266, 1, 18.00, 0.00, 24.00
    ),  # no zone 266
]


@pytest.fixture(scope="module")
def loaded(stack, tmp_path_factory) -> dict:
    """The shared lake plus two synthetic months, the literal month and (when present) three real samples.
    Other tests' loads stay in it: the reference covers every load in load_log, whatever is there."""
    folder = tmp_path_factory.mktemp("literal")
    literal = folder / LITERAL
    pq.write_table(pa.Table.from_pylist(LITERAL_ROWS, schema=TLC_ERAS["2024"]), literal)
    _, checks = flow.load_checked(
        Kit.on(stack.platform, stack.state),
        flow.LoadSpec(source="synthetic", months="2017-07..2017-08", rows_per_month=3000, seed=11),
    )
    assert checks.ok, [c.as_dict() for c in checks.failed]
    paths = [str(literal)] + [str(p) for p in REAL_SAMPLES if p.exists()]
    _, checks = flow.load_checked(Kit.on(stack.platform, stack.state), flow.LoadSpec(source="files", paths=paths))
    assert checks.ok, [c.as_dict() for c in checks.failed]
    return {"literal": literal}


@pytest.fixture
def lake(stack):
    with Lake(stack.platform.endpoints()) as lk:
        yield lk


def _failed(checks: CheckRun) -> set[str]:
    return {c.name for c in checks.failed}


def test_every_query_is_a_numbered_file_that_says_what_it_teaches():
    found = queries.list_queries()
    assert [q.name for q in found] == NAMES
    for q in found:
        comment = [ln for ln in q.sql.splitlines() if ln.startswith("--")]
        assert q.path.name[:3].rstrip("_").isdigit() and 2 <= len(comment) <= 4 and q.teaches, q.path
        assert "ORDER BY" in q.sql, q.path  # deterministic answers, so they compare exactly
    assert set(queries.REFERENCE_SQL) == set(NAMES)


def test_the_reference_rules_are_the_quality_rules_in_their_order():
    from ducklake_kit.taxi import transforms

    assert [code for code, _ in reference.REFERENCE_RULES] == list(transforms.QUALITY_RULES)
    assert reference.MAX_DISTANCE_MILES == transforms.MAX_DISTANCE_MILES
    assert reference.MAX_DURATION_US == transforms.MAX_DURATION_S * 1_000_000


def test_every_query_runs_and_matches_the_source(loaded, lake):
    checks = CheckRun()
    answers = queries.check_queries(lake, checks)
    assert checks.ok, [(c.name, c.actual, c.expected) for c in checks.failed]
    assert [c.name for c in checks.checks] == [f"query {n} matches the source" for n in NAMES] + [QUARANTINE_CHECK]
    assert list(answers) == NAMES and all(rows and columns for columns, rows, _ in answers.values())
    # the reference covered the real samples too (their years are in the answer), not only synthetic months
    years = {r[1] for r in answers["q3_trips_by_passenger_count_and_year"][1]}
    assert {2016, 2017} <= years and ({2019, 2022, 2025} <= years or not REAL_SAMPLES[0].exists())
    # naming queries checks only those
    some = CheckRun()
    queries.check_queries(lake, some, ["daily_summary", "06_top_pickup_zones"])
    assert [c.name for c in some.checks] == [
        "query daily_summary matches the source",
        "query top_pickup_zones matches the source",
    ]
    assert some.ok


def test_query_on_the_real_samples_passes_every_check(loaded, stack, cli):
    """`query` as a user runs it, on a lake that holds the real samples (issue 29: every sample loaded with every check
    passing, then `query` exited 1 on daily_summary)."""
    if not all(p.exists() for p in REAL_SAMPLES):
        pytest.skip(f"the real TLC samples ({SAMPLES}) are absent")
    result = cli(stack.env, "query", "--json")
    assert result.exit_code == 0, result.output[-3000:]
    doc = json.loads(result.stdout)
    assert doc["result"]["failed"] == 0 and doc["result"]["passed"] == len(NAMES) + 1
    days = {r[0]: r[2:4] for r in doc["result"]["queries"]["daily_summary"]["rows"]}
    # the two half-cent days, rounded half away from zero: 3.035 -> 3.04 miles, 18.885 -> $18.89
    assert (days["2018-06-16"][0], days["2019-03-31"][1]) == (3.04, 18.89)


def test_half_cent_averages_round_the_same_way_in_the_lessons_and_the_reference():
    """Without the stack: the same rows as the lake's `trips` (for the lessons' SQL) and as `source_trips` (for the
    reference). A day's average depends only on its exact DECIMAL sum and its count: these are the real samples' three
    ties (2018-06-16, 2019-03-31, and 2022-05-22, whose DOUBLE falls just below 4.015 in both)."""

    def day(
        date_: str, n: int, distance: tuple[float, float], total: tuple[float, float], pax: int, pu: int
    ) -> list[tuple]:
        # n - 1 rows of the first value, one of the second: the sums are the real days' sums
        return [(f"{date_} 10:00:00", pax, pu, *(distance[i == n - 1], total[i == n - 1])) for i in range(n)]

    rows = (
        day("2018-06-16", 312, (3.03, 4.59), (10.0, 10.0), 1, 132)  # 946.92 miles / 312 = 3.035
        + day("2019-03-31", 274, (1.0, 1.0), (18.88, 20.25), 2, 161)  # $5,174.49 / 274 = 18.885
        + day("2022-05-22", 22, (4.01, 4.12), (10.0, 10.0), 3, 161)
    )  # 88.33 miles / 22 = 4.015
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE source_trips AS SELECT * FROM (VALUES "
        + ", ".join(f"(TIMESTAMP '{p}', {x}, {pu}, {d}, {t})" for p, x, pu, d, t in rows)
        + ") v(pickup_at, passenger_count, "
        "pu_location_id, trip_distance, total_amount)"
    )
    con.execute("ALTER TABLE source_trips ADD COLUMN do_location_id INTEGER DEFAULT 161")
    con.execute("ALTER TABLE source_trips ADD COLUMN ratecode_id INTEGER DEFAULT 1")
    con.execute("ALTER TABLE source_trips ADD COLUMN reject_reason VARCHAR")
    con.execute("CREATE TABLE trips AS SELECT *, CAST(pickup_at AS DATE) AS pickup_date FROM source_trips")
    for name in ("daily_summary", "q2_avg_total_by_passenger_count", "airport_trips"):
        lesson = con.execute(queries.get_query(name).sql).fetchall()
        assert lesson == con.execute(queries.REFERENCE_SQL[name]).fetchall(), name
    assert [r[2:4] for r in con.execute(queries.get_query("daily_summary").sql).fetchall()] == [
        (3.04, 10.0),
        (1.0, 18.89),
        (4.01, 10.0),
    ]
    assert con.execute(queries.get_query("q2_avg_total_by_passenger_count").sql).fetchall()[1] == (2, 274, 18.89)
    assert con.execute(queries.get_query("airport_trips").sql).fetchall()[0] == (
        "JFK",
        "pickup",
        312,
        0,
        3.04,
        Decimal("3120.00"),
    )


def test_the_queries_give_hand_computed_answers_on_a_literal_month(loaded, lake):
    # the reference rules on the literal file itself: the first broken rule wins (row 5 is negative AND bad zone)
    con = duckdb.connect()
    reasons = con.execute(
        f"SELECT reject_reason, count(*) FROM ({reference.source_select(con, str(loaded['literal']), '2016-11')}) "
        "GROUP BY ALL ORDER BY 1 NULLS FIRST"
    ).fetchall()
    assert reasons == [(None, 4), ("bad_location", 1), ("negative_amount", 1), ("pickup_outside_period", 1)]
    # the same reasons in the lake's quarantine, from the Spark load
    assert (
        lake.con.execute(
            "SELECT reject_reason, count(*) FROM quarantine WHERE source_file = ? GROUP BY ALL ORDER BY 1", [LITERAL]
        ).fetchall()
        == reasons[1:]
    )

    # each query's own SQL over only the literal month's trips (a private DuckDB with `trips` and `zones`)
    con.register("trips_src", lake.con.execute("SELECT * FROM trips WHERE source_file = ?", [LITERAL]).to_arrow_table())
    con.register("zones_src", lake.con.execute("SELECT * FROM zones").to_arrow_table())
    con.execute("CREATE TABLE trips AS SELECT * FROM trips_src")
    con.execute("CREATE TABLE zones AS SELECT * FROM zones_src")

    def answer(name: str) -> list[tuple]:
        return con.execute(queries.get_query(name).sql).fetchall()

    assert answer("q1_trips_by_vendor") == [(1, 2), (2, 2)]
    assert answer("q2_avg_total_by_passenger_count") == [(None, 1, 100.0), (1, 2, 29.15), (2, 1, 95.5)]
    assert answer("q3_trips_by_passenger_count_and_year") == [(None, 2016, 1), (1, 2016, 2), (2, 2016, 1)]
    # 2.50 miles rounds half away from zero to 3
    assert answer("q4_trips_by_passenger_count_year_distance") == [
        (None, 2016, 16, 1),
        (1, 2016, 3, 1),
        (1, 2016, 10, 1),
        (2, 2016, 17, 1),
    ]
    assert answer("daily_summary") == [
        (date(2016, 11, 7), 2, 9.9, 57.75, Decimal("115.50")),
        (date(2016, 11, 8), 2, 12.9, 69.15, Decimal("138.30")),
    ]
    top = answer("top_pickup_zones")
    assert [(r[0], r[3], r[4]) for r in top] == [
        (237, 1, Decimal("100.00")),
        (132, 1, Decimal("95.50")),
        (138, 1, Decimal("38.30")),
        (161, 1, Decimal("20.00")),
    ]
    assert (top[1][1:3], top[2][1:3]) == (("Queens", "JFK Airport"), ("Queens", "LaGuardia Airport"))
    assert answer("hourly_demand_by_weekday") == [
        (1, "Monday", 8, 2, 100.0),
        (2, "Tuesday", 18, 1, 50.0),
        (2, "Tuesday", 23, 1, 50.0),
    ]
    # card: 18.00 tips of 115.50 charged = 15.58 %
    assert answer("tip_share_by_payment_type") == [
        (0, "Flex Fare", 1, Decimal("10.00"), 10.0, 100.0),
        (1, "Credit card", 2, Decimal("18.00"), 15.58, 100.0),
        (2, "Cash", 1, Decimal("0.00"), 0.0, 0.0),
    ]
    assert answer("airport_trips") == [
        ("EWR", "dropoff", 1, 0, 16.0, Decimal("100.00")),
        ("JFK", "pickup", 1, 1, 17.3, Decimal("95.50")),
        ("LGA", "pickup", 1, 0, 9.8, Decimal("38.30")),
    ]


@pytest.mark.parametrize(
    "tamper, must_fail",
    [
        # a dropped partition: every query sees fewer trips
        ("DELETE FROM trips WHERE pickup_year = 2017 AND pickup_month = 8", {"q1_trips_by_vendor", "daily_summary"}),
        # a load registered twice
        (
            f"INSERT INTO trips SELECT * FROM trips WHERE source_file = '{LITERAL}'",
            {"q1_trips_by_vendor", "airport_trips"},
        ),
        # a wrong derived column: only the query that reads it can see it
        (
            f"UPDATE trips SET pickup_hour = (pickup_hour + 1) % 24 WHERE source_file = '{LITERAL}'",
            {"hourly_demand_by_weekday"},
        ),
    ],
)
def test_a_tampered_lake_fails_the_check(loaded, lake, tamper, must_fail):
    lake.con.execute("BEGIN TRANSACTION")
    try:
        lake.con.execute(tamper)
        checks = CheckRun()
        queries.check_queries(lake, checks)
    finally:
        lake.con.execute("ROLLBACK")
    assert not checks.ok
    failed = _failed(checks)
    assert {f"query {n} matches the source" for n in must_fail} <= failed, failed
    if tamper.startswith("UPDATE"):
        assert failed == {"query hourly_demand_by_weekday matches the source"}
    after = CheckRun()
    queries.check_queries(lake, after, ["q1_trips_by_vendor", "hourly_demand_by_weekday"])
    assert after.ok  # rolled back: the lake is as it was


def test_a_wrong_rule_in_the_reference_fails_the_check(loaded, lake, monkeypatch):
    rules = list(reference.REFERENCE_RULES)
    # a rule forgotten: the refunds would count as trips
    monkeypatch.setattr(reference, "REFERENCE_RULES", [r for r in rules if r[0] != "negative_amount"])
    checks = CheckRun()
    queries.check_queries(lake, checks)
    assert "query q1_trips_by_vendor matches the source" in _failed(checks)
    # the same rules in another order: the same trips, but a row breaking two rules gets the other reason
    i, j = [c for c, _ in rules].index("negative_amount"), [c for c, _ in rules].index("bad_location")
    swapped = list(rules)
    swapped[i], swapped[j] = rules[j], rules[i]
    monkeypatch.setattr(reference, "REFERENCE_RULES", swapped)
    checks = CheckRun()
    queries.check_queries(lake, checks)
    assert _failed(checks) == {QUARANTINE_CHECK}


def test_an_unknown_query_name_is_one_clear_error(lake):
    with pytest.raises(KitError) as err:
        queries.run_query(lake, "q5_nope")
    assert err.value.line() == f"Error: unknown query 'q5_nope'. Try: choose one of: {', '.join(NAMES)}."
    with pytest.raises(KitError, match="unknown query 'nope'"):
        queries.check_queries(lake, CheckRun(), ["daily_summary", "nope"])


def test_bad_sql_in_a_query_file_names_the_file(lake, tmp_path, monkeypatch):
    (tmp_path / "01_broken.sql").write_text(
        "-- a query with a typo\n-- in a column name\nSELECT vendor_idd FROM trips;\n"
    )
    monkeypatch.setattr(lesson_queries, "QUERIES_DIR", tmp_path)
    with pytest.raises(KitError) as err:
        queries.run_query(lake, "broken")
    assert err.value.what.startswith("query broken (01_broken.sql): SQL failed:") and "vendor_idd" in err.value.what


def test_a_query_on_a_dropped_trips_table_says_it_was_dropped_and_how_to_get_it_back(fresh_stack):
    # issue 16: `query --no-check` after `DROP TABLE trips` said "fix the statement"
    from ducklake_kit.taxi.load import ddl_statements

    fresh_stack.platform.up()
    with Lake(fresh_stack.platform.endpoints()) as lake:
        for stmt in ddl_statements():
            lake.run(stmt)
        lake.run("DROP TABLE trips")
        with pytest.raises(KitError) as info:
            queries.run_query(lake, "q1_trips_by_vendor")
    assert "the table trips was dropped" in info.value.what and "AT (VERSION =>" in info.value.fix
