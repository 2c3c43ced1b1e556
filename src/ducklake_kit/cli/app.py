"""The harness: `python ducklake_test.py [--platform ...] COMMAND`. Global options here; the commands live in one
module per group (core: the services; data: SQL, loads and lessons; bench: the benchmarks).

Exit codes: 0 ok, 1 a computed check failed, 2 usage error, 3 bad input, an environment problem or a declined confirmation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

# each registers its commands on `app`, in this order (the order of `--help`)
from ducklake_kit.cli import core, workers, spark, data, steps, pipeline, dynamic, bench, console  # noqa: F401  # isort: skip
from ducklake_kit.cli.common import app
from ducklake_kit.platforms import PLATFORMS
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.platforms.state import (
    DEFAULT_PG_PORT,
    DEFAULT_S3_PORT,
    K3D_PG_PORT,
    K3D_S3_PORT,
    PODMAN_PG_PORT,
    PODMAN_S3_PORT,
)


@app.callback()
def main_options(
    ctx: typer.Context,
    platform: Annotated[
        str, typer.Option(envvar="DUCKLAKE_PLATFORM", help=f"Where the services run: {', '.join(PLATFORMS)}.")
    ] = "local",
    home: Annotated[
        Path | None,
        typer.Option(envvar="DUCKLAKE_HOME", help="State folder (data, logs, credentials). Default: ./.ducklake"),
    ] = None,
    pg_port: Annotated[
        int | None,
        typer.Option(
            envvar="DUCKLAKE_PG_PORT",
            help=f"Local PostgreSQL port (default {DEFAULT_PG_PORT}; k3d: {K3D_PG_PORT}, the port-forward; podman: "
            f"{PODMAN_PG_PORT}).",
        ),
    ] = None,
    s3_port: Annotated[
        int | None,
        typer.Option(
            envvar="DUCKLAKE_S3_PORT",
            help=f"Local S3 port (default {DEFAULT_S3_PORT}; k3d: {K3D_S3_PORT}, the port-forward; podman: {PODMAN_S3_PORT}).",
        ),
    ] = None,
    scheduler: Annotated[
        str | None,
        typer.Option(
            envvar="DUCKLAKE_SCHEDULER",
            help="A running Dask scheduler (tcp://host:port, or tls://host:port with DUCKLAKE_SCHEDULER_TLS_CA/_CERT/_KEY or Dask's TLS config) to use as the worker plane instead of starting one.",
        ),
    ] = None,
) -> None:
    if platform not in PLATFORMS:
        raise typer.BadParameter(f"choose one of {', '.join(PLATFORMS)}", param_hint="--platform")
    if scheduler is not None and not scheduler.startswith(("tcp://", "tls://")):
        raise typer.BadParameter(
            "give the scheduler's address as tcp://host:port or tls://host:port", param_hint="--scheduler"
        )
    ctx.obj = Kit.build(platform, home, pg_port=pg_port, s3_port=s3_port, scheduler=scheduler)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
