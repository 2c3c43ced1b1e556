"""`bench --suite dynamic`: an incremental refresh against a full recompute of the same table, at two base sizes,
in one run.

The table is `dynamic_tables/daily_revenue_by_borough.sql`'s query (trips joined with zones, grouped by day and
borough) over the suite's own tables in the `bench` schema: `bench.dt_trips` (the columns that query reads, from
synthetic TLC months, written by DuckDB: this suite measures refreshes, not the load) and `bench.dt_zones`. Two
dynamic tables read them: one REFRESH_MODE = INCREMENTAL, one REFRESH_MODE = FULL. For each base (N months, then 2N):
build the base, create both tables, then `runs` times append a tenth of a month and refresh each table, then one
more month and refresh each table (the same rows for both bases), timed (`Refresher.refresh`, wall clock: lock, reads, change feed, writes and commit), with
DuckDB's external file cache off unless asked (`file_cache=True`): every refresh reads its Parquet from S3. Both
tables are then compared with their query run in full (EXCEPT ALL both ways): a figure from a wrong table is no
figure.

The second base has 2N months, or as many as asked (`months=(12, 48)`).

Goals (issue 13), for the month appended: at 12M base rows the incremental refresh takes at most 1/10 of the full
one, and doubling the base changes the incremental time by under 20%. (Issue 30), for the tenth of a month: a
change of 100,000 rows into 12M and 48M base rows (`--rows 1000000 --months 12,48`): the incremental refresh at
most 0.15 of the full one at 12M, and its time grows at most 5 % from 12M to 48M.

Then two more measurements (issue 30):
- **The fixed cost of a refresh**: one row inserted into a small table (`bench.dt_small`, 1,000 rows), its ADAPTIVE
  aggregate refreshed, FIXED_RUNS times: the median wall time and the median of each phase the refresh times itself
  (`Refresh.phases`: lock, bind, catalog, change feed, delta, write, commit, history). Goal: under 50 ms.
- **ADAPTIVE against both fixed modes**: on the first base again, REPLICAS tables of the same query in each mode
  (INCREMENTAL, FULL, ADAPTIVE) through a stream of STREAM changes: appends of 1 % of the base, and at STREAM // 2 one
  whole month replaced (its rows deleted and loaded again in one commit, as `load --mode replace` does), each change
  followed by a refresh of every table, timed, in REPLICAS rounds of one table per mode whose order turns with the
  step and the round (so no mode always follows the FULL tables' heavy query). A mode's time in a step is the median
  of its tables' (the same statements on the same change: their spread is the machine's noise, printed). Goals:
  ADAPTIVE's total at most 1.1 x the better of the other two, and at no step more than 1.1 x the better
  (`Stream.per_step`; the same computed from one table per mode is printed beside it); the crossover (the change's share of the base where an
  incremental refresh costs what a full one does) measured from the same refreshes, and the constants of ADAPTIVE's
  cost estimate (`dynamic_tables/cost.py`) they imply (`Stream.cost`), printed beside the kit's.
- **A star join and a DOWNSTREAM chain** (`dynamic_joins`): a 1-fact + 3-dimension join refreshed after a fact
  append against the same table without the joins, and one row through three DOWNSTREAM tables end to end."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ducklake_kit.bench.dynamic_joins import Chain, StarJoin, bench_joins, checked
from ducklake_kit.bench.results import BENCH_SCHEMA, Machine, load_average, write_outputs
from ducklake_kit.dynamic_tables import ddl, manage
from ducklake_kit.dynamic_tables.cost import DEFAULT as DEFAULT_COST
from ducklake_kit.dynamic_tables.cost import Cost
from ducklake_kit.dynamic_tables.metadata import SUCCEEDED, Metadata
from ducklake_kit.dynamic_tables.refresh import ADAPTIVE_CROSSOVER, FULL, INCREMENTAL, PHASES, Refresher
from ducklake_kit.errors import EXIT_CHECK_FAILED, KitError
from ducklake_kit.lake import Lake
from ducklake_kit.lake.sql import quote_literal
from ducklake_kit.lake.transactions import commit
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.taxi import synthetic

GOAL_RATIO = 0.10  # incremental / full, at 12M base rows
GOAL_GROWTH = 0.20  # how much the incremental time may change when the base doubles
GOAL_BASE_ROWS = 12_000_000
# issue 30: a change of a tenth of a month (100,000 rows at --rows 1000000) into 12M and 48M base rows
CHANGE_OF_MONTH = 10  # the small change is rows_per_month // CHANGE_OF_MONTH rows
GOAL_CHANGE_RATIO = 0.15  # incremental / full for that change, at 12M base rows
GOAL_CHANGE_GROWTH = 0.05  # how much its incremental time may grow from 12M to 48M base rows
GOAL_CHANGE = (100_000, 12_000_000, 48_000_000)  # the change's rows and the two bases' rows the goal is set at
GOAL_FIXED_MS = 50  # a one-row change into a small table, refreshed
GOAL_ADAPTIVE = 1.1  # ADAPTIVE's total over the better of always-incremental and always-full
FIXED_RUNS, SMALL_ROWS = 15, 1000
STREAM, APPEND_SHARE = 20, 0.01
REPLICAS = 5  # the stream's tables per mode, refreshed after every change: a step's time is their median
FIRST_YEAR = 2021  # base months from January of this year; the appended months follow the largest base
TRIPS, ZONES = f"{BENCH_SCHEMA}.dt_trips", f"{BENCH_SCHEMA}.dt_zones"
INC, FULL_TABLE = f"{BENCH_SCHEMA}.dt_revenue_incremental", f"{BENCH_SCHEMA}.dt_revenue_full"
ADAPT = f"{BENCH_SCHEMA}.dt_revenue_adaptive"
SMALL, SMALL_SUM = f"{BENCH_SCHEMA}.dt_small", f"{BENCH_SCHEMA}.dt_small_sum"
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
    small_change_rows: int = 0  # rows of the small change (a tenth of a month)
    small_incremental_s: list[float] = field(default_factory=list)
    small_full_s: list[float] = field(default_factory=list)
    small_incremental_phases: list[dict[str, float]] = field(default_factory=list)  # each refresh's own (ms)

    @property
    def small_phase_medians(self) -> dict[str, float]:
        """The median of each phase of the small change's incremental refreshes (ms)."""
        return {
            p: round(statistics.median(x.get(p, 0.0) for x in self.small_incremental_phases), 1)
            for p in PHASES
            if self.small_incremental_phases
        }

    @property
    def small_incremental_median_s(self) -> float:
        return round(statistics.median(self.small_incremental_s), 3)

    @property
    def small_full_median_s(self) -> float:
        return round(statistics.median(self.small_full_s), 3)

    @property
    def small_ratio(self) -> float:
        return round(self.small_incremental_median_s / self.small_full_median_s, 3)

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
            "small_incremental_median_s": self.small_incremental_median_s,
            "small_full_median_s": self.small_full_median_s,
            "small_ratio": self.small_ratio,
            "small_phase_medians_ms": self.small_phase_medians,
        }


@dataclass
class FixedCost:
    """A one-row change into a small table, refreshed `runs` times: the median wall time and phases (ms)."""

    table_rows: int
    runs: int
    wall_ms: list[float] = field(default_factory=list)
    phases_ms: list[dict[str, float]] = field(default_factory=list)
    how: str = ""

    @property
    def median_ms(self) -> float:
        return round(statistics.median(self.wall_ms), 1)

    @property
    def phase_medians(self) -> dict[str, float]:
        return {p: round(statistics.median(x.get(p, 0.0) for x in self.phases_ms), 1) for p in PHASES}

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "median_ms": self.median_ms, "phase_medians_ms": self.phase_medians}


@dataclass
class StreamStep:
    """One change of the stream and the three refreshes after it (seconds)."""

    kind: str  # append | replace
    change_rows: int  # rows added plus rows removed
    share: float  # change_rows over the base's rows before the change
    incremental_s: float
    full_s: float
    adaptive_s: float
    adaptive_mode: str
    adaptive_reason: str
    rows_before: int = 0  # the base's rows before the change
    # each table's time (s), per mode, in the tables' order (the step's times above are their medians), and the
    # order the step refreshed them in (I, F, A: the modes' initials, one round of three per table)
    incremental_tables_s: list[float] = field(default_factory=list)
    full_tables_s: list[float] = field(default_factory=list)
    adaptive_tables_s: list[float] = field(default_factory=list)
    adaptive_modes: list[str] = field(default_factory=list)
    order: str = ""
    # the phases (ms) of the INCREMENTAL and the ADAPTIVE tables' refreshes: where a step's gap between them went
    incremental_phases: dict[str, float] = field(default_factory=dict)
    adaptive_phases: dict[str, float] = field(default_factory=dict)

    @property
    def gap(self) -> dict[str, float]:
        """ADAPTIVE's phases less the INCREMENTAL table's (ms), when both refreshed incrementally: by phase."""
        if self.adaptive_mode != INCREMENTAL:
            return {}
        a, i = self.adaptive_phases, self.incremental_phases
        return {p: round(a.get(p, 0.0) - i.get(p, 0.0), 1) for p in PHASES}


@dataclass
class Stream:
    base_rows: int
    steps: list[StreamStep] = field(default_factory=list)
    fixed_ms: float | None = None  # the fixed cost measured in the same run (`fixed_cost`), set once it is

    def cost(self) -> Cost | None:
        """The constants of ADAPTIVE's estimate (`dynamic_tables.cost`) these refreshes imply, every time less the
        fixed cost: full_us_per_row, the median full refresh of an append over the base's rows before it;
        incremental_us_per_row and incremental_ms, the line through the median incremental refresh of an append and
        the one of the replace, against the rows changed. None without both kinds of change or the fixed cost."""
        appends = [s for s in self.steps if s.kind == "append"]
        replaces = [s for s in self.steps if s.kind == "replace"]
        if not appends or not replaces or self.fixed_ms is None:
            return None
        fixed, r = self.fixed_ms, replaces[0]
        full = statistics.median((s.full_s * 1000 - fixed) * 1000 / max(s.rows_before, 1) for s in appends)
        inc_ms = statistics.median(s.incremental_s * 1000 - fixed for s in appends)
        rows = statistics.median(s.change_rows for s in appends)
        per_row = (r.incremental_s * 1000 - fixed - inc_ms) * 1000 / max(r.change_rows - rows, 1)
        per_row = max(per_row, 0.001)  # the replace no slower than the appends: the rows changed cost ~nothing
        return Cost(round(max(full, 0.0), 4), round(per_row, 3), round(max(inc_ms - per_row * rows / 1000, 0.0), 1))

    def per_step(self) -> dict[str, Any]:
        """Each step's ADAPTIVE time over the better of the other two (each mode's time the median of its tables'):
        the median, the worst, how many over 1.1; in how many steps ADAPTIVE chose the mode whose tables refreshed
        faster in that step (of all, and of those over 1.1); whether no step is over 1.1 (`met`); the same ratios
        from the first table of each mode alone (`one_table`: one sample per mode and step, as a single run of each
        would measure); and the noise: the worst, over steps and modes, of a mode's slowest table over its fastest
        (the same statements on the same change; ADAPTIVE's counted where its tables chose alike)."""
        ratios = [s.adaptive_s / max(min(s.incremental_s, s.full_s), 1e-9) for s in self.steps]
        faster = [s.adaptive_mode == (INCREMENTAL if s.incremental_s <= s.full_s else FULL) for s in self.steps]
        if not ratios:
            return {"median": None, "worst": None, "over_goal": 0, "chose_faster": 0, "over_chose_faster": 0}
        over = [r > GOAL_ADAPTIVE for r in ratios]
        # of the steps over, those where ADAPTIVE and the INCREMENTAL table both merged: their gap by phase (summed)
        gaps = [s.gap for s, o in zip(self.steps, over) if o and s.gap]
        return {
            "median": round(statistics.median(ratios), 3),
            "worst": round(max(ratios), 3),
            "over_goal": sum(over),
            "chose_faster": sum(faster),
            "over_chose_faster": sum(o and f for o, f in zip(over, faster)),
            "over_both_incremental": len(gaps),
            "over_gap_ms": {p: round(sum(g[p] for g in gaps), 1) for p in PHASES} if gaps else {},
            "met": not any(over),
            "one_table": _one_table(self.steps),
            "noise_worst": _noise(self.steps),
        }

    def total(self, which: str) -> float:
        return round(sum(getattr(s, f"{which}_s") for s in self.steps), 3)

    @property
    def better(self) -> float:
        return min(self.total("incremental"), self.total("full"))

    @property
    def ratio(self) -> float:
        return round(self.total("adaptive") / self.better, 3)

    def crossover(self) -> float | None:
        """The share of the base where an incremental refresh costs what a full one does: interpolated between the
        appends (their median) and the replace, where the faster mode changes between them; None when it does not."""
        appends = [s for s in self.steps if s.kind == "append"]
        replaces = [s for s in self.steps if s.kind == "replace"]
        if not appends or not replaces:
            return None
        a_share = statistics.median(s.share for s in appends)
        a_gap = statistics.median(s.incremental_s - s.full_s for s in appends)
        r = replaces[0]
        r_gap = r.incremental_s - r.full_s
        if (a_gap < 0) == (r_gap < 0) or r.share == a_share:
            return None
        return round(a_share + (r.share - a_share) * a_gap / (a_gap - r_gap), 4)

    def as_dict(self) -> dict[str, Any]:
        return {
            "base_rows": self.base_rows,
            "steps": [asdict(s) for s in self.steps],
            "incremental_total_s": self.total("incremental"),
            "full_total_s": self.total("full"),
            "adaptive_total_s": self.total("adaptive"),
            "adaptive_over_better": self.ratio,
            "crossover_measured": self.crossover(),
            "crossover_used": ADAPTIVE_CROSSOVER,  # the kit's cost model's turn on very large sources
            "crossover_used_at_base": round(DEFAULT_COST.crossover_at(self.base_rows), 4),  # ... and at this base
            "per_step_over_better": self.per_step(),
            "fixed_ms": self.fixed_ms,
            "cost_measured": asdict(measured) if (measured := self.cost()) else None,
            "crossover_of_cost_measured": round(measured.crossover_at(self.base_rows), 4) if measured else None,
            "cost_used": asdict(DEFAULT_COST),
        }


def _one_table(steps: list[StreamStep]) -> dict[str, Any]:
    """`Stream.per_step`'s ratios from each mode's first table alone: median, worst, steps over 1.1."""
    ratios = [
        s.adaptive_tables_s[0] / max(min(s.incremental_tables_s[0], s.full_tables_s[0]), 1e-9)
        for s in steps
        if s.adaptive_tables_s and s.incremental_tables_s and s.full_tables_s
    ]
    if not ratios:
        return {"median": None, "worst": None, "over_goal": 0}
    return {
        "median": round(statistics.median(ratios), 3),
        "worst": round(max(ratios), 3),
        "over_goal": sum(r > GOAL_ADAPTIVE for r in ratios),
    }


def _noise(steps: list[StreamStep]) -> float | None:
    """The worst slowest-over-fastest of one mode's tables in one step (ADAPTIVE's where its tables chose alike)."""
    spreads = [
        max(times) / max(min(times), 1e-9)
        for s in steps
        for times in (
            s.incremental_tables_s,
            s.full_tables_s,
            s.adaptive_tables_s if len(set(s.adaptive_modes)) == 1 else [],
        )
        if len(times) > 1
    ]
    return round(max(spreads), 3) if spreads else None


@dataclass
class DynamicBench:
    machine: Machine
    rows_per_month: int
    runs: int
    bases: list[BaseFigures]
    file_cache: bool = False  # DuckDB's external file cache (off: every refresh reads its files from S3)
    fixed: FixedCost | None = None
    stream: Stream | None = None
    star: StarJoin | None = None
    chain: Chain | None = None

    @property
    def growth(self) -> float:
        """The incremental time (a month appended) at the second base over the one at the first base, minus 1."""
        a, b = self.bases[0].incremental_median_s, self.bases[-1].incremental_median_s
        return round(b / a - 1, 3)

    @property
    def small_growth(self) -> float:
        """The incremental time (a tenth of a month appended) at the second base over the first base's, minus 1."""
        a, b = self.bases[0].small_incremental_median_s, self.bases[-1].small_incremental_median_s
        return round(b / a - 1, 3)

    def change_goal(self) -> dict[str, Any]:
        """Issue 30's goal, computed from the small change: its ratio at the first base and its growth."""
        first, second = self.bases[0], self.bases[-1]
        return {
            "change_rows": first.small_change_rows,
            "first_base_rows": first.base_rows,
            "second_base_rows": second.base_rows,
            "ratio": first.small_ratio,
            "ratio_goal": GOAL_CHANGE_RATIO,
            "ratio_met": first.small_ratio <= GOAL_CHANGE_RATIO,
            "growth": self.small_growth,
            "growth_goal": GOAL_CHANGE_GROWTH,
            "growth_met": self.small_growth <= GOAL_CHANGE_GROWTH,
            "goal_size": list(GOAL_CHANGE),
            "at_goal_size": first.small_change_rows == GOAL_CHANGE[0]
            and first.base_rows >= GOAL_CHANGE[1]
            and second.base_rows >= GOAL_CHANGE[2],
        }

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
            "second_base_rows": self.bases[-1].base_rows,
            "change": self.change_goal(),
            "fixed_cost_ms": self.fixed.median_ms if self.fixed else None,
            "fixed_cost_goal_ms": GOAL_FIXED_MS,
            "fixed_cost_met": bool(self.fixed and self.fixed.median_ms < GOAL_FIXED_MS),
            "adaptive_over_better": self.stream.ratio if self.stream else None,
            "adaptive_goal": GOAL_ADAPTIVE,
            "adaptive_met": bool(self.stream and self.stream.ratio <= GOAL_ADAPTIVE),
            "adaptive_per_step_met": bool(self.stream and self.stream.per_step()["met"]),
            **({"star": self.star.as_dict()} if self.star else {}),
            **(
                {"chain": {k: v for k, v in self.chain.as_dict().items() if k in ("median_s", "goal_s", "met")}}
                if self.chain
                else {}
            ),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "machine": self.machine.as_dict(),
            "rows_per_month": self.rows_per_month,
            "runs": self.runs,
            "file_cache": self.file_cache,
            "bases": [b.as_dict() for b in self.bases],
            "fixed_cost": self.fixed.as_dict() if self.fixed else None,
            "stream": self.stream.as_dict() if self.stream else None,
            "star_join": self.star.as_dict() if self.star else None,
            "chain": self.chain.as_dict() if self.chain else None,
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


def replicas(name: str) -> list[str]:
    """The stream's REPLICAS tables of one mode: `name` itself, then `name_2`, `name_3`..."""
    return [name, *(f"{name}_{k}" for k in range(2, REPLICAS + 1))]


def _drop(lake: Lake, meta: Metadata) -> None:
    for name in (*replicas(INC), *replicas(FULL_TABLE), *replicas(ADAPT), SMALL_SUM):
        manage.drop(lake, meta, name, if_exists=True)


def _create(lake: Lake, meta: Metadata, name: str, mode: str, query: str = QUERY) -> None:
    [stmt] = ddl.parse(f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 day' REFRESH_MODE = {mode} AS {query}")
    manage.create(lake, meta, stmt)


def _timed(refresher: Refresher, meta: Metadata, name: str, mode: str | None = None):
    """One refresh of `name`, wall-clock seconds; it must succeed (in `mode`, when given)."""
    start = time.perf_counter()
    r = refresher.refresh(meta.get(name), "bench")
    took = round(time.perf_counter() - start, 3)
    if r.status != SUCCEEDED or (mode is not None and r.mode != mode):
        raise KitError(
            f"the refresh of {name} was {r.status} {r.mode} ({r.error or r.reason})",
            f"see `dynamic history {name}`",
            exit_code=EXIT_CHECK_FAILED,
        )
    return r, took


def fixed_cost(lake: Lake, meta: Metadata, refresher: Refresher, say: Callable[[str], None]) -> FixedCost:
    """One row inserted into a table of SMALL_ROWS rows, its ADAPTIVE aggregate refreshed, FIXED_RUNS times."""
    lake.con.execute(
        f"CREATE OR REPLACE TABLE lake.{SMALL} AS SELECT i % 10 AS k, (i % 97)::DECIMAL(9, 2) AS v "
        f"FROM range({SMALL_ROWS}) AS t(i)"
    )
    _create(lake, meta, SMALL_SUM, "ADAPTIVE", f"SELECT k, sum(v) AS s, count(*) AS n FROM {SMALL} GROUP BY k")
    out = FixedCost(SMALL_ROWS, FIXED_RUNS)
    for i in range(FIXED_RUNS):
        commit(lake, f"INSERT INTO lake.{SMALL} VALUES ({i % 10}, 1.25)", "bench dynamic: one row")
        r, took = _timed(refresher, meta, SMALL_SUM, INCREMENTAL)
        out.wall_ms.append(round(took * 1000, 1))
        out.phases_ms.append(r.phases or {})
        out.how = r.reason or ""
    checked(lake, meta, (SMALL_SUM,))
    say(f"fixed cost: one row into {SMALL_ROWS:,} rows refreshed in {out.median_ms} ms (median of {FIXED_RUNS})")
    return out


def _stream(lake: Lake, meta: Metadata, refresher: Refresher, files: dict[int, Path], months: int, say) -> Stream:
    """The stream on a base of `months` months (already written): STREAM changes, REPLICAS tables per mode refreshed
    after each, in rounds of one table per mode whose order turns with the step and the round."""
    modes = ((INC, INCREMENTAL), (FULL_TABLE, FULL), (ADAPT, None))  # None: ADAPTIVE, whichever it chooses
    initial = {INC: "I", FULL_TABLE: "F", ADAPT: "A"}
    for name, mode in modes:
        for table in replicas(name):
            _create(lake, meta, table, mode or "ADAPTIVE")
    base = int(lake.scalar(f"SELECT count(*) FROM lake.{TRIPS}"))
    out = Stream(base)
    per = max(1, int(base * APPEND_SHARE))
    for i in range(STREAM):
        before = int(lake.scalar(f"SELECT count(*) FROM lake.{TRIPS}"))
        if i == STREAM // 2:  # a whole month replaced: its rows deleted and loaded again, one commit
            year, month = month_of(0)
            where = f"year(pickup_date) = {year} AND month(pickup_date) = {month}"
            made = commit(
                lake,
                [f"DELETE FROM lake.{TRIPS} WHERE {where}", f"INSERT INTO lake.{TRIPS} {_month_rows(files[0])}"],
                "bench dynamic: a month replaced",
            )
            kind, change = "replace", made.affected_rows  # rows deleted plus rows inserted
        else:
            src = _month_rows(files[i % months])
            commit(lake, f"INSERT INTO lake.{TRIPS} {src} LIMIT {per} OFFSET {per * (i // months)}", "bench: append")
            kind, change = "append", int(lake.scalar(f"SELECT count(*) FROM lake.{TRIPS}")) - before
        done: dict[str, list[tuple[float, Any]]] = {name: [] for name, _ in modes}
        order = []
        for k in range(REPLICAS):
            turn = (i + k) % len(modes)
            for name, mode in modes[turn:] + modes[:turn]:
                r, took = _timed(refresher, meta, replicas(name)[k], mode)
                done[name].append((took, r))
                order.append(initial[name])
        (inc_s, ri), (full_s, _), (ada_s, r) = (_median(done[name]) for name, _ in modes)
        step = StreamStep(kind, change, round(change / before, 4), inc_s, full_s, ada_s, r.mode, r.reason, before)
        step.incremental_phases, step.adaptive_phases = ri.phases or {}, r.phases or {}
        step.incremental_tables_s, step.full_tables_s, step.adaptive_tables_s = (
            [t for t, _ in done[name]] for name, _ in modes
        )
        step.adaptive_modes, step.order = [x.mode for _, x in done[ADAPT]], "".join(order)
        out.steps.append(step)
        say(
            f"  {kind} of {change:,} rows: incremental {inc_s} s, full {full_s} s, adaptive {ada_s} s ({r.mode}); "
            f"median of {REPLICAS} tables each"
        )
    checked(lake, meta, [t for name, _ in modes for t in replicas(name)])
    return out


def _median(timed: list[tuple[float, Any]]) -> tuple[float, Any]:
    """The median of one mode's (seconds, refresh) in a step, with that table's refresh (the lower middle one of
    an even count)."""
    ordered = sorted(timed, key=lambda x: x[0])
    return ordered[(len(ordered) - 1) // 2]


def _base(lake: Lake, meta: Metadata, refresher: Refresher, base: str, added: list[tuple[str, str]], say):
    """A base (`base`: a query of its rows) with both tables, then for each (small change, month) of `added` (queries
    of their rows): the small change appended and both tables refreshed, then the month and both refreshed."""
    lake.con.execute(f"CREATE OR REPLACE TABLE lake.{TRIPS} AS {base}")
    base_rows = int(lake.scalar(f"SELECT count(*) FROM lake.{TRIPS}"))
    for name, mode in ((INC, "INCREMENTAL"), (FULL_TABLE, "FULL")):
        _create(lake, meta, name, mode)
    fig = BaseFigures(0, base_rows, 0)
    small, month = [], []
    for pair in added:
        for src, changes, inc_s, full_s in (
            (pair[0], small, fig.small_incremental_s, fig.small_full_s),
            (pair[1], month, fig.incremental_s, fig.full_s),
        ):
            before_rows = int(lake.scalar(f"SELECT count(*) FROM lake.{TRIPS}"))
            lake.con.execute(f"INSERT INTO lake.{TRIPS} {src}")
            changes.append(int(lake.scalar(f"SELECT count(*) FROM lake.{TRIPS}")) - before_rows)
            for name, times, mode in ((INC, inc_s, INCREMENTAL), (FULL_TABLE, full_s, FULL)):
                r, took = _timed(refresher, meta, name, mode)
                times.append(took)
                if name == INC:
                    fig.incremental_how = r.reason or ""
                    if changes is small:
                        fig.small_incremental_phases.append(r.phases or {})
                say(f"  +{changes[-1]:,} trips: {name} {r.mode.lower()} in {took} s ({r.reason})")
    checked(lake, meta, (INC, FULL_TABLE))
    fig.small_change_rows, fig.change_rows = int(statistics.median(small)), int(statistics.median(month))
    return fig


def bases_of(months: int | tuple[int, int]) -> tuple[int, int]:
    """The two bases' months: N (then 2N) or (N, M) with M > N >= 1."""
    first, second = (months, 2 * months) if isinstance(months, int) else months
    if first < 1 or second <= first:
        raise KitError(
            f"--months {first},{second}: the bases' months must be at least 1, the second more than the first",
            "e.g. bench --suite dynamic --months 12 (then 24) or --months 12,48",
        )
    return first, second


def bench_dynamic(
    kit: Kit,
    *,
    months: int | tuple[int, int] = 12,
    rows_per_month: int = 100_000,
    runs: int = 2,
    file_cache: bool = False,
    json_path: Path | None = None,
) -> DynamicBench:
    """`months`: the first base's months (the second has twice as many), or both bases' (`(12, 48)`)."""
    first, second = bases_of(months)
    if rows_per_month < 1000 or runs < 1:
        raise KitError(
            "--months, --runs must be at least 1 and --rows (rows per month) at least 1000",
            "e.g. bench --suite dynamic --months 12 --rows 1000000",
        )
    before = load_average()
    # after the largest base's months: per run, a month appended whole (the months of before, 2N + i, when the
    # second base is 2N) and, before it, the first tenth of another
    state, say = kit.state, kit.say
    files = _month_files(state.cache_dir, list(range(second + 2 * runs)), rows_per_month, say)
    small = rows_per_month // CHANGE_OF_MONTH
    changes = [
        (f"{_month_rows(files[second + runs + i])} LIMIT {small}", _month_rows(files[second + i])) for i in range(runs)
    ]
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
            lake.con.execute(
                f"CREATE OR REPLACE TABLE lake.{ZONES} AS SELECT LocationID AS location_id, "
                f"Borough AS borough FROM read_csv({quote_literal(str(zones_csv))}, header = true)"
            )
            for n in (first, second):
                say(f"base of {n} months: writing {TRIPS} with DuckDB, creating {INC} and {FULL_TABLE}")
                _drop(lake, meta)
                union = " UNION ALL ".join(_month_rows(files[i]) for i in range(n))
                bases.append(_base(lake, meta, refresher, union, changes, say))
                bases[-1].months = n
                say(f"base of {n} months: {bases[-1].base_rows:,} trips")
            _drop(lake, meta)
            say(
                f"stream: {STREAM} changes on a base of {first} months, {REPLICAS} tables each INCREMENTAL, FULL "
                "and ADAPTIVE"
            )
            lake.con.execute(
                f"CREATE OR REPLACE TABLE lake.{TRIPS} AS "
                + " UNION ALL ".join(_month_rows(files[i]) for i in range(first))
            )
            stream = _stream(lake, meta, refresher, files, first, say)
            per = stream.per_step()
            say(
                f"per step, ADAPTIVE over the better of the other two: median {per['median']}, worst {per['worst']}, "
                f"{per['over_goal']} of {len(stream.steps)} steps over {GOAL_ADAPTIVE} ({per['over_chose_faster']} of "
                f"them with the faster mode chosen); ADAPTIVE chose the faster mode in {per['chose_faster']} steps; "
                f"from one table per mode: worst {per['one_table']['worst']}, {per['one_table']['over_goal']} over; "
                f"noise (a mode's slowest table over its fastest, one step): worst {per['noise_worst']}"
            )
            _drop(lake, meta)
            fixed = fixed_cost(lake, meta, refresher, say)
            stream.fixed_ms = fixed.median_ms
            if (measured := stream.cost()) is not None:
                say(
                    f"ADAPTIVE's constants measured here (fixed cost {fixed.median_ms} ms left out): full "
                    f"{measured.full_us_per_row:g} us per row of the base; incremental {measured.incremental_ms:g} "
                    f"ms + {measured.incremental_us_per_row:g} us per row changed; crossover at "
                    f"{stream.base_rows:,} rows {measured.crossover_at(stream.base_rows):.2%}, on large sources "
                    f"{measured.crossover:.2%}. The kit's (dynamic_tables/cost.py): full "
                    f"{DEFAULT_COST.full_us_per_row:g}; incremental {DEFAULT_COST.incremental_ms:g} ms + "
                    f"{DEFAULT_COST.incremental_us_per_row:g}; crossover at {stream.base_rows:,} rows "
                    f"{DEFAULT_COST.crossover_at(stream.base_rows):.2%}, on large sources {DEFAULT_COST.crossover:.2%}"
                )
            star, chain = bench_joins(lake, meta, first * rows_per_month, say)
        finally:
            refresher.close()
            _drop(lake, meta)
            for t in (TRIPS, ZONES, SMALL):
                lake.con.execute(f"DROP TABLE IF EXISTS lake.{t}")
    result = DynamicBench(Machine.since(before), rows_per_month, runs, bases, file_cache, fixed, stream, star, chain)
    write_outputs(result, json_path, None)
    return result
