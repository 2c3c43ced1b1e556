"""The worker plane is no open door: it speaks mutual TLS, so a local process without the kit's client certificate
(plain TCP, TLS without a certificate, or a certificate of another CA) is refused at the handshake, also when it runs
as another user (`nobody`); under root its tasks do not run as root; its TLS files are private; a user's own TLS
cluster works through --scheduler with its files, and a mismatch of address and settings is one line."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ducklake_kit.platforms import procs
from ducklake_kit.platforms.service_user import SERVICE_USER, make_python_reachable
from ducklake_kit.platforms.state import State
from ducklake_kit.workers import WorkerPlane, plane, tls
from ducklake_kit.workers.client import NO_RETRIES_ENV

pytestmark = pytest.mark.integration
ROOT = os.geteuid() == 0

# A Dask client in another process: without security, with a certificate of its own CA, with the kit's files.
DASK_CLIENT = r"""
import sys
from distributed import Client
from distributed.security import Security
kind, address = sys.argv[1], sys.argv[2]
security = {"none": None, "foreign": Security.temporary()}.get(kind)
if kind == "kit":
    security = Security(tls_ca_file=sys.argv[3], tls_client_cert=sys.argv[4], tls_client_key=sys.argv[5],
                        require_encryption=True)
try:
    with Client(address, timeout=5, security=security) as c:
        print("connected", c.run_on_scheduler(lambda dask_scheduler=None: len(dask_scheduler.workers)))
except Exception as exc:
    print("refused", type(exc).__name__)
"""


@pytest.fixture(scope="module")
def kit_plane(stack):
    ep = stack.platform.endpoints()
    status = plane.up(stack.state, ep)
    assert status.healthy, status.detail
    return stack.state, status


def _run(argv: list[str], user: str | None = None) -> str:
    prefix = ["runuser", "-u", user, "--"] if user else []
    out = subprocess.run(prefix + argv, capture_output=True, text=True, timeout=60, cwd="/")
    return (out.stdout.strip().splitlines() or [out.stderr.strip()])[-1]


def test_a_dask_client_without_the_kits_certificate_is_refused(kit_plane):
    state, status = kit_plane
    assert status.address.startswith("tls://127.0.0.1:")
    plain = status.address.replace("tls://", "tcp://")
    assert _run([sys.executable, "-c", DASK_CLIENT, "none", plain]).startswith("refused")
    assert _run([sys.executable, "-c", DASK_CLIENT, "foreign", status.address]).startswith("refused")
    # the control: the same client with the kit's files gets in (so the refusals above are the certificate's doing)
    kit = tls.ClientTLS.of_kit(state)
    assert _run([sys.executable, "-c", DASK_CLIENT, "kit", status.address, kit.ca_file, kit.cert, kit.key]).startswith(
        "connected"
    )


@contextlib.contextmanager
def python_for(user: str):
    """Let `user` run this Python (as the kit lets its service user), and take that back afterwards."""
    folders = sorted(
        {p for t in (Path(sys.executable).resolve(), Path(sys.prefix), Path(__file__).resolve()) for p in t.parents}
    )
    before = {}
    for folder in folders:
        try:
            before[folder] = os.getxattr(folder, "system.posix_acl_access")
        except OSError:
            before[folder] = None
    try:
        make_python_reachable(user)
        yield sys.executable
    finally:
        for folder, acl in before.items():
            if acl is not None:
                os.setxattr(folder, "system.posix_acl_access", acl)
            else:
                with contextlib.suppress(OSError):
                    os.removexattr(folder, "system.posix_acl_access")


@pytest.mark.skipif(not ROOT, reason="runs the intruder as user nobody, which takes root (runuser)")
def test_another_local_user_with_dask_is_refused_too(kit_plane):
    """The campaign's intruder: user nobody with Dask's own client, which got root's /etc/shadow before."""
    _state, status = kit_plane
    with python_for("nobody") as python:
        plain = status.address.replace("tls://", "tcp://")
        for kind, address in (("none", plain), ("none", status.address), ("foreign", status.address)):
            assert _run([python, "-c", DASK_CLIENT, kind, address], user="nobody").startswith("refused"), kind


@pytest.mark.skipif(not ROOT, reason="the plane is demoted only when the kit runs as root")
def test_under_root_the_scheduler_and_the_tasks_do_not_run_as_root(kit_plane, stack):
    _state, status = kit_plane
    service_uid = pwd.getpwnam(SERVICE_USER).pw_uid
    with WorkerPlane(status.address, stack.platform.endpoints()) as wp:
        uids = wp.client.run(os.getuid)
        assert set(uids.values()) == {service_uid}, uids
        assert wp.client.run_on_scheduler(os.getuid) == service_uid
        # a task submitted the kit's way runs there too
        assert wp.client.submit(os.geteuid, pure=False).result(timeout=30) == service_uid
    assert status.user == SERVICE_USER


def test_the_tls_files_are_private_and_the_client_key_is_the_kits(kit_plane):
    state, _status = kit_plane
    files = sorted(tls.tls_dir(state).iterdir())
    assert [f.name for f in files] == [
        "ca.crt",
        "client.crt",
        "client.key",
        "scheduler.crt",
        "scheduler.key",
        "worker.crt",
        "worker.key",
    ]
    assert {oct(f.stat().st_mode & 0o777) for f in files} == {"0o600"}
    assert (tls.tls_dir(state) / "client.key").stat().st_uid == os.geteuid()
    if ROOT:  # the service user owns what its processes read, and nothing of the client's
        service_uid = pwd.getpwnam(SERVICE_USER).pw_uid
        assert {f.name for f in files if f.stat().st_uid == service_uid} == {
            "ca.crt",
            "scheduler.crt",
            "scheduler.key",
            "worker.crt",
            "worker.key",
        }


def test_a_plane_started_with_other_certificates_is_started_anew(stack, local_only):
    home = Path(tempfile.mkdtemp(prefix="ducklake-plane-"))
    home.chmod(0o711)
    state = State(home)
    state.save_settings(scheduler_port=procs.free_port(), dashboard_port=procs.free_port())
    ep = stack.platform.endpoints()
    try:
        first = plane.up(state, ep, 1)
        shutil.rmtree(tls.tls_dir(state))  # as after a restore, or certificates near their end
        again = plane.up(state, ep, 1)
        assert again.healthy and again.scheduler_pid != first.scheduler_pid and again.detail == "started w1"
        with WorkerPlane(again.address, ep) as wp:
            assert wp.run("SELECT 42").rows == [(42,)]
    finally:
        plane.down(state)
        shutil.rmtree(home, ignore_errors=True)


# -- a user's own TLS cluster through --scheduler -------------------------------------------------------------------


def test_a_users_tls_cluster_through_scheduler_with_its_files(stack, cli, tmp_path):
    theirs = State(tmp_path / "their-cluster")
    tls.ensure_certificates(theirs, None)  # their CA and certificates, made the kit's way for the test
    port = procs.free_port()
    address = f"tls://127.0.0.1:{port}"
    log = open(tmp_path / "dask.log", "wb")

    def dask(args: list[str], role: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "dask", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **NO_RETRIES_ENV, **tls.process_env(theirs, role)},
            start_new_session=True,
        )

    started = [
        dask(
            ["scheduler", "--protocol", "tls", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
            "scheduler",
        )
    ]
    try:
        started.append(
            dask(
                [
                    "worker",
                    address,
                    "--name",
                    "their-worker",
                    "--nthreads",
                    "1",
                    "--no-nanny",
                    "--no-dashboard",
                    "--host",
                    "127.0.0.1",
                    "--death-timeout",
                    "30",
                ],
                "worker",
            )
        )
        client = tls.ClientTLS.of_kit(theirs)
        files = {
            "DUCKLAKE_SCHEDULER_TLS_CA": client.ca_file,
            "DUCKLAKE_SCHEDULER_TLS_CERT": client.cert,
            "DUCKLAKE_SCHEDULER_TLS_KEY": client.key,
        }
        env = {**stack.env, "DUCKLAKE_SCHEDULER": address, **files}
        result = cli(env, "up", "--json")
        assert result.exit_code == 0, result.output
        up = json.loads(result.stdout)["result"]["worker_plane"]
        assert up["managed"] is False and [(w["name"], w["lake"]) for w in up["workers"]] == [
            ("their-worker", "attached")
        ]

        result = cli({**stack.env, "DUCKLAKE_SCHEDULER": address}, "workers")
        assert result.exit_code == 3, result.output
        assert result.stderr.startswith(
            f"Error: the Dask scheduler at {address} speaks TLS but no TLS settings were "
            "given. Try: set DUCKLAKE_SCHEDULER_TLS_CA,"
        )
        assert len(result.stderr.splitlines()) == 1

        plain = f"tcp://127.0.0.1:{port}"
        result = cli({**stack.env, "DUCKLAKE_SCHEDULER": plain, **files}, "workers")
        assert result.exit_code == 3, result.output
        assert result.stderr.strip() == (
            f"Error: TLS settings were given but the Dask scheduler address {plain} is "
            f"not tls://. Try: give it as tls://127.0.0.1:{port}, or drop the TLS settings."
        )
    finally:
        for p in reversed(started):
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
