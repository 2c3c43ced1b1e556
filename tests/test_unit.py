"""Unit tests: no services needed."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from ducklake_kit import doctor, lake, procs
from ducklake_kit.checks import CheckRun
from ducklake_kit.errors import KitError
from ducklake_kit.output import envelope
from ducklake_kit.platforms.base import Endpoints, PgEndpoint, S3Endpoint
from ducklake_kit.platforms.external import parse_endpoints
from ducklake_kit.state import State, write_private

EP = Endpoints(PgEndpoint("127.0.0.1", 5432, "u", "p'w"), S3Endpoint("127.0.0.1:9000", "k", "s"))


def test_error_line_is_one_line_with_what_and_fix():
    assert KitError("port 5 is busy.", "use --pg-port").line() == "Error: port 5 is busy. Try: use --pg-port."
    assert KitError("boom").line() == "Error: boom."


@pytest.mark.parametrize(
    "text, major",
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('openjdk version "21" 2023-09-19', 21),
        ('java version "1.8.0_292"', 8),
        ("bash: java: command not found", None),
    ],
)
def test_java_major_parses_real_version_banners(text, major):
    assert doctor.java_major(text) == major


def test_extensions_load_from_the_pinned_wheels_not_the_internet():
    stmts = lake.load_statements()
    assert len(stmts) == 3
    assert all(s.startswith("LOAD '") and s.endswith(".duckdb_extension'") for s in stmts), stmts
    assert not any("INSTALL" in s for s in stmts)


def test_setup_sql_quotes_secrets_and_keeps_the_password_out_of_attach():
    stmts = lake.setup_statements(EP)
    secret = next(s for s in stmts if "TYPE postgres" in s)
    assert "PASSWORD 'p''w'" in secret  # a quote in a password cannot break out of the literal
    attach = next(s for s in stmts if s.startswith("ATTACH"))
    assert "p'w" not in attach and "password" not in attach.lower()
    assert "DATA_PATH 's3://lake/'" in attach
    assert stmts[-1] == "USE lake"


def test_external_dsn_url_and_keyvalue_forms():
    ep = parse_endpoints({"pg_dsn": "postgresql://me:secret@db.example:6543/cat", "s3_endpoint": "https://s3.example:9443",
                          "s3_key_id": "k", "s3_secret": "s"})
    assert (ep.pg.host, ep.pg.port, ep.pg.user, ep.pg.password, ep.pg.dbname) == ("db.example", 6543, "me", "secret", "cat")
    assert (ep.s3.endpoint, ep.s3.use_ssl, ep.s3.url) == ("s3.example:9443", True, "https://s3.example:9443")
    ep = parse_endpoints({"pg_dsn": "host=h user=u password=p", "s3_endpoint": "http://127.0.0.1:9000", "s3_key_id": "k", "s3_secret": "s"})
    assert (ep.pg.port, ep.pg.dbname, ep.s3.use_ssl) == (5432, "ducklake_catalog", False)


def test_external_dsn_without_password_is_refused():
    with pytest.raises(KitError, match="has no password"):
        parse_endpoints({"pg_dsn": "postgresql://me@db/cat", "s3_endpoint": "x:1", "s3_key_id": "k", "s3_secret": "s"})


def test_credentials_are_generated_once_and_private(tmp_path):
    state = State(tmp_path / "home")
    assert state.credentials() is None
    first = state.credentials(create=True)
    assert state.credentials(create=True) == first  # not regenerated
    assert oct(state.credentials_file.stat().st_mode & 0o777) == "0o600"
    assert len(first.pg_password) >= 24 and first.pg_password != first.s3_secret


def test_write_private_replaces_content_with_0600(tmp_path):
    path = tmp_path / "f"
    path.write_text("old")
    path.chmod(0o644)
    write_private(path, "new")
    assert path.read_text() == "new" and oct(path.stat().st_mode & 0o777) == "0o600"


def test_check_run_is_not_ok_without_checks_or_with_one_failure():
    run = CheckRun()
    assert not run.ok  # nothing checked is not a pass
    run.equal("a", 1, 1)
    assert run.ok
    run.equal("b", [1, 2], [1, 3])
    assert not run.ok and [c.name for c in run.failed] == ["b"]


def test_json_envelope_shape():
    doc = json.loads(envelope("error", {"error": "x"}))
    assert doc == {"status": "error", "result": {"error": "x"}, "catalog_info": {}}


def test_stale_pid_file_is_detected_and_never_kills_a_stranger(tmp_path):
    # a live process that is NOT the one recorded (same pid, other start time) must be treated as stale
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid_file = tmp_path / "svc.pid.json"
        pid_file.write_text(json.dumps({"service": "svc", "pid": stranger.pid, "create_time": 1.0, "port": 1, "argv0": "x"}))
        assert procs.live_pid(pid_file) is None
        assert procs.stop(pid_file).startswith("not running")
        assert stranger.poll() is None, "stop() killed a process the kit did not start"
        assert not pid_file.exists()
    finally:
        stranger.kill()
        stranger.wait()


def test_start_and_stop_a_real_process(tmp_path):
    pid_file, log = tmp_path / "s.pid.json", tmp_path / "s.log"
    rec, proc = procs.start("s", [sys.executable, "-c", "print('hello', flush=True); import time; time.sleep(60)"],
                            pid_file=pid_file, log_file=log, port=1)
    assert procs.live_pid(pid_file) == rec
    procs.wait_until(lambda: "hello" in log.read_text() or None, what="s", timeout=10, proc=proc)
    assert procs.stop(pid_file).startswith("stopped")
    proc.wait(5)
    assert procs.live_pid(pid_file) is None


def test_wait_until_reports_an_exited_process_with_its_log(tmp_path):
    log = tmp_path / "x.log"
    _, proc = procs.start("x", [sys.executable, "-c", "import sys; print('cannot bind'); sys.exit(7)"],
                          pid_file=tmp_path / "x.pid.json", log_file=log, port=1)
    start = time.monotonic()
    with pytest.raises(KitError) as err:
        procs.wait_until(lambda: None, what="x", timeout=30, proc=proc, log_file=log)
    assert time.monotonic() - start < 10, "did not notice the exit early"
    assert "exited with code 7" in err.value.what and "cannot bind" in err.value.detail


def test_wait_until_times_out_with_the_last_error():
    def probe():
        raise ConnectionRefusedError("nobody home")

    with pytest.raises(KitError, match=r"not ready after 0s \(ConnectionRefusedError: nobody home\)"):
        procs.wait_until(probe, what="svc", timeout=0.3)


def test_port_in_use_sees_a_listener():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert procs.port_in_use(s.getsockname()[1])
    assert not procs.port_in_use(procs.free_port())
