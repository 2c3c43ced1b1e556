"""The offline generator: exact TLC schemas, determinism, bounded memory, realistic shapes and quirk rates.

The expectations are computed from the written files with pyarrow, independently of the generator's code.
"""

from __future__ import annotations

import csv
import hashlib
import math
import subprocess
import sys
from collections import Counter
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.taxi import schema
from ducklake_kit.taxi.synthetic import QuirkRates, Recipe, generate_month, write_zone_lookup

ROWS = 200_000  # enough for the rarest default quirk (0.05%) to be measured within about +-40%


@pytest.fixture(scope="module")
def month(tmp_path_factory):
    """One generated 2025-03 month (2025 era), read back whole for the statistical tests."""
    out = generate_month(tmp_path_factory.mktemp("synthetic"), 2025, 3, ROWS, seed=7)
    return pq.read_table(out.path)


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _data_hash(table: pa.Table) -> str:
    """A hash of the values, not of the file layout (bytes under null slots and chunking vary)."""
    h = hashlib.sha256(str(table.schema).encode())
    for name in table.column_names:
        h.update(repr(table[name].to_pylist()).encode())
    return h.hexdigest()


# --- schema -----------------------------------------------------------------------------------------------


def test_2025_era_schema_equals_the_real_2025_sample(tmp_path, sample):
    real = pq.ParquetFile(sample("yellow_tripdata_2025-02_random5000.parquet")).schema_arrow
    out = generate_month(tmp_path, 2025, 2, 1000, seed=1)
    assert out.path.name == "yellow_tripdata_2025-02.parquet"
    assert pq.ParquetFile(out.path).schema_arrow.equals(real)  # names, order, types, nullability


@pytest.mark.parametrize(("era", "year"), [("2025", 2025), ("2024", 2024), ("2022", 2022), ("2022", 2019)])
def test_each_era_writes_its_declared_schema(tmp_path, era, year):
    out = generate_month(tmp_path / "x.parquet", year, 6, 5000, seed=1, recipe=Recipe(era=era))
    assert out.era == era
    written = pq.ParquetFile(out.path).schema_arrow
    assert written.equals(schema.TLC_ERAS[era])
    assert schema.detect_variant(written.names) is schema.ERA_VARIANT[era]


@pytest.mark.parametrize(("year", "era"), [(2021, "2022"), (2023, "2024"), (2026, "2025")])
def test_era_defaults_to_the_year(tmp_path, year, era):
    out = generate_month(tmp_path, year, 1, 100, seed=1)
    assert out.era == era
    assert pq.ParquetFile(out.path).schema_arrow.equals(schema.TLC_ERAS[era])


def test_2019_has_no_airport_fee_and_2022_fees_follow_the_old_tariff(tmp_path):
    t19 = pq.read_table(generate_month(tmp_path / "a.parquet", 2019, 6, 20_000, seed=3).path)
    assert t19["airport_fee"].null_count == t19.num_rows  # the column exists, the fee did not yet
    t22 = pq.read_table(generate_month(tmp_path / "b.parquet", 2022, 6, 20_000, seed=3).path)
    fees = set(pc.unique(pc.abs(t22["airport_fee"].drop_null())).to_pylist())
    assert fees == {0.0, 1.25}
    assert set(pc.unique(pc.abs(t22["improvement_surcharge"])).to_pylist()) == {0.3}


# --- determinism and memory ---------------------------------------------------------------------------------


def test_same_seed_same_bytes_other_seed_other_values(tmp_path):
    a = generate_month(tmp_path / "a.parquet", 2024, 1, 30_000, seed=42)
    b = generate_month(tmp_path / "b.parquet", 2024, 1, 30_000, seed=42)
    c = generate_month(tmp_path / "c.parquet", 2024, 1, 30_000, seed=43)
    d = generate_month(tmp_path / "d.parquet", 2024, 2, 30_000, seed=42)
    assert _sha256(a.path) == _sha256(b.path) == a.sha256 == b.sha256
    hashes = {_data_hash(pq.read_table(x.path)) for x in (a, c, d)}
    assert len(hashes) == 3  # another seed or another month: other data
    ta, tc = pq.read_table(a.path), pq.read_table(c.path)
    assert ta["trip_distance"].to_pylist()[:100] != tc["trip_distance"].to_pylist()[:100]


def test_values_do_not_depend_on_row_group_size_and_smaller_months_are_prefixes(tmp_path):
    small_groups = generate_month(tmp_path / "a.parquet", 2025, 1, 40_000, seed=5, recipe=Recipe(chunk_rows=3_000))
    one_group = generate_month(tmp_path / "b.parquet", 2025, 1, 40_000, seed=5, recipe=Recipe(chunk_rows=1_000_000))
    shorter = generate_month(tmp_path / "c.parquet", 2025, 1, 25_000, seed=5)
    a, b, c = (pq.read_table(x.path) for x in (small_groups, one_group, shorter))
    assert a.equals(b) and _data_hash(a) == _data_hash(b)
    assert c.equals(b.slice(0, 25_000))


def test_row_groups_are_chunk_sized(tmp_path):
    out = generate_month(tmp_path / "m.parquet", 2024, 3, 50_000, seed=1, recipe=Recipe(chunk_rows=7_000))
    meta = pq.ParquetFile(out.path).metadata
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sizes == [7_000] * 7 + [1_000]
    assert out.row_groups == 8 and out.rows == meta.num_rows == 50_000


_PEAK = """
import sys, pyarrow as pa
from ducklake_kit.taxi.synthetic import Recipe, generate_month
generate_month(sys.argv[1], 2024, 5, int(sys.argv[2]), seed=1, recipe=Recipe(chunk_rows=16_384))
print(pa.default_memory_pool().max_memory())
"""


def test_memory_stays_flat_as_rows_grow(tmp_path):
    """Peak Arrow memory of a fresh process: 8x the rows must not need more memory. Holding the month
    (175,000 more rows x 20 columns x 8 bytes = 28 MB more) would break the second assertion."""

    def peak(rows: int) -> int:
        out = subprocess.run(
            [sys.executable, "-c", _PEAK, str(tmp_path / f"{rows}.parquet"), str(rows)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return int(out.stdout.strip())

    small, large = peak(25_000), peak(200_000)
    assert large < small * 1.25, (small, large)
    assert large - small < 8 * 2**20, (small, large)


def test_bad_arguments_are_clear_errors(tmp_path):
    with pytest.raises(KitError, match="no such month: 2024-13"):
        generate_month(tmp_path, 2024, 13, 10)
    with pytest.raises(KitError, match="unknown TLC schema era '2030'"):
        generate_month(tmp_path, 2024, 1, 10, recipe=Recipe(era="2030"))
    with pytest.raises(KitError, match="rows must be >= 0"):
        generate_month(tmp_path, 2024, 1, -1)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_zero_rows_is_an_empty_file_with_the_schema(tmp_path):
    out = generate_month(tmp_path / "e.parquet", 2024, 1, 0)
    t = pq.read_table(out.path)
    assert t.num_rows == 0 and t.schema.equals(schema.TLC_ERAS["2024"])


# --- shapes ---------------------------------------------------------------------------------------------------


def _rate(mask: pa.Array) -> float:
    return pc.sum(pc.cast(mask, pa.int64())).as_py() / len(mask)


def _within(observed: float, p: float, n: int) -> bool:
    return abs(observed - p) <= 4.5 * math.sqrt(p * (1 - p) / n)  # ~1 in 150,000 false alarms


def test_null_block_is_one_block_of_five_columns_and_flex_fare(month):
    nulls = [
        pc.is_null(month[c])
        for c in ("passenger_count", "RatecodeID", "store_and_fwd_flag", "congestion_surcharge", "Airport_fee")
    ]
    for other in nulls[1:]:
        assert other.equals(nulls[0])  # the same rows, every time
    assert pc.equal(month["payment_type"], 0).equals(nulls[0])
    assert _within(_rate(nulls[0]), 0.22, month.num_rows)
    for c in ("VendorID", "tpep_pickup_datetime", "trip_distance", "fare_amount", "total_amount", "cbd_congestion_fee"):
        assert month[c].null_count == 0


def test_quirk_rates(month):
    n = month.num_rows
    pickup, dropoff = month["tpep_pickup_datetime"], month["tpep_dropoff_datetime"]
    start, end = datetime(2025, 3, 1), datetime(2025, 4, 1)
    rates = QuirkRates()
    observed = {
        "negative_fare": _rate(pc.less(month["fare_amount"], 0)),
        "zero_distance": _rate(pc.equal(month["trip_distance"], 0)),
        "dropoff_before_pickup": _rate(pc.less(dropoff, pickup)),
        "out_of_month": _rate(
            pc.or_(
                pc.less(pickup, pa.scalar(start, pa.timestamp("us"))),
                pc.greater_equal(pickup, pa.scalar(end, pa.timestamp("us"))),
            )
        ),
        "long_duration": _rate(
            pc.greater(pc.subtract(dropoff, pickup), pa.scalar(3 * 3600 * 10**6, pa.duration("us")))
        ),
        "distance_outlier": _rate(pc.greater(month["trip_distance"], 500)),
    }
    for name, value in observed.items():
        assert _within(value, getattr(rates, name), n), (name, value)
    rc = month["RatecodeID"].drop_null()  # RatecodeID 99 among the rows that report a rate code
    assert _within(_rate(pc.equal(rc, 99)), rates.ratecode_99, len(rc))
    years = Counter(
        d.year
        for d in pc.filter(pickup, pc.less(pickup, pa.scalar(datetime(2024, 1, 1), pa.timestamp("us")))).to_pylist()
    )
    assert set(years) <= {2002, 2008, 2009} and sum(years.values()) > 0  # the bogus far-away years


def test_refunds_negate_every_amount(month):
    neg = pc.filter(month, pc.less(month["fare_amount"], 0))
    for c in ("extra", "mta_tax", "improvement_surcharge", "total_amount", "cbd_congestion_fee"):
        assert pc.max(neg[c]).as_py() <= 0, c
    assert set(pc.unique(neg["payment_type"]).to_pylist()) <= {0, 2, 3, 4}


def test_demand_follows_the_hour_of_day_and_the_weekday(month):
    inside = month.filter(
        pc.and_(
            pc.greater_equal(month["tpep_pickup_datetime"], pa.scalar(datetime(2025, 3, 1), pa.timestamp("us"))),
            pc.less(month["tpep_pickup_datetime"], pa.scalar(datetime(2025, 4, 1), pa.timestamp("us"))),
        )
    )
    times = inside["tpep_pickup_datetime"].to_pylist()
    hours = Counter(t.hour for t in times)
    assert (hours[17] + hours[18] + hours[19]) > 4 * (hours[3] + hours[4] + hours[5])
    assert max(hours, key=hours.get) in (17, 18)
    days = Counter(t.date() for t in times)
    per_weekday: dict[int, list[int]] = {}
    for d, k in days.items():
        per_weekday.setdefault(d.weekday(), []).append(k)
    mean = {wd: sum(v) / len(v) for wd, v in per_weekday.items()}
    assert mean[3] > 1.15 * mean[6]  # Thursdays busier than Sundays
    assert len(days) == 31


def _good_standard(month: pa.Table) -> pa.Table:
    return month.filter(
        pc.and_(
            pc.equal(month["RatecodeID"], 1.0),
            pc.and_(pc.greater(month["fare_amount"], 0), pc.less(month["trip_distance"], 500)),
        )
    )


def test_distance_duration_and_fares_look_like_nyc(month):
    t = _good_standard(month)
    dist = sorted(t["trip_distance"].to_pylist())
    assert 1.2 < dist[len(dist) // 2] < 2.6  # median trip distance, miles
    secs = sorted(
        int((b - a).total_seconds())
        for a, b in zip(t["tpep_pickup_datetime"].to_pylist(), t["tpep_dropoff_datetime"].to_pylist())
    )
    assert 7 * 60 < secs[len(secs) // 2] < 20 * 60  # median duration

    def mean_fare(lo, hi):
        f = t.filter(pc.and_(pc.greater_equal(t["trip_distance"], lo), pc.less(t["trip_distance"], hi)))
        return pc.mean(f["fare_amount"]).as_py()

    short, medium, long_ = mean_fare(0.5, 1.5), mean_fare(3, 5), mean_fare(8, 12)
    assert short < medium < long_ and long_ > 3 * short


def test_tips_depend_on_payment_type(month):
    good = month.filter(pc.greater(month["fare_amount"], 0))
    cash = good.filter(pc.equal(good["payment_type"], 2))
    card = good.filter(pc.equal(good["payment_type"], 1))
    assert cash.num_rows > 1000 and pc.max(cash["tip_amount"]).as_py() == 0.0
    ratio = pc.sum(card["tip_amount"]).as_py() / pc.sum(card["fare_amount"]).as_py()
    assert 0.12 < ratio < 0.3
    assert 0.05 < _rate(pc.equal(card["tip_amount"], 0.0)) < 0.2  # some card riders tip nothing


def test_airports(month):
    pu = month["PULocationID"]
    for zone, share in ((132, 0.045), (138, 0.03)):
        assert abs(_rate(pc.equal(pu, zone)) - share) < 0.006
    at_airport = pc.is_in(pu, pa.array([132, 138], pa.int32()))
    reported = pc.is_valid(month["Airport_fee"])
    fee = pc.abs(month["Airport_fee"])
    assert set(pc.unique(pc.filter(fee, pc.and_(at_airport, reported))).to_pylist()) == {1.75}
    assert set(pc.unique(pc.filter(fee, pc.and_(pc.invert(at_airport), reported))).to_pylist()) == {0.0}
    jfk_flat = month.filter(pc.and_(pc.equal(month["RatecodeID"], 2.0), pc.greater(month["fare_amount"], 0)))
    assert jfk_flat.num_rows > 500 and set(pc.unique(jfk_flat["fare_amount"]).to_pylist()) == {70.0}
    jfk = pc.or_(pc.equal(jfk_flat["PULocationID"], 132), pc.equal(jfk_flat["DOLocationID"], 132))
    assert pc.all(jfk).as_py()
    ewr_trips = month.filter(pc.equal(month["DOLocationID"], 1))
    assert ewr_trips.num_rows > 100


def test_every_zone_id_occurs(month):
    assert set(pc.unique(month["PULocationID"]).to_pylist()) == set(range(1, 266))
    assert set(pc.unique(month["DOLocationID"]).to_pylist()) == set(range(1, 266))


def test_cbd_fee_starts_on_2025_01_05(tmp_path):
    t = pq.read_table(generate_month(tmp_path / "j.parquet", 2025, 1, 40_000, seed=2).path)
    ok = t.filter(
        pc.and_(
            pc.greater(t["fare_amount"], 0),
            pc.greater_equal(t["tpep_pickup_datetime"], pa.scalar(datetime(2025, 1, 1), pa.timestamp("us"))),
        )
    )
    before = ok.filter(pc.less(ok["tpep_pickup_datetime"], pa.scalar(datetime(2025, 1, 5), pa.timestamp("us"))))
    after = ok.filter(pc.greater_equal(ok["tpep_pickup_datetime"], pa.scalar(datetime(2025, 1, 5), pa.timestamp("us"))))
    assert set(pc.unique(before["cbd_congestion_fee"]).to_pylist()) == {0.0}
    assert set(pc.unique(after["cbd_congestion_fee"]).to_pylist()) == {0.0, 0.75}


def test_totals_add_up(month):
    """total = every reported component (the null block reports no congestion or airport fee)."""
    rows = month.slice(0, 5000).to_pylist()
    for r in rows:
        parts = [
            r[c] or 0.0
            for c in (
                "fare_amount",
                "extra",
                "mta_tax",
                "tip_amount",
                "tolls_amount",
                "improvement_surcharge",
                "congestion_surcharge",
                "Airport_fee",
                "cbd_congestion_fee",
            )
        ]
        assert abs(sum(parts) - r["total_amount"]) < 0.011, r


# --- the zone lookup ------------------------------------------------------------------------------------------


def test_zone_lookup_csv_shape(tmp_path):
    path = write_zone_lookup(tmp_path)
    raw = path.read_bytes()
    assert raw.startswith(b'"LocationID","Borough","Zone","service_zone"\r\n1,"EWR","Newark Airport","EWR"\r\n')
    with open(path, newline="") as f:
        rows = list(csv.reader(f))[1:]
    assert [int(r[0]) for r in rows] == list(range(1, 266))
    by_id = {int(r[0]): r[1:] for r in rows}
    assert by_id[132] == ["Queens", "JFK Airport", "Airports"]
    assert by_id[138] == ["Queens", "LaGuardia Airport", "Airports"]
    assert by_id[264] == ["Unknown", "N/A", "N/A"]
    assert by_id[265] == ["N/A", "Outside of NYC", "N/A"]
    boroughs = Counter(r[1] for r in rows)
    assert boroughs == {
        "Manhattan": 69,
        "Queens": 69,
        "Brooklyn": 61,
        "Bronx": 43,
        "Staten Island": 20,
        "EWR": 1,
        "Unknown": 1,
        "N/A": 1,
    }
    assert Counter(r[3] for r in rows) == {"Boro Zone": 205, "Yellow Zone": 55, "Airports": 2, "N/A": 2, "EWR": 1}
    assert by_id[237][0] == "Manhattan"  # the busiest synthetic pickup zone is a Manhattan one
    assert len({r[2] for r in rows}) == 265  # distinct names
    assert write_zone_lookup(tmp_path / "again.csv").read_bytes() == raw  # deterministic


def test_zone_lookup_matches_the_official_file_shape(tmp_path, sample):
    real = sample("taxi_zone_lookup.csv").read_bytes()
    ours = write_zone_lookup(tmp_path).read_bytes()
    assert ours.splitlines()[0] == real.splitlines()[0]
    assert ours.count(b"\r\n") == real.count(b"\r\n")
    with open(sample("taxi_zone_lookup.csv"), newline="") as f:
        real_rows = list(csv.reader(f))
    with open(tmp_path / "taxi_zone_lookup.csv", newline="") as f:
        our_rows = list(csv.reader(f))
    assert len(our_rows) == len(real_rows) == 266
    real_by_id = {r[0]: r for r in real_rows[1:]}
    for zone_id in ("1", "264", "265"):
        assert our_rows[int(zone_id)] == real_by_id[zone_id]
    assert Counter(r[1] for r in our_rows[1:]) == Counter(r[1] for r in real_rows[1:])
