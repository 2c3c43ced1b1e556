"""`sql --expect V`: the rule that compares a statement's answer with the value a lab expects."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from typing import Any

from ducklake_kit.lake.connection import Lake, StatementResult
from ducklake_kit.platforms.base import Endpoints


@dataclass(frozen=True)
class Expectation:
    expected: str
    actual: str
    passed: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def as_sql_text(value: Any) -> str:
    """A value as SQL prints it: NULL, true/false, else str()."""
    if value is None:
        return "NULL"
    return str(value).lower() if isinstance(value, bool) else str(value)


def expect_value(result: StatementResult, expected: str) -> Expectation:
    """The statement's affected-row count (DML) or its single value, as text, compared with `expected`. A result
    that is not exactly one value fails, saying its shape."""
    if result.affected_rows is not None:
        actual = str(result.affected_rows)
    elif len(result.rows) == 1 and len(result.rows[0]) == 1:
        actual = as_sql_text(result.rows[0][0])
    else:
        actual = f"{len(result.rows)} rows x {len(result.columns)} columns (--expect needs exactly one value)"
    return Expectation(expected, actual, actual == expected)


@dataclass
class SqlRun:
    """What `sql` ran: every statement's result, the lake afterwards, and the expectation's verdict if one was given."""

    results: list[StatementResult]
    catalog_info: dict[str, Any]
    expectation: Expectation | None = None

    @property
    def ok(self) -> bool:
        return self.expectation is None or self.expectation.passed


def run_sql(endpoints: Endpoints, platform_name: str, text: str, expect: str | None = None) -> SqlRun:
    """Run one or more statements against the lake; with `expect`, compare the last statement's answer with it.
    Each autocommit write commits with a token of its own and this run's id in its commit_extra_info
    (`{"commit": ..., "run": "sql", "id": ..., "statement": n}`); an explicit BEGIN ... COMMIT keeps the user's own
    commit message, if it sets one."""
    with Lake(endpoints) as lake:
        lake.autocommit_tag = {"run": "sql", "id": uuid.uuid4().hex}
        results = lake.run(text)
        info = lake.catalog_info(platform_name)
    return SqlRun(results, info, expect_value(results[-1], expect) if expect is not None else None)
