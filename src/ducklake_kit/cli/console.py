"""The lake console: `console` starts it (or finds it running) and prints its URL with the token."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import typer

from ducklake_kit.cli.common import JsonOpt, Kit, app, command
from ducklake_kit.cli.output import console as out_console
from ducklake_kit.cli.output import print_json


@app.command()
@command
def console(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Start the lake console in the background (or find it running) and print its URL with its token: Query runs SQL
    as a task on the worker plane and draws the answer as a message, a table or a chart; Lake shows the tables, the
    snapshot timeline, any query at a snapshot, a table's data files by snapshot, a table's diff between two
    snapshots and the raw catalog tables; Load loads a CSV or Parquet file (or folder) of trips through the PySpark
    load, with its progress (Cancel); Dynamic tables shows each one's lag, mode and refreshes (Refresh now);
    Lineage runs a pipeline of the pipelines/ folder and draws its nodes' states live, and a table's lineage;
    Workers lists the plane's workers. It listens on 127.0.0.1 (a free port) and refuses any request without the
    token; the token is also in the state folder's console/token. `down` stops it."""
    from ducklake_kit.platforms import console as console_mod  # psutil loads only when the command runs
    from ducklake_kit.workers.config import PlaneConfig  # no Dask import: the server connects itself

    c: Kit = ctx.obj
    plane = PlaneConfig.of(c.state, c.scheduler)
    settings = {
        "platform": c.platform_name,
        "pipelines_dir": str(Path.cwd() / "pipelines"),  # the Lineage page's list of pipeline files
        "endpoints": asdict(c.platform.endpoints()),
        "plane": {
            "address": plane.address,
            "dashboard": plane.dashboard,
            "tls": asdict(plane.tls) if plane.tls else None,
        },
    }
    status, token = console_mod.start(c.state, settings)
    url = console_mod.url_with_token(status, token)
    if as_json:
        print_json("ok", {**status.as_dict(c.state), "url_with_token": url})
        return
    out = out_console()
    out.print(f"console: {status.detail} (pid {status.pid}, user {status.user})", markup=False)
    out.print("open in a browser (the token is in the URL; `down` stops the console):", markup=False)
    out.print(f"  {url}", markup=False, soft_wrap=True)
