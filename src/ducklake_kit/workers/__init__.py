"""The worker plane: DuckDB workers on Dask, each with the lake attached once (a pooled connection) and an
in-memory database `local` for worker-local tables; SQL tasks on any worker or on a named one.

- `plane`: the scheduler and workers as supervised local processes (`up`, `down`, `status`), or a user's cluster
- `client.WorkerPlane`: connect, list the workers, submit and run tasks
- `tasks`: what a task runs on its worker and its typed result (`TaskResult`)
- `plugin`: the worker side (the lake attached at join, worker-local tables)
"""

from ducklake_kit.workers.client import WorkerInfo, WorkerPlane
from ducklake_kit.workers.plugin import LOCAL_DB
from ducklake_kit.workers.tasks import StatementOutcome, TaskError, TaskResult

__all__ = ["LOCAL_DB", "StatementOutcome", "TaskError", "TaskResult", "WorkerInfo", "WorkerPlane"]
