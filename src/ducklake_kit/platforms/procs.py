"""Supervised background processes: start detached, remember them in pid files, check, stop.

A pid file records the pid AND the process start time, so a recycled pid is never mistaken for
ours (a stale pid file is replaced, and `down` stops exactly the processes the kit started).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

import psutil

from ducklake_kit.errors import KitError, first_line

T = TypeVar("T")

# the libraries the long-running processes (the plane's scheduler and workers, the console) load: another version
# under them is other code too
_LOADED = ("duckdb", "dask", "distributed", "nicegui", "sqlglot")


@functools.cache
def code_fingerprint(root: Path | None = None) -> str:
    """What a long-running process the kit starts would run now: a hash of the kit's own source files (its .py and
    data files) and of the versions of the Python and the libraries it loads. A process started under another
    fingerprint runs code that is no longer here (a `git pull`, an upgrade): `up` and `console` start it anew rather
    than reuse it, since the old code would take the new code's tasks (a worker given arguments its old functions do
    not know fails each task)."""
    root = root or Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(sys.version.encode())
    for name in _LOADED:
        try:
            digest.update(f"{name}=={importlib.metadata.version(name)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{name} absent".encode())
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".json", ".sql") and p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@dataclass
class PidRecord:
    service: str
    pid: int
    create_time: float
    port: int
    argv0: str

    def process(self) -> psutil.Process | None:
        """The live process this record describes, or None when it is gone (the record is stale)."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) > 0.5 or proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None


def read_pid(path: Path) -> PidRecord | None:
    try:
        return PidRecord(**json.loads(path.read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def live_pid(path: Path) -> PidRecord | None:
    """The record if its process is alive, else None (a stale file is left for the caller to replace)."""
    rec = read_pid(path)
    return rec if rec and rec.process() else None


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something already listens on host:port (a TIME_WAIT leftover does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def ephemeral_range() -> tuple[int, int] | None:
    """Linux's range of source ports for outgoing connections (any client may hold one of these for a while)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return None


def port_holder(port: int) -> str:
    """Who holds a loopback port: a program listening on it, or a connection using it as its source port."""
    try:
        conns = [c for c in psutil.net_connections("inet") if c.laddr and c.laddr.port == port]
    except psutil.Error:
        conns = []
    for c in conns:
        if c.status == psutil.CONN_LISTEN:
            name = None
            if c.pid:
                try:
                    name = psutil.Process(c.pid).name()
                except psutil.Error:
                    pass
            return f"{name} (pid {c.pid}) listens on it" if name else "a program listens on it"
    for c in conns:
        if c.raddr:
            return (
                f"a connection from {c.laddr.ip}:{port} to {c.raddr.ip}:{c.raddr.port} ({c.status}) uses it as "
                "its source port"
            )
    return "it is bound"


def busy_port(port: int, what: str, option: str) -> KitError | None:
    """None when `port` is free; else the one line that says who holds it and how to choose another."""
    if not port_in_use(port):
        return None
    holder = port_holder(port)
    span = ephemeral_range()
    inside = span is not None and span[0] <= port <= span[1]
    note = (
        f"; {port} lies in Linux's ephemeral range {span[0]}-{span[1]}, where any outgoing connection may take it "
        "as its source port"
        if inside
        else ""
    )
    fix = (
        f"choose a port below {span[0]} with {option}"
        if inside
        else f"stop that program or choose another port with {option}"
    )
    return KitError(f"port {port} for {what} is already in use by another program ({holder}{note})", fix)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log yet)"
    return "\n".join(text[-lines:]) or "(log is empty)"


def _preexec(user: str | None, umask: int | None) -> Callable[[], None] | None:
    """A preexec function that sets the umask (files the server creates) and drops root to `user` (PostgreSQL
    refuses to run as root)."""
    if user is None and umask is None:
        return None
    entry = pwd.getpwnam(user) if user is not None else None

    def preexec() -> None:
        if umask is not None:
            os.umask(umask)
        if entry is not None:
            os.setgid(entry.pw_gid)
            os.setgroups([])
            os.setuid(entry.pw_uid)

    return preexec


@dataclass(frozen=True)
class Launch:
    """How `start` runs a process, besides its argv: `env` added to the kit's environment, `run_as` a user to switch
    to (the kit runs as root), `umask` for the files and folders it creates (0o077: only their owner may read them),
    `cwd` its working folder."""

    env: dict[str, str] | None = None
    run_as: str | None = None
    umask: int | None = None
    cwd: Path | None = None


def start(
    service: str,
    argv: list[str],
    *,
    pid_file: Path,
    log_file: Path,
    port: int,
    how: Launch = Launch(),
) -> tuple[PidRecord, subprocess.Popen]:
    """Start `argv` in its own session (it outlives the CLI), output appended to `log_file`, as `how` says."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        log.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {service} on port {port}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # not killed with the terminal that ran `up`
            env={**os.environ, **(how.env or {})},
            preexec_fn=_preexec(how.run_as, how.umask),  # noqa: PLW1509 - setgid/setuid/umask only, no lock taken
            close_fds=True,
            cwd=how.cwd,
        )
    rec = PidRecord(service, proc.pid, psutil.Process(proc.pid).create_time(), port, Path(argv[0]).name)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(json.dumps(asdict(rec)))
    return rec, proc


def stop(pid_file: Path, *, sig: int = signal.SIGTERM, timeout: float = 20.0) -> str:
    """Stop the process in `pid_file` (only if it is still the one we started); remove the file."""
    return stop_all([pid_file], sig=sig, timeout=timeout)[0]


def stop_all(pid_files: list[Path], *, sig: int = signal.SIGTERM, timeout: float = 20.0) -> list[str]:
    """`stop` for several processes at once: signal all of them, then wait for each (they shut down in parallel)."""
    signalled: list[tuple[Path, PidRecord | None, psutil.Process | None]] = []
    for pid_file in pid_files:
        rec = read_pid(pid_file)
        proc = rec.process() if rec else None
        if proc is not None:
            try:
                proc.send_signal(sig)
            except psutil.NoSuchProcess:  # it exited in the meantime
                proc = None
        signalled.append((pid_file, rec, proc))
    msgs = []
    for pid_file, rec, proc in signalled:
        if rec is None:
            msgs.append("not running")
            continue
        msg = "not running (stale pid file removed)"
        if proc is not None:
            try:
                wait_exited(proc, timeout)
                msg = f"stopped (pid {rec.pid})"
            except psutil.TimeoutExpired:
                proc.kill()
                wait_exited(proc, 5)
                msg = f"killed after {timeout:.0f}s (pid {rec.pid})"
        pid_file.unlink(missing_ok=True)
        msgs.append(msg)
    return msgs


def wait_exited(proc: psutil.Process, timeout: float) -> None:
    """Wait until `proc` has exited: gone, or a zombie its parent has not reaped yet (it holds no port and no file
    then). A process the kit started in an earlier command is init's child, and an init that reaps late (PID 1 of
    some containers, and of the machine this was measured on: ~1.8 s after the exit) would otherwise add that to
    every stop, as `psutil.Process.wait` sees the zombie as running. Our own child is reaped. Raises
    psutil.TimeoutExpired."""
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        try:
            if not proc.is_running():  # gone (is_running also notices another process now holding its pid)
                return
            if proc.status() == psutil.STATUS_ZOMBIE:
                with contextlib.suppress(psutil.Error):
                    proc.wait(0)  # reaps it if it is our child; else its parent will
                return
        except psutil.NoSuchProcess:
            return
        if time.monotonic() >= deadline:
            raise psutil.TimeoutExpired(timeout, proc.pid)
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` is still alive (a zombie is not, as in `wait_exited`)."""
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                return True
        except (ProcessLookupError, psutil.Error):
            continue  # it ended while we looked
    return False


def end_group(pgid: int, grace: float) -> None:
    """End process group `pgid` (e.g. a load and its Spark: the JVM and its Python workers): SIGTERM, then SIGKILL to
    what is left after `grace` seconds; returns once none of it is alive (or after SIGKILL's own grace)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return
            time.sleep(0.1)


class GiveUp(Exception):
    """Raised by a `wait_until` check that knows waiting longer cannot help: `wait_until` raises its `error`."""

    def __init__(self, error: KitError):
        super().__init__(error.what)
        self.error = error


def wait_until(
    check: Callable[[], T | None],
    *,
    what: str,
    timeout: float,
    proc: subprocess.Popen | None = None,
    log_file: Path | None = None,
    fix: str = "",
) -> T:
    """Poll `check` (None or an exception = not yet) until it returns a value, with a deadline; a check that
    raises `GiveUp` ends the wait at once with its error.

    Fails early when the process we are waiting for exits, and shows the reason and the log's tail.
    """
    deadline = time.monotonic() + timeout
    delay = 0.05
    last_error = "no answer yet"
    while True:
        try:
            value = check()
            if value is not None:
                return value
        except GiveUp as give_up:
            raise give_up.error from None
        except Exception as exc:  # noqa: BLE001 - any failure of the probe means "not ready yet"
            last_error = f"{type(exc).__name__}: {first_line(exc)}"
        exited = proc is not None and proc.poll() is not None
        if exited or time.monotonic() > deadline:
            reason = (
                f"exited with code {proc.returncode}" if exited else f"not ready after {timeout:.0f}s ({last_error})"
            )
            detail = f"last lines of {log_file}:\n{log_tail(log_file)}" if log_file else ""
            raise KitError(f"{what} {reason}", fix or (f"read {log_file}" if log_file else ""), detail=detail)
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def dir_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total
