"""Fixtures of the taxi tests: one SparkSession for the whole run, and the real samples in ../shared."""

from __future__ import annotations

from pathlib import Path

import pytest

# Real TLC samples next to the project (never copied into it): tests that read them skip without them.
SAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "tlc-samples"

# Deliberately not UTC: a transform that shifted timestamps through the session time zone would show it
# in every test, not only in the ones about time zones.
SESSION_TIME_ZONE = "America/New_York"


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    from ducklake_kit.taxi.transforms import SPARK_CONF

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("ducklake-kit-taxi-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", SESSION_TIME_ZONE)
    )
    for k, v in SPARK_CONF.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def time_zone(spark, request):
    """Run a test under the session time zone `request.param`, then put the default back."""
    spark.conf.set("spark.sql.session.timeZone", request.param)
    yield request.param
    spark.conf.set("spark.sql.session.timeZone", SESSION_TIME_ZONE)


@pytest.fixture(scope="session")
def sample():
    """`sample(name)`: a file of ../shared/tlc-samples, or skip the test (a user's clone lacks them)."""

    def get(name: str) -> Path:
        path = SAMPLES / name
        if not path.exists():
            pytest.skip(f"real TLC sample {path} is absent (it lives next to the project, in ../shared)")
        return path

    return get
