"""The services: doctor, up, down, status, reset, connect, shell."""

from __future__ import annotations

import subprocess
from typing import Annotated, Any

import click
import typer

from ducklake_kit.cli.common import JsonOpt, Kit, app, command
from ducklake_kit.cli.output import console, print_json, table
from ducklake_kit.cli.spark import print_cluster
from ducklake_kit.cli.workers import print_plane
from ducklake_kit.errors import EXIT_CHECK_FAILED, EXIT_ERROR, KitError
from ducklake_kit.lake import clients
from ducklake_kit.platforms import doctor as doctor_mod


def _services_table(statuses) -> Any:
    rows = [
        [s.name, "yes" if s.healthy else "NO", s.port or "", s.pid or "", _size(s.data_bytes), s.detail]
        for s in statuses
    ]
    return table("Services", ["service", "healthy", "port", "pid", "data", "detail"], rows)


def _size(n: int | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@app.command()
@command
def doctor(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Check prerequisites (Python, Java 17+, uv, just; docker, k3d, kubectl for k3d; podman, runc, mmdebstrap and the
    kit's containers.conf for podman) with versions and install hints."""
    c: Kit = ctx.obj
    tools = doctor_mod.check(c.platform_name)
    ok = all(t.ok for t in tools)
    if as_json:
        print_json("ok" if ok else "error", {"platform": c.platform_name, "tools": [t.as_dict() for t in tools]})
    else:
        rows = [
            [
                t.name,
                "ok" if t.found else ("MISSING" if t.required else "missing (optional here)"),
                t.version,
                "" if t.found else t.hint,
            ]
            for t in tools
        ]
        console().print(
            table(f"Prerequisites for --platform {c.platform_name}", ["tool", "state", "version", "install hint"], rows)
        )
        for t in tools:
            if not t.ok:
                problem = "is missing" if t.version == "not found" else f"is not usable: {t.version}"
                typer.echo(f"Error: {t.name} {problem} ({t.why}). Try: {t.hint}.", err=True)
    if not ok:
        raise typer.Exit(EXIT_ERROR)


WorkersOpt = Annotated[
    int | None,
    typer.Option(
        "--workers",
        min=0,
        help="DuckDB workers on Dask to run (default 2, or as many as the last `up`); 0: no worker plane.",
    ),
]


@app.command()
@command
def up(ctx: typer.Context, workers: WorkersOpt = None, as_json: JsonOpt = False) -> None:
    """Start the catalog (PostgreSQL) and the S3 store, create the catalog database and buckets, then the worker
    plane (a Dask scheduler and N DuckDB workers, each with the lake attached). Idempotent."""
    from ducklake_kit.workers import plane as plane_mod  # Dask loads only with the commands that use it

    c: Kit = ctx.obj
    platform = c.platform
    statuses = platform.up()
    plane = plane_mod.up(c.state, platform.endpoints(), workers, c.scheduler)
    if as_json:
        print_json("ok", {"services": [vars(s) for s in statuses], "worker_plane": plane.as_dict()})
    else:
        console().print(_services_table(statuses))
        print_plane(plane)


@app.command()
@command
def down(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Stop the console, the worker plane, the Spark cluster (`spark up`) and the services the kit started. Data stays
    (see `reset`)."""
    from ducklake_kit.workers import plane as plane_mod

    c: Kit = ctx.obj
    from ducklake_kit.platforms import console as console_mod  # psutil loads only with the commands that use it
    from ducklake_kit.platforms.spark_cluster import SparkCluster

    msgs = [console_mod.stop(c.state)]
    msgs += [] if c.scheduler else plane_mod.down(c.state)  # a user's Dask cluster is theirs to stop
    msgs += SparkCluster(c.state).down()
    msgs += c.platform.down()
    if as_json:
        print_json("ok", {"stopped": msgs})
    else:
        for m in msgs:
            console().print(m, markup=False)


@app.command()
@command
def status(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Show each service's health (a real round trip), port, pid and data size, the workers, the Spark cluster of
    `spark up` and the console. Exit 1 when one is down."""
    from ducklake_kit.workers import plane as plane_mod

    c: Kit = ctx.obj
    platform = c.platform
    statuses = platform.status()
    healthy = all(s.healthy for s in statuses)
    plane = plane_mod.status(c.state, platform.endpoints(), c.scheduler) if healthy else None
    from ducklake_kit.platforms.spark_cluster import SparkCluster

    spark = SparkCluster(c.state).status()  # only what `spark up` started counts for the health
    from ducklake_kit.platforms import console as console_mod

    web = console_mod.status(c.state)  # as does the console, once `console` started it
    healthy = healthy and (plane is None or plane.healthy) and spark.healthy and (web.running or web.pid is None)
    if as_json:
        print_json(
            "ok" if healthy else "error",
            {
                "services": [vars(s) for s in statuses],
                "worker_plane": plane.as_dict() if plane else None,
                "spark": spark.as_dict(),
                "console": web.as_dict(c.state),
            },
        )
    else:
        console().print(_services_table(statuses))
        if plane is not None:
            print_plane(plane)
        else:
            console().print("worker plane: not checked (the catalog or S3 is down)", markup=False)
        if spark.started:
            print_cluster(spark)
        else:
            console().print(
                "spark: local[*] in each load's own process (no cluster: `spark up` starts one)", markup=False
            )
        console().print(_console_line(c, web), markup=False)
    if not healthy:
        raise typer.Exit(EXIT_CHECK_FAILED)


@app.command()
@command
def reset(
    ctx: typer.Context,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Stop the services and delete all their data and credentials (asks first)."""
    c: Kit = ctx.obj
    if not yes and not _confirmed(f"Delete the catalog, the lake data and the credentials in {c.state.home}?"):
        raise KitError("reset cancelled; nothing was deleted", "pass --yes to reset without asking")
    from ducklake_kit.platforms import console as console_mod  # psutil loads only with the commands that use it
    from ducklake_kit.platforms.spark_cluster import SparkCluster
    from ducklake_kit.workers import plane as plane_mod

    msgs = [console_mod.stop(c.state)]
    msgs += [] if c.scheduler else plane_mod.down(c.state)
    msgs += SparkCluster(c.state).down()
    msgs += c.platform.reset()
    if as_json:
        print_json("ok", {"reset": msgs})
    else:
        for m in msgs:
            console().print(m, markup=False)


def _console_line(c: Kit, web) -> str:
    """`web`: the console's status (platforms.console.ConsoleStatus)."""
    from ducklake_kit.platforms import console as console_mod

    if not web.running:
        return f"console: {web.detail}"
    return f"console: {web.address} (pid {web.pid}, user {web.user}); its token is in {console_mod.token_file(c.state)}"


def _confirmed(question: str) -> bool:
    """The user's yes; no answer (stdin at its end, or closed) is a no, not a traceback."""
    try:
        return typer.confirm(question, default=False)
    except (click.exceptions.Abort, EOFError, OSError, RuntimeError, ValueError):
        return False


@app.command()
@command
def connect(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Print how to reach the catalog (psql, DBeaver), the lake (DuckDB CLI with an init SQL file), the worker plane,
    the Spark cluster and the console."""
    c: Kit = ctx.obj
    info = clients.describe(c.state, c.platform.endpoints())
    info["worker_plane"] = _plane_address(c)
    info["spark"] = _spark_addresses(c)
    from ducklake_kit.platforms import console as console_mod

    web = console_mod.status(c.state)
    info["console"] = {"url": web.address, "running": web.running, "token_file": str(console_mod.token_file(c.state))}
    if as_json:
        print_json("ok", info)
        return
    out = console()
    out.print("[bold]Catalog (PostgreSQL) with psql:[/]")
    out.print(f"  {info['psql']}", markup=False)
    out.print("  worth running there:")
    for q in info["psql_queries"]:
        out.print(f"    {q}", markup=False)
    out.print("[bold]Lake with the DuckDB CLI[/] (extensions from the wheels, lake attached):")
    out.print(f"  {info['duckdb_cli']}", markup=False)
    out.print("  then e.g.: FROM ducklake_snapshots('lake');", markup=False)
    out.print("  or simply: python ducklake_test.py shell   (the same command, run for you)", markup=False)
    out.print("[bold]DBeaver:[/]")
    for kind, settings in info["dbeaver"].items():
        out.print(f"  {kind}: " + ", ".join(f"{k}={v}" for k, v in settings.items()), markup=False)
    out.print("[bold]S3:[/]")  # the values may hold brackets: printed without markup
    out.print("  " + ", ".join(f"{k}={v}" for k, v in info["s3"].items()), markup=False)
    plane = info["worker_plane"]
    out.print("[bold]Worker plane:[/]")
    out.print(f"  Dask scheduler {plane['scheduler']}", markup=False)
    if plane["tls_dir"]:
        out.print(
            f"  mutual TLS: a client needs the CA and the client certificate and key in {plane['tls_dir']}",
            markup=False,
        )
    if plane["dashboard"]:
        out.print(
            f"  dashboard (open in a browser): {plane['dashboard']} (read-only, no login, loopback only)", markup=False
        )
    sp = info["spark"]
    out.print("[bold]Spark[/] (the cluster `spark up` starts):")
    out.print(f"  standalone master {sp['master']}, status page {sp['status_page']}", markup=False)
    out.print(f"  Spark Connect {sp['connect']} (the token: {sp['token_file']})", markup=False)
    out.print("[bold]Console:[/]")
    out.print("  " + _console_line(c, web).removeprefix("console: "), markup=False)


def _plane_address(c: Kit) -> dict[str, Any]:
    from ducklake_kit.workers.config import PlaneConfig  # no Dask import for printing an address
    from ducklake_kit.workers.tls import tls_dir

    cfg = PlaneConfig.of(c.state, c.scheduler)
    return {
        "scheduler": cfg.address,
        "dashboard": cfg.dashboard,
        "tls_dir": None if cfg.external_address else str(tls_dir(c.state)),
    }


def _spark_addresses(c: Kit) -> dict[str, Any]:
    from ducklake_kit.platforms.spark_cluster import SparkCluster

    cluster = SparkCluster(c.state)
    return {
        "master": cluster.master_url,
        "status_page": f"http://127.0.0.1:{cluster.ui_port}",
        "connect": cluster.connect_url,
        "token_file": str(cluster.root / "secrets.json"),
    }


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@command
def shell(ctx: typer.Context) -> None:
    """Open the DuckDB CLI with the lake attached (the init SQL `connect` prints); extra arguments go to duckdb, e.g. -c "SQL"."""
    c: Kit = ctx.obj
    argv = clients.shell_argv(c.state, c.platform.endpoints(), list(ctx.args))
    try:
        code = subprocess.call(argv)
    except OSError as exc:
        raise KitError(
            f"could not start the DuckDB CLI {argv[0]} ({exc.strerror})",
            "run `uv sync`: the duckdb-cli wheel provides it",
        ) from None
    raise typer.Exit(code)
