"""The podman platform's prerequisites: the shipped containers.conf, and each tool found or missing with its hint."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ducklake_kit.platforms import podman_doctor

NAMES = ["podman", "runc", "mmdebstrap", "containers.conf"]


def test_the_shipped_conf_holds_what_podman_needs_here() -> None:
    assert podman_doctor.CONTAINERS_CONF.is_file()
    assert podman_doctor.conf_problems() == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n[engine]\nruntime = "crun"\n',
            "runtime is 'crun'",
        ),
        ('[containers]\ndefault_ulimits = ["nofile=20000:20000"]\n[engine]\nruntime = "runc"\n', "sets no nproc"),
        ('[engine]\nruntime = "runc"\n', "sets no nofile"),
        ("[engine\n", "not valid TOML"),
    ],
)
def test_a_wrong_conf_is_named(tmp_path: Path, text: str, problem: str) -> None:
    conf = tmp_path / "containers.conf"
    conf.write_text(text)
    assert any(problem in p for p in podman_doctor.conf_problems(conf)), podman_doctor.conf_problems(conf)


def test_a_missing_conf_is_named(tmp_path: Path) -> None:
    assert "cannot be read" in podman_doctor.conf_problems(tmp_path / "nope.conf")[0]


def test_missing_tools_are_reported_with_the_install_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: none of the tools is on it
    tools = podman_doctor.check(required=True)
    assert [t.name for t in tools] == NAMES
    for t in tools[:3]:
        assert (t.found, t.ok, t.version) == (False, False, "not found")
        assert "apt-get install podman runc mmdebstrap" in t.hint
    assert tools[3].found and "podman not found" in tools[3].version
    # not the platform asked for: the same facts, nothing required
    assert all(t.ok for t in podman_doctor.check(required=False))


def test_each_item_is_what_doctor_prints() -> None:
    from ducklake_kit.platforms.doctor import Tool
    from ducklake_kit.platforms.doctor import check as doctor_check

    items = podman_doctor.check(required=True)
    assert items and all(isinstance(item, Tool) for item in items)  # doctor adds them to its list as they are
    names = [t.name for t in doctor_check("podman")]
    assert [i.name for i in items] == [n for n in names if n in {i.name for i in items}]


def test_podman_env_points_at_the_conf() -> None:
    assert podman_doctor.podman_env()["CONTAINERS_CONF"] == str(podman_doctor.CONTAINERS_CONF)


@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (apt-get install podman runc)")
def test_podman_reads_the_conf_and_runs_runc() -> None:
    tools = {t.name: t for t in podman_doctor.check(required=True)}
    assert all(t.found for t in tools.values()), [vars(t) for t in tools.values() if not t.found]
    assert tools["containers.conf"].version == "read by podman: runtime runc"
