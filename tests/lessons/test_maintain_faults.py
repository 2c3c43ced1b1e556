"""Maintenance on a catalog that ends idle transactions (duckdb/ducklake#1462): DuckLake keeps its catalog
transaction open through the Parquet work of a merge, so with `idle_in_transaction_session_timeout` set on the
catalog database a merge that takes longer used to fail. `maintain` run while three writers insert: no writer
fails, maintain fails nothing, and every row that was reported inserted is there once.

The timeout is 1 s, not the 10 s of the issue: a merge that lasts 10 s needs far more data than a test should write
on this machine (2 cores); 120 files of 2,000 rows take a few seconds to merge, several times the timeout."""

from __future__ import annotations

import threading
import time

import pytest

from ducklake_kit.checks import CheckRun
from ducklake_kit.lake import Lake
from ducklake_kit.lessons import maintain
from ducklake_kit.platforms import postgres
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.platforms.report import CallbackReporter

pytestmark = [pytest.mark.integration]
FILES, ROWS_PER_FILE = 120, 2000
WRITERS = 3
TIMEOUT = "1s"


class Stream:
    """`WRITERS` threads, each with its own Lake, inserting one row at a time until stopped; every failure kept."""

    def __init__(self, ep):
        self.ep, self.stop = ep, threading.Event()
        self.done: list[tuple[int, int]] = []
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self.write, args=(w,), daemon=True) for w in range(WRITERS)]

    def write(self, writer: int) -> None:
        try:
            with Lake(self.ep) as lake:
                op = 0
                while not self.stop.is_set():
                    try:
                        lake.run(f"INSERT INTO maint.stream VALUES ({writer}, {op})")
                        self.done.append((writer, op))
                    except Exception as exc:  # noqa: BLE001 - every failure is the test's finding
                        self.failures.append(f"writer {writer} op {op}: {exc}")
                    op += 1
        except Exception as exc:  # noqa: BLE001
            self.failures.append(f"writer {writer} could not start: {exc}")

    def __enter__(self) -> Stream:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


def small_files(ep) -> None:
    """maint.big in FILES Parquet files (what the merge reads and rewrites), and the stream's table."""
    with Lake(ep) as lake:
        lake.run(
            "CREATE SCHEMA maint; CREATE TABLE maint.big (i BIGINT, s VARCHAR); "
            "CREATE TABLE maint.stream (writer INTEGER, op INTEGER)"
        )
        lake.con.execute("CALL lake.set_option('data_inlining_row_limit', 0, schema => 'maint', table_name => 'big')")
        for k in range(FILES):
            lake.run(
                f"INSERT INTO maint.big SELECT i, md5(i::VARCHAR) FROM range({k * ROWS_PER_FILE}, "
                f"{(k + 1) * ROWS_PER_FILE}) r(i)"
            )


def test_maintain_during_an_insert_stream_on_a_catalog_that_ends_idle_transactions(fresh_stack):
    fresh_stack.platform.up()
    ep = fresh_stack.platform.endpoints()
    small_files(ep)
    admin = postgres.connect(ep.pg, timeout=10)
    admin.execute(f"ALTER DATABASE {ep.pg.dbname} SET idle_in_transaction_session_timeout = '{TIMEOUT}'")
    try:
        with Stream(ep) as stream:
            time.sleep(1)  # the writers are inserting before maintain starts
            checks = CheckRun()
            start = time.monotonic()
            result = maintain.run(Kit.on(fresh_stack.platform), checks)
            seconds = time.monotonic() - start
            time.sleep(0.5)  # and still after it
    finally:
        admin.execute(f"ALTER DATABASE {ep.pg.dbname} RESET idle_in_transaction_session_timeout")
        admin.close()
    assert checks.ok, [c.as_dict() for c in checks.failed]
    merged = result.done.merged["maint.big"]
    assert merged["files_processed"] >= FILES, merged  # the merge did run, under the timeout
    assert seconds > 1.0  # longer than the timeout: the idle transaction it used to die of had the time to
    assert stream.failures == []
    assert len(stream.done) > 0
    with Lake(ep) as lake:
        n, distinct = lake.con.execute("SELECT count(*), count(DISTINCT (writer, op)) FROM maint.stream").fetchone()
        assert n == distinct == len(stream.done)  # every reported insert there, once
        assert lake.scalar("SELECT count(*) FROM maint.big") == FILES * ROWS_PER_FILE


def test_maintain_during_a_load_on_a_catalog_that_ends_idle_transactions(fresh_stack, monkeypatch):
    """The same timeout, `maintain` started while a synthetic load (Spark) runs: both succeed, every check passes."""
    from ducklake_kit.taxi import flow

    fresh_stack.platform.up()
    ep = fresh_stack.platform.endpoints()
    small_files(ep)
    admin = postgres.connect(ep.pg, timeout=10)
    admin.execute(f"ALTER DATABASE {ep.pg.dbname} SET idle_in_transaction_session_timeout = '{TIMEOUT}'")
    loaded: list = []
    load_ended: list[float] = []

    # the load's own hook holds it, its files written and its Lake open, until maintain has started
    monkeypatch.setenv("DUCKLAKE_FAULT", "pause-before-commit=8")
    paused = threading.Event()

    def on_step(line: str) -> None:
        if line.startswith("test hook: every file written"):
            paused.set()

    def load() -> None:
        try:
            kit = Kit.on(fresh_stack.platform, reporter=CallbackReporter(on_step))
            spec = flow.LoadSpec(source="synthetic", months="2023-01..2023-02", rows_per_month=5000, seed=3)
            loaded.append(flow.load_checked(kit, spec))
        except Exception as exc:  # noqa: BLE001 - the load's failure is the finding
            loaded.append(exc)
        load_ended.append(time.monotonic())

    try:
        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        assert paused.wait(300), "the load never reached its pause before the commit"
        checks = CheckRun()
        maintain_started = time.monotonic()
        result = maintain.run(Kit.on(fresh_stack.platform), checks)
        loader.join(600)
    finally:
        admin.execute(f"ALTER DATABASE {ep.pg.dbname} RESET idle_in_transaction_session_timeout")
        admin.close()
    assert checks.ok, [c.as_dict() for c in checks.failed]
    assert result.done.merged["maint.big"]["files_processed"] >= FILES
    assert len(loaded) == 1 and not isinstance(loaded[0], Exception), loaded
    assert load_ended[0] > maintain_started  # they did overlap: maintain started while the load ran
    load_result, load_checks = loaded[0]
    assert load_checks.ok, [c.as_dict() for c in load_checks.failed]
    assert [f.status for f in load_result.files] == ["loaded", "loaded"]
