"""The one shape of a lesson: `run(kit, checks, **options) -> <Lesson>Result`.

Every lesson module exposes `run`, decorated with `@lesson("<name>")`; its result is a dataclass derived from
`LessonResult`: the lesson's name, the checks it computed (each with what it compared: expected and actual), its
seconds, and the lesson's own typed fields. `as_dict()` gives the lesson's own fields as the commands print them
under `--json` (the checks travel in the CheckRun's part of the envelope, as before).

    checks = CheckRun()
    done = maintain.run(kit, checks, versions=[7])
    done.ok, [c.name for c in done.failed], done.seconds, done.done.expired
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ducklake_kit.checks import Check, CheckRun


@dataclass(kw_only=True)
class LessonResult:
    """What every lesson returns; `name`, `checks` and `seconds` are filled in by `@lesson`."""

    name: str = ""
    checks: list[Check] = field(default_factory=list, repr=False)  # the checks this run added to the CheckRun
    seconds: float = 0.0

    @property
    def passed(self) -> list[Check]:
        return [c for c in self.checks if c.passed]

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    @property
    def ok(self) -> bool:
        """Every check held (a lesson skipped because the plane is off computed none, and that is not a failure)."""
        return not self.failed

    def as_dict(self) -> dict[str, Any]:
        """The lesson's own fields, as `--json` and `all` print them."""
        raise NotImplementedError


R = TypeVar("R", bound=LessonResult)


def lesson(name: str) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Make `run(kit, checks, **options)` a lesson: its result carries `name`, the checks the run added to `checks`
    (the CheckRun is shared: `all` passes one for every stage) and the seconds it took."""

    def wrap(run: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(run)
        def measured(kit: Any, checks: CheckRun, **options: Any) -> R:
            first, start = len(checks.checks), time.perf_counter()
            result = run(kit, checks, **options)
            result.name, result.checks = name, checks.checks[first:]
            result.seconds = round(time.perf_counter() - start, 3)
            return result

        return measured

    return wrap
