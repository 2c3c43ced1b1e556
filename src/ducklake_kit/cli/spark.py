"""The kit's Spark cluster: `spark up [--mode standalone|connect] [--spark-workers N]`, `spark status`, `spark down`.
`load --spark-master standalone|connect` runs the load on it; `down` and `reset` stop it too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from ducklake_kit.cli.common import JsonOpt, Kit, app, command
from ducklake_kit.cli.output import console, print_json, table
from ducklake_kit.errors import EXIT_CHECK_FAILED, EXIT_USAGE, KitError

if TYPE_CHECKING:
    from ducklake_kit.platforms.spark_cluster import ClusterStatus

spark_app = typer.Typer(
    help="Spark beyond local[*]: a standalone cluster (a master and N workers) and a Spark Connect server, started "
    "from PySpark's own package on loopback, for `load --spark-master standalone|connect`.",
    no_args_is_help=True,
)
app.add_typer(spark_app, name="spark")


def print_cluster(st: ClusterStatus) -> None:
    rows = [[p.name, "yes" if p.running else "no", p.pid or "", p.port or "", p.detail] for p in st.processes]
    out = console()
    out.print(table("Spark (the kit's cluster)", ["process", "running", "pid", "port", "detail"], rows))
    if st.master_url:
        out.print(
            f"standalone master: {st.master_url} ({st.alive_workers} worker(s) ALIVE); status page {st.ui_url}; "
            "load with --spark-master standalone",
            markup=False,
        )
    if st.connect_url:
        out.print(
            f"Spark Connect: {st.connect_url} (jobs run on {st.connect_master}; the token is in the state "
            "folder's spark/secrets.json); load with --spark-master connect",
            markup=False,
        )
    out.print(f"spark: {st.detail}", markup=False)


@spark_app.command("up")
@command
def spark_up(
    ctx: typer.Context,
    mode: Annotated[
        str,
        typer.Option(
            help="standalone: a master and N workers; connect: a Spark Connect server (on "
            "the standalone cluster when it runs, else local[*])."
        ),
    ] = "standalone",
    spark_workers: Annotated[
        int | None,
        typer.Option(
            "--spark-workers",
            help="Standalone Spark workers, 1 core and 2g each (default 2, or as many as the last `spark up`).",
        ),
    ] = None,
    # --workers names the worker plane's Dask workers everywhere (`up --workers N`): here it is refused with a hint
    dask_workers: Annotated[str | None, typer.Option("--workers", hidden=True)] = None,
    as_json: JsonOpt = False,
) -> None:
    """Start the kit's Spark cluster (idempotent): ready when the master reports N workers ALIVE, or when a Spark
    Connect client session answers a query."""
    from ducklake_kit.platforms.spark_cluster import SparkCluster

    if dask_workers is not None:
        raise KitError(
            "spark up takes --spark-workers N (the Spark workers); --workers is the worker plane's Dask workers",
            f"spark up --spark-workers {dask_workers}",
            exit_code=EXIT_USAGE,
        )
    c: Kit = ctx.obj
    st = SparkCluster(c.state).up(mode, spark_workers)
    if as_json:
        print_json("ok", st.as_dict())
    else:
        print_cluster(st)


@spark_app.command("status")
@command
def spark_status(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """The master, the workers and the Connect server: pid, port, a real round trip. Exit 1 when one the kit started
    is gone or not answering."""
    from ducklake_kit.platforms.spark_cluster import SparkCluster

    c: Kit = ctx.obj
    st = SparkCluster(c.state).status()
    if as_json:
        print_json("ok" if st.healthy else "error", st.as_dict())
    else:
        print_cluster(st)
    if not st.healthy:
        raise typer.Exit(EXIT_CHECK_FAILED)


@spark_app.command("down")
@command
def spark_down(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Stop the Connect server, the workers and the master, and any executor they left behind."""
    from ducklake_kit.platforms.spark_cluster import SparkCluster

    c: Kit = ctx.obj
    msgs = SparkCluster(c.state).down()
    if as_json:
        print_json("ok", {"stopped": msgs})
    else:
        for m in msgs:
            console().print(m, markup=False)
