"""The embedded default: PostgreSQL and `rclone serve s3` as supervised processes on this machine, no Docker."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ducklake_kit.errors import KitError
from ducklake_kit.platforms import postgres, procs, s3
from ducklake_kit.platforms.base import Endpoints, PgEndpoint, Platform, S3Endpoint, ServiceStatus
from ducklake_kit.platforms.state import DEFAULT_PG_PORT, DEFAULT_S3_PORT, State

READY_TIMEOUT = float(os.environ.get("DUCKLAKE_READY_TIMEOUT", "60"))


@dataclass
class _Service:
    name: str  # "postgres" | "s3"
    label: str
    port_option: str
    stop_signal: int
    ping: Callable[[], object]


def private_tree(root: Path) -> None:
    """Folders 0700 and files 0600 under `root` (a state folder from before the S3 server ran with umask 077)."""
    if not root.stat().st_mode & 0o077:
        return  # already private: nothing to walk
    for folder, _dirs, files in os.walk(root):
        os.chmod(folder, 0o700)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o600)


class LocalPlatform(Platform):
    name = "local"

    def __init__(self, state: State | None = None, *, pg_port: int | None = None, s3_port: int | None = None):
        self.state = state or State()
        saved = self.state.settings()
        self.pg_port = int(pg_port or os.environ.get("DUCKLAKE_PG_PORT") or saved.get("pg_port") or DEFAULT_PG_PORT)
        self.s3_port = int(s3_port or os.environ.get("DUCKLAKE_S3_PORT") or saved.get("s3_port") or DEFAULT_S3_PORT)

    # -- endpoints -------------------------------------------------------------------------------------
    def endpoints(self) -> Endpoints:
        creds = self.state.credentials()
        if creds is None:
            raise KitError(f"the local lake has not been set up in {self.state.home}", "run `up` first")
        return Endpoints(
            pg=PgEndpoint("127.0.0.1", self.pg_port, creds.pg_user, creds.pg_password),
            s3=S3Endpoint(f"127.0.0.1:{self.s3_port}", creds.s3_key_id, creds.s3_secret),
        )

    def _services(self, ep: Endpoints) -> list[_Service]:
        return [
            _Service(
                "postgres", "PostgreSQL", "--pg-port or DUCKLAKE_PG_PORT", signal.SIGINT, lambda: postgres.ping(ep.pg)
            ),
            _Service(
                "s3", "S3 (rclone)", "--s3-port or DUCKLAKE_S3_PORT", signal.SIGTERM, lambda: s3.list_buckets(ep.s3)
            ),
        ]

    def _port(self, name: str) -> int:
        return self.pg_port if name == "postgres" else self.s3_port

    # -- lifecycle -------------------------------------------------------------------------------------
    def up(self) -> list[ServiceStatus]:
        """Start what is not running; reuse what is healthy. Idempotent: safe to re-run."""
        self.state.ensure_dirs()
        with self.state.lock():
            return self._up()

    def _up(self) -> list[ServiceStatus]:
        creds = self.state.credentials(create=True)
        ep = self.endpoints()
        statuses = []
        for svc in self._services(ep):
            statuses.append(self._ensure_running(svc, creds))
        self.state.save_settings(pg_port=self.pg_port, s3_port=self.s3_port)
        postgres.ensure_database(ep.pg)
        s3.ensure_buckets(ep.s3)
        return statuses

    def _ensure_running(self, svc: _Service, creds) -> ServiceStatus:
        pid_file, log_file, port = self.state.pid_file(svc.name), self.state.log_file(svc.name), self._port(svc.name)
        rec = procs.live_pid(pid_file)
        if rec and rec.port == port:
            try:
                # a live process we started: healthy means reuse; still starting means wait for it
                procs.wait_until(
                    svc.ping, what=f"{svc.label} (pid {rec.pid})", timeout=READY_TIMEOUT, log_file=log_file
                )
                return ServiceStatus(svc.name, True, "already running, reused", rec.pid, port)
            except KitError:
                procs.stop(pid_file, sig=svc.stop_signal)  # hung: replace it
        elif rec:
            procs.stop(pid_file, sig=svc.stop_signal)  # running on another port than asked: move it
        else:
            pid_file.unlink(missing_ok=True)  # stale pid file: the process is gone
        busy = procs.busy_port(port, svc.label, svc.port_option)
        if busy:
            raise busy
        argv, env, run_as = self._command(svc.name, creds)
        # the S3 server's objects are the lake's and the raw files: readable by their owner only (0600 in 0700
        # folders), so that no other local user reads them around S3's authentication
        rec, proc = procs.start(
            svc.name,
            argv,
            pid_file=pid_file,
            log_file=log_file,
            port=port,
            how=procs.Launch(env=env, run_as=run_as, umask=0o077 if svc.name == "s3" else None),
        )
        try:
            procs.wait_until(
                svc.ping, what=f"{svc.label} on port {port}", timeout=READY_TIMEOUT, proc=proc, log_file=log_file
            )
        except KitError:
            procs.stop(pid_file, sig=svc.stop_signal)
            raise
        return ServiceStatus(svc.name, True, "started", rec.pid, port)

    def _command(self, name: str, creds) -> tuple[list[str], dict[str, str], str | None]:
        if name == "postgres":
            bin_dir = postgres.find_bin_dir()
            postgres.initdb(
                bin_dir, self.state.pg_data, creds.pg_user, creds.pg_password, self.state.log_file("postgres")
            )
            return postgres.server_argv(bin_dir, self.state.pg_data, self.pg_port), {}, postgres.run_as_user()
        self.state.s3_data.mkdir(parents=True, exist_ok=True)
        private_tree(self.state.s3_data)
        conf = self.state.home / "rclone.conf"
        conf.touch(mode=0o600, exist_ok=True)
        argv = s3.server_argv(s3.rclone_bin(), self.state.s3_data, self.s3_port, conf)
        # rclone reads list flags from the environment as CSV: quote the pair so it stays one `key,secret`
        return argv, {"RCLONE_AUTH_KEY": f'"{creds.s3_key_id},{creds.s3_secret}"'}, None

    def down(self) -> list[str]:
        """Stop exactly the processes the kit started (by pid file and start time). Data stays."""
        if not self.state.home.exists():
            return [f"{name}: not running" for name in ("s3", "postgres")]
        with self.state.lock():
            return self._down()

    def _down(self) -> list[str]:
        msgs = []
        for name, sig in (("s3", signal.SIGTERM), ("postgres", signal.SIGINT)):  # SIGINT: PostgreSQL fast shutdown
            msgs.append(f"{name}: {procs.stop(self.state.pid_file(name), sig=sig)}")
        return msgs

    def status(self) -> list[ServiceStatus]:
        out = []
        creds = self.state.credentials()
        data_dirs = {"postgres": self.state.pg_data, "s3": self.state.s3_data}
        for name, label in (("postgres", "PostgreSQL"), ("s3", "S3 (rclone)")):
            port = self._port(name)
            rec = procs.read_pid(self.state.pid_file(name))
            size = procs.dir_size(data_dirs[name]) if data_dirs[name].exists() else 0
            if creds is None:
                out.append(ServiceStatus(name, False, "never started: run `up`", None, port, size))
                continue
            if rec is None:
                out.append(ServiceStatus(name, False, "stopped", None, port, size))
                continue
            if rec.process() is None:
                out.append(
                    ServiceStatus(
                        name, False, f"not running (pid {rec.pid} is gone): run `up`", rec.pid, rec.port, size
                    )
                )
                continue
            ep = self.endpoints()
            try:
                postgres.ping(ep.pg) if name == "postgres" else s3.list_buckets(ep.s3)
                out.append(ServiceStatus(name, True, f"{label} answers", rec.pid, rec.port, size))
            except KitError as exc:
                out.append(
                    ServiceStatus(name, False, f"running but not answering: {exc.what}", rec.pid, rec.port, size)
                )
        return out

    def reset(self) -> list[str]:
        """Stop the services and delete everything in the state folder: catalog, lake data, credentials."""
        if not self.state.home.exists():
            return [f"nothing to delete: {self.state.home} does not exist"]
        with self.state.lock():
            msgs = self._down()
            shutil.rmtree(self.state.home)
        msgs.append(f"deleted {self.state.home}")
        return msgs
