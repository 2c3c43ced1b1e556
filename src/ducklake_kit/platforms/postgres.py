"""The catalog's PostgreSQL: find the binaries, initdb, start, check with a real query, create the catalog database."""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import subprocess
from pathlib import Path

import psycopg

from ducklake_kit.errors import KitError
from ducklake_kit.platforms.base import PgEndpoint
from ducklake_kit.platforms.service_user import service_user


def find_bin_dir() -> Path:
    """PostgreSQL binaries: $DUCKLAKE_PG_BIN, else the pinned `pgserver` wheel (PostgreSQL 16), else PATH."""
    candidates: list[Path] = []
    if os.environ.get("DUCKLAKE_PG_BIN"):
        candidates.append(Path(os.environ["DUCKLAKE_PG_BIN"]))
    spec = importlib.util.find_spec("pgserver")
    if spec and spec.origin:
        candidates.append(Path(spec.origin).parent / "pginstall" / "bin")
    on_path = shutil.which("postgres") or shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for c in candidates:
        if (c / "postgres").exists() and (c / "initdb").exists():
            return c
    raise KitError(
        "no PostgreSQL server binaries found (postgres, initdb)",
        "run `uv sync` (installs the pgserver wheel), install Debian's `postgresql`, or set DUCKLAKE_PG_BIN",
    )


def run_as_user() -> str | None:
    """The system user that runs PostgreSQL when the kit runs as root (created if missing)."""
    return service_user()


def _check_reachable(path: Path, user: str) -> None:
    """When demoting from root, every parent of the data folder must be traversable by `user`."""
    for parent in path.parents:
        if not parent.stat().st_mode & 0o001:
            raise KitError(
                f"PostgreSQL runs as user '{user}' (root may not run it) and cannot enter {parent}",
                f"`chmod o+x {parent}` or set DUCKLAKE_HOME to a folder whose parents others can traverse",
            )


def initdb(bin_dir: Path, data: Path, user: str, password: str, log_file: Path) -> bool:
    """Create the cluster once, with scram-sha-256 password authentication (no `trust`). Idempotent."""
    if (data / "PG_VERSION").exists():
        return False
    run_as = run_as_user()
    data.mkdir(parents=True, exist_ok=True)
    os.chmod(data, 0o700)
    pwfile = data.parent / "initdb.pw"
    fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")
    if run_as:
        entry = pwd.getpwnam(run_as)
        _check_reachable(data.parent, run_as)
        for p in (data.parent, data, pwfile):
            os.chown(p, entry.pw_uid, entry.pw_gid)
    from ducklake_kit.platforms.procs import _preexec  # procs imports psutil: only when a catalog is initialised

    try:
        result = subprocess.run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                user,
                "--pwfile",
                str(pwfile),
                "--auth",
                "scram-sha-256",
                "--encoding",
                "UTF8",
                "--locale",
                "C",
            ],
            capture_output=True,
            text=True,
            preexec_fn=_preexec(run_as, None),
        )
    finally:
        pwfile.unlink(missing_ok=True)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a") as log:
        log.write(result.stdout + result.stderr)
    if result.returncode != 0:
        shutil.rmtree(data, ignore_errors=True)
        raise KitError(
            f"initdb failed with code {result.returncode}",
            f"read {log_file}",
            detail=(result.stderr or result.stdout)[-2000:],
        )
    return True


def server_argv(bin_dir: Path, data: Path, port: int) -> list[str]:
    return [
        str(bin_dir / "postgres"),
        "-D",
        str(data),
        "-p",
        str(port),
        "-c",
        "listen_addresses=127.0.0.1",  # loopback only
        "-c",
        "unix_socket_directories=",  # no socket files: TCP with a password only
        "-c",
        "password_encryption=scram-sha-256",
        "-c",
        "max_connections=200",  # concurrent writers and Spark tasks each hold a catalog connection
    ]


def connect(ep: PgEndpoint, dbname: str | None = None, timeout: int = 3) -> psycopg.Connection:
    """A psycopg connection; authentication and reachability failures become one clear KitError."""
    try:
        return psycopg.connect(ep.libpq(dbname), connect_timeout=timeout, autocommit=True)
    except psycopg.OperationalError as exc:
        msg = str(exc)
        where = f"PostgreSQL at {ep.host}:{ep.port}"
        if "password authentication failed" in msg:
            raise KitError(
                f"{where} refused the password for user '{ep.user}'",
                "check the credentials (DUCKLAKE_PG_DSN for --platform external, .ducklake/credentials.json for local)",
            ) from None
        if 'database "' in msg and "does not exist" in msg:
            raise KitError(f"{where} has no database '{dbname or ep.dbname}'", "run `up` to create it") from None
        if "Connection refused" in msg or "timeout" in msg.lower():
            raise KitError(f"{where} is not reachable", "run `up` (or `status` to see what is down)") from None
        raise KitError(f"{where}: {msg.strip().splitlines()[-1]}", "run `status`") from None


def ping(ep: PgEndpoint, dbname: str = "postgres") -> bool:
    """A real round trip: authenticate and run a query."""
    with connect(ep, dbname, timeout=2) as conn:
        return conn.execute("select 1").fetchone() == (1,)


def ensure_database(ep: PgEndpoint, admin_db: str = "postgres") -> bool:
    """Create the catalog database when missing. Idempotent; returns True when it created it."""
    with connect(ep, admin_db) as conn:
        exists = conn.execute("select 1 from pg_database where datname = %s", (ep.dbname,)).fetchone()
        if exists:
            return False
        try:
            conn.execute(psycopg.sql.SQL("create database {}").format(psycopg.sql.Identifier(ep.dbname)))
        except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
            # created concurrently (another `up`, another run's step): a CREATE that lost the race after the check
            # fails on pg_database's unique index rather than as a duplicate database
            return False
        return True
