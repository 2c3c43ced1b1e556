"""The lake console's process (`console`): one web server per state folder, on 127.0.0.1 and a free port, supervised
as PostgreSQL, S3 and the worker plane are (a pid file with the start time, a log in the state folder, ready only
after a real round trip, `down` stops exactly it).

Its token is made anew at each start and written 0600 to `<state>/console/token`; what the server needs to reach the
lake and the plane (the endpoints, the plane's address and client TLS files) goes 0600 into the same private folder.
Neither is ever in a process's arguments, environment or log: the server reads them from the folder by path. When
the kit runs as root the server runs as the service user (as the plane's processes do) and owns that folder.
The server itself (the pages, the token gate) is `ducklake_kit.console`.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from ducklake_kit.errors import KitError
from ducklake_kit.platforms import procs
from ducklake_kit.platforms.service_user import check_reachable, make_python_reachable, service_user
from ducklake_kit.platforms.state import State, write_private

SERVICE = "console"  # its pid and log file names
READY_TIMEOUT_S = float(os.environ.get("DUCKLAKE_READY_TIMEOUT", "60"))
HEALTH_PATH = "/_console/health"  # answers 200 to a request with the token, 401 without


@dataclass
class ConsoleStatus:
    running: bool
    detail: str
    pid: int | None = None
    port: int | None = None
    user: str | None = None  # the user the server runs as

    @property
    def address(self) -> str | None:
        """The console's URL without its token."""
        return f"http://127.0.0.1:{self.port}/" if self.port else None

    def as_dict(self, state: State) -> dict[str, Any]:
        return {
            "running": self.running,
            "detail": self.detail,
            "pid": self.pid,
            "port": self.port,
            "url": self.address,
            "token_file": str(token_file(state)),
            "user": self.user,
        }


def folder(state: State) -> Path:
    """The server's private folder: its token, its settings (endpoints, TLS files), its cwd and HOME."""
    return state.home / "console"


def token_file(state: State) -> Path:
    return folder(state) / "token"


def settings_file(state: State) -> Path:
    return folder(state) / "settings.json"


def read_token(state: State) -> str | None:
    try:
        return token_file(state).read_text().strip() or None
    except FileNotFoundError:
        return None


def url_with_token(status: ConsoleStatus, token: str) -> str:
    return f"{status.address}?token={token}"


def _ping(port: int, token: str) -> bool | None:
    """A real round trip: the server answers the health path, and only because the token came with the request."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{HEALTH_PATH}", headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=2) as resp:
        return resp.status == 200 or None


class _Assets(HTMLParser):
    """The page's own scripts, styles and fonts (NiceGUI's static files: /_nicegui/...)."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.paths += [v for k, v in attrs if k in ("src", "href") and v and v.startswith("/_nicegui/")]


def _warmed(port: int, token: str) -> bool:
    """The server made its first connections to the plane and the lake (or found it could not)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{HEALTH_PATH}", headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=2) as resp:
        return json.loads(resp.read()).get("warm") is True


def _warm(port: int, token: str) -> None:
    """Before the URL is printed: the server's own first connections to the plane and the lake (seconds of CPU that
    would slow the first page), then the Query page and the files it loads, asked for once (a server's first page
    build: NiceGUI's templates and elements, this server's imports, 0.5-1.5 s here under load). Best effort: the
    health check proved the server answers, and a page says itself what is wrong."""
    headers = {"Authorization": f"token {token}"}
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while not _warmed(port, token) and time.monotonic() < deadline:
            time.sleep(0.1)
        with urllib.request.urlopen(
            urllib.request.Request(f"http://127.0.0.1:{port}/", headers=headers), timeout=30
        ) as r:
            assets = _Assets()
            assets.feed(r.read().decode("utf-8", "replace"))
        for path in dict.fromkeys(assets.paths):
            with urllib.request.urlopen(
                urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers), timeout=30
            ) as r:
                r.read()
    except (OSError, ValueError):  # urllib's errors are OSErrors; ValueError: a health answer that is not JSON
        pass  # the page says what is wrong when the user opens it


def _private_folder(path: Path, run_as: str | None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    if run_as:
        entry = pwd.getpwnam(run_as)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def _give(paths: list[Path], run_as: str | None) -> None:
    if run_as:
        entry = pwd.getpwnam(run_as)
        for p in paths:
            os.chown(p, entry.pw_uid, entry.pw_gid)


def _copy_tls(state: State, tls: dict[str, str | None] | None, run_as: str | None) -> dict[str, str | None] | None:
    """The plane's client TLS files, copied into the console's folder (0600, the server's user's): as root the kit's
    client key is root's alone, and the server runs as the service user."""
    if not tls:
        return None
    out: dict[str, str | None] = {}
    for key, src in tls.items():
        if not src:
            out[key] = None
            continue
        dest = folder(state) / "tls" / f"{key}.pem"
        _private_folder(dest.parent, run_as)
        write_private(dest, Path(src).read_text())
        _give([dest], run_as)
        out[key] = str(dest)
    return out


def start(state: State, settings: dict[str, Any]) -> tuple[ConsoleStatus, str]:
    """Start the console unless it runs and answers (then it is reused, with its token). `settings`: what the server
    needs, {"platform", "endpoints", "plane": {"address", "tls": {"ca_file", "cert", "key"} | None}}, written 0600
    for it. Returns its status and its token."""
    state.ensure_dirs()
    with state.lock():
        pid_file, log_file = state.pid_file(SERVICE), state.log_file(SERVICE)
        rec = procs.live_pid(pid_file)
        token = read_token(state)
        stale = bool(rec and token and _started_code(state) != procs.code_fingerprint())
        if stale:
            token = None  # it runs code that is no longer here (a pull, an upgrade): replaced below
        if rec and token:
            try:
                procs.wait_until(
                    lambda: _ping(rec.port, token), what=f"the console (pid {rec.pid})", timeout=10, log_file=log_file
                )
                return ConsoleStatus(True, "already running, reused", rec.pid, rec.port, _owner(rec)), token
            except KitError:
                pass  # alive but not answering: replaced below
        procs.stop(pid_file)
        run_as = service_user()  # None unless the kit runs as root
        if run_as:
            make_python_reachable(run_as)
            check_reachable(folder(state), run_as, "the console")
        shutil.rmtree(folder(state), ignore_errors=True)  # the last run's token and settings go
        _private_folder(folder(state), run_as)
        token = secrets.token_urlsafe(32)
        plane = dict(settings.get("plane") or {})
        plane["tls"] = _copy_tls(state, plane.get("tls"), run_as)
        port = procs.free_port()
        write_private(token_file(state), token + "\n")
        written = {**settings, "plane": plane, "port": port, "code": procs.code_fingerprint()}
        write_private(settings_file(state), json.dumps(written, indent=2))
        _give([token_file(state), settings_file(state)], run_as)
        rec, proc = procs.start(
            SERVICE,
            [sys.executable, "-m", "ducklake_kit.console", str(folder(state))],
            pid_file=pid_file,
            log_file=log_file,
            port=port,
            how=procs.Launch(
                env={"HOME": str(folder(state)), "PYTHONUNBUFFERED": "1"}, run_as=run_as, umask=0o077, cwd=folder(state)
            ),
        )
        try:
            procs.wait_until(
                lambda: _ping(port, token),
                what=f"the console on port {port}",
                timeout=READY_TIMEOUT_S,
                proc=proc,
                log_file=log_file,
            )
        except KitError:
            procs.stop(pid_file)
            raise
        _warm(port, token)
        detail = "restarted: the kit's code changed since it started" if stale else "started"
        return ConsoleStatus(True, detail, rec.pid, port, run_as or _me()), token


def _started_code(state: State) -> str | None:
    """The code fingerprint the running console was started with (None: unknown, an older kit's)."""
    try:
        return json.loads(settings_file(state).read_text()).get("code")
    except (OSError, ValueError):
        return None


def _me() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def _owner(rec: procs.PidRecord) -> str | None:
    proc = rec.process()
    try:
        return proc.username() if proc is not None else None
    except Exception:  # noqa: BLE001 - who runs it is a detail for `status`
        return None


def status(state: State) -> ConsoleStatus:
    """Whether the console runs and answers (with its token: a request without it is refused)."""
    rec = procs.read_pid(state.pid_file(SERVICE))
    if rec is None:
        return ConsoleStatus(False, "not running (`console` starts it)")
    if rec.process() is None:
        return ConsoleStatus(False, f"not running (pid {rec.pid} is gone): `console` starts it", rec.pid, rec.port)
    token = read_token(state)
    try:
        if token and _ping(rec.port, token):
            return ConsoleStatus(True, "answers", rec.pid, rec.port, _owner(rec))
        why = "its token file is gone"
    except (OSError, urllib.error.URLError) as exc:
        why = str(getattr(exc, "reason", exc))
    return ConsoleStatus(False, f"running but not answering ({why})", rec.pid, rec.port, _owner(rec))


def stop(state: State) -> str:
    """Stop the console the kit started; its token goes with it (a new start makes a new one)."""
    if not state.run_dir.exists():
        return "console: not running"
    with state.lock():
        msg = procs.stop(state.pid_file(SERVICE))
        token_file(state).unlink(missing_ok=True)
    return f"console: {msg}"
