"""The reference reader (what the load's checks and the query lessons read the raw files with) reads every real
sample Spark reads: all 36 gx CSVs (two of them end their lines in CRLF but the last in LF, which DuckDB's sniffer
gave up on), the BigQuery CSV and both TLC Parquet samples. Each file's row count and money total are compared with
the file read by Python's csv module or pyarrow. And a raw object it cannot read fails that file's check alone."""

from __future__ import annotations

import csv
import decimal
from pathlib import Path
from types import SimpleNamespace

import duckdb
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from ducklake_kit.checks import CheckRun
from ducklake_kit.lake import Lake
from ducklake_kit.taxi.reference import source_select
from ducklake_kit.taxi.verify import verify_file

SAMPLES = Path(__file__).resolve().parents[3] / "shared" / "tlc-samples"
GX = sorted((SAMPLES / "gx_yellow_tripdata_samples_2018-2020").glob("*.csv"))
CSVS = [*GX, SAMPLES / "bigquery_tlc_yellow_trips_2022_random10000.csv"]
PARQUETS = [
    SAMPLES / "yellow_tripdata_2025-01_head10000.parquet",
    SAMPLES / "yellow_tripdata_2025-02_random5000.parquet",
]
pytestmark = pytest.mark.skipif(not SAMPLES.exists(), reason=f"the real TLC samples ({SAMPLES}) are absent")


def test_there_are_36_gx_samples():
    assert len(GX) == 36


@pytest.mark.parametrize("path", CSVS + PARQUETS, ids=lambda p: p.name)
def test_the_reference_reads_every_real_sample(path):
    if path.suffix == ".csv":
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        expected_rows = len(rows)
        expected_total = sum(decimal.Decimal(r["total_amount"]) for r in rows if r["total_amount"])
    else:
        table = pq.read_table(path, columns=["total_amount"])
        expected_rows = table.num_rows
        expected_total = decimal.Decimal(str(round(pc.sum(table["total_amount"]).as_py(), 2)))
    con = duckdb.connect()
    got_rows, got_total = con.execute(
        f"SELECT count(*), sum(CAST(total_amount AS DECIMAL(18, 2))) FROM ({source_select(con, str(path), 'any')})"
    ).fetchone()
    assert (got_rows, got_total) == (expected_rows, expected_total.quantize(decimal.Decimal("0.01")))


def test_a_raw_object_the_reference_cannot_read_fails_its_own_check_with_a_fix(stack, tmp_path):
    broken = tmp_path / "yellow_tripdata_2024-01.csv"
    broken.write_bytes(b'vendor_id,pickup_datetime\n1,"2024-01-01 00:00:00\n')  # an unterminated quote
    gone = tmp_path / "missing" / "yellow_tripdata_2024-02.csv"
    checks = CheckRun()
    with Lake(stack.platform.endpoints()) as lake:
        for path in (broken, gone):
            fr = SimpleNamespace(raw_uri=str(path), source=SimpleNamespace(path=path, period="2024-01", month=1))
            verify_file(lake, fr, "load-x", checks)  # records a failed check; never raises
    assert [c.name for c in checks.checks] == [
        f"{broken.name}: the reference reader can read the raw object",
        f"{gone.name}: the reference reader can read the raw object",
    ]
    assert not any(c.passed for c in checks.checks)
    assert "report the file" in checks.checks[0].actual and "load --mode replace" in checks.checks[1].actual
