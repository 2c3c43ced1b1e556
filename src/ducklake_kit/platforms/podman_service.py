"""podman's Docker-compatible API on a unix socket: what testcontainers (through the Docker SDK) talks to where no
Docker engine runs (`just test-containers`, DUCKLAKE_TEST_BACKEND=containers).

`podman system service --time=0 unix://<folder>/podman.sock` runs with the kit's containers.conf, on a unix socket
in a folder only its owner may enter (0700): never on TCP, so nothing off this machine, and no other user on it,
reaches an API that can start root containers. `run` starts it, runs one command with DOCKER_HOST pointing at it,
then removes every container that command left labelled with that DOCKER_HOST and stops the service, also when the
command fails or is interrupted.

    python -m ducklake_kit.platforms.podman_service -- pytest tests/lake   # what `just test-containers` runs
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ducklake_kit.errors import EXIT_ERROR, KitError
from ducklake_kit.platforms import podman_doctor, procs
from ducklake_kit.platforms.podman_doctor import podman_env

SOCKET = "podman.sock"
PID_FILE = "podman-service.pid"
LOG_FILE = "podman-service.log"
# the label a client of the service puts on its containers (tests/conftest.py's ContainerStack): `run` removes the
# ones still there when its command ends, whatever became of the command
LABEL = "ducklake-kit.docker-host"
START_TIMEOUT = 30.0
CHILD_GRACE = 120.0  # how long an interrupted command may take to clean up (the stack's teardown) before a kill


@dataclass(frozen=True)
class Service:
    folder: Path
    pid: int

    @property
    def socket(self) -> Path:
        return self.folder / SOCKET

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    def client_env(self) -> dict[str, str]:
        """What a Docker client (testcontainers) needs to use this service and nothing else."""
        return {
            "DOCKER_HOST": self.docker_host,
            # Ryuk, testcontainers' reaper, is an image on Docker Hub that cannot be pulled here; `run` reaps instead
            "TESTCONTAINERS_RYUK_DISABLED": "true",
            # the engine runs on this machine: containers' published ports are on its loopback
            "TESTCONTAINERS_CONNECTION_MODE": "docker_host",
            "TC_HOST": "127.0.0.1",
        }


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def ping(sock: Path, timeout: float = 5.0) -> bool:
    """True when the Docker API on `sock` answers `GET /_ping` with OK."""
    conn = _UnixConnection(sock, timeout)
    try:
        conn.request("GET", "/_ping")
        resp = conn.getresponse()
        return resp.status == 200 and resp.read().strip() == b"OK"
    except OSError:
        return False
    finally:
        conn.close()


def start(folder: Path) -> Service:
    """Start the service on `<folder>/podman.sock` (the folder is made 0700) and wait until its API answers."""
    podman_doctor.run(["podman", "--version"], "podman", timeout=30)  # missing: one line with the install hint
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    sock = folder / SOCKET
    if sock.exists():
        raise KitError(f"{sock} exists: a podman service may already run there", f"run `stop` on {folder} first")
    log = folder / LOG_FILE
    rec, proc = procs.start(
        "podman-service",
        ["podman", "system", "service", "--time=0", f"unix://{sock}"],
        pid_file=folder / PID_FILE,
        log_file=log,
        port=0,
        how=procs.Launch(env={"CONTAINERS_CONF": podman_env()["CONTAINERS_CONF"]}),
    )
    try:
        procs.wait_until(
            lambda: True if ping(sock, timeout=2.0) else None,
            what=f"podman's API service on {sock}",
            timeout=START_TIMEOUT,
            proc=proc,
            log_file=log,
            fix=f"read {log}; `podman info` must work with CONTAINERS_CONF={podman_doctor.CONTAINERS_CONF}",
        )
    except KitError:
        stop(folder)
        raise
    return Service(folder, rec.pid)


def stop(folder: Path) -> str:
    """Stop the service started in `folder` (only the process the pid file names) and remove its socket."""
    msg = procs.stop(folder / PID_FILE, timeout=20.0)
    (folder / SOCKET).unlink(missing_ok=True)
    return msg


def remove_labelled(service: Service) -> list[str]:
    """Remove (with their anonymous volumes) the containers labelled with this service's DOCKER_HOST; their ids."""
    label = f"label={LABEL}={service.docker_host}"
    out = podman_doctor.run(["podman", "ps", "--all", "--quiet", "--filter", label], "podman ps", timeout=60)
    ids = out.stdout.decode().split()
    if ids:
        podman_doctor.run(["podman", "rm", "--force", "--volumes", *ids], "podman rm", timeout=120)
    return ids


def _raise_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through `run`'s finally: the containers go, the service stops


def _wait(proc: subprocess.Popen) -> int:
    """The command's exit code. Interrupted, it gets time to clean up after itself (pytest tears its fixtures down,
    removing the containers) before it is killed: a Ctrl-C reached it already (one process group), a SIGTERM did
    not, so it gets the Ctrl-C's SIGINT; a second signal during its teardown would cut the teardown short."""
    try:
        return proc.wait()
    except BaseException as exc:
        if proc.poll() is None:
            if not isinstance(exc, KeyboardInterrupt):
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(CHILD_GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise


def run(argv: Sequence[str], folder: Path | None = None) -> int:
    """Run `argv` with the service's client environment; its exit code. Cleans up whatever happens to `argv`."""
    if not argv:
        raise KitError("no command to run", "give one after `--`, e.g. `-- pytest tests/lake`")
    own = folder is None
    folder = folder or Path(tempfile.mkdtemp(prefix="ducklake-podman-service-"))
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        service = start(folder)
        print(f"podman API service: {service.docker_host} (pid {service.pid})", file=sys.stderr)
        try:
            return _wait(subprocess.Popen(list(argv), env={**os.environ, **service.client_env()}))
        finally:
            left = remove_labelled(service)
            if left:
                print(f"removed {len(left)} container(s) the command left: {' '.join(left)}", file=sys.stderr)
    finally:
        print(f"podman API service: {stop(folder)}", file=sys.stderr)
        signal.signal(signal.SIGTERM, previous)
        if own:
            shutil.rmtree(folder, ignore_errors=True)


def main(args: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if args is None else args)
    if args[:1] == ["--"]:
        args = args[1:]
    try:
        return run(args)
    except KitError as exc:
        print(exc.line(), file=sys.stderr)
        if exc.detail:
            print(exc.detail, file=sys.stderr)
        return exc.exit_code or EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
