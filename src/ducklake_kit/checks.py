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
    stage: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "expected": self.expected,
            "actual": self.actual,
            "seconds": self.seconds,
            "stage": self.stage,
        }


class CheckRun:
    """Collects checks and timings; `ok` only when at least one check ran and all held."""

    def __init__(self) -> None:
        self.checks: list[Check] = []
        self.timings: dict[str, float] = {}
        self.stages: dict[str, float] = {}  # the flow's stages (foundation, load, ...) and their seconds
        self._stage = ""

    def equal(self, name: str, actual: Any, expected: Any) -> bool:
        passed = actual == expected
        self.checks.append(Check(name, passed, expected, actual, stage=self._stage))
        return passed

    def true(self, name: str, condition: bool, *, expected: Any = True, actual: Any = None) -> bool:
        self.checks.append(
            Check(name, bool(condition), expected, condition if actual is None else actual, stage=self._stage)
        )
        return bool(condition)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """A stage of a flow: its checks are grouped under it and its time is kept, for the summary."""
        previous, self._stage = self._stage, name
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stages[name] = round(time.perf_counter() - start, 3)
            self._stage = previous

    def summary(self) -> list[dict[str, Any]]:
        """Per stage: checks passed / total and seconds."""
        out = []
        for name, seconds in self.stages.items():
            mine = [c for c in self.checks if c.stage == name]
            out.append({"stage": name, "passed": sum(c.passed for c in mine), "checks": len(mine), "seconds": seconds})
        return out

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Keep the time of what runs inside, under `name` (the run's `timings_s`)."""
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
            "stages": self.summary(),
        }
