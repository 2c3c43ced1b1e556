"""The worker plane: `workers` lists it; `up`, `down`, `status`, `reset` and `connect` (cli/core.py) include it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from ducklake_kit.cli.common import JsonOpt, Kit, app, command
from ducklake_kit.cli.output import console, print_json, table
from ducklake_kit.errors import EXIT_CHECK_FAILED

if TYPE_CHECKING:
    from ducklake_kit.workers.plane import PlaneStatus


def workers_table(plane: PlaneStatus) -> Any:
    rows = [
        [
            w.name,
            w.address,
            w.pid or "",
            w.state,
            w.lake,
            w.tasks_run,
            "" if w.uptime_s is None else f"{w.uptime_s:.0f} s",
            "" if w.memory_mib is None else f"{w.memory_mib:.0f}",
            ", ".join(w.local_tables) or "-",
        ]
        for w in plane.workers
    ]
    rows += [[name, "", "", "GONE: run `up`", "", "", "", "", ""] for name in plane.missing]
    where = "the kit's" if plane.managed else "a user's"
    return table(
        f"Workers ({where} Dask scheduler {plane.address})",
        ["worker", "address", "pid", "state", "lake", "tasks run", "uptime", "memory MiB", "worker-local tables"],
        rows,
    )


def print_plane(plane: PlaneStatus) -> None:
    out = console()
    if plane.workers or plane.missing:
        out.print(workers_table(plane))
    out.print(f"worker plane: {plane.detail}", markup=False)
    if plane.managed and plane.user:
        out.print(
            f"scheduler and workers: mutual TLS with the state folder's certificates, run as user {plane.user}",
            markup=False,
        )
    if plane.dashboard:
        out.print(f"Dask dashboard: {plane.dashboard}", markup=False)


@app.command()
@command
def workers(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List the worker plane's workers: name, address, pid, state, tasks run, uptime, memory, worker-local tables.
    Exit 1 when one is gone or has no lake attached."""
    from ducklake_kit.workers import plane as plane_mod

    c: Kit = ctx.obj
    plane = plane_mod.status(c.state, c.platform.endpoints(), c.scheduler)
    if as_json:
        print_json("ok" if plane.healthy else "error", plane.as_dict())
    else:
        print_plane(plane)
    if not plane.healthy:
        raise typer.Exit(EXIT_CHECK_FAILED)
