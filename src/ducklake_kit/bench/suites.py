"""The bench's front door: one registry of suites. Each suite declares the options it takes, with what each means
to it, and runs as `run(kit, **options) -> Report` (bench/reports.py): its keyword parameters are exactly the
options it declares, with their defaults (tests/bench/test_suites.py holds the two together, so an option cannot be
silently ignored again). The CLI parses, checks the options given against the suite (`prepare`), calls, renders.

Importing this module is light: a suite's own module (Spark, matplotlib, Dask) loads when that suite runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ducklake_kit.bench import reports
from ducklake_kit.bench.results import Report
from ducklake_kit.errors import EXIT_USAGE, KitError
from ducklake_kit.platforms.kit import Kit


@dataclass(frozen=True)
class Suite:
    name: str
    summary: str  # what it measures, for --suite's help
    takes: dict[str, str]  # option (its parameter name) -> what it means to this suite
    run: Callable[..., Report]  # run(kit, **options)


OPTIONS = ("rows", "runs", "months", "file_cache", "workers", "writers", "ops", "modes", "out", "png")
OUT = "also write the results to this JSON file"
PNG = "also draw a bar chart to this PNG file"


def flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def help_for(option: str) -> str:
    """An option's --help: what it means to each suite that takes it (suites that read it alike, together)."""
    meanings: dict[str, list[str]] = {}
    for s in SUITES.values():
        if option in s.takes:
            meanings.setdefault(s.takes[option], []).append(s.name)
    every = len(SUITES)
    return "; ".join(f"{'every suite' if len(n) == every else ', '.join(n)}: {m}" for m, n in meanings.items()) + "."


def suites_help() -> str:
    names = [f"{s.name} ({s.summary})" for s in SUITES.values()]
    return ", ".join(names[:-1]) + f" or {names[-1]}."


def _refused(s: Suite, option: str, value: Any) -> KitError:
    """The one line for an option suite `s` does not take. --workers and --writers get the spelling that works:
    --workers is the worker plane's Dask workers in every command; the concurrency suite's writers have their own."""
    if option == "workers" and "writers" in s.takes:
        return KitError(
            f"bench --suite {s.name} takes --writers N (the concurrent writers); --workers is the worker plane's "
            "Dask workers",
            f"bench --suite {s.name} --writers {value}",
            exit_code=EXIT_USAGE,
        )
    if option == "writers" and "workers" in s.takes:
        return KitError(
            f"--writers is for --suite concurrency, not {s.name}",
            f"bench --suite {s.name} --workers {value}",
            exit_code=EXIT_USAGE,
        )
    others = ", ".join(o.name for o in SUITES.values() if option in o.takes)
    return KitError(
        f"{flag(option)} means nothing to --suite {s.name}",
        f"drop it (--suite {s.name} takes {', '.join(map(flag, s.takes))}; {flag(option)} is for --suite {others})",
        exit_code=EXIT_USAGE,
    )


def sizes(rows: list[str] | list[int]) -> tuple[int, ...]:
    """--rows as given: repeated, or a comma list (1000000,10000000), or both."""
    try:
        return tuple(int(v.replace("_", "")) for r in rows for v in str(r).split(",") if v.strip())
    except ValueError:
        raise KitError(
            f"--rows {','.join(map(str, rows))} is not a list of whole numbers",
            "e.g. --rows 1000000,10000000",
            exit_code=EXIT_USAGE,
        ) from None


def months(value: int | str) -> int | tuple[int, int]:
    """--months (--suite dynamic): N (the second base has 2N months) or N,M (both bases' months)."""
    parts = [p.strip() for p in str(value).split(",")]
    if len(parts) not in (1, 2) or not all(p.isdigit() for p in parts):
        raise KitError(
            f"--months {value} is not N or N,M (the bases' months, whole numbers)",
            "e.g. --months 12 (bases of 12 and 24 months) or --months 12,48",
            exit_code=EXIT_USAGE,
        )
    return int(parts[0]) if len(parts) == 1 else (int(parts[0]), int(parts[1]))


@dataclass(frozen=True)
class Prepared:
    """A suite and the options given for it, checked: `run(kit)` measures."""

    suite: Suite
    options: dict[str, Any]

    def run(self, kit: Kit) -> Report:
        return self.suite.run(kit, **self.options)


def prepare(name: str, given: dict[str, Any]) -> Prepared:
    """Suite `name` with the options given (a value of None: not given). Refuses an unknown suite and an option the
    suite does not take, before anything starts; the suite's own defaults stand for the options not given."""
    if name not in SUITES:
        raise KitError(f"unknown suite '{name}'", f"choose one of: {', '.join(SUITES)}")
    s = SUITES[name]
    given = {k: v for k, v in given.items() if v is not None}
    unknown = set(given) - set(OPTIONS)
    if unknown:
        raise ValueError(f"not a bench option: {sorted(unknown)}")  # a defect of the caller, not the user's input
    refused = [o for o in OPTIONS if o in given and o not in s.takes]
    if refused:
        raise _refused(s, refused[0], given[refused[0]])
    if "rows" in given:
        given["rows"] = sizes(given["rows"])
    if "months" in given:
        given["months"] = months(given["months"])
    return Prepared(s, given)


def _suite(name: str, run: Callable[..., Report], summary: str, **takes: str) -> Suite:
    return Suite(name, summary, takes, run)


# the suites, in the order --help lists them, each with the options it takes and what each means to it
SUITES: dict[str, Suite] = {
    s.name: s
    for s in (
        _suite(
            "load",
            reports.load,
            "Spark -> DuckLake on local[*] and on a standalone cluster vs Spark -> plain Parquet vs DuckDB alone",
            rows="the sizes, a comma list or repeated (default 1000000,10000000)",
            out=OUT,
        ),
        _suite(
            "queries",
            reports.queries,
            "DuckLake vs Parquet on S3 vs Spark SQL",
            rows="one size (default 1,000,000)",
            runs="timed runs per query and engine, after one warm-up (default 5)",
            out=OUT,
            png=PNG,
        ),
        _suite(
            "concurrency",
            reports.concurrency,
            "many writers",
            writers="concurrent writers, default 3 (processes; in the workers modes, one worker plane worker each)",
            ops="inserts per writer (default 100)",
            modes="the modes to run, a comma list of file, ducklake, ducklake-optimistic, workers, workers-optimistic "
            "(default: all; -optimistic: without the commit gate)",
            out=OUT,
            png=PNG,
        ),
        _suite(
            "pipeline",
            reports.pipeline,
            "the DAG runner vs its bound",
            workers="the worker plane's Dask workers (default 2)",
            out=OUT,
        ),
        _suite(
            "steps",
            reports.steps,
            "the step runner vs direct inserts",
            workers="the worker plane's Dask workers (default 3)",
            ops="loop iterations, one insert each (default 100)",
            out=OUT,
        ),
        _suite(
            "dynamic",
            reports.dynamic,
            "incremental vs full refresh of a dynamic table",
            rows="rows per month, one size (default 100,000)",
            runs="changes appended and refreshed per base, each a tenth of a month then a month (default 2)",
            months="months in the first base, the second has twice as many (default 12); or both bases' months, "
            "N,M (e.g. 12,48)",
            file_cache="keep DuckDB's external file cache on (the full recompute then reads the base from memory; "
            "default off)",
            out=OUT,
        ),
        _suite(
            "console",
            reports.console,
            "the lake console in a browser: first page, a query drawn vs sql, 20 sessions at once",
            rows="the table's rows, one size (default 10,000,000)",
            runs="timed runs of each measure, after one warm-up (default 3)",
            out=OUT,
        ),
    )
}
