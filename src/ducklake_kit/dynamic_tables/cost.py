"""ADAPTIVE's choice: an estimate of what a full and an incremental refresh would cost, from what the refresh knows
before it reads any data: the rows the change added or removed (from the catalog's file counts, inlined changes
counted at the inlining limit), the sources' live rows (the same catalog query), and the delta terms the incremental
refresh evaluates (one per changed source).

    full        = full_us_per_row x the sources' rows
    incremental = incremental_ms + incremental_us_per_row x the rows changed x the delta terms

Both kinds pay the same fixed cost (lock, catalog, commit, history: `bench --suite dynamic`'s "fixed cost"), so it
is left out of both; `incremental_ms` is what an incremental refresh pays on top of it whatever the change's size
(reading the groups it touches from its own table, deleting and writing them). ADAPTIVE refreshes in full when the
full estimate is the smaller. With one delta term and no `incremental_ms` the two meet where the change is
`crossover` = full_us_per_row / incremental_us_per_row of the sources' rows.

The constants are measured by `bench --suite dynamic` from its stream of 1 % appends and one month replaced (every
time less the fixed cost measured in the same run): full_us_per_row is the median full refresh of an append over
the base's rows; incremental_us_per_row and incremental_ms the line through the median incremental refresh of an
append and the one of the replace, against the rows changed. The bench prints the constants it measured and the
crossover they imply at its base size. DEFAULT is such a measurement on the kit's 2-core machine
(docs/benchmarks.md, the dynamic suite): it is a machine's figure, not a law, and `Refresher(cost=...)` takes
another."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

FULL, INCREMENTAL = "FULL", "INCREMENTAL"


@dataclass(frozen=True)
class Estimate:
    """One refresh's estimate (milliseconds, fixed cost left out) and the choice it makes."""

    changed: int  # rows added plus rows removed in the sources since the last refresh
    rows: int  # the sources' live rows now
    terms: int  # the delta terms an incremental refresh evaluates
    full_ms: float
    incremental_ms: float

    @property
    def mode(self) -> str:
        return FULL if self.full_ms < self.incremental_ms else INCREMENTAL

    def why(self, mode: str | None = None) -> str:
        """The choice (`mode`, when another rule made it; else the estimate's) and its numbers, as the history
        records it."""
        term = "term" if self.terms == 1 else "terms"
        return (
            f"ADAPTIVE chose {(mode or self.mode).lower()}: the change (~{self.changed:,} rows, {self.terms} delta {term}) "
            f"estimated at {self.incremental_ms:,.0f} ms incremental against {self.full_ms:,.0f} ms full "
            f"for the sources' {self.rows:,} rows"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mode": self.mode}


@dataclass(frozen=True)
class Cost:
    """The per-row costs of the two kinds of refresh (microseconds), as measured by `bench --suite dynamic`."""

    full_us_per_row: float  # a full recompute, per live row of its sources
    incremental_us_per_row: float  # an incremental refresh, per row changed and delta term
    incremental_ms: float = 0.0  # an incremental refresh, whatever the change's size (over the shared fixed cost)

    @classmethod
    def at(cls, crossover: float) -> Cost:
        """A cost whose crossover (one delta term) is `crossover`: 0 chooses full for any change, infinity never."""
        return cls(full_us_per_row=crossover, incremental_us_per_row=1.0)

    @property
    def crossover(self) -> float:
        """The change's share of the sources' rows where both estimates meet, with one delta term, on sources so
        large that `incremental_ms` does not count."""
        return self.full_us_per_row / self.incremental_us_per_row

    def crossover_at(self, rows: int) -> float:
        """The change's share where both estimates meet on sources of `rows` rows, with one delta term (0: full
        is the cheaper for any change)."""
        full_ms = self.full_us_per_row * rows / 1000
        return max(full_ms - self.incremental_ms, 0.0) * 1000 / self.incremental_us_per_row / max(rows, 1)

    def estimate(self, changed: int, rows: int, terms: int = 1) -> Estimate:
        terms = max(terms, 1)
        return Estimate(
            changed,
            rows,
            terms,
            self.full_us_per_row * rows / 1000,
            self.incremental_ms + self.incremental_us_per_row * changed * terms / 1000,
        )


# measured by `bench --suite dynamic` at the default size (a base of 1.2M rows, appends of 12,000, a month of
# ~212,000 rows replaced; 2 cores; fixed cost 30-31 ms), 2026-11-28, after small merges were inlined (no file
# written) and an insert's rows aggregated before the joins: three runs, load 0.4-2.2: full 0.173-0.176 us per row of
# the base, incremental 31-33 ms + 2.25-2.37 us per row changed (see docs/benchmarks.md). Before those, with one
# MERGE writing a file every time: 0.19 and 183 ms + 1.9 us (the incremental's own cost six times today's), and
# before merged tables were compacted 464-587 ms + 2.3-6.2 us. So at 1.2M rows the two meet at a change of ~6.5 %
# of the sources (measured there: 8.2-8.8 %), on 12M rows at ~7.5 % (measured at 12M: 7.9-8.0 %).
DEFAULT = Cost(full_us_per_row=0.176, incremental_us_per_row=2.3, incremental_ms=32.0)
