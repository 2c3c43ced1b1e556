"""The named queries in `queries/*.sql`, run against the lake and checked against the source files.

    for q in list_queries(): print(q.name, q.teaches)
    columns, rows, seconds = run_query(lake, "q1_trips_by_vendor")
    check_queries(lake, checks)        # one check per query: "query <name> matches the source"

The check is an independent computation. It does not read `trips`: a private DuckDB connection reads the raw
objects that `load_log.raw_uri` names (one read per load still in load_log, so a file loaded twice with
`--mode append` counts twice, as it does in the lake), conforms each with its own variant's column spellings
(`schema.detect_variant`), applies the quality rules re-implemented in SQL (`taxi.reference.REFERENCE_RULES`, not
the Spark code), joins the `zones` lookup and computes each aggregate with its own SQL (`REFERENCE_SQL`). The
lake's answer must equal it exactly: money and distances are summed as DECIMAL(18, 2) and averages and
percentages rounded to 2 decimals in both, so no floating-point summation order can differ. An average is the
lessons' own arithmetic in both, `avg` over those DECIMALs: an exact sum, then one division to DOUBLE (DuckDB 1.5.5
divides no DECIMAL exactly: `avg` and `/` both give DOUBLE), so both round the same DOUBLE. `sum(...) / count(*)`
divides another way and, on two days of the real samples, rounded exact averages of 3.035 and 18.885 down where the
lesson rounds them up. (The DOUBLE itself can fall below a tie: the real 2022-05-22 averages 4.015 miles, shown as
4.01 by both; exact decimal rounding would need an exact average in the lesson's SQL too.)

A dropped partition, a duplicated load, a row the loader kept or rejected wrongly, a shifted timestamp or a
wrong derived column (weekday, hour, date, year) makes the lake's answer differ from the reference.
"""

from __future__ import annotations

from typing import Any

from ducklake_kit.checks import CheckRun
from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.taxi.lesson_queries import REFERENCE_SQL, Query, build_reference, get_query, list_queries, run_query
from ducklake_kit.taxi.reference import UnreadableSource

__all__ = ["REFERENCE_SQL", "Query", "answers_as_dict", "check_queries", "get_query", "list_queries", "run_query"]

_QUARANTINE_CHECK = "quarantine reasons match the source"


def check_queries(
    lake: Lake, checks: CheckRun, names: list[str] | None = None
) -> dict[str, tuple[list[str], list[tuple], float]]:
    """Run each query (all by default) and check its answer equals the reference computed from the source files.

    Returns the lake's answers by name, (columns, rows, seconds), for rendering. With all queries, also checks
    that the quarantine holds, per reject_reason, exactly the rows the reference rules reject."""
    known = {q.name: q for q in list_queries()}
    for n in names or []:
        get_query(n)  # an unknown name is one clear error, before anything is read
    wanted = [get_query(n).name for n in names] if names else [n for n in known if n in REFERENCE_SQL]
    missing = [n for n in wanted if n not in REFERENCE_SQL]
    if missing:
        raise KitError(
            f"query '{missing[0]}' has no reference computation to check it against",
            f"checked queries: {', '.join(n for n in known if n in REFERENCE_SQL)}",
        )
    answers: dict[str, tuple[list[str], list[tuple], float]] = {}
    try:
        with checks.step("queries: reference from the source files"):
            ref = build_reference(lake)
    except UnreadableSource as exc:  # one failed check naming the file and the fix, and the lessons still run
        checks.true(
            "queries: the reference reads every loaded raw object", False, expected="readable", actual=exc.line()
        )
        return {name: run_query(lake, name) for name in wanted}
    try:
        for name in wanted:
            columns, rows, seconds = run_query(lake, name)
            answers[name] = (columns, rows, seconds)
            expected = ref.execute(REFERENCE_SQL[name]).fetchall()
            checks.equal(f"query {name} matches the source", rows, expected)
        if names is None:
            lake_reasons = lake.con.execute(
                f"SELECT reject_reason, count(*) FROM {lake.alias}.main.quarantine GROUP BY 1 ORDER BY 1"
            ).fetchall()
            ref_reasons = ref.execute(
                "SELECT reject_reason, count(*) FROM source_trips WHERE reject_reason IS NOT NULL GROUP BY 1 ORDER BY 1"
            ).fetchall()
            checks.equal(_QUARANTINE_CHECK, lake_reasons, ref_reasons)
    finally:
        ref.close()
    return answers


def run_queries(
    endpoints: Endpoints, platform_name: str, names: list[str] | None = None, *, check: bool = True
) -> tuple[dict[str, tuple[list[str], list[tuple], float]], CheckRun, dict[str, Any]]:
    """`query`: run the named queries (all by default), each checked against the source files unless `check` is
    off: (answers by name, the checks, the lake's catalog_info afterwards)."""
    run = CheckRun()
    with Lake(endpoints) as lake:
        if check:
            answers = check_queries(lake, run, names)
        else:
            answers = {n: run_query(lake, n) for n in (names or [x.name for x in list_queries()])}
        info = lake.catalog_info(platform_name)
    return answers, run, info


def answers_as_dict(answers: dict[str, tuple[list[str], list[tuple], float]]) -> dict[str, Any]:
    """{name: {columns, rows, seconds}} with rows as lists (the CLI makes dates and decimals JSON-safe)."""
    return {n: {"columns": c, "rows": [list(r) for r in rows], "seconds": s} for n, (c, rows, s) in answers.items()}
