"""What the pages show, as JSON, behind the same token gate: `/api/snapshots` (the Lake page's timeline) and
`/api/diff?table=&before=&after=` (its diff, with the same summary line). A script or a lab reads them with curl
(`Authorization: token ...`) and can compare them with the lake's own answers; the pages and these routes call the
same functions."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from ducklake_kit.console import shapes
from ducklake_kit.console.backend import Backend
from ducklake_kit.errors import KitError


def _refused(exc: KitError) -> JSONResponse:
    return JSONResponse({"error": exc.line()}, status_code=400)


def snapshots_json(backend: Backend) -> dict[str, Any]:
    return {
        "snapshots": [
            {
                "snapshot_id": s.snapshot_id,
                "time": s.time.isoformat() if s.time is not None else None,
                "author": s.author,
                "commit_message": s.commit_message,
                "commit_extra_info": s.commit_extra_info,
                "changes": s.changes,
            }
            for s in backend.snapshots()
        ]
    }


def diff_json(backend: Backend, table: str, before: int, after: int) -> dict[str, Any]:
    got = backend.diff(table, before, after)
    return {
        "table": got.table,
        "before": got.before,
        "after": got.after,
        "summary": shapes.diff_summary(got),
        "counts": got.counts,
        "total_rows": got.total_rows,
        "columns": got.columns,
        "rows": [[shapes.cell(v) for v in r] for r in got.rows],
    }


def register(app, backend: Backend) -> None:
    """The routes, on NiceGUI's FastAPI app (the gate in front of it refuses them without the token). Plain `def`
    routes: FastAPI runs them on its thread pool, so a slow catalog never holds the pages' event loop."""

    @app.get("/api/snapshots")
    def snapshots() -> Any:
        try:
            return snapshots_json(backend)
        except KitError as exc:
            return _refused(exc)

    @app.get("/api/diff")
    def diff(table: str, before: int, after: int) -> Any:
        try:
            return diff_json(backend, table, before, after)
        except KitError as exc:
            return _refused(exc)
