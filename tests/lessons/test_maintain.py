"""Maintenance against a private stack per test (it expires snapshots, so the shared lake keeps its history):
a dry run changes nothing; a real run keeps every answer, makes expired versions unreachable, and removes the
files a killed load left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest

from ducklake_kit.checks import CheckRun
from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.lessons import maintain
from ducklake_kit.lessons.maintain import fingerprint, referenced_files, s3_objects
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.taxi import flow

pytestmark = [pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]


def _history(lake: Lake) -> tuple[list[int], int, int]:
    """A table with small (inlined) and larger (Parquet) inserts and a delete; returns the snapshots, and the
    expected rows and sum(x), computed in Python."""
    lake.run("CREATE TABLE events (id BIGINT, x BIGINT, note VARCHAR)")
    snaps, ids = [lake.current_snapshot()], []
    for lo, hi in ((0, 5), (5, 10), (10, 2010), (2010, 4010), (4010, 4013)):
        lake.run(f"INSERT INTO events SELECT i, i * 3, 'n' || i FROM range({lo}, {hi}) r(i)")
        ids += range(lo, hi)
        snaps.append(lake.current_snapshot())
    lake.run("DELETE FROM events WHERE id % 10 = 7")
    snaps.append(lake.current_snapshot())
    kept = [i for i in ids if i % 10 != 7]
    return snaps, len(kept), sum(i * 3 for i in kept)


def _answers(lake: Lake) -> tuple[int, int]:
    n, s = lake.con.execute("SELECT count(*), sum(x) FROM events").fetchone()
    return n, int(s)


def test_dry_run_changes_nothing_then_a_real_run_keeps_answers_and_expires(fresh_stack):
    fresh_stack.platform.up()
    ep = fresh_stack.platform.endpoints()
    with Lake(ep) as lake:
        snaps, rows, total = _history(lake)
        assert _answers(lake) == (rows, total)
        cutoff = lake.scalar("SELECT now()")
        lake.run("INSERT INTO events VALUES (-1, 0, 'after the cutoff')")
        after_cutoff = lake.current_snapshot()
        objects, all_snaps = (
            s3_objects(ep),
            lake.con.execute("SELECT snapshot_id FROM ducklake_snapshots('lake')").fetchall(),
        )
        # the fingerprint can fail: one changed value changes it
        fp = fingerprint(lake)
        assert fp["main.events"][0] == rows + 1

    with pytest.raises(KitError, match="cannot read the age"):
        maintain.run(Kit.on(fresh_stack.platform), CheckRun(), older_than="seven days")

    checks = CheckRun()
    dry = maintain.run(Kit.on(fresh_stack.platform), checks, older_than=cutoff, dry_run=True)
    assert checks.ok, [c.as_dict() for c in checks.failed]
    would = dry.would
    assert would["expire_snapshots"] == [0, *snaps]  # everything committed before the cutoff
    assert would["flush_inlined_rows"] == {"main.events": 5 + 5 - 1 + 3 + 1}  # inlined inserts, minus the deleted id 7
    with Lake(ep) as lake:
        assert s3_objects(ep) == objects
        assert lake.con.execute("SELECT snapshot_id FROM ducklake_snapshots('lake')").fetchall() == all_snaps
        lake.run("UPDATE events SET x = x + 1 WHERE id = 0")
        assert fingerprint(lake) != fp
        lake.run("UPDATE events SET x = x - 1 WHERE id = 0")
        assert fingerprint(lake)["main.events"] == fp["main.events"]
        restored = lake.current_snapshot()

    checks = CheckRun()
    done = maintain.run(Kit.on(fresh_stack.platform), checks, versions=[after_cutoff])  # exactly one version
    assert checks.ok, [c.as_dict() for c in checks.failed]
    assert done.done.expired == [after_cutoff]
    assert done.name == "maintain" and done.checks == checks.checks and done.ok  # the result carries its checks

    checks = CheckRun()
    real = maintain.run(Kit.on(fresh_stack.platform), checks, older_than=cutoff)
    assert checks.ok, [c.as_dict() for c in checks.failed]
    assert real.done.expired == [0, *snaps]
    assert real.done.flushed == {}  # the versions run already flushed them
    assert real.after["inlined_rows"] == 0
    with Lake(ep) as lake:
        assert _answers(lake) == (rows + 1, total)
        for version in (snaps[0], snaps[-1]):
            with pytest.raises(duckdb.InvalidInputException, match="No snapshot found"):
                lake.con.execute(f"SELECT count(*) FROM events AT (VERSION => {version})").fetchall()
        assert lake.scalar(f"SELECT count(*) FROM events AT (VERSION => {restored})") == rows + 1
        assert referenced_files(lake) <= set(s3_objects(ep))


@pytest.mark.spark
def test_orphaned_files_from_a_killed_load_are_removed_and_answers_unchanged(fresh_stack):
    fresh_stack.platform.up()
    ep = fresh_stack.platform.endpoints()
    result, checks = flow.load_checked(
        Kit.on(fresh_stack.platform, fresh_stack.state),
        flow.LoadSpec(source="synthetic", months="2021-05", rows_per_month=4000),
    )
    assert checks.ok
    env = {**os.environ, **fresh_stack.env, "DUCKLAKE_FAULT": "kill-before-commit"}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "ducklake_test.py"),
            "load",
            "--source",
            "synthetic",
            "--months",
            "2021-06",
            "--rows-per-month",
            "4000",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -9, proc.stdout + proc.stderr
    with Lake(ep) as lake:
        orphans = set(s3_objects(ep)) - referenced_files(lake)
        answers = lake.con.execute("SELECT count(*), sum(total_amount) FROM trips").fetchone()
    assert any("pickup_month=6" in o for o in orphans), orphans  # the killed load's trips file

    checks = CheckRun()
    dry = maintain.run(Kit.on(fresh_stack.platform), checks, older_than="7 days", dry_run=True)
    assert checks.ok and dry.would["orphaned_files"] == []  # younger than the cutoff: a running load is safe

    checks = CheckRun()
    real = maintain.run(Kit.on(fresh_stack.platform), checks, older_than=datetime.now(UTC))
    assert checks.ok, [c.as_dict() for c in checks.failed]
    assert orphans <= set(real.done.orphans_deleted)
    assert not orphans & set(s3_objects(ep))
    with Lake(ep) as lake:
        assert lake.con.execute("SELECT count(*), sum(total_amount) FROM trips").fetchone() == answers
        assert answers[0] == result.files[0].rows_accepted


def test_maintain_beside_another_writer_checks_its_own_commits(fresh_stack):
    """Another writer committing while maintain runs is normal (a load, the worker plane). maintain used to compare
    the whole lake before and after, so the other writer's rows failed "current answers unchanged"; each of its own
    commits is now checked against the snapshot it was built on, and the whole lake only when nobody else wrote."""
    import threading

    fresh_stack.platform.up()
    ep = fresh_stack.platform.endpoints()
    with Lake(ep) as lake:
        _history(lake)  # inlined rows to flush and small files to merge: maintain commits snapshots of its own
        lake.run("CREATE TABLE other_writer (i BIGINT)")
    stop, inserted = threading.Event(), []

    def write() -> None:
        with Lake(ep) as other:
            while not stop.is_set():  # a commit every 0.1 s (back to back, it starves maintain's commit retries)
                other.run(f"INSERT INTO other_writer VALUES ({len(inserted)})")
                inserted.append(other.last_committed_snapshot())
                stop.wait(0.1)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        while len(inserted) < 3:  # the writer is committing before maintain starts, and goes on during it
            stop.wait(0.05)
        checks = CheckRun()
        result = maintain.run(Kit.on(fresh_stack.platform), checks, versions=[])
    finally:
        stop.set()
        writer.join(30)
    assert checks.ok, [c.as_dict() for c in checks.failed]
    assert result.other_writers_snapshots, "the other writer committed nothing while maintain ran"
    own = [c.name for c in checks.checks if "changed no answer" in c.name]
    assert own and any(n.startswith("flushing inlined data") for n in own), own
    assert not any(c.name.startswith("current answers unchanged") for c in checks.checks)
    with Lake(ep) as lake:
        assert lake.scalar("SELECT count(*) FROM other_writer") == len(inserted)  # none of its rows lost


@pytest.mark.spark
def test_dead_loads_files_go_now_and_a_running_loads_files_stay(fresh_stack, tmp_path):
    """issue 16: a killed load's files stayed for `--older-than` (7 days), and nothing said why. Each load holds a
    lock in the catalog for its whole life and names its files for itself: `--dead-loads` removes now the files of
    a load whose lock is free, and never those of a load that is running (here: files written, commit paused)."""

    from ducklake_kit.lake.locks import load_id_of
    from ducklake_kit.lessons.maintain import unreferenced_files

    fresh_stack.platform.up()
    ep = fresh_stack.platform.endpoints()
    env = {**os.environ, **fresh_stack.env}
    argv = [sys.executable, str(ROOT / "ducklake_test.py"), "load", "--source", "synthetic", "--rows-per-month", "3000"]
    killed = subprocess.run(
        argv + ["--months", "2021-07"],
        env={**env, "DUCKLAKE_FAULT": "kill-before-commit"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -9, killed.stdout + killed.stderr
    with Lake(ep) as lake:
        left = unreferenced_files(lake, ep)
    dead, other = left["dead"], left["other"]  # other: the zones file DuckLake itself wrote in the killed commit
    assert dead and not left["running"] and all(load_id_of(p) is None for p in other), left

    # paused with its files written until the test has run maintain beside it and touches `resume` (the 300 s are a
    # cap for a stuck test, not a wait: a fixed pause cost every run its whole length)
    resume = tmp_path / "resume"
    running = subprocess.Popen(
        argv + ["--months", "2021-08"],
        env={**env, "DUCKLAKE_FAULT": "pause-before-commit=300", "DUCKLAKE_FAULT_RESUME_FILE": str(resume)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in running.stdout:  # until the running load has written all its files (seeing one is not enough:
            if "pausing 300 s before the commit" in line:  # its executors may still be writing the next)
                break
        assert running.poll() is None, running.stderr.read()
        with Lake(ep) as lake:
            left = unreferenced_files(lake, ep)
        alive = left["running"]
        assert alive, left
        checks = CheckRun()
        plain = maintain.run(Kit.on(fresh_stack.platform), checks)  # without the option: they stay, and it says why
        assert checks.ok and plain.unreferenced_left == {
            "running": len(alive),
            "dead": len(dead),
            "other": len(other),
        }
        checks = CheckRun()
        result = maintain.run(Kit.on(fresh_stack.platform), checks, dead_loads=True)
        assert checks.ok, [c.as_dict() for c in checks.failed]
        assert result.done.dead_load_files_deleted == dead
        objects = set(s3_objects(ep))
        assert not set(dead) & objects and set(alive) <= objects
        assert result.unreferenced_left == {"running": len(alive), "dead": 0, "other": len(other)}
    finally:
        resume.touch()
        _out, err = running.communicate(timeout=600)
    assert running.returncode == 0, err[-3000:]  # its own checks passed: every row it wrote is in the lake
    with Lake(ep) as lake:
        assert set(alive) <= referenced_files(lake)  # it committed the very files maintain left alone
        assert unreferenced_files(lake, ep) == {"running": [], "dead": [], "other": other}
