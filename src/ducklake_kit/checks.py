"""Computed checks: every line printed as passed compared a measured value with an expected one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass
class Check:
    name: str
    passed: bool
    expected: Any
    actual: Any
    seconds: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "expected": self.expected, "actual": self.actual, "seconds": self.seconds}


class CheckRun:
    """Collects checks and step timings; `ok` only when at least one check ran and all held."""

    def __init__(self) -> None:
        self.checks: list[Check] = []
        self.timings: dict[str, float] = {}

    def equal(self, name: str, actual: Any, expected: Any) -> bool:
        passed = actual == expected
        self.checks.append(Check(name, passed, expected, actual))
        return passed

    def true(self, name: str, condition: bool, *, expected: Any = True, actual: Any = None) -> bool:
        self.checks.append(Check(name, bool(condition), expected, condition if actual is None else actual))
        return bool(condition)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = round(time.perf_counter() - start, 3)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def as_dict(self) -> dict[str, Any]:
        return {
            "passed": sum(c.passed for c in self.checks),
            "failed": len(self.failed),
            "checks": [c.as_dict() for c in self.checks],
            "timings_s": self.timings,
        }
