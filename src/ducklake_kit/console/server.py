"""The console's process: read its token and settings from its private folder (never from argv or the environment),
put the token gate in front of NiceGUI's FastAPI app, and serve the pages on 127.0.0.1 (no access log: a first visit's
URL carries the token)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from ducklake_kit.platforms.console import HEALTH_PATH


def main(folder: str) -> None:
    # NiceGUI takes a process that inherited pytest's variable for its own test harness (another port, no server)
    os.environ.pop("PYTEST_CURRENT_TEST", None)
    here = Path(folder)
    settings = json.loads((here / "settings.json").read_text())
    token = (here / "token").read_text().strip()
    port = int(settings["port"])

    from nicegui import app, background_tasks, run, ui

    from ducklake_kit.console import api, pages
    from ducklake_kit.console.backend import Backend
    from ducklake_kit.console.gate import TokenGate
    from ducklake_kit.errors import KitError

    backend = Backend(settings, here)
    warmed = threading.Event()
    pages.register(backend)
    api.register(app, backend)

    @app.get(HEALTH_PATH)
    def health() -> dict[str, bool]:
        return {"ok": True, "warm": warmed.is_set()}

    async def warm() -> None:
        """The plane's and the lake's first connections (seconds each), made before the first page asks for them;
        `console` prints the URL once they are (the health path says `warm`): made while the first page loads, they
        held the server's GIL and slowed that page by 0.3-0.5 s."""
        try:
            for fn in (backend.workers, lambda: backend.on_lake(lambda lake: None)):
                try:
                    await run.io_bound(fn)
                except KitError:
                    pass  # the page says what is wrong when it asks
        finally:
            warmed.set()

    app.on_startup(lambda: background_tasks.create(warm(), name="warm the connections"))
    if backend.loads is not None:
        app.on_shutdown(backend.loads.stop)  # a load the Load page started ends with the console, lake unchanged
    app.add_middleware(TokenGate, token=token, port=port)
    ui.run(
        host="127.0.0.1",
        port=port,
        title="ducklake-kit console",
        reload=False,
        show=False,
        show_welcome_message=False,
        uvicorn_logging_level="warning",
        access_log=False,
        favicon="🦆",
        # loopback only: compressing 1.3 MB of scripts and styles for each new page cost the server's one event loop
        # more than it saves on 127.0.0.1 (a first page took 1.4-1.6 s with it, 0.9 s without, at load 27)
        gzip_middleware_factory=None,
        # a page whose socket misses a ping when the machine is busy (2 s by default; 12 s with this) is kept for 30 s
        # for its reconnection instead of being dropped, and reloaded (20 sessions at load 30-40 lost one at 3 s)
        reconnect_timeout=30.0,
    )
