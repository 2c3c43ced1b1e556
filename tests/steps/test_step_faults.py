"""`steps run` when a worker or the plane's scheduler dies under a loop: each iteration commits a token of its own, the
runner decides an iteration whose worker could not report by looking its token up in the lake, `--resume RUN` runs
again only what did not commit, and a lost scheduler is one line (and the --json envelope), never a traceback. Each
test counts the rows: every iteration's INSERT is in the lake exactly once."""

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
from ducklake_kit.platforms import postgres, procs
from ducklake_kit.workers import plane

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

# one INSERT per id, in parallel on the workers; `n` makes each take long enough to be killed in
PLAYBOOK = """apiVersion: noetl.io/v1
kind: Playbook
metadata:
  name: faults
workload:
  ids: [1, 2]
  n: 1000
workflow:
  - step: ins
    loop:
      collection: "{{ ids }}"
      element: id
      mode: async
    tool: ducklake
    params:
      id: "{{ id }}"
      n: "{{ n }}"
    command: |
      INSERT INTO once_t SELECT $id, count(*) FROM range($n) t(i) WHERE i % 7 = 3;
  - step: after
    tool: ducklake
    command: SELECT count(*) AS n FROM once_t;
"""


N, N_ROWS = 300_000_000, len(range(3, 300_000_000, 7))  # i % 7 = 3 below N


@pytest.fixture
def playbook(tmp_path) -> Path:
    path = tmp_path / "faults.yaml"
    path.write_text(PLAYBOOK)
    return path


def _plane(stack, workers: int = 2):
    stack.platform.up()
    ep = stack.platform.endpoints()
    plane.up(stack.state, ep, workers)
    with Lake(ep) as lake:
        lake.run("CREATE TABLE once_t (id INTEGER, n BIGINT)")
    return ep


def _start(stack, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "ducklake_test.py"), "steps", "run", *args],
        env={**os.environ, **stack.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _commits(ep, count: int, timeout: float = 120) -> dict[int, dict]:
    """Poll the catalog until `count` INSERTs into once_t committed: iteration -> its snapshot and the extra info its
    commit carries (found by what it changed, so that a runner that tags no commit is still caught in the act)."""
    deadline = time.monotonic() + timeout
    with postgres.connect(ep.pg) as conn:
        while time.monotonic() < deadline:
            rows = conn.execute(
                "SELECT snapshot_id, commit_extra_info FROM ducklake_snapshot_changes "
                "WHERE changes_made LIKE 'in%insert%' ORDER BY snapshot_id"
            ).fetchall()
            infos = [{**json.loads(e or "{}"), "snapshot": snap} for snap, e in rows]
            found = {info.get("iteration", i): info for i, info in enumerate(infos)}
            if len(found) >= count:
                return found
            time.sleep(0.05)  # well inside the workers' 10 s pause after a commit, and 10x fewer catalog reads
    raise AssertionError(f"fewer than {count} iterations committed")


def _kill(stack, service: str) -> None:
    os.kill(procs.read_pid(stack.state.pid_file(service)).pid, signal.SIGKILL)


def _rows(ep) -> list:
    with Lake(ep) as lake:
        return lake.con.execute("SELECT id, n FROM once_t ORDER BY id").fetchall()


def _iterations(envelope: dict) -> list[dict]:
    ins = next(s for s in envelope["result"]["steps"] if s["step"] == "ins")
    return ins["result"]["iterations"]


def _resume(stack, cli, monkeypatch, playbook: Path, run_id: str, *extra: str) -> dict:
    """Replace what was killed (without the fault hook), run the run again; the envelope."""
    monkeypatch.delenv("DUCKLAKE_FAULT", raising=False)  # the new workers inherit the environment: no pause for them
    monkeypatch.delenv("DUCKLAKE_FAULT_RESUME_FILE", raising=False)
    plane.up(stack.state, stack.platform.endpoints(), 2)
    again = cli(stack.env, "steps", "run", str(playbook), "--resume", run_id, "--json", *extra)
    assert again.exit_code == 0, again.output
    envelope = json.loads(again.stdout)
    assert envelope["result"]["summary"]["execution_id"] == run_id and envelope["result"]["summary"]["resumed"]
    return envelope


def _resume_file(stack, monkeypatch) -> Path:
    """The file whose appearance ends the workers' pause after a commit (in the stack's home: the workers, another
    user when the tests run as root, can see it there)."""
    resume = stack.home / "resume"
    monkeypatch.setenv("DUCKLAKE_FAULT_RESUME_FILE", str(resume))
    return resume


def test_an_iteration_whose_worker_dies_after_its_commit_is_ok_and_never_run_again(
    fresh_stack, cli, playbook, monkeypatch
):
    monkeypatch.setenv("DUCKLAKE_FAULT", "pause-after-commit=10")  # the workers wait there: the kill lands in it
    resume = _resume_file(fresh_stack, monkeypatch)
    ep = _plane(fresh_stack)
    proc = _start(fresh_stack, str(playbook), "--json")
    first = _commits(ep, 1)
    iteration, commit = next(iter(first.items()))
    _kill(fresh_stack, f"worker-{commit.get('worker', 'w1')}")
    resume.touch()  # the kill has landed in the pause: the other worker need not wait out its 10 s
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, (out, err)  # the lake says it committed: the run did all it had to
    envelope = json.loads(out)
    it = _iterations(envelope)[iteration]
    assert (it["status"], it["snapshot_id"]) == ("ok", commit["snapshot"]), it
    assert it["note"] and it["note"].startswith(f"worker {commit['worker']} "), it
    assert "found in the lake by its token" in it["note"], it
    run_id = envelope["result"]["summary"]["execution_id"]
    assert commit["run"] == run_id and commit["steps"] == "faults"
    again = _resume(fresh_stack, cli, monkeypatch, playbook, run_id)
    assert all("not run again" in it["note"] for it in _iterations(again)), _iterations(again)
    assert _rows(ep) == [(1, 143), (2, 143)]  # i % 7 = 3 below 1000, each id once


def test_an_iteration_whose_worker_dies_before_its_commit_did_not_commit_and_runs_once_on_resume(
    fresh_stack, cli, playbook, monkeypatch
):
    ep = _plane(fresh_stack)
    proc = _start(fresh_stack, str(playbook), "--set", "n=600000000", "--json")
    seen = []
    while not any("step ins (loop)" in line for line in seen) and proc.poll() is None:
        seen.append(proc.stderr.readline())
    time.sleep(1.0)  # each worker is running one iteration's INSERT
    _kill(fresh_stack, "worker-w1")
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, (out, err)
    iterations = _iterations(json.loads(out))
    lost = [it for it in iterations if it["status"] == "error"]
    assert len(lost) == 1 and lost[0]["worker"] == "w1", iterations
    assert "did not commit (its token is not in the lake)" in lost[0]["error"]["message"], lost
    done = next(it for it in iterations if it["status"] == "ok")
    assert _rows(ep) == [(done["element"], 85714286)]
    again = _iterations(
        _resume(
            fresh_stack,
            cli,
            monkeypatch,
            playbook,
            json.loads(out)["result"]["summary"]["execution_id"],
            "--set",
            "n=600000000",
        )
    )
    assert [it["note"] is not None for it in again] == [it is done for it in iterations]  # only the lost one ran
    assert _rows(ep) == [(1, 85714286), (2, 85714286)]  # each id once


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
def test_the_scheduler_lost_mid_loop_is_one_line_and_resume_runs_what_did_not_commit(
    fresh_stack, cli, playbook, monkeypatch, as_json
):
    monkeypatch.setenv("DUCKLAKE_FAULT", "pause-after-commit=10")
    resume = _resume_file(fresh_stack, monkeypatch)
    ep = _plane(fresh_stack)
    # each INSERT takes about a second: the run is still busy when the first two have committed
    proc = _start(
        fresh_stack, str(playbook), "--set", "ids=[1,2,3]", "--set", f"n={N}", *(["--json"] if as_json else [])
    )
    landed = _commits(ep, 2)  # two iterations committed and waiting on their workers; the third is queued
    _kill(fresh_stack, "scheduler")
    resume.touch()  # the kill has landed in the pause: the workers need not wait out its 10 s
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, (out, err)
    assert "Traceback" not in err + out and "distributed." not in err + out, err
    run_id = next(iter(landed.values())).get("run")
    errors = [line for line in err.splitlines() if line.startswith("Error: ")]
    assert errors == [
        "Error: the worker plane's scheduler was lost during the run. Try: run `up` to start it again, "
        f"then `steps run {playbook} --resume {run_id}`."
    ], err
    if as_json:
        envelope = json.loads(out)
        assert envelope["status"] == "error" and set(envelope) == {"status", "result", "catalog_info"}
        summary = envelope["result"]["summary"]
        assert summary["aborted"].startswith("the worker plane's scheduler was lost"), summary
        its = {it["index"]: it for it in _iterations(envelope)}
        for i, commit in landed.items():
            assert (its[i]["status"], its[i]["snapshot_id"]) == ("ok", commit["snapshot"]), its[i]
            assert "found in the lake by its token" in its[i]["note"]
        (other,) = set(its) - set(landed)
        assert its[other]["status"] == "error" and "is not in the lake" in its[other]["error"]["message"], its[other]
        after = next(s for s in envelope["result"]["steps"] if s["step"] == "after")
        assert after["status"] == "skipped" and after["reason"].startswith("not run: the worker plane's scheduler")
    else:  # what the text run says; the resume that follows does not depend on how the run printed, so once
        assert "ABORTED: playbook faults" in out, out
        assert _rows(ep) == [(i + 1, N_ROWS) for i in sorted(landed)]  # only what committed is in the lake
        return
    again = _iterations(
        _resume(fresh_stack, cli, monkeypatch, playbook, run_id, "--set", "ids=[1,2,3]", "--set", f"n={N}")
    )
    assert sorted(it["index"] for it in again if it["note"] is None) == sorted({0, 1, 2} - set(landed))
    assert _rows(ep) == [(i, N_ROWS) for i in (1, 2, 3)]  # each id once
