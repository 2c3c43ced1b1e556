"""The podman platform for real: the overlay's pods up, their probes passing, a wrong password and an anonymous S3
request refused, data surviving a killed PostgreSQL and a re-played pod. Skipped with the reason where podman
(or mmdebstrap, which builds the images' base) is absent. The images are built once and cached by their inputs."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.platforms import postgres, s3
from ducklake_kit.platforms.podman import PodmanPlatform
from ducklake_kit.platforms.podman_doctor import podman_env
from ducklake_kit.platforms.procs import free_port
from ducklake_kit.platforms.state import State

pytestmark = [
    pytest.mark.service,
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("podman") is None or shutil.which("mmdebstrap") is None,
        reason="podman or mmdebstrap is not installed (sudo apt-get install podman runc mmdebstrap)",
    ),
]


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodmanPlatform]:
    home = tmp_path_factory.mktemp("podman-home")
    kit = PodmanPlatform(State(home), pg_port=free_port(), s3_port=free_port())
    try:
        kit.up()
        yield kit
    finally:
        kit.reset()


def podman(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, env=podman_env(), timeout=120)


def query(kit: PodmanPlatform, sql: str) -> list[tuple]:
    with postgres.connect(kit.endpoints().pg) as conn:
        return conn.execute(sql).fetchall()


def test_up_plays_the_pods_and_their_probes_pass(platform: PodmanPlatform) -> None:
    plan = platform._names()
    assert plan is not None
    for pod in plan.pods:
        assert podman("pod", "exists", pod.name).returncode == 0
    for probe in plan.probes():  # the manifests' own commands, run again now: all pass
        out = podman("exec", probe.container, *probe.argv)
        assert out.returncode == 0, (probe.kind, probe.container, out.stderr)
    status = {r.name: r for r in platform.status()}
    for name in ("postgres", "s3"):
        assert status[name].healthy and "readiness probe passes" in status[name].detail, status[name].detail
    assert len(status["adapter"].extra["translations"]) == len(plan.translations)
    # up again: nothing changed, the running pods are reused
    rows = platform.up()
    assert "reused" in rows[0].detail, rows[0].detail


def test_ports_are_published_on_loopback_only(platform: PodmanPlatform) -> None:
    plan = platform._names()
    assert plan is not None
    pods = {p.name: p for p in plan.pods}
    for port in plan.ports:
        (container,) = pods[port.pod].containers()
        out = podman("port", container).stdout
        assert out.strip() and all(line.split("-> ")[1].startswith("127.0.0.1:") for line in out.splitlines()), out


BYTES = {"Mi": 2**20, "Gi": 2**30}


def test_the_manifests_limits_and_security_context_apply(platform: PodmanPlatform) -> None:
    # read back from podman and from the kernel (/proc/<pid>/status of each container's first process), not the plan
    plan = platform._names()
    assert plan is not None
    for pod in plan.pods:
        (spec,) = pod.manifest["spec"]["containers"]
        container = f"{pod.name}-{spec['name']}"
        limit = spec["resources"]["limits"]["memory"]
        assert int(podman("inspect", container, "--format", "{{.HostConfig.Memory}}").stdout) == (
            int(limit[:-2]) * BYTES[limit[-2:]]
        ), (container, limit)
        pid = podman("inspect", container, "--format", "{{.State.Pid}}").stdout.strip()
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        assert status["NoNewPrivs"] == "1", container  # allowPrivilegeEscalation: false
        assert status["Seccomp"] == "2", container  # seccompProfile RuntimeDefault: a filter is on
        if spec["securityContext"].get("capabilities", {}).get("drop") == ["ALL"]:
            assert int(status["CapEff"], 16) == int(status["CapBnd"], 16) == 0, container


def test_a_wrong_password_is_refused(platform: PodmanPlatform) -> None:
    ep = platform.endpoints()
    assert postgres.ping(ep.pg, ep.pg.dbname)
    with pytest.raises(KitError, match="refused the password"):
        postgres.ping(dataclasses.replace(ep.pg, password="wrong"), ep.pg.dbname)


def test_anonymous_and_wrongly_signed_s3_requests_are_refused(platform: PodmanPlatform) -> None:
    ep = platform.endpoints()
    assert "lake" in s3.list_buckets(ep.s3)
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{ep.s3.url}/lake", timeout=5)
    assert 400 <= info.value.code < 500
    with pytest.raises(KitError):
        s3.list_buckets(dataclasses.replace(ep.s3, secret="wrong"))


def test_data_survives_a_killed_postgres_and_a_replayed_pod(platform: PodmanPlatform) -> None:
    with postgres.connect(platform.endpoints().pg) as conn:
        conn.execute("create table survives(x int)")
        conn.execute("insert into survives values (42)")
    container = f"{platform.prefix}postgres-0-postgres"
    pid = int(podman("inspect", container, "--format", "{{.State.Pid}}").stdout)
    os.kill(pid, signal.SIGKILL)  # a crash, not `podman kill` (which counts as stopped by the user: no restart)
    deadline = time.monotonic() + 60
    while True:
        try:
            assert query(platform, "select x from survives") == [(42,)]
            break
        except KitError:
            assert time.monotonic() < deadline, "PostgreSQL did not come back after SIGKILL"
            time.sleep(0.5)
    assert int(podman("inspect", container, "--format", "{{.RestartCount}}").stdout) >= 1
    # the catalog's pod deleted, the other left running (kube play --replace failed on exactly this): up plays both
    assert podman("pod", "rm", "--force", f"{platform.prefix}postgres-0").returncode == 0
    assert "played" in platform.up()[0].detail
    assert query(platform, "select x from survives") == [(42,)]
    # down removes the pods, up plays them again: the volumes still hold the rows and the buckets
    assert any("removed" in m for m in platform.down())
    assert podman("pod", "exists", f"{platform.prefix}postgres-0").returncode != 0
    platform.up()
    assert query(platform, "select x from survives") == [(42,)]
    assert "lake" in s3.list_buckets(platform.endpoints().s3)


def test_another_state_folder_shares_no_name_and_its_reset_leaves_ours(
    platform: PodmanPlatform, tmp_path: Path
) -> None:
    other = PodmanPlatform(State(tmp_path), pg_port=free_port(), s3_port=free_port())
    assert other.prefix != platform.prefix
    assert other.reset() == []  # never set up there: nothing of ours (or anyone's) is touched
    plan = platform._names()
    assert plan is not None
    assert all(podman("pod", "exists", p.name).returncode == 0 for p in plan.pods)
    assert all(podman("volume", "exists", v.name).returncode == 0 for v in plan.volumes)
