"""The console server's connections: one client of the worker plane and one lake connection, made on first use and
used from the pages' worker threads (NiceGUI's `run.io_bound`), one call at a time each. What goes wrong is said in
one line, as the CLI says it."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ducklake_kit.errors import KitError, first_line
from ducklake_kit.lake import Lake, explore
from ducklake_kit.platforms.base import Endpoints, PgEndpoint, S3Endpoint
from ducklake_kit.workers.query import QueryAnswer, ask, cancel
from ducklake_kit.workers.tls import ClientTLS

T = TypeVar("T")


def _has_dynamic(text: str) -> bool:
    from ducklake_kit.dynamic_tables import ddl

    return ddl.has_dynamic(text)


def endpoints_of(settings: dict[str, Any]) -> Endpoints:
    ep = settings["endpoints"]
    return Endpoints(PgEndpoint(**ep["pg"]), S3Endpoint(**ep["s3"]), ep["data_path"])


class Backend:
    def __init__(self, settings: dict[str, Any], folder: Path | None = None):
        """`folder`: the server's private folder (the Load page's loads keep their state folder in it)."""
        from ducklake_kit.console.loading import Loads

        self.endpoints = endpoints_of(settings)
        self.loads = Loads(folder / "load", self.endpoints) if folder is not None else None
        plane = settings.get("plane") or {}
        self.address: str = plane.get("address", "")
        self.dashboard: str | None = plane.get("dashboard")
        self.tls = ClientTLS(**plane["tls"]) if plane.get("tls") else None
        self.platform = settings.get("platform", "")
        self.pipelines_dir = Path(settings["pipelines_dir"]) if settings.get("pipelines_dir") else None
        if self.tls is not None and self.address:
            # the library's own clients of the plane (a pipeline run's) find the plane's TLS files as a user's
            # cluster's are found: paths in this process's environment (no secret: the files are 0600, ours)
            os.environ["DUCKLAKE_SCHEDULER_TLS_CA"] = self.tls.ca_file
            os.environ["DUCKLAKE_SCHEDULER_TLS_CERT"] = self.tls.cert
            os.environ["DUCKLAKE_SCHEDULER_TLS_KEY"] = self.tls.key or ""
        self._plane = None
        self._lake: Lake | None = None
        self._plane_lock = threading.Lock()
        self._lake_lock = threading.Lock()

    # -- the worker plane -------------------------------------------------------------------------------------
    def _connected_plane(self):
        from ducklake_kit.workers.client import WorkerPlane

        if self._plane is not None and self._plane.scheduler_lost():
            self._plane.close()
            self._plane = None
        if self._plane is None:
            security = self.tls.security() if self.tls else None
            self._plane = WorkerPlane(self.address, self.endpoints, security=security)
        return self._plane

    def workers(self) -> list[str]:
        """The workers' names (w1 first); KitError when the plane does not answer."""
        from ducklake_kit.workers.client import name_order

        with self._plane_lock:
            return sorted(self._connected_plane().names(), key=name_order)

    def ask(self, text: str, worker: str | None, rows: int, query_id: str) -> QueryAnswer:
        """`text` as a task on the plane (on `worker`, or any), cancelled by `cancel(query_id)`; a plane that does not
        answer is the answer's error."""
        if _has_dynamic(text):
            return self._dynamic(text, rows)
        try:
            with self._plane_lock:
                plane = self._connected_plane()
            return ask(plane, text, worker=worker or None, rows=rows, query_id=query_id)
        except KitError as exc:
            return QueryAnswer(error=exc.line())

    def _dynamic(self, text: str, rows: int) -> QueryAnswer:
        """Text with dynamic-table DDL (CREATE DYNAMIC TABLE, SHOW DYNAMIC TABLES, ...) runs here, as `sql` runs it
        in the CLI: the dynamic tables' metadata lives in PostgreSQL, beside the lake, not on the workers."""
        from ducklake_kit.dynamic_tables import manage
        from ducklake_kit.dynamic_tables.metadata import Metadata
        from ducklake_kit.lake import StatementFailed

        def work(lake: Lake) -> QueryAnswer:
            start = time.perf_counter()
            answer = QueryAnswer(worker="the console (dynamic-table DDL runs where `sql` runs it)")
            try:
                with Metadata(self.endpoints) as meta:
                    last = manage.run_text(lake, meta, text)[-1]
            except StatementFailed as exc:
                answer.error = exc.error
                return answer
            except KitError as exc:
                answer.error = exc.line()
                return answer
            answer.statement_type = last.statement_type
            if last.columns:
                answer.columns, answer.rows, answer.total_rows = last.columns, last.rows[:rows], len(last.rows)
                answer.types = ["VARCHAR"] * len(last.columns)
            else:
                answer.message = (
                    f"{last.statement_type}: {last.affected_rows} rows affected"
                    if last.affected_rows is not None
                    else f"{last.statement_type}: ok"
                )
            answer.snapshot_id = lake.current_snapshot()
            answer.seconds = round(time.perf_counter() - start, 6)
            return answer

        return self.on_lake(work)

    def worker_list(self) -> list:
        """The workers as `workers` lists them (workers.client.WorkerInfo): state, lake, tasks run, local tables."""
        with self._plane_lock:
            return self._connected_plane().workers()

    def cancel(self, query_id: str) -> bool:
        with self._plane_lock:
            plane = self._connected_plane()
        return cancel(plane, query_id)

    # -- the lake -----------------------------------------------------------------------------------------------
    def on_lake(self, fn: Callable[[Lake], T]) -> T:
        """`fn(lake)` on the server's lake connection (made again when it broke)."""
        with self._lake_lock:
            if self._lake is None:
                self._lake = Lake(self.endpoints)
            try:
                return fn(self._lake)
            except KitError:
                raise
            except Exception as exc:  # noqa: BLE001 - the connection may be broken: the next call makes another
                self._lake.close()
                self._lake = None
                raise KitError(f"the lake did not answer ({first_line(exc)})", "run `status`") from None

    def tables(self) -> list[explore.TableInfo]:
        return self.on_lake(explore.tables)

    def snapshots(self) -> list[explore.SnapshotInfo]:
        return self.on_lake(explore.snapshots)

    def diff(self, table: str, before: int, after: int) -> explore.TableDiff:
        return self.on_lake(lambda lake: explore.diff(lake, table, before, after))

    def strata(self, table: str):
        """The table's data files from the catalog, as console.strata.Strata."""
        from ducklake_kit.console import strata

        return self.on_lake(lambda lake: strata.data_files(lake, table))

    # -- dynamic tables (their metadata lives in PostgreSQL beside the lake) -----------------------------------
    def dynamic_tables(self) -> list[tuple[Any, Any]]:
        """Every dynamic table's Definition with its last Refresh (None: never refreshed)."""
        from ducklake_kit.dynamic_tables.metadata import Metadata

        with Metadata(self.endpoints) as meta:
            return [(d, next(iter(meta.history(d.name, 1)), None)) for d in meta.all()]

    def dynamic_history(self, name: str, limit: int = 50) -> tuple[Any, list]:
        """A dynamic table's Definition and its refreshes, newest first (as `dynamic show` and `dynamic history`)."""
        from ducklake_kit.dynamic_tables import manage
        from ducklake_kit.dynamic_tables.metadata import Metadata

        with Metadata(self.endpoints) as meta:
            d = manage.get(meta, name)
            return d, meta.history(d.name, limit)

    def dynamic_refresh(self, name: str) -> list:
        """Refresh `name` now (the dynamic tables it reads first, as `dynamic refresh NAME`): the refreshes made."""
        from ducklake_kit.dynamic_tables import manage
        from ducklake_kit.dynamic_tables.metadata import Metadata

        def work(lake: Lake) -> list:
            with Metadata(self.endpoints) as meta:
                return manage.refresh_many(lake, meta, [name]).refreshes

        return self.on_lake(work)

    # -- pipelines -----------------------------------------------------------------------------------------------
    def pipeline_files(self) -> list[str]:
        """The pipeline files of the project's pipelines/ folder (where `console` was started), by name."""
        if self.pipelines_dir is None or not self.pipelines_dir.is_dir():
            return []
        try:
            return sorted(p.name for p in self.pipelines_dir.glob("*.sql"))
        except OSError:
            return []

    def pipeline_text(self, name: str) -> str:
        path = (self.pipelines_dir or Path(".")) / Path(name).name  # a name of the folder's list, never a path
        try:
            return path.read_text(encoding="utf-8-sig")
        except OSError as exc:
            raise KitError(f"cannot read the pipeline file {path} ({exc.strerror})", "check the file") from None

    def build_pipeline(self, text: str, name: str):
        """The pipeline in `text` (as `pipeline plan` reads a file named `name`): its nodes and edges, or one line."""
        from ducklake_kit.pipelines import dag

        return dag.build(text, name, name=Path(name).stem)

    def run_pipeline(self, pipeline, on_event: Callable[[str, Any], None]):
        """Run it as `pipeline run FILE` does (on the plane, change-aware, recorded in the lake); `on_event` as each
        node starts and ends. The flow's RunOutcome (None: nothing to run)."""
        from ducklake_kit.pipelines import flow

        return flow.run(
            pipeline, self.address, self.endpoints, flow.DEFAULTS, platform_name=self.platform, on_event=on_event
        )

    def lineage(self, table: str):
        """The recorded table and column lineage of `table` (as `pipeline lineage TABLE --columns`)."""
        from ducklake_kit.pipelines import flow

        return flow.lineage(self.endpoints, table, columns=True)

    def catalog_tables(self) -> list[str]:
        return self.on_lake(explore.catalog_tables)

    def catalog_rows(self, table: str) -> explore.CatalogRows:
        return self.on_lake(lambda lake: explore.catalog_rows(lake, table))
