"""The worker plane: DuckDB workers on Dask, each with the lake attached once (a pooled connection) and an
in-memory database `local` for worker-local tables; SQL tasks on any worker or on a named one.

- `config`: where the plane is (ports, or a user's scheduler)
- `plane`: the scheduler and workers as supervised local processes (`up`, `down`, `status`), or a user's cluster
- `client.WorkerPlane`: connect, list the workers, submit and run tasks
- `tasks`: what a task runs on its worker and its typed result (`TaskResult`)
- `plugin`: the worker side (the lake attached at join, worker-local tables)
"""

from __future__ import annotations

import importlib
from typing import Any

# loaded on first use, so that `workers.config` (what `connect` needs) does not import Dask
_EXPORTS = {
    "WorkerInfo": "client",
    "WorkerPlane": "client",
    "LOCAL_DB": "config",
    "StatementOutcome": "tasks",
    "TaskError": "tasks",
    "TaskResult": "tasks",
}
__all__ = sorted(_EXPORTS)  # noqa: PLE0605 - the names are read lazily (__getattr__), listed once


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
