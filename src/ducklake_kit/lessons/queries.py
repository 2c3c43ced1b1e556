"""The named queries in `queries/*.sql`, run against the lake and checked against the source files.

    for q in list_queries(): print(q.name, q.teaches)
    columns, rows, seconds = run_query(lake, "q1_trips_by_vendor")
    check_queries(lake, checks)        # one check per query: "query <name> matches the source"
    done = run(kit, checks)            # the lesson (`query`, `all`): every query, checked; done.answers[name].rows

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

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ducklake_kit.checks import CheckRun
from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.lessons.result import LessonResult, lesson
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.taxi.lesson_queries import REFERENCE_SQL, Query, build_reference, get_query, list_queries, run_query
from ducklake_kit.taxi.reference import UnreadableSource

__all__ = ["REFERENCE_SQL", "Answer", "QueriesResult", "Query", "check_queries", "get_query", "list_queries", "run"]

_QUARANTINE_CHECK = "quarantine reasons match the source"


class Answer(NamedTuple):
    """One query's answer from the lake."""

    columns: list[str]
    rows: list[tuple]
    seconds: float


@dataclass(kw_only=True)
class QueriesResult(LessonResult):
    answers: dict[str, Answer]  # by query name, in the order they ran
    catalog_info: dict[str, Any] = field(default_factory=dict)  # the lake's, after the queries

    def as_dict(self) -> dict[str, Any]:
        """`query --json`: {"queries": {name: {columns, rows, seconds}}} with rows as lists (the CLI makes dates and
        decimals JSON-safe)."""
        return {
            "queries": {
                n: {"columns": a.columns, "rows": [list(r) for r in a.rows], "seconds": a.seconds}
                for n, a in self.answers.items()
            }
        }

    def summary(self) -> dict[str, Any]:
        """`all`'s record of the stage: {name: {rows: how many, seconds}}."""
        return {n: {"rows": len(a.rows), "seconds": round(a.seconds, 4)} for n, a in self.answers.items()}


def _answer(lake: Lake, name: str) -> Answer:
    return Answer(*run_query(lake, name))


def check_queries(lake: Lake, checks: CheckRun, names: list[str] | None = None) -> dict[str, Answer]:
    """Run each query (all by default) and check its answer equals the reference computed from the source files.

    Returns the lake's answers by name, for rendering. With all queries, also checks that the quarantine holds,
    per reject_reason, exactly the rows the reference rules reject."""
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
    answers: dict[str, Answer] = {}
    try:
        with checks.timed("queries: reference from the source files"):
            ref = build_reference(lake)
    except UnreadableSource as exc:  # one failed check naming the file and the fix, and the lessons still run
        checks.true(
            "queries: the reference reads every loaded raw object", False, expected="readable", actual=exc.line()
        )
        return {name: _answer(lake, name) for name in wanted}
    try:
        for name in wanted:
            answers[name] = _answer(lake, name)
            expected = ref.execute(REFERENCE_SQL[name]).fetchall()
            checks.equal(f"query {name} matches the source", answers[name].rows, expected)
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


@lesson("queries")
def run(kit: Kit, checks: CheckRun, *, names: list[str] | None = None, check: bool = True) -> QueriesResult:
    """The named queries (all by default), each checked against the source files unless `check` is off."""
    with Lake(kit.platform.endpoints()) as lake:
        if check:
            answers = check_queries(lake, checks, names)
        else:
            answers = {n: _answer(lake, n) for n in (names or [x.name for x in list_queries()])}
        info = lake.catalog_info(kit.platform.name)
    return QueriesResult(answers=answers, catalog_info=info)
