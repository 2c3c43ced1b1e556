"""podman's Docker API service (platforms/podman_service.py) for real: it answers on a private unix socket and on no
TCP port, `stop` ends exactly it, and `run` removes the containers its command left even when the command fails.
Skipped with the reason where podman is absent."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.platforms import podman_images, podman_service
from ducklake_kit.platforms.podman_doctor import podman_env

pytestmark = [
    pytest.mark.service,
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (docs/podman.md)"),
]


def labelled(docker_host: str) -> list[str]:
    out = subprocess.run(
        ["podman", "ps", "--all", "--quiet", "--filter", f"label={podman_service.LABEL}={docker_host}"],
        capture_output=True,
        text=True,
        env=podman_env(),
        check=True,
        timeout=60,
    )
    return out.stdout.split()


def test_the_api_answers_on_a_private_unix_socket_only_and_stop_ends_it(tmp_path):
    folder = tmp_path / "svc"
    service = podman_service.start(folder)
    try:
        assert podman_service.ping(service.socket)
        assert folder.stat().st_mode & 0o777 == 0o700
        proc = psutil.Process(service.pid)
        assert [c for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN] == []
        assert service.client_env()["DOCKER_HOST"] == f"unix://{folder}/podman.sock"
    finally:
        msg = podman_service.stop(folder)
    assert msg.startswith("stopped"), msg
    assert not service.socket.exists()
    assert not psutil.pid_exists(service.pid) or psutil.Process(service.pid).status() == psutil.STATUS_ZOMBIE
    assert not podman_service.ping(service.socket)


def test_run_removes_the_containers_a_failing_command_left(tmp_path):
    image = podman_images.base_image()
    if not podman_images.exists(image):
        pytest.skip(f"the kit's base image {image} is not built (`just up podman` builds it)")
    # through the Docker API, as testcontainers does: a labelled container left behind, then a failure
    made = tmp_path / "made"
    child = (
        "import os, docker, pathlib; from ducklake_kit.platforms.podman_service import LABEL; "
        f"c = docker.from_env().containers.create({image!r}, 'true', labels={{LABEL: os.environ['DOCKER_HOST']}}); "
        f"pathlib.Path({str(made)!r}).write_text(c.id); raise SystemExit(7)"
    )
    folder = tmp_path / "svc"
    assert podman_service.run([sys.executable, "-c", child], folder) == 7
    container = made.read_text()
    assert container, "the command made no container"
    exists = subprocess.run(["podman", "container", "exists", container], env=podman_env(), timeout=60)
    assert exists.returncode == 1, f"{container} is still there"
    assert labelled(f"unix://{folder}/podman.sock") == []
    assert not (folder / "podman.sock").exists()


def test_run_without_a_command_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(KitError, match="no command to run"):
        podman_service.run([], tmp_path / "svc")
    assert not (tmp_path / "svc").exists()


def test_a_sigterm_lets_the_command_clean_up_then_reaps_and_stops_the_service(tmp_path):
    image = podman_images.base_image()
    if not podman_images.exists(image):
        pytest.skip(f"the kit's base image {image} is not built (`just up podman` builds it)")
    made, cleaned = tmp_path / "made", tmp_path / "cleaned"
    # the command makes a labelled container, says so, and waits; Ctrl-C's SIGINT is its cue to clean up
    child = (
        "import os, signal, time, docker, pathlib; from ducklake_kit.platforms.podman_service import LABEL\n"
        f"c = docker.from_env().containers.create({image!r}, 'true', labels={{LABEL: os.environ['DOCKER_HOST']}})\n"
        f"signal.signal(signal.SIGINT, lambda *a: (pathlib.Path({str(cleaned)!r}).write_text('yes'), os._exit(2)))\n"
        f"pathlib.Path({str(made)!r}).write_text(os.environ['DOCKER_HOST'] + ' ' + c.id)\n"
        "time.sleep(120)"
    )
    runner = subprocess.Popen(
        [sys.executable, "-m", "ducklake_kit.platforms.podman_service", "--", sys.executable, "-c", child],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(600):
            if made.exists() and made.read_text():
                break
            assert runner.poll() is None, runner.stderr.read()
            time.sleep(0.1)
        docker_host, container = made.read_text().split()
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(60) == 128 + signal.SIGTERM
    finally:
        if runner.poll() is None:
            runner.kill()
    assert cleaned.read_text() == "yes"
    exists = subprocess.run(["podman", "container", "exists", container], env=podman_env(), timeout=60)
    assert exists.returncode == 1, f"{container} is still there"
    assert not Path(docker_host.removeprefix("unix://")).parent.exists()
