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
    return subprocess.Popen([sys.executable, str(ROOT / "ducklake_test.py"), *args], env={**os.environ, **stack.env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


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
    assert errors == ["Error: the worker plane's scheduler was lost during the run. Try: run `up` to start it again, "
                      "then `pipeline run --from-failed`."], err
    # the run is in the history, ABORTED, so --from-failed knows what to re-run
    with Lake(ep) as lake:
        assert lake.con.execute("SELECT status FROM pipeline_runs WHERE run_id = ?", [run["run_id"]]).fetchall() == [
            ("failed",)]


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
        "again.")
    with Lake(ep) as lake:  # the second run left no trace: one run recorded, the first
        assert lake.con.execute("SELECT run_id, status FROM pipeline_runs WHERE pipeline = 'faults' "
                                "AND started_at > now() - INTERVAL 10 MINUTE").fetchall() == [(run_id, "ok")]
    # the lock went with the first run: the pipeline runs again
    again = cli(stack.env, "pipeline", "run", str(slow_file), "--select", "after")
    assert again.exit_code == 0, again.output
