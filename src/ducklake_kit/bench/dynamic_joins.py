"""Two more measurements of `bench --suite dynamic` (issue 30), on tables of their own in the `bench` schema:

- **A star join after a fact append**: a fact table (`bench.dt_star_facts`, the suite's base size, written by DuckDB
  from `range`) and three dimensions; two INCREMENTAL dynamic tables of the same groups, one joined with the three
  dimensions (`dt_star_joined`: the groups named by the dimensions' names), one without the joins
  (`dt_star_plain`: the same groups by the fact's own keys). After one append refreshed untimed (a running
  refresher's state: the dimensions copied in memory, each table merged into once), each run appends 1 % of the
  base to the fact table and refreshes both, alternating which goes first. Goals: the joined table's median at most GOAL_STAR x the plain one's,
  and one delta term evaluated (the dimensions did not change: their change feeds are not read and they add no
  term), which the refresher counts.
- **One row through a chain of three DOWNSTREAM tables**: `dt_chain_1` (a projection of the facts) <- `dt_chain_2`
  (an aggregate of it) <- `dt_chain_3` (a projection of that, also DOWNSTREAM); one row inserted, then the last
  table refreshed (which refreshes the two it reads first, upstream first): the time from before the insert's commit
  to the last refresh's end, CHAIN_RUNS times. Goal: under GOAL_CHAIN_S, and the last table shows the row.

Every table is compared with its query run in full afterwards (EXCEPT ALL both ways): a figure from a wrong table
is no figure."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ducklake_kit.bench.results import BENCH_SCHEMA
from ducklake_kit.dynamic_tables import ddl, manage
from ducklake_kit.dynamic_tables.metadata import SUCCEEDED, Metadata
from ducklake_kit.dynamic_tables.refresh import INCREMENTAL, PHASES, Refresher
from ducklake_kit.errors import EXIT_CHECK_FAILED, KitError
from ducklake_kit.lake import Lake
from ducklake_kit.lake.transactions import commit

GOAL_STAR = 1.2  # the joined table's refresh over the plain one's, after the same fact append
GOAL_CHAIN_S = 0.3  # one row through three DOWNSTREAM tables, end to end
STAR_RUNS, CHAIN_RUNS, APPEND_SHARE = 5, 5, 0.01
DIM_ROWS = {"a": 200, "b": 50, "c": 12}  # the dimensions' sizes (the fact's keys fall in them)
FACTS = f"{BENCH_SCHEMA}.dt_star_facts"
DIMS = {d: f"{BENCH_SCHEMA}.dt_star_dim_{d}" for d in DIM_ROWS}
JOINED, PLAIN = f"{BENCH_SCHEMA}.dt_star_joined", f"{BENCH_SCHEMA}.dt_star_plain"
CHAIN = [f"{BENCH_SCHEMA}.dt_chain_{i}" for i in (1, 2, 3)]
JOINED_QUERY = (
    f"SELECT a.name AS a, b.name AS b, c.name AS c, count(*) AS n, sum(f.v) AS s FROM {FACTS} AS f "
    f"JOIN {DIMS['a']} AS a ON f.a = a.id JOIN {DIMS['b']} AS b ON f.b = b.id JOIN {DIMS['c']} AS c ON f.c = c.id "
    "GROUP BY a.name, b.name, c.name"
)
PLAIN_QUERY = f"SELECT f.a, f.b, f.c, count(*) AS n, sum(f.v) AS s FROM {FACTS} AS f GROUP BY f.a, f.b, f.c"
CHAIN_QUERIES = [
    f"SELECT id, a, v FROM {FACTS} WHERE v > 0",
    f"SELECT a, count(*) AS n, sum(v) AS s FROM {CHAIN[0]} GROUP BY a",
    f"SELECT a, n, s FROM {CHAIN[1]} WHERE n > 0",
]


@dataclass
class StarJoin:
    """The joined and the plain table refreshed after the same appends (seconds), and the terms each evaluated."""

    base_rows: int
    append_rows: int
    joined_s: list[float] = field(default_factory=list)
    plain_s: list[float] = field(default_factory=list)
    joined_terms: list[int] = field(default_factory=list)
    joined_copied: list[int] = field(default_factory=list)  # the dimensions each refresh read from memory
    joined_how: str = ""
    # each refresh's phases (`Refresh.phases`, ms): where the joined table's extra time goes
    joined_phases: list[dict[str, float]] = field(default_factory=list)
    plain_phases: list[dict[str, float]] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return round(statistics.median(self.joined_s) / statistics.median(self.plain_s), 3)

    def phase_medians(self, which: str) -> dict[str, float]:
        """The median of each phase over the `which` ("joined" or "plain") table's timed refreshes, ms."""
        runs = self.joined_phases if which == "joined" else self.plain_phases
        return {
            p: round(statistics.median(r.get(p, 0.0) for r in runs), 1) for p in PHASES if any(p in r for r in runs)
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "joined_median_s": round(statistics.median(self.joined_s), 3),
            "plain_median_s": round(statistics.median(self.plain_s), 3),
            "ratio": self.ratio,
            "joined_phase_medians_ms": self.phase_medians("joined"),
            "plain_phase_medians_ms": self.phase_medians("plain"),
            "goal": GOAL_STAR,
            "met": self.ratio <= GOAL_STAR and set(self.joined_terms) == {1},
        }


@dataclass
class Chain:
    """One row inserted, then the last of three DOWNSTREAM tables refreshed: seconds end to end, per run."""

    end_to_end_s: list[float] = field(default_factory=list)
    refreshes: list[list[str]] = field(default_factory=list)  # per run: each table's mode, upstream first

    @property
    def median_s(self) -> float:
        return round(statistics.median(self.end_to_end_s), 3)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "median_s": self.median_s, "goal_s": GOAL_CHAIN_S, "met": self.median_s < GOAL_CHAIN_S}


def _create(lake: Lake, meta: Metadata, name: str, query: str, lag: str = "'1 day'") -> None:
    [stmt] = ddl.parse(f"CREATE DYNAMIC TABLE {name} TARGET_LAG = {lag} REFRESH_MODE = INCREMENTAL AS {query}")
    manage.create(lake, meta, stmt)


def _refreshed(refresher: Refresher, meta: Metadata, name: str) -> tuple[float, int, str, dict[str, float]]:
    """One INCREMENTAL refresh of `name`: (seconds, delta terms evaluated, its reason, its phases); anything else
    raises (`refresher.copied` then says how many unchanged sources it read from memory)."""
    start = time.perf_counter()
    r = refresher.refresh(meta.get(name), "bench")
    took = round(time.perf_counter() - start, 4)
    if r.status != SUCCEEDED or r.mode != INCREMENTAL:
        raise KitError(
            f"the refresh of {name} was {r.status} {r.mode} ({r.error or r.reason})",
            f"see `dynamic history {name}`",
            exit_code=EXIT_CHECK_FAILED,
        )
    return took, refresher.terms, r.reason or "", dict(r.phases or {})


def checked(lake: Lake, meta: Metadata, names: Sequence[str]) -> None:
    """Stop the bench (exit code EXIT_CHECK_FAILED) when a dynamic table differs from its query run in full."""
    for name in names:
        wrong = manage.check(lake, meta, name)
        if wrong != (0, 0):
            raise KitError(
                f"{name} differs from its query run in full ({wrong[0]} rows only in the table, "
                f"{wrong[1]} only in the query)",
                "this is a defect of the refresher: report it",
                exit_code=EXIT_CHECK_FAILED,
            )


def drop(lake: Lake, meta: Metadata) -> None:
    """The suite's dynamic tables (readers first) and source tables."""
    for name in (*reversed(CHAIN), JOINED, PLAIN):
        manage.drop(lake, meta, name, if_exists=True)
    for t in (FACTS, *DIMS.values()):
        lake.con.execute(f"DROP TABLE IF EXISTS lake.{t}")


def _facts(first: int, rows: int) -> str:
    """`rows` fact rows with ids from `first`: keys spread over the dimensions, DECIMAL amounts (exact sums)."""
    a, b, c = DIM_ROWS["a"], DIM_ROWS["b"], DIM_ROWS["c"]
    return (
        f"SELECT i AS id, i % {a} AS a, (i // 7) % {b} AS b, (i // 13) % {c} AS c, ((i % 997) / 10)::DECIMAL(12, 2) "
        f"AS v FROM range({first}, {first + rows}) AS t(i)"
    )


def bench_joins(lake: Lake, meta: Metadata, base_rows: int, say: Callable[[str], None]) -> tuple[StarJoin, Chain]:
    """Both measurements on a fact table of `base_rows` rows; the tables are dropped afterwards."""
    drop(lake, meta)
    refresher = Refresher(lake, meta)
    try:
        lake.con.execute(f"CREATE TABLE lake.{FACTS} AS {_facts(0, base_rows)}")
        for d, n in DIM_ROWS.items():
            lake.con.execute(f"CREATE TABLE lake.{DIMS[d]} AS SELECT i AS id, '{d}' || i AS name FROM range({n}) t(i)")
        _create(lake, meta, JOINED, JOINED_QUERY)
        _create(lake, meta, PLAIN, PLAIN_QUERY)
        per = max(1, int(base_rows * APPEND_SHARE))
        star = StarJoin(base_rows, per)
        say(f"star join: {base_rows:,} facts and 3 dimensions; {STAR_RUNS} appends of {per:,} rows (after one untimed)")
        # one append refreshed untimed first, so both tables are measured as a running refresher has them: the
        # joined one's dimensions already copied in memory, each table's groups already merged into once (a first
        # merge reads a table no merge touched yet, and was the fastest of every run)
        commit(lake, f"INSERT INTO lake.{FACTS} {_facts(base_rows, per)}", "bench dynamic: a fact append (warm-up)")
        for name in (JOINED, PLAIN):
            _refreshed(refresher, meta, name)
        next_id = base_rows + per
        for i in range(STAR_RUNS):
            commit(lake, f"INSERT INTO lake.{FACTS} {_facts(next_id, per)}", "bench dynamic: a fact append")
            next_id += per
            order = [(JOINED, star.joined_s, star.joined_phases), (PLAIN, star.plain_s, star.plain_phases)]
            for name, times, phases in order if i % 2 == 0 else reversed(order):
                took, terms, how, spent = _refreshed(refresher, meta, name)
                times.append(took)
                phases.append(spent)
                if name == JOINED:
                    star.joined_terms.append(terms)
                    star.joined_copied.append(refresher.copied)
                    star.joined_how = how
            say(
                f"  +{per:,} facts: joined {star.joined_s[-1]} s ({star.joined_terms[-1]} term, "
                f"{star.joined_copied[-1]} dimensions from memory), plain {star.plain_s[-1]} s"
            )
        say(
            "  phases (ms, median): joined "
            + ", ".join(f"{p} {v:g}" for p, v in star.phase_medians("joined").items())
            + "; plain "
            + ", ".join(f"{p} {v:g}" for p, v in star.phase_medians("plain").items())
        )
        checked(lake, meta, [JOINED, PLAIN])
        for name, query in zip(CHAIN, CHAIN_QUERIES):
            _create(lake, meta, name, query, "DOWNSTREAM")
        chain = Chain()
        say(f"chain: one row through {len(CHAIN)} DOWNSTREAM tables, {CHAIN_RUNS} times")
        for _ in range(CHAIN_RUNS):
            start = time.perf_counter()
            commit(lake, f"INSERT INTO lake.{FACTS} VALUES ({next_id}, 7, 0, 0, 1.25)", "bench dynamic: one row")
            batch = manage.refresh_many(lake, meta, [CHAIN[-1]], refresher=refresher)
            took = round(time.perf_counter() - start, 4)
            next_id += 1
            modes = [f"{r.name.split('.')[-1]} {r.status} {r.mode}" for r in batch.refreshes]
            if [r.name for r in batch.refreshes] != CHAIN or any(
                r.status != SUCCEEDED or r.mode != INCREMENTAL for r in batch.refreshes
            ):
                raise KitError(f"the chain's refreshes were {'; '.join(modes)}", "see `dynamic history`", exit_code=1)
            chain.end_to_end_s.append(took)
            chain.refreshes.append(modes)
            say(f"  one row, three tables: {took} s")
        checked(lake, meta, [*CHAIN, JOINED, PLAIN])
        return star, chain
    finally:
        refresher.close()
        drop(lake, meta)
