"""The Kit (a run's context) and its reporters, without services: what `from_env` reads, and what each reporter
writes where (lines in a pipe, bars with a rate and an ETA in a terminal, nothing by default)."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from ducklake_kit.errors import KitError
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.platforms.report import BarReporter, LineReporter, Reporter, reporter_for


def test_from_env_reads_what_the_cli_reads(monkeypatch, tmp_path):
    monkeypatch.setenv("DUCKLAKE_PLATFORM", "local")
    monkeypatch.setenv("DUCKLAKE_HOME", str(tmp_path))
    monkeypatch.setenv("DUCKLAKE_PG_PORT", "25432")
    monkeypatch.setenv("DUCKLAKE_S3_PORT", "29000")
    monkeypatch.setenv("DUCKLAKE_SCHEDULER", "tcp://127.0.0.1:28786")
    kit = Kit.from_env()
    assert kit.state.home == tmp_path.resolve() or kit.state.home == tmp_path
    assert (kit.platform_name, kit.scheduler) == ("local", "tcp://127.0.0.1:28786")
    assert (kit.platform.pg_port, kit.platform.s3_port) == (25432, 29000)
    assert type(kit.reporter) is Reporter  # a notebook's default: says nothing


def test_from_env_refuses_a_port_that_is_not_a_number(monkeypatch, tmp_path):
    monkeypatch.setenv("DUCKLAKE_HOME", str(tmp_path))
    monkeypatch.setenv("DUCKLAKE_PG_PORT", "fifty")
    with pytest.raises(KitError) as err:
        Kit.from_env()
    assert err.value.line().startswith("Error: DUCKLAKE_PG_PORT=fifty is not a port number. Try: ")


def test_an_unknown_platform_is_one_line(tmp_path):
    with pytest.raises(KitError, match="unknown platform 'moon'"):
        Kit.build("moon", tmp_path)


def test_on_keeps_the_platform_it_is_given(tmp_path):
    from ducklake_kit.platforms.local import LocalPlatform
    from ducklake_kit.platforms.state import State

    platform = LocalPlatform(State(tmp_path), pg_port=1, s3_port=2)
    kit = Kit.on(platform, scheduler="tcp://x:1")
    assert kit.platform is platform and kit.state is platform.state and kit.scheduler == "tcp://x:1"
    quiet = kit.with_reporter(Reporter())
    assert quiet.platform is platform  # the same run, another listener


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=120, color_system=None if not terminal else "standard"), buf


def test_lines_in_a_pipe_are_the_plain_progress_lines_and_no_bar():
    console, buf = _console(terminal=False)
    report = reporter_for(console)
    assert isinstance(report, LineReporter) and not isinstance(report, BarReporter)
    report.say("landing raw files in s3://raw")
    with report.progress("landing raw files", total=3, unit="files") as bar:
        for _ in range(3):
            bar.advance()
    assert buf.getvalue() == "• landing raw files in s3://raw\n"


def test_a_terminal_gets_a_bar_with_count_rate_and_eta():
    console, buf = _console(terminal=True)
    report = reporter_for(console)
    assert isinstance(report, BarReporter)
    report.say("before")
    with report.progress("Spark: writing rows", total=1000, unit="rows") as bar:
        bar.advance(400)
        report.say("during")  # printed above the bar, not into it
        bar.advance(600)
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())  # the terminal's control sequences
    assert "• before" in out and "• during" in out
    last = [line for line in out.splitlines() if "Spark: writing rows" in line][-1]
    assert "1000/1000" in last and "100%" in last and "rows/s" in last and "ETA" in last, last


def test_track_advances_once_per_item_and_the_default_says_nothing(capsys):
    assert list(Reporter().track([1, 2, 3], "x")) == [1, 2, 3]
    Reporter().say("nobody listens")
    assert capsys.readouterr() == ("", "")
