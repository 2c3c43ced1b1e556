"""doctor finds the tools the recipes use, and says which uv it found.

Every test builds the machine it needs: a PATH of stand-in executables (tiny shell scripts printing a version) in
tmp_path, and an environment without the developer's own uv, java or just. So no test passes or fails because of
what happens to be installed here.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ducklake_kit.cli import app
from ducklake_kit.platforms import doctor

ROOT = Path(__file__).resolve().parents[2]

UV = 'echo "uv 0.13.8 (stand-in)"'
JUST = 'echo "just 1.59.0"'
JAVA_17 = """echo 'openjdk version "17.0.1" 2021-10-19' >&2"""
JAVA_11 = """echo 'openjdk version "11.0.2" 2019-01-15' >&2"""
# a python3 that has the uv module (`pip install uv` into it) / one that has not (a fresh venv's, a system python)
PYTHON_WITH_UV = (
    'if [ "$*" = "-m uv --version" ]; then echo "uv 0.13.8 (module)"; exit 0; fi\necho "unexpected: $*" >&2; exit 64'
)
PYTHON_WITHOUT_UV = 'echo "$0: No module named uv" >&2; exit 1'


class Machine:
    """A folder of stand-ins that is the whole PATH, and the other places doctor looks for uv, all in tmp_path."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        self.tmp = tmp_path
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        self.uv_home = tmp_path / "uv-home"  # where scripts/uv.sh would install the pinned uv
        monkeypatch.setenv("PATH", str(self.bin))
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        monkeypatch.setenv("DUCKLAKE_UV_HOME", str(self.uv_home))
        for name in ("DUCKLAKE_UV", "JAVA_HOME", "VIRTUAL_ENV", "XDG_CACHE_HOME", "DUCKLAKE_PLATFORM"):
            monkeypatch.delenv(name, raising=False)
        # the interpreter this venv was made from, and the user's pip --user folder: neither has a uv here
        monkeypatch.setattr(
            sys, "_base_executable", str(self.tool("python3", PYTHON_WITHOUT_UV, folder="base")), raising=False
        )
        monkeypatch.setattr(site, "USER_BASE", str(tmp_path / "user-base"))

    def tool(self, name: str, body: str, folder: str = "bin") -> Path:
        path = self.tmp / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
        return path

    def complete(self, **bodies: str) -> Machine:
        """java 17, just and uv on PATH; a keyword replaces one (java=JAVA_11) or leaves it out (uv=None)."""
        for name, body in {"java": JAVA_17, "just": JUST, "uv": UV, **bodies}.items():
            if body is not None:
                self.tool(name, body)
        return self


@pytest.fixture
def machine(tmp_path, monkeypatch) -> Machine:
    return Machine(tmp_path, monkeypatch)


def tools(platform: str = "local") -> dict[str, doctor.Tool]:
    return {t.name: t for t in doctor.check(platform)}


def doctor_cli(*args: str) -> subprocess.CompletedProcess:
    """The real entry point, in a new process, with the environment the test built."""
    return subprocess.run(
        [sys.executable, str(ROOT / "ducklake_test.py"), "doctor", *args],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_uv_on_path_is_found_and_named(machine):
    machine.complete()
    found = tools()
    assert all(found[name].ok for name in ("python", "java", "uv", "just")), found
    assert found["uv"].version == f"0.13.8 (on PATH: {machine.bin / 'uv'})"
    assert found["java"].version == f"17 ({machine.bin / 'java'})"
    assert found["just"].version == "1.59.0"


def test_uv_only_as_python3_m_uv_passes_and_says_so(machine):
    # the README's prerequisites: Python, Java, just; uv was pip-installed into python3 by scripts/uv.sh
    machine.complete(uv=None)
    machine.tool("python3", PYTHON_WITH_UV)
    result = doctor_cli("--json")
    assert result.returncode == 0, result.stdout + result.stderr
    uv = {t["name"]: t for t in json.loads(result.stdout)["result"]["tools"]}["uv"]
    assert uv["found"] and uv["version"] == f"0.13.8 (python3 -m uv at {machine.bin / 'python3'})"


def test_the_venvs_own_python3_is_passed_over(machine, monkeypatch):
    # doctor runs in the project's venv, first on PATH: its python3 has no uv; the user's python3 further on has
    venv = machine.tmp / "venv"
    machine.tool("python3", PYTHON_WITHOUT_UV, folder="venv/bin")
    machine.complete(uv=None)
    machine.tool("python3", PYTHON_WITH_UV)
    monkeypatch.setenv("VIRTUAL_ENV", str(venv))
    monkeypatch.setenv("PATH", f"{venv / 'bin'}{os.pathsep}{machine.bin}")
    assert tools()["uv"].version == f"0.13.8 (python3 -m uv at {machine.bin / 'python3'})"


def test_the_uv_scripts_uv_sh_ran_is_found_off_path(machine, monkeypatch):
    machine.complete(uv=None)
    uv = machine.tool("uv", UV, folder="elsewhere")
    monkeypatch.setenv("DUCKLAKE_UV", str(uv))
    assert tools()["uv"].version == f"0.13.8 (scripts/uv.sh: {uv})"
    python = machine.tool("python3", PYTHON_WITH_UV, folder="elsewhere")
    monkeypatch.setenv("DUCKLAKE_UV", f"{python} -m uv")
    assert tools()["uv"].version == f"0.13.8 (scripts/uv.sh: {python} -m uv)"


def test_the_uv_scripts_uv_sh_installed_is_found_without_being_told(machine):
    # `python ducklake_test.py doctor` run by hand, after a recipe installed the pinned uv (not on PATH)
    machine.complete(uv=None)
    uv = machine.tool("uv", UV, folder="uv-home/uv-0.13.8/bin")
    assert tools()["uv"].version == f"0.13.8 (installed by scripts/uv.sh: {uv})"


def test_uv_nowhere_is_missing_with_a_hint_and_exits_3(machine):
    machine.complete(uv=None)
    machine.tool("python3", PYTHON_WITHOUT_UV)
    uv = tools()["uv"]
    assert not uv.found and uv.required and uv.version == "not found"
    assert "scripts/uv.sh" in uv.hint and "docs.astral.sh/uv" in uv.hint
    result = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": "200"})
    assert result.exit_code == 3, result.output
    assert result.stderr.splitlines() == [
        f"Error: uv is missing (installs the pinned environment). Try: {doctor.UV_HINT}."
    ]


def test_a_uv_that_does_not_answer_is_not_taken(machine, monkeypatch):
    machine.complete(uv='echo "uv: cannot execute binary file" >&2; exit 126')
    monkeypatch.setenv("DUCKLAKE_UV", str(machine.tool("uv", UV, folder="elsewhere")))
    assert tools()["uv"].version.startswith("0.13.8 (scripts/uv.sh: ")


def test_java_too_old_is_not_usable(machine):
    machine.complete(java=JAVA_11)
    java = tools()["java"]
    assert not java.ok and java.version == f"11 is too old ({machine.bin / 'java'})"
    result = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": "200"})
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith("Error: java is not usable: 11 is too old (")
    assert "Try: install Java 17+" in result.stderr


def test_java_missing_exits_3_with_one_line_and_a_hint(machine):
    machine.complete(java=None)
    result = doctor_cli("--json")
    assert result.returncode == 3, result.stdout + result.stderr
    found = {t["name"]: t for t in json.loads(result.stdout)["result"]["tools"]}
    assert found["java"]["found"] is False and found["java"]["required"] is True
    assert "openjdk-17" in found["java"]["hint"]
    assert [name for name, t in found.items() if not t["ok"]] == ["java"]
    text = doctor_cli()
    assert text.returncode == 3
    assert text.stderr.startswith(
        "Error: java is missing (PySpark 4 runs on the JVM, Java 17 or newer). Try: install Java 17+"
    )
    assert len(text.stderr.splitlines()) == 1


def test_java_home_wins_over_path(machine, monkeypatch):
    machine.complete(java=JAVA_11)
    jdk = machine.tool("java", JAVA_17, folder="jdk/bin")
    monkeypatch.setenv("JAVA_HOME", str(jdk.parent.parent))
    assert tools()["java"].version == f"17 ({jdk})"


def test_k3d_tools_are_optional_for_local_and_required_for_k3d(machine):
    machine.complete()
    local, k3d = tools("local"), tools("k3d")
    assert not local["docker"].found and not local["docker"].required and local["docker"].ok
    assert not k3d["docker"].ok and not k3d["k3d"].ok


def test_doctor_reports_the_spark_modes_and_a_missing_connect_client_module():
    found = tools()
    assert [found[m].found for m in ("spark local[*]", "spark standalone", "spark connect")] == [True, True, True]
    assert "spark-connect_" in found["spark connect"].version
    assert doctor._connect_client(("grpc", "no_such_module_for_the_test")) == (
        "the Connect client's module no_such_module_for_the_test is missing"
    )
