"""`bench --suite dynamic`: an incremental refresh against a full recompute of the same table, at two base sizes,
in one run.

The table is `dynamic_tables/daily_revenue_by_borough.sql`'s query (trips joined with zones, grouped by day and
borough) over the suite's own tables in the `bench` schema: `bench.dt_trips` (the columns that query reads, from
synthetic TLC months, written by DuckDB: this suite measures refreshes, not the load) and `bench.dt_zones`. Two
dynamic tables read them: one AUTO (incremental), one REFRESH_MODE = FULL. For each base (N months, then 2N):
build the base, create both tables, then `runs` times append one more month (the same months for both bases) and
refresh each table, timed (`Refresher.refresh`, wall clock: lock, reads, change feed, writes and commit), with
DuckDB's external file cache off unless asked (`file_cache=True`): every refresh reads its Parquet from S3. Both
tables are then compared with their query run in full (EXCEPT ALL both ways): a figure from a wrong table is no
figure.

Goals (issue 13): at 12M base rows the incremental refresh takes at most 1/10 of the full one, and doubling the
base changes the incremental time by under 20%."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ducklake_kit.bench.results import BENCH_SCHEMA, Machine, load_average, write_outputs
from ducklake_kit.dynamic_tables import ddl, manage
from ducklake_kit.dynamic_tables.metadata import SUCCEEDED, Metadata
from ducklake_kit.dynamic_tables.refresh import FULL, INCREMENTAL, Refresher
from ducklake_kit.errors import EXIT_CHECK_FAILED, KitError
from ducklake_kit.lake import Lake
from ducklake_kit.lake.sql import quote_literal
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.taxi import synthetic

GOAL_RATIO = 0.10  # incremental / full, at 12M base rows
GOAL_GROWTH = 0.20  # how much the incremental time may change when the base doubles
GOAL_BASE_ROWS = 12_000_000
FIRST_YEAR = 2021  # base months from January of this year; the appended months follow the largest base
TRIPS, ZONES = f"{BENCH_SCHEMA}.dt_trips", f"{BENCH_SCHEMA}.dt_zones"
INC, FULL_TABLE = f"{BENCH_SCHEMA}.dt_revenue_incremental", f"{BENCH_SCHEMA}.dt_revenue_full"
QUERY = (
    f"SELECT t.pickup_date, z.borough, count(*) AS trips, sum(t.total_amount::DECIMAL(18, 2)) AS revenue, "
    f"sum(t.tip_amount::DECIMAL(18, 2)) AS tips FROM {TRIPS} AS t JOIN {ZONES} AS z "
    f"ON t.pu_location_id = z.location_id GROUP BY t.pickup_date, z.borough"
)


def month_of(i: int) -> tuple[int, int]:
    """The i-th month (0-based) from January of FIRST_YEAR."""
    return FIRST_YEAR + i // 12, i % 12 + 1


@dataclass
class BaseFigures:
    months: int
    base_rows: int
    change_rows: int  # rows one appended month adds (the median over the runs)
    incremental_s: list[float] = field(default_factory=list)
    full_s: list[float] = field(default_factory=list)
    incremental_how: str = ""

    @property
    def incremental_median_s(self) -> float:
        return round(statistics.median(self.incremental_s), 3)

    @property
    def full_median_s(self) -> float:
        return round(statistics.median(self.full_s), 3)

    @property
    def ratio(self) -> float:
        return round(self.incremental_median_s / self.full_median_s, 3)

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "incremental_median_s": self.incremental_median_s,
            "full_median_s": self.full_median_s,
            "ratio": self.ratio,
        }


@dataclass
class DynamicBench:
    machine: Machine
    rows_per_month: int
    runs: int
    bases: list[BaseFigures]
    file_cache: bool = False  # DuckDB's external file cache (off: every refresh reads its files from S3)

    @property
    def growth(self) -> float:
        """The incremental time at the doubled base over the one at the first base, minus 1."""
        a, b = self.bases[0].incremental_median_s, self.bases[-1].incremental_median_s
        return round(b / a - 1, 3)

    def goals(self) -> dict[str, Any]:
        first = self.bases[0]
        return {
            "ratio_at_first_base": first.ratio,
            "ratio_goal": GOAL_RATIO,
            "ratio_met": first.ratio <= GOAL_RATIO,
            "first_base_rows": first.base_rows,
            "goal_base_rows": GOAL_BASE_ROWS,
            "at_goal_size": first.base_rows >= GOAL_BASE_ROWS,
            "growth_when_doubled": self.growth,
            "growth_goal": GOAL_GROWTH,
            "growth_met": abs(self.growth) < GOAL_GROWTH,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "machine": self.machine.as_dict(),
            "rows_per_month": self.rows_per_month,
            "runs": self.runs,
            "file_cache": self.file_cache,
            "bases": [b.as_dict() for b in self.bases],
            "goals": self.goals(),
        }


def _month_files(cache: Path, months: list[int], rows_per_month: int, say: Callable[[str], None]) -> dict[int, Path]:
    folder = cache / "bench-dynamic" / f"{rows_per_month}"
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for i in months:
        year, month = month_of(i)
        path = folder / synthetic.month_file_name(year, month)
        if not path.exists():
            say(f"generating {path.name} ({rows_per_month:,} synthetic trips)")
            synthetic.generate_month(path, year, month, rows_per_month, seed=i)
        out[i] = path
    return out


def _month_rows(path: Path) -> str:
    """The columns the query reads, from one raw month (every trip of the file, its odd dates included)."""
    return (
        f"SELECT tpep_pickup_datetime::DATE AS pickup_date, PULocationID::INTEGER AS pu_location_id, "
        f"total_amount, tip_amount FROM read_parquet({quote_literal(str(path))})"
    )


def _drop(lake: Lake, meta: Metadata) -> None:
    for name in (INC, FULL_TABLE):
        manage.drop(lake, meta, name, if_exists=True)


def bench_dynamic(
    kit: Kit,
    *,
    months: int = 12,
    rows_per_month: int = 100_000,
    runs: int = 2,
    file_cache: bool = False,
    json_path: Path | None = None,
) -> DynamicBench:
    if months < 1 or rows_per_month < 1000 or runs < 1:
        raise KitError(
            "--months, --runs must be at least 1 and --rows (rows per month) at least 1000",
            "e.g. bench --suite dynamic --months 12 --rows 1000000",
        )
    before = load_average()
    appended = list(range(2 * months, 2 * months + runs))
    state, say = kit.state, kit.say
    files = _month_files(state.cache_dir, list(range(2 * months)) + appended, rows_per_month, say)
    zones_csv = synthetic.write_zone_lookup(state.cache_dir / "bench-dynamic" / "taxi_zone_lookup.csv")
    bases = []
    ep = kit.platform.endpoints()
    with Lake(ep) as lake, Metadata(ep) as meta:
        lake.con.execute(f"CREATE SCHEMA IF NOT EXISTS lake.{BENCH_SCHEMA}")
        # every refresh reads its files from S3, as a fresh process does: with DuckDB's external file cache on, the
        # full recompute would read the base from memory (warmed by the create) while the incremental refresh
        # always reads new files cold
        lake.con.execute(f"SET enable_external_file_cache = {'true' if file_cache else 'false'}")
        refresher = Refresher(lake, meta)
        try:
            for n in (months, 2 * months):
                say(f"base of {n} months: writing {TRIPS} with DuckDB")
                _drop(lake, meta)
                union = " UNION ALL ".join(_month_rows(files[i]) for i in range(n))
                lake.con.execute(f"CREATE OR REPLACE TABLE lake.{TRIPS} AS {union}")
                lake.con.execute(
                    f"CREATE OR REPLACE TABLE lake.{ZONES} AS SELECT LocationID AS location_id, "
                    f"Borough AS borough FROM read_csv({quote_literal(str(zones_csv))}, header = true)"
                )
                base_rows = int(lake.scalar(f"SELECT count(*) FROM lake.{TRIPS}"))
                say(f"base of {n} months: {base_rows:,} trips; creating {INC} (AUTO) and {FULL_TABLE} (FULL)")
                for name, mode in ((INC, "AUTO"), (FULL_TABLE, "FULL")):
                    [stmt] = ddl.parse(
                        f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 day' REFRESH_MODE = {mode} AS {QUERY}"
                    )
                    manage.create(lake, meta, stmt)
                fig = BaseFigures(n, base_rows, 0)
                changes = []
                for i in appended:
                    before_rows = int(lake.scalar(f"SELECT count(*) FROM lake.{TRIPS}"))
                    lake.con.execute(f"INSERT INTO lake.{TRIPS} {_month_rows(files[i])}")
                    changes.append(int(lake.scalar(f"SELECT count(*) FROM lake.{TRIPS}")) - before_rows)
                    for name, times, mode in ((INC, fig.incremental_s, INCREMENTAL), (FULL_TABLE, fig.full_s, FULL)):
                        start = time.perf_counter()
                        r = refresher.refresh(meta.get(name), "bench")
                        times.append(round(time.perf_counter() - start, 3))
                        if (r.status, r.mode) != (SUCCEEDED, mode):
                            raise KitError(
                                f"the {mode.lower()} refresh of {name} was {r.status} {r.mode} ({r.error or r.reason})",
                                "see `dynamic history " + name + "`",
                                exit_code=EXIT_CHECK_FAILED,
                            )
                        if name == INC:
                            fig.incremental_how = r.reason or ""
                        say(f"  +{changes[-1]:,} trips: {name} {r.mode.lower()} in {times[-1]} s ({r.reason})")
                for name in (INC, FULL_TABLE):
                    wrong = manage.check(lake, meta, name)
                    if wrong != (0, 0):
                        raise KitError(
                            f"{name} differs from its query run in full ({wrong[0]} rows only in the table, "
                            f"{wrong[1]} only in the query)",
                            "this is a defect of the refresher: report it",
                            exit_code=EXIT_CHECK_FAILED,
                        )
                fig.change_rows = int(statistics.median(changes))
                bases.append(fig)
        finally:
            _drop(lake, meta)
            for t in (TRIPS, ZONES):
                lake.con.execute(f"DROP TABLE IF EXISTS lake.{t}")
    result = DynamicBench(Machine.since(before), rows_per_month, runs, bases, file_cache)
    write_outputs(result, json_path, None)
    return result
