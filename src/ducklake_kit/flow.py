"""`all`, the whole flow with checks (what `just ducklake-test` runs):
up -> buckets -> the foundation's table and snapshot checks -> the taxi load through PySpark, checked
against the source -> the same load again, which must change nothing."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from . import smoke
from .checks import CheckRun
from .lake import Lake
from .platforms.base import Platform
from .state import State
from .taxi import flow as taxi_flow
from .taxi import sources

# synthetic by default (offline, quick on 2 cores; `--source auto` downloads ~9M real rows when the TLC host
# answers); size overridable with DUCKLAKE_ALL_ROWS_PER_MONTH
ALL_MONTHS = "2024-01..2024-03"
ALL_ROWS_PER_MONTH = sources.DEFAULT_ROWS_PER_MONTH


def all_rows_per_month() -> int:
    return int(os.environ.get("DUCKLAKE_ALL_ROWS_PER_MONTH") or ALL_ROWS_PER_MONTH)


def run_all(platform: Platform, state: State, checks: CheckRun, *, source: str = "synthetic", mode: str = "skip",
            on_step: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    on_step("foundation: services, buckets, a table, two inserts, time travel")
    result = smoke.run(platform, checks)
    with checks.step("load"):
        first, _ = taxi_flow.load_and_verify(platform, state, source=source, months=ALL_MONTHS,
                                             rows_per_month=all_rows_per_month(), mode=mode, on_step=on_step, checks=checks)
    with checks.step("load again (no-op)"):
        on_step("the same load again: every file must be skipped")
        again, _ = taxi_flow.load_and_verify(platform, state, source=source, months=ALL_MONTHS,
                                             rows_per_month=all_rows_per_month(), on_step=on_step, checks=checks,
                                             verify_skipped=False)  # the figures were just checked
    checks.equal("re-running the load skips every file", [f.status for f in again.files], ["skipped"] * len(first.files))
    result["load"] = first.as_dict()
    with Lake(platform.endpoints()) as lake:
        result["catalog_info"] = lake.catalog_info(platform.name)  # after the load, not before
    return result
