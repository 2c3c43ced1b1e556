"""`pipeline` commands on bad input: one line on stderr naming the file and line, exit 3, before any service is
contacted (these run with no services at all)."""

from __future__ import annotations

import pytest


@pytest.fixture
def env(tmp_path):
    # a state folder with nothing running: a command that reached for a service would fail differently
    return {"DUCKLAKE_PLATFORM": "local", "DUCKLAKE_HOME": str(tmp_path / "state")}


@pytest.mark.parametrize(
    "source, expected",
    [
        (
            "-- id: a\n-- depends_on: b\nSELECT 1;\n-- id: b\n-- depends_on: a\nSELECT 2;",
            "{f}:2: the dependencies form a cycle: ",
        ),
        ("-- id: 1\nSELECT 'a;b';\n-- id: 1\nSELECT 2;", "{f}:3: id '1' is used twice (first on line 2)."),
        (
            "-- id: x\n-- nodes: w1\nSELECT 1;",
            "{f}:2: unknown header 'nodes' (did you mean 'node'?). Try: spell it as one of id, depends_on, node, description",
        ),
    ],
)
@pytest.mark.parametrize("command", ["plan", "run"])
def test_a_bad_file_is_one_line_with_its_line_number_and_exit_3(cli, env, tmp_path, source, expected, command):
    path = tmp_path / "bad.sql"
    path.write_text(source)
    result = cli(env, "pipeline", command, str(path))
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith("Error: " + expected.format(f=path)), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_missing_file_and_bad_options(cli, env, tmp_path):
    result = cli(env, "pipeline", "plan", str(tmp_path / "nope.sql"))
    assert result.exit_code == 3 and result.stderr.startswith(f"Error: no pipeline file at {tmp_path / 'nope.sql'}.")
    path = tmp_path / "ok.sql"
    path.write_text("SELECT 1")
    both = cli(env, "pipeline", "run", str(path), "--select", "1", "--from-failed")
    assert both.exit_code == 2 and "give --select or --from-failed, not both" in both.output
    unknown = cli(env, "pipeline", "plan", str(path), "--select", "+9")
    assert unknown.exit_code == 3 and "--select names '9', which is no node of the pipeline" in unknown.stderr
