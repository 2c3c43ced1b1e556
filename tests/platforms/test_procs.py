"""Supervised processes: pid files, start/stop, readiness, ports."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import psutil
import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.platforms import procs


def test_stale_pid_file_is_detected_and_never_kills_a_stranger(tmp_path):
    # a live process that is NOT the one recorded (same pid, other start time) must be treated as stale
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid_file = tmp_path / "svc.pid.json"
        pid_file.write_text(
            json.dumps({"service": "svc", "pid": stranger.pid, "create_time": 1.0, "port": 1, "argv0": "x"})
        )
        assert procs.live_pid(pid_file) is None
        assert procs.stop(pid_file).startswith("not running")
        assert stranger.poll() is None, "stop() killed a process the kit did not start"
        assert not pid_file.exists()
    finally:
        stranger.kill()
        stranger.wait()


def test_start_and_stop_a_real_process(tmp_path):
    pid_file, log = tmp_path / "s.pid.json", tmp_path / "s.log"
    rec, proc = procs.start(
        "s",
        [sys.executable, "-c", "print('hello', flush=True); import time; time.sleep(60)"],
        pid_file=pid_file,
        log_file=log,
        port=1,
    )
    assert procs.live_pid(pid_file) == rec
    procs.wait_until(lambda: "hello" in log.read_text() or None, what="s", timeout=10, proc=proc)
    assert procs.stop(pid_file).startswith("stopped")
    proc.wait(5)
    assert procs.live_pid(pid_file) is None


def test_a_stopped_process_counts_as_exited_before_init_reaps_it():
    # a process started by an earlier command is init's child; here PID 1 reaps ~1.8 s after the exit, and a stop
    # that waited for the pid to vanish paid that every time: the zombie holds no port or file, so it has exited
    started = subprocess.run(["bash", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
    proc = psutil.Process(int(started.stdout))
    assert proc.ppid() != os.getpid()
    t = time.monotonic()
    proc.terminate()
    procs.wait_exited(proc, 10)
    assert time.monotonic() - t < 1.0
    assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE


def test_waiting_reaps_our_own_child_and_gives_up_on_a_live_process():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc = psutil.Process(child.pid)
    with pytest.raises(psutil.TimeoutExpired):
        procs.wait_exited(proc, 0.2)  # still running
    proc.terminate()
    procs.wait_exited(proc, 10)
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)  # already reaped: no zombie left behind


def test_a_process_group_ends_whole_and_one_that_ignores_sigterm_is_killed():
    # a leader and a grandchild in a group of their own (as a console load and its Spark JVM); the grandchild
    # ignores SIGTERM, so only the SIGKILL after the grace period ends it
    script = "trap '' TERM; sleep 60 & wait"
    leader = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(psutil.Process(leader.pid).children()) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    members = [psutil.Process(leader.pid), *psutil.Process(leader.pid).children(recursive=True)]
    assert procs.group_alive(leader.pid) and all(os.getpgid(p.pid) == leader.pid for p in members)
    t = time.monotonic()
    procs.end_group(leader.pid, 0.5)
    assert 0.5 <= time.monotonic() - t < 5  # it waited out the grace, then killed
    assert not procs.group_alive(leader.pid)  # zombies not reaped yet count as gone
    leader.wait(5)


def test_wait_until_reports_an_exited_process_with_its_log(tmp_path):
    log = tmp_path / "x.log"
    _, proc = procs.start(
        "x",
        [sys.executable, "-c", "import sys; print('cannot bind'); sys.exit(7)"],
        pid_file=tmp_path / "x.pid.json",
        log_file=log,
        port=1,
    )
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


def test_the_default_ports_lie_below_linuxs_ephemeral_range():
    """An outgoing connection may take any port of 32768-60999 as its source port, and `up` then failed for minutes
    on a port nothing listened on: the defaults stay below that range."""
    from ducklake_kit.platforms import spark_cluster, state

    defaults = {
        name: getattr(mod, name)
        for mod in (state, spark_cluster)
        for name in dir(mod)
        if name.endswith("_PORT") and isinstance(getattr(mod, name), int)
    }
    assert len(defaults) >= 9, defaults
    low = (procs.ephemeral_range() or (32768, 60999))[0]
    assert {name: port for name, port in defaults.items() if port >= low} == {}


def test_a_port_held_as_a_clients_source_port_is_named_so():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        target = server.getsockname()[1]
        with socket.socket() as client:
            client.bind(("127.0.0.1", 0))  # the kernel's pick, from the ephemeral range, as for any client
            source = client.getsockname()[1]
            client.connect(("127.0.0.1", target))
            busy = procs.busy_port(source, "S3 (rclone)", "--s3-port or DUCKLAKE_S3_PORT")
    assert busy is not None
    span = procs.ephemeral_range()
    inside = (
        f"; {source} lies in Linux's ephemeral range {span[0]}-{span[1]}, where any outgoing connection may take "
        "it as its source port"
        if span and span[0] <= source <= span[1]
        else ""
    )
    assert busy.what == (
        f"port {source} for S3 (rclone) is already in use by another program (a connection from "
        f"127.0.0.1:{source} to 127.0.0.1:{target} (ESTABLISHED) uses it as its source port{inside})"
    )
    assert busy.fix.endswith("with --s3-port or DUCKLAKE_S3_PORT")


def test_a_free_port_is_not_busy():
    assert procs.busy_port(procs.free_port(), "x", "y") is None
