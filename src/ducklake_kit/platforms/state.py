"""The kit's state folder: service data, logs, pid files, ports and generated credentials.

Default `<project>/.ducklake` (gitignored); `DUCKLAKE_HOME` overrides it. Secrets are written 0600.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DEFAULT_PG_PORT = 15432  # the local platform's PostgreSQL
DEFAULT_S3_PORT = 19000  # the local platform's S3 server
# k3d's port-forwards: other loopback ports than local's, so both platforms can run at once
K3D_PG_PORT = 15433
K3D_S3_PORT = 19001
# podman's pods publish theirs on 127.0.0.1: beside local's and k3d's, so all three can run at once
PODMAN_PG_PORT = 15434
PODMAN_S3_PORT = 19002
# the worker plane (one per state folder, whatever the platform): the Dask scheduler and its dashboard
DEFAULT_SCHEDULER_PORT = 18786
DEFAULT_DASHBOARD_PORT = 18787


def project_root() -> Path | None:
    """The checkout this package runs from (editable install), if any."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "ducklake_test.py").exists() else None


def default_home() -> Path:
    env = os.environ.get("DUCKLAKE_HOME")
    if env:
        return Path(env).expanduser().resolve()
    root = project_root()
    return (root or Path.cwd()) / ".ducklake"


def write_private(path: Path, text: str) -> None:
    """Write a file readable by its owner only (0600), never briefly world-readable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


@dataclass
class Credentials:
    pg_user: str
    pg_password: str
    s3_key_id: str
    s3_secret: str

    @classmethod
    def generate(cls) -> Credentials:
        return cls(
            pg_user="ducklake",
            pg_password=secrets.token_urlsafe(24),
            s3_key_id="dl" + secrets.token_hex(8),
            s3_secret=secrets.token_urlsafe(30),
        )


class State:
    """Paths and persisted settings under one home folder."""

    def __init__(self, home: Path | None = None):
        self.home = (home or default_home()).resolve()

    # layout
    @property
    def cache_dir(self) -> Path:
        """Downloaded and generated source files, kept across runs (content-addressed where it matters)."""
        return self.home / "cache"

    @property
    def credentials_file(self) -> Path:
        return self.home / "credentials.json"

    @property
    def settings_file(self) -> Path:
        return self.home / "settings.json"

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    @property
    def pg_data(self) -> Path:
        return self.home / "postgres" / "data"

    @property
    def s3_data(self) -> Path:
        return self.home / "s3"

    def pid_file(self, service: str) -> Path:
        return self.run_dir / f"{service}.pid.json"

    def log_file(self, service: str) -> Path:
        return self.log_dir / f"{service}.log"

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Serialise `up`, `down` and `reset` of one state folder (two at once could orphan a server)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / "lifecycle.lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def ensure_dirs(self) -> None:
        for d in (self.home, self.run_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        # private; as root, PostgreSQL runs as another user who must traverse (not list) the folder
        os.chmod(self.home, 0o711 if os.geteuid() == 0 else 0o700)

    # credentials: generated once, on first `up`
    def credentials(self, *, create: bool = False) -> Credentials | None:
        if self.credentials_file.exists():
            data = json.loads(self.credentials_file.read_text())
            return Credentials(**data)
        if not create:
            return None
        self.ensure_dirs()
        creds = Credentials.generate()
        write_private(self.credentials_file, json.dumps(asdict(creds), indent=2))
        return creds

    # settings: ports chosen at `up`, remembered for later commands
    def settings(self) -> dict[str, Any]:
        if self.settings_file.exists():
            return json.loads(self.settings_file.read_text())
        return {}

    def ports(self, pg_port: int | None, s3_port: int | None, defaults: tuple[int, int]) -> tuple[int, int]:
        """PostgreSQL's and S3's ports for a platform of the kit's (k3d, podman): each the one given (an option),
        else DUCKLAKE_PG_PORT / DUCKLAKE_S3_PORT, else the one this state folder saved, else the platform's default."""
        saved = self.settings()
        return (
            int(pg_port or os.environ.get("DUCKLAKE_PG_PORT") or saved.get("pg_port") or defaults[0]),
            int(s3_port or os.environ.get("DUCKLAKE_S3_PORT") or saved.get("s3_port") or defaults[1]),
        )

    def save_settings(self, **values: Any) -> dict[str, Any]:
        data = self.settings() | values
        self.ensure_dirs()
        write_private(self.settings_file, json.dumps(data, indent=2))
        return data
