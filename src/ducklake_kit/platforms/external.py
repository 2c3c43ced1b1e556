"""Your own PostgreSQL and S3: the same flow pointed at services the kit does not run.

Settings come from environment variables, or from a TOML file (`DUCKLAKE_EXTERNAL_CONFIG`, default
`<state folder>/external.toml`) with the same keys in lower case without the prefix:

    DUCKLAKE_PG_DSN        libpq DSN or URL of the catalog database, e.g. postgresql://user:pw@db:5432/ducklake_catalog
    DUCKLAKE_S3_ENDPOINT   host:port or http(s)://host:port of the S3 API
    DUCKLAKE_S3_KEY_ID / DUCKLAKE_S3_SECRET / DUCKLAKE_S3_REGION (us-east-1) / DUCKLAKE_S3_URL_STYLE (path)
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from ducklake_kit.errors import KitError
from ducklake_kit.platforms import postgres, s3
from ducklake_kit.platforms.base import CATALOG_DB, Endpoints, PgEndpoint, Platform, S3Endpoint, ServiceStatus
from ducklake_kit.platforms.state import State

KEYS = ("pg_dsn", "s3_endpoint", "s3_key_id", "s3_secret", "s3_region", "s3_url_style")
REQUIRED = ("pg_dsn", "s3_endpoint", "s3_key_id", "s3_secret")


def load_settings(state: State) -> dict[str, str]:
    cfg_path = Path(os.environ.get("DUCKLAKE_EXTERNAL_CONFIG") or state.home / "external.toml")
    settings: dict[str, str] = {}
    if cfg_path.exists():
        try:
            data = tomllib.loads(cfg_path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise KitError(f"{cfg_path} is not valid TOML ({exc})", "fix the file; keys: " + ", ".join(KEYS)) from None
        settings.update({k: str(v) for k, v in data.items() if k in KEYS})
    for key in KEYS:  # environment variables win over the file
        if os.environ.get(f"DUCKLAKE_{key.upper()}"):
            settings[key] = os.environ[f"DUCKLAKE_{key.upper()}"]
    missing = [f"DUCKLAKE_{k.upper()}" for k in REQUIRED if not settings.get(k)]
    if missing:
        raise KitError(
            f"--platform external needs {', '.join(missing)}",
            f"export them, or write them (lower case, no prefix) to {cfg_path}",
        )
    return settings


def parse_endpoints(settings: dict[str, str]) -> Endpoints:
    try:
        dsn = conninfo_to_dict(settings["pg_dsn"])
    except Exception as exc:  # noqa: BLE001 - psycopg raises ProgrammingError for a malformed DSN
        raise KitError(
            f"DUCKLAKE_PG_DSN does not parse ({exc})", "use postgresql://user:password@host:5432/dbname"
        ) from None
    for k in ("host", "user", "password"):
        if not dsn.get(k):
            raise KitError(f"DUCKLAKE_PG_DSN has no {k}", "use postgresql://user:password@host:5432/dbname")
    endpoint = settings["s3_endpoint"]
    use_ssl = not endpoint.startswith("http://")
    endpoint = endpoint.removeprefix("https://").removeprefix("http://").rstrip("/")
    return Endpoints(
        pg=PgEndpoint(
            str(dsn["host"]),
            int(dsn.get("port") or 5432),
            str(dsn["user"]),
            str(dsn["password"]),
            str(dsn.get("dbname") or CATALOG_DB),
        ),
        s3=S3Endpoint(
            endpoint,
            settings["s3_key_id"],
            settings["s3_secret"],
            region=settings.get("s3_region") or "us-east-1",
            use_ssl=use_ssl,
            url_style=settings.get("s3_url_style") or "path",
        ),
    )


class ExternalPlatform(Platform):
    name = "external"

    def __init__(self, state: State | None = None):
        self.state = state or State()

    def endpoints(self) -> Endpoints:
        return parse_endpoints(load_settings(self.state))

    def up(self) -> list[ServiceStatus]:
        """Nothing to start: check both services answer, create the catalog database and buckets if missing."""
        ep = self.endpoints()
        note = ""
        try:
            postgres.ping(ep.pg, ep.pg.dbname)
        except KitError as exc:
            if "has no database" not in exc.what:
                raise
            postgres.ensure_database(ep.pg)  # needs CREATEDB on the server's `postgres` database
            note = f"; created database {ep.pg.dbname}"
        created = s3.ensure_buckets(ep.s3)
        return [
            ServiceStatus("postgres", True, f"answers at {ep.pg.host}:{ep.pg.port}{note}", None, ep.pg.port),
            ServiceStatus(
                "s3", True, f"answers at {ep.s3.url}" + (f"; created {', '.join(created)}" if created else "")
            ),
        ]

    def status(self) -> list[ServiceStatus]:
        ep = self.endpoints()
        out = []
        for name, probe, where in (
            ("postgres", lambda: postgres.ping(ep.pg, ep.pg.dbname), f"{ep.pg.host}:{ep.pg.port}"),
            ("s3", lambda: s3.list_buckets(ep.s3), ep.s3.url),
        ):
            try:
                probe()
                out.append(ServiceStatus(name, True, f"answers at {where}"))
            except KitError as exc:
                out.append(ServiceStatus(name, False, exc.what))
        return out

    def down(self) -> list[str]:
        return ["external services are not managed by the kit: nothing to stop"]

    def reset(self) -> list[str]:
        raise KitError(
            "reset deletes data and only works on the platforms the kit runs (local, k3d, podman)",
            "drop the catalog database and empty the buckets on your own services if you mean it",
        )
