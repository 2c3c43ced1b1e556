"""A load's progress as a user sees it (issue 24): Rich bars with a count, a rate and an ETA in a real terminal
(the CLI run inside tmux, its screen captured), the plain `• ...` lines and no bar in a pipe, and nothing but the
envelope on stdout under --json. Each run loads a synthetic month no other test loads."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]
TMUX = "/usr/bin/tmux"
ROWS = "20000"
BAR = "━"  # what Rich draws a bar with (and a table's header rule)


def _load_args(month: str) -> list[str]:
    return [sys.executable, str(ROOT / "ducklake_test.py"), "load", "--source", "synthetic", "--months", month,
            "--rows-per-month", ROWS]  # fmt: skip


def _screen_of(stack, argv: list[str], tmp: Path, timeout_s: float = 600) -> str:
    """Run `argv` in a fresh tmux server (its own socket) in a 200x50 terminal; the screen when it has exited."""
    done = tmp / "exit-code"
    script = tmp / "run.sh"
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in stack.env.items())
    script.write_text(f"{exports}unset COLUMNS\n{shlex.join(argv)}\necho $? > {shlex.quote(str(done))}\nsleep 600\n")
    socket = f"ducklake-test-{uuid.uuid4().hex[:8]}"
    tmux = [TMUX, "-L", socket]
    subprocess.run(
        [*tmux, "new-session", "-d", "-x", "200", "-y", "50", f"bash {shlex.quote(str(script))}"], check=True
    )
    try:
        deadline = time.monotonic() + timeout_s
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        screen = subprocess.run([*tmux, "capture-pane", "-p", "-J"], capture_output=True, text=True, check=True).stdout
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    assert done.exists(), f"the load did not end in {timeout_s} s:\n{screen}"
    assert done.read_text().strip() == "0", screen
    return screen


@pytest.mark.skipif(not os.access(TMUX, os.X_OK), reason="tmux is not installed")
def test_a_load_in_a_terminal_draws_bars_with_a_rate_and_an_eta(stack, tmp_path):
    screen = _screen_of(stack, _load_args("2011-01"), tmp_path)
    bars = [line for line in screen.splitlines() if BAR in line]
    assert any("landing raw files" in b and "files/s" in b and "ETA" in b for b in bars), screen
    assert any("Spark: writing rows" in b and "20000/20000" in b and "rows/s" in b for b in bars), screen
    assert any("checking files against the source" in b and "100%" in b for b in bars), screen
    assert "• landing raw files in s3://raw" in screen  # the lines are still there, above the bars


def test_a_load_in_a_pipe_prints_the_plain_lines_and_no_bar(stack):
    run = subprocess.run(_load_args("2011-02"), env={**os.environ, **stack.env}, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "• landing raw files in s3://raw\n" in run.stdout
    assert "• Spark: conform, flag quality, derive, write Parquet from the executors\n" in run.stdout
    both = run.stdout + run.stderr
    assert "ETA" not in both and "rows/s" not in both and "files/s" not in both  # no bar (tables use ━ too)


def test_a_load_under_json_prints_only_the_envelope_on_stdout(stack):
    run = subprocess.run(
        [*_load_args("2011-03"), "--json"], env={**os.environ, **stack.env}, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads(run.stdout)  # the whole of stdout is one JSON document
    assert doc["status"] == "ok" and set(doc) == {"status", "result", "catalog_info"}
    assert "• landing raw files in s3://raw" in run.stderr and "ETA" not in run.stderr  # lines on stderr, no bar
