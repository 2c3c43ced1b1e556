"""`dynamic run`: refresh each dynamic table when it is stale, until stopped.

A table with a time lag is stale when the lake has committed something since the snapshot it reflects and now
minus that snapshot's commit time exceeds its lag (so an idle lake costs no refreshes). A DOWNSTREAM table is
refreshed when a table that reads it is (`manage.refresh_many` refreshes upstream first). A table never filled
(INITIALIZE = ON_SCHEDULE) is stale at once. Suspended tables wait for ALTER ... RESUME; 5 consecutive failures
suspend a table.

SIGTERM or Ctrl-C: the refresh under way finishes (its transaction commits whole or not at all) and the loop
stops; a second Ctrl-C abandons it (rolled back)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import duckdb
import psycopg

from ducklake_kit.dynamic_tables import manage
from ducklake_kit.dynamic_tables.catalog import reflected, snapshot_time
from ducklake_kit.dynamic_tables.metadata import ACTIVE, Definition, Metadata, Refresh
from ducklake_kit.dynamic_tables.refresh import Refresher
from ducklake_kit.errors import KitError, first_line
from ducklake_kit.lake import Lake

TICK_S = 1.0


def stale(lake: Lake, d: Definition, current: int, now: datetime) -> bool:
    if d.status != ACTIVE or d.lag_seconds is None:
        return False
    snap = reflected(lake, d)
    if snap is None:
        return True
    if snap >= current:
        return False
    return (now - snapshot_time(lake, snap)).total_seconds() > d.lag_seconds


@dataclass
class RunResult:
    ticks: int = 0
    refreshes: list[Refresh] = field(default_factory=list)
    errors: int = 0  # rounds that could not ask the lake or the catalog
    stopped_by: str = ""  # once | time | signal


@dataclass(frozen=True)
class Listener:
    """Who hears of the scheduler's rounds: `on_refresh` each refresh as it is done, `on_error` a round that could
    not ask the lake or the catalog (the next round tries again)."""

    on_refresh: Callable[[Refresh], None] = lambda _r: None
    on_error: Callable[[str], None] = lambda _e: None


NO_ONE = Listener()


def run(
    lake: Lake,
    meta: Metadata,
    *,
    once: bool = False,
    seconds: float | None = None,
    tick_s: float = TICK_S,
    listener: Listener = NO_ONE,
) -> RunResult:
    """Refresh stale tables every `tick_s` seconds: one round (`once`), for `seconds`, or until a signal."""
    on_refresh, on_error = listener.on_refresh, listener.on_error
    out = RunResult()
    stop = {"asked": False}
    deadline = time.monotonic() + seconds if seconds is not None else None
    refresher = Refresher(lake, meta)

    def ask_stop(signum, _frame) -> None:
        if stop["asked"] and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C abandons the refresh under way
        stop["asked"] = True

    previous = {s: signal.signal(s, ask_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            out.ticks += 1
            try:
                current = lake.current_snapshot()
                now = datetime.now(UTC)
                due = [d.name for d in meta.all() if stale(lake, d, current, now)]
                batch = (
                    manage.refresh_many(
                        lake, meta, due, trigger="schedule", refresher=refresher, include_suspended=False
                    )
                    if due
                    else manage.Batch()
                )
            except (KitError, duckdb.Error, psycopg.Error) as exc:  # the catalog went away a moment: try next round
                on_error(exc.line() if isinstance(exc, KitError) else first_line(exc))
                out.errors += 1
                batch = manage.Batch()
            for r in batch.refreshes:
                out.refreshes.append(r)
                on_refresh(r)
            if once:
                out.stopped_by = "once"
                break
            if stop["asked"]:
                out.stopped_by = "signal"
                break
            if deadline is not None and time.monotonic() >= deadline:
                out.stopped_by = "time"
                break
            end = time.monotonic() + tick_s
            while time.monotonic() < end and not stop["asked"]:
                time.sleep(min(0.1, tick_s))
            if stop["asked"]:
                out.stopped_by = "signal"
                break
    finally:
        refresher.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return out
