"""`pipeline run` when the plane fails or another run is busy: the scheduler killed mid-run ends the run ABORTED
with one line saying so (no Dask log, no traceback) and the envelope under --json; a second run of the same pipeline
while one runs says which run holds it and changes nothing; the history of concurrent runs is never lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ducklake_kit.lake import Lake
from ducklake_kit.platforms import procs
from ducklake_kit.workers import plane

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

# one worker, a node that takes a few seconds, and one after it
SLOW = """-- id: slow
CREATE OR REPLACE TABLE faults_slow AS SELECT count(*) AS n FROM range({n}) t(i) WHERE i % 7 = 3;
-- id: after
-- depends_on: slow
CREATE OR REPLACE TABLE faults_after AS SELECT n FROM faults_slow;
"""


def _start(stack, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "ducklake_test.py"), *args],
        env={**os.environ, **stack.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _wait_for_line(proc: subprocess.Popen, text: str, timeout: float = 120) -> list[str]:
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"no line with {text!r} in {seen}")


@pytest.fixture(scope="module")
def slow_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("faults") / "faults.sql"
    path.write_text(SLOW.format(n=1_500_000_000))
    return path


def test_the_scheduler_killed_mid_run_ends_it_aborted_with_one_line(fresh_stack, slow_file):
    fresh_stack.platform.up()
    ep = fresh_stack.platform.endpoints()
    plane.up(fresh_stack.state, ep, 1)
    proc = _start(fresh_stack, "pipeline", "run", str(slow_file), "--json")
    before = _wait_for_line(proc, "node slow: started")
    time.sleep(1.0)  # the node is running on w1
    os.kill(procs.read_pid(fresh_stack.state.pid_file("scheduler")).pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    err = "".join(before) + err
    assert proc.returncode == 1, (out, err)
    envelope = json.loads(out)
    assert envelope["status"] == "error"
    run = envelope["result"]
    assert run["aborted"].startswith("the worker plane's scheduler was lost"), run["aborted"]
    nodes = {n["id"]: n for n in run["nodes"]}
    assert nodes["slow"]["status"] == "failed" and nodes["after"]["status"] == "skipped"
    assert "Traceback" not in err and "distributed." not in err, err
    errors = [line for line in err.splitlines() if line.startswith("Error: ")]
    assert errors == [
        "Error: the worker plane's scheduler was lost during the run. Try: run `up` to start it again, "
        "then `pipeline run --from-failed`."
    ], err
    # the run is in the history, ABORTED, so --from-failed knows what to re-run
    with Lake(ep) as lake:
        assert lake.con.execute("SELECT status FROM pipeline_runs WHERE run_id = ?", [run["run_id"]]).fetchall() == [
            ("failed",)
        ]


def test_a_second_run_of_a_running_pipeline_names_the_run_and_changes_nothing(stack, cli, slow_file):
    ep = stack.platform.endpoints()
    plane.up(stack.state, ep)
    first = _start(stack, "pipeline", "run", str(slow_file), "--json")
    _wait_for_line(first, "node slow: started")
    second = cli(stack.env, "pipeline", "run", str(slow_file))
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    run_id = json.loads(out)["result"]["run_id"]
    assert second.exit_code == 3, second.output
    assert second.stderr.strip() == (
        f"Error: pipeline faults is already running (run {run_id}); one run of a pipeline at a time, or the two would "
        "replace each other's tables and race to record their history. Try: wait for that run to end, then run it "
        "again."
    )
    with Lake(ep) as lake:  # the second run left no trace: one run recorded, the first
        assert lake.con.execute(
            "SELECT run_id, status FROM pipeline_runs WHERE pipeline = 'faults' "
            "AND started_at > now() - INTERVAL 10 MINUTE"
        ).fetchall() == [(run_id, "ok")]
    # the lock went with the first run: the pipeline runs again
    again = cli(stack.env, "pipeline", "run", str(slow_file), "--select", "after")
    assert again.exit_code == 0, again.output


# -- exactly once: a node whose worker or scheduler dies is decided by its token in the lake ------------------------

ONCE = """-- id: ins
-- node: w2
INSERT INTO once_t SELECT count(*) FROM range({n}) t(i) WHERE i % 7 = 3;
-- id: after
-- depends_on: ins
CREATE OR REPLACE TABLE once_after AS SELECT count(*) AS n FROM once_t;
"""


def _once_stack(stack, tmp_path, n: int) -> tuple:
    stack.platform.up()
    ep = stack.platform.endpoints()
    plane.up(stack.state, ep, 2)
    with Lake(ep) as lake:
        lake.run("CREATE TABLE once_t (n BIGINT)")
    path = tmp_path / "onceonly.sql"
    path.write_text(ONCE.format(n=n))
    return ep, path


def _wait_for_commit(ep, node: str, timeout: float = 120) -> int:
    """Poll the catalog for the node's commit, as the fault campaign did, and return its snapshot."""
    from ducklake_kit.platforms import postgres

    deadline = time.monotonic() + timeout
    with postgres.connect(ep.pg) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT snapshot_id FROM ducklake_snapshot_changes WHERE commit_message LIKE %s",
                [f"pipeline onceonly: node {node} (run %"],
            ).fetchone()
            if row:
                return row[0]
            time.sleep(0.05)  # well inside the workers' 10 s pause after a commit, and 10x fewer catalog reads
    raise AssertionError(f"node {node} never committed")


def _pid_of(stack, service: str) -> int:
    return procs.read_pid(stack.state.pid_file(service)).pid


def _rows(ep) -> list:
    with Lake(ep) as lake:
        return lake.con.execute("SELECT n FROM once_t").fetchall()


@pytest.mark.parametrize("victim", ["worker-w2", "scheduler"])
def test_a_node_whose_worker_or_scheduler_dies_after_its_commit_is_ok_and_never_run_again(
    fresh_stack, cli, tmp_path, monkeypatch, victim
):
    # the workers wait there, the kill lands in it (the test kills within milliseconds of the commit showing); every
    # commit pauses, the next node's too, so the pause is a floor on the test's time: 10 s, as for the steps
    monkeypatch.setenv("DUCKLAKE_FAULT", "pause-after-commit=10")
    resume = fresh_stack.home / "resume"  # the pause ends once it exists (the home is one the workers can read)
    monkeypatch.setenv("DUCKLAKE_FAULT_RESUME_FILE", str(resume))
    ep, path = _once_stack(fresh_stack, tmp_path, 1000)
    proc = _start(fresh_stack, "pipeline", "run", str(path), "--json")
    snapshot = _wait_for_commit(ep, "ins")
    os.kill(_pid_of(fresh_stack, victim), signal.SIGKILL)
    resume.touch()  # the kill has landed in the pause: the rest of the run need not wait out its 10 s
    out, err = proc.communicate(timeout=180)
    ins = {n["id"]: n for n in json.loads(out)["result"]["nodes"]}["ins"]
    assert (ins["status"], ins["snapshot_id"]) == ("ok", snapshot), (ins, err)
    assert "found in the lake by its token" in ins["reason"]
    if victim == "scheduler":  # the rest of the run was lost with the plane
        assert proc.returncode == 1
    monkeypatch.delenv("DUCKLAKE_FAULT")
    monkeypatch.delenv("DUCKLAKE_FAULT_RESUME_FILE")
    plane.up(fresh_stack.state, ep, 2)  # replaces what was killed
    again = cli(fresh_stack.env, "pipeline", "run", str(path), "--from-failed", "--json")
    assert again.exit_code == 0, again.output
    rerun = [n["id"] for n in json.loads(again.stdout)["result"]["nodes"]]
    assert "ins" not in rerun  # committed once: never again
    assert _rows(ep) == [(143,)]  # one row: i % 7 = 3 below 1000, counted once


def test_a_node_whose_worker_dies_before_its_commit_fails_and_runs_once_when_run_again(fresh_stack, cli, tmp_path):
    ep, path = _once_stack(fresh_stack, tmp_path, 1_500_000_000)
    proc = _start(fresh_stack, "pipeline", "run", str(path), "--json")
    _wait_for_line(proc, "node ins: started")
    time.sleep(1.0)  # the INSERT is running on w2
    os.kill(_pid_of(fresh_stack, "worker-w2"), signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, err
    nodes = {n["id"]: n for n in json.loads(out)["result"]["nodes"]}
    assert (
        nodes["ins"]["status"] == "failed" and "did not commit (its token is not in the lake)" in nodes["ins"]["error"]
    )
    assert nodes["after"]["status"] == "skipped"
    assert _rows(ep) == []
    plane.up(fresh_stack.state, ep, 2)
    # run again over 1000 rows, not 1.5e9 (the size was for the kill to land mid-INSERT; a whole one costs seconds
    # of CPU): the one row then says which run's INSERT landed, and that it landed once
    path.write_text(ONCE.format(n=1000))
    again = cli(fresh_stack.env, "pipeline", "run", str(path), "--from-failed")
    assert again.exit_code == 0, again.output
    assert _rows(ep) == [(143,)]  # once, the run's again: count of i % 7 = 3 below 1000
