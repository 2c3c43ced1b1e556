"""What every platform (local, k3d, podman, external) provides: endpoints for the catalog and the lake, and a lifecycle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CATALOG_DB = "ducklake_catalog"  # the PostgreSQL database that holds the DuckLake catalog
LAKE_BUCKET = "lake"  # DuckLake's Parquet data files
RAW_BUCKET = "raw"  # landing files before the Spark load
BUCKETS = (LAKE_BUCKET, RAW_BUCKET)


@dataclass(frozen=True)
class PgEndpoint:
    host: str
    port: int
    user: str
    password: str
    dbname: str = CATALOG_DB

    def libpq(self, dbname: str | None = None, *, with_password: bool = True) -> str:
        """libpq key/value string, as DuckDB's postgres extension and psycopg take it."""
        parts = [f"dbname={dbname or self.dbname}", f"host={self.host}", f"port={self.port}", f"user={self.user}"]
        if with_password:
            parts.append(f"password={self.password}")
        return " ".join(parts)


@dataclass(frozen=True)
class S3Endpoint:
    endpoint: str  # host:port, no scheme
    key_id: str
    secret: str
    region: str = "us-east-1"
    use_ssl: bool = False
    url_style: str = "path"

    @property
    def url(self) -> str:
        return f"{'https' if self.use_ssl else 'http'}://{self.endpoint}"


@dataclass(frozen=True)
class Endpoints:
    pg: PgEndpoint
    s3: S3Endpoint
    data_path: str = f"s3://{LAKE_BUCKET}/"


@dataclass
class ServiceStatus:
    name: str
    healthy: bool
    detail: str
    pid: int | None = None
    port: int | None = None
    data_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Platform:
    """A place the catalog (PostgreSQL) and the lake's storage (S3) live."""

    name = "base"

    def up(self) -> list[ServiceStatus]:
        raise NotImplementedError

    def down(self) -> list[str]:
        raise NotImplementedError

    def status(self) -> list[ServiceStatus]:
        raise NotImplementedError

    def reset(self) -> list[str]:
        raise NotImplementedError

    def endpoints(self) -> Endpoints:
        """The endpoints of running services; raises KitError when they are not up."""
        raise NotImplementedError
