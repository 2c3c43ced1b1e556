"""Two loads of the same file that both planned before either committed: exactly one lands.

The test holds the loads' commit lock itself, so both loads are certainly waiting in the commit phase (the
window the race needs) when it lets go; without the lock both would register their files and the rows would
be in the lake twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ducklake_kit.lake import Lake
from ducklake_kit.lake.locks import COMMIT_LOCK_KEY
from ducklake_kit.platforms import postgres

pytestmark = [pytest.mark.integration, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[2]
MONTH, ROWS = "2015-05", 3000  # a month no other test loads (the tests share one lake)


def _waiting_loads(conn) -> int:
    return conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid::bigint = %s",
        [COMMIT_LOCK_KEY & 0xFFFFFFFF],
    ).fetchone()[0]


def test_two_identical_loads_racing_to_commit_land_once(stack):
    ep = stack.platform.endpoints()
    holder = postgres.connect(ep.pg)
    holder.execute("SELECT pg_advisory_lock(%s)", [COMMIT_LOCK_KEY])
    cmd = [
        sys.executable,
        str(ROOT / "ducklake_test.py"),
        "load",
        "--source",
        "synthetic",
        "--months",
        MONTH,
        "--rows-per-month",
        str(ROWS),
    ]
    env = {**os.environ, **stack.env, "COLUMNS": "200"}
    procs = [
        subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 600
        while _waiting_loads(holder) < 2:
            assert all(p.poll() is None for p in procs), "a load ended before reaching its commit: " + "".join(
                p.communicate()[1] for p in procs if p.poll() is not None
            )
            assert time.monotonic() < deadline, "the two loads never both waited for the commit lock"
            time.sleep(0.5)
    finally:
        holder.close()  # lets go: one load commits, then the other re-plans inside the lock
    outs = [p.communicate(timeout=600) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 3], outs
    loser = next(err for p, (_, err) in zip(procs, outs) if p.returncode == 3)
    assert "another load committed some of these files while this one ran; nothing was registered" in loser
    name = f"yellow_tripdata_{MONTH}.parquet"
    with Lake(ep) as lake:
        rows = lake.scalar(
            "SELECT (SELECT count(*) FROM trips WHERE source_file = ?) + "
            "(SELECT count(*) FROM quarantine WHERE source_file = ?)",
            [name, name],
        )
        logged = lake.scalar("SELECT count(*) FROM load_log WHERE source_file = ?", [name])
    assert (rows, logged) == (ROWS, 1)
