"""The local platform against real PostgreSQL and rclone processes: lifecycle, faults and bad input."""

from __future__ import annotations

import json
import os
import signal
import socket
import urllib.error
import urllib.request
from dataclasses import replace

import psutil
import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.platforms import postgres, procs, s3
from ducklake_kit.platforms.local import LocalPlatform

pytestmark = pytest.mark.integration


def _pids(platform: LocalPlatform) -> dict[str, int]:
    return {name: procs.read_pid(platform.state.pid_file(name)).pid for name in ("postgres", "s3")}


def test_up_twice_reuses_the_running_services(stack, local_only):
    before = _pids(stack.platform)
    statuses = stack.platform.up()
    assert [s.detail for s in statuses] == ["already running, reused"] * 2
    assert _pids(stack.platform) == before


def test_services_listen_on_loopback_only(stack, local_only):
    for name, port in (("postgres", stack.pg_port), ("s3", stack.s3_port)):
        pid = procs.read_pid(stack.platform.state.pid_file(name)).pid
        listening = {
            c.laddr.ip for c in psutil.net_connections("inet") if c.status == "LISTEN" and c.laddr.port == port
        }
        assert listening == {"127.0.0.1"}, (name, listening, pid)


def test_secrets_are_private(stack, local_only):
    creds = stack.platform.state.credentials_file
    assert oct(creds.stat().st_mode & 0o777) == "0o600"
    assert "trust" not in (stack.platform.state.pg_data / "pg_hba.conf").read_text().split("#")[-1]
    hba_rules = [
        ln.split()
        for ln in (stack.platform.state.pg_data / "pg_hba.conf").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert hba_rules and all(rule[-1] == "scram-sha-256" for rule in hba_rules), hba_rules


def test_wrong_password_is_refused_with_one_clear_line(stack):
    bad = replace(stack.platform.endpoints().pg, password="not-the-password")
    with pytest.raises(KitError) as err:
        postgres.ping(bad)
    assert err.value.line().startswith(f"Error: PostgreSQL at {bad.host}:{bad.port} refused the password for user")
    ep = stack.platform.endpoints()
    with pytest.raises(KitError, match="refused the password"):
        Lake(replace(ep, pg=bad))


def test_s3_without_credentials_is_refused(stack):
    ep = stack.platform.endpoints()
    s3.ensure_buckets(ep.s3)
    s3.client(ep.s3).put_object(Bucket="raw", Key="probe.txt", Body=b"secret data")
    for url in (f"{ep.s3.url}/", f"{ep.s3.url}/raw/", f"{ep.s3.url}/raw/probe.txt"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url, timeout=5)  # an anonymous request, as a raw curl would send
        assert err.value.code in (400, 403), (url, err.value.code)
        assert b"secret data" not in err.value.read()
    wrong = replace(ep.s3, secret="wrong-secret")
    with pytest.raises(KitError, match="refused the credentials"):
        s3.list_buckets(wrong)


def test_buckets_are_created_idempotently(stack):
    ep = stack.platform.endpoints()
    s3.ensure_buckets(ep.s3)
    assert s3.ensure_buckets(ep.s3) == []
    assert {"lake", "raw"} <= set(s3.list_buckets(ep.s3))


def test_a_busy_port_is_named_with_the_option_to_change_it(fresh_stack):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", fresh_stack.pg_port))
        squatter.listen()
        with pytest.raises(KitError) as err:
            fresh_stack.platform.up()
    line = err.value.line()
    assert f"port {fresh_stack.pg_port} for PostgreSQL is already in use" in line and "--pg-port" in line
    assert procs.live_pid(fresh_stack.state.pid_file("postgres")) is None


def test_stale_pid_file_is_replaced(fresh_stack):
    p = fresh_stack.platform
    p.up()
    pid_file = p.state.pid_file("s3")
    procs.stop(pid_file)
    # a pid file left behind by a crash, pointing at a live process that is not ours (this test process)
    pid_file.write_text(
        json.dumps(
            {"service": "s3", "pid": os.getpid(), "create_time": 1.0, "port": fresh_stack.s3_port, "argv0": "rclone"}
        )
    )
    statuses = p.up()
    assert statuses[1].detail == "started" and statuses[1].pid != os.getpid()
    assert procs.live_pid(pid_file).pid == statuses[1].pid


def test_postgres_killed_status_says_so_and_up_recovers_without_losing_data(fresh_stack, cli):
    p = fresh_stack.platform
    p.up()
    with Lake(p.endpoints()) as lake:
        lake.run("CREATE TABLE keep AS SELECT range AS id FROM range(100)")
        version = lake.current_snapshot()
    pid = procs.read_pid(p.state.pid_file("postgres")).pid
    os.kill(pid, signal.SIGKILL)
    psutil.Process(pid).wait(10) if psutil.pid_exists(pid) else None

    result = cli(fresh_stack.env, "status")
    assert result.exit_code == 1, result.output
    assert "not running (pid" in result.output and "run `up`" in result.output

    assert p.up()[0].detail == "started"
    with Lake(p.endpoints()) as lake:
        assert lake.scalar("SELECT count(*) FROM keep") == 100
        assert lake.current_snapshot() == version


def test_data_and_snapshots_survive_down_and_up(fresh_stack):
    p = fresh_stack.platform
    p.up()
    with Lake(p.endpoints()) as lake:
        lake.run(
            "CREATE TABLE t (id INT); INSERT INTO t SELECT range FROM range(50); INSERT INTO t SELECT range FROM range(25)"
        )
        snaps = lake.con.execute("SELECT snapshot_id FROM ducklake_snapshots('lake') ORDER BY 1").fetchall()
    pids = _pids(p)
    assert p.down() == [f"s3: stopped (pid {pids['s3']})", f"postgres: stopped (pid {pids['postgres']})"]
    # exited: gone, or a zombie init has not reaped yet (it holds no port or file)
    assert not [p for p in pids.values() if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert [s.detail for s in p.up()] == ["started", "started"]
    with Lake(p.endpoints()) as lake:
        assert lake.scalar("SELECT count(*) FROM t") == 75
        assert lake.con.execute("SELECT snapshot_id FROM ducklake_snapshots('lake') ORDER BY 1").fetchall() == snaps
        assert lake.scalar(f"SELECT count(*) FROM t AT (VERSION => {snaps[-2][0]})") == 50


def test_lake_and_raw_files_are_readable_by_their_owner_only(fresh_stack, local_only):
    # issue 16: the S3 server's folders were 0755 and its files 0644, so any local user could read the Parquet
    # around S3's authentication. A state folder from before keeps working: `up` makes it private too.
    p = fresh_stack.platform
    old = p.state.s3_data / "lake" / "from-before"
    old.mkdir(parents=True)
    (old / "x.parquet").write_bytes(b"PAR1")
    os.chmod(old / "x.parquet", 0o644)
    p.up()
    with Lake(p.endpoints()) as lake:  # more rows than DuckLake inlines: a Parquet file written through S3
        lake.run("CREATE TABLE private_t AS SELECT range AS id FROM range(1000)")
    s3.ensure_buckets(p.endpoints().s3)
    modes = {}
    for folder, _dirs, files in os.walk(p.state.s3_data):
        modes[folder] = os.stat(folder).st_mode & 0o777
        modes.update({os.path.join(folder, f): os.stat(os.path.join(folder, f)).st_mode & 0o777 for f in files})
    parquet = [f for f in modes if f.endswith(".parquet") and "private_t" in f]
    assert parquet, sorted(modes)
    loose = {f: oct(m) for f, m in modes.items() if m & 0o077}
    assert loose == {}, loose


def test_down_stops_only_what_the_kit_started(fresh_stack):
    p = fresh_stack.platform
    assert p.down() == ["s3: not running", "postgres: not running"]  # never started: nothing to stop


def test_reset_wipes_the_state_folder(fresh_stack):
    p = fresh_stack.platform
    p.up()
    p.reset()
    assert not fresh_stack.home.exists()
    assert procs.live_pid(p.state.pid_file("postgres")) is None
