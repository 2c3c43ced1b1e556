"""The client side of the worker plane: connect to a Dask scheduler (the kit's own or a user's), make sure every
worker has the lake attached, list the workers, and run SQL tasks on any worker or on a named one.

A task whose worker died is never run again: the kit's scheduler runs with `allowed-failures = 0`, so Dask raises
at once instead of re-running the task elsewhere (a statement that may have committed must not run twice), and a
user's scheduler that would re-run tasks is refused with the setting to change.
"""

from __future__ import annotations

import logging
import time
import uuid
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass
from typing import Any

from ducklake_kit.errors import KitError, first_line
from ducklake_kit.lake import Lake
from ducklake_kit.lake.transactions import CommitTag
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.workers.config import security_for
from ducklake_kit.workers.plugin import LakePlugin, WorkerState, plugin_name, worker_state
from ducklake_kit.workers.tasks import TaskError, TaskResult, run_statements

CONNECT_TIMEOUT_S = 10
NO_RETRIES_ENV = {"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"}  # how the kit starts its scheduler


@dataclass
class WorkerInfo:
    """One worker, as `workers` lists it."""

    name: str
    address: str
    pid: int | None
    state: str  # Dask's status (running, paused, closing) and, when busy, how many tasks it is processing
    lake: str  # "attached" or why not
    tasks_run: int
    uptime_s: float | None
    local_tables: list[str]
    memory_mib: float | None = None  # resident memory of the worker process

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class SchedulerUnreachable(KitError):
    """No Dask scheduler answers at the address (`status` reports it; other errors are the user's to fix)."""


class WorkerPlane:
    """A connection to the worker plane's scheduler, with the lake plugin registered for `endpoints`."""

    def __init__(
        self,
        address: str,
        endpoints: Endpoints,
        *,
        timeout_s: float = CONNECT_TIMEOUT_S,
        register: bool = True,
        security=None,
    ):
        from distributed import Client  # the CLI only pays for importing Dask when it uses the workers

        # this process is a client only: what goes wrong with the plane (a lost scheduler, a refused connection) the
        # kit says itself, in one line; Dask's client logs the same with tracebacks on stderr
        for name in ["distributed", *(n for n in logging.root.manager.loggerDict if n.startswith("distributed."))]:
            logging.getLogger(name).setLevel(logging.CRITICAL)  # Dask's config gives some their own level
        self.address = address
        self.endpoints = endpoints
        self.plugin = plugin_name(endpoints)
        # the kit's own plane: its client certificate (the scheduler refuses a client without one)
        security = security if security is not None else security_for(address)
        try:
            self.client = Client(address, timeout=timeout_s, set_as_default=False, security=security)
        except FileNotFoundError as exc:  # the plane's certificates are gone (a `reset`, a state folder moved)
            raise SchedulerUnreachable(
                f"the worker plane's TLS files are missing ({exc.filename})",
                "run `up` (it makes them and restarts the plane)",
            ) from None
        except (OSError, TimeoutError) as exc:
            raise SchedulerUnreachable(
                f"no Dask scheduler answers at {address} ({first_line(exc)})",
                "run `up` (it starts the worker plane), or check --scheduler / DUCKLAKE_SCHEDULER",
            ) from None
        except (ValueError, TypeError) as exc:  # no port, a port that is not a number, tls:// without TLS settings
            raise KitError(
                f"cannot use the Dask scheduler address {address} ({first_line(exc)})",
                "give it as tcp://host:port (or tls://host:port)",
            ) from None
        try:
            self._refuse_task_retries()
            if register:
                self.ensure_plugin()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> WorkerPlane:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.client.close()

    def threads(self) -> int:
        """How many tasks the plane runs at once now: its workers' threads (at least 1)."""
        return max(1, sum(self.client.nthreads().values()))

    def scheduler_lost(self) -> bool:
        """The client is no longer connected to its scheduler (it died, or the connection broke)."""
        return self.client.status != "running"

    # -- set-up --------------------------------------------------------------------------------------------------
    def _refuse_task_retries(self) -> None:
        # lambdas travel by value: the scheduler needs Dask, not this package
        allowed = self.client.run_on_scheduler(lambda dask_scheduler=None: int(dask_scheduler.allowed_failures))
        if allowed != 0:
            raise KitError(
                f"the Dask scheduler at {self.address} re-runs a task whose worker died (allowed-failures = {allowed}), "
                "which could run a committed statement twice",
                "start it with DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=0 in its environment",
            )

    def ensure_plugin(self) -> None:
        """Register the lake plugin at the scheduler unless it already is: every worker, present or future, attaches
        the lake once. Registering it again would make every worker attach again."""
        if self.plugin in self.client.run_on_scheduler(lambda dask_scheduler=None: list(dask_scheduler.worker_plugins)):
            return
        # attach once from here first: on a new catalog, the first ATTACH creates DuckLake's tables, and several
        # workers doing that at once collide in PostgreSQL (duplicate key in pg_type)
        Lake(self.endpoints).close()
        # idempotent at the scheduler: when two clients register at once, the second does not make every worker
        # tear the plugin down and attach again under a running task (the public register_plugin has no such flag)
        self.client.sync(self.client._register_worker_plugin, LakePlugin(self.endpoints), self.plugin, True)

    # -- the workers ---------------------------------------------------------------------------------------------
    def _scheduler_workers(self) -> dict[str, dict[str, Any]]:
        return self.client.scheduler_info(n_workers=-1)["workers"]

    def names(self) -> dict[str, str]:
        """Worker name -> address, for the workers the scheduler knows now."""
        return {str(w["name"]): addr for addr, w in self._scheduler_workers().items()}

    def states(self, addresses: list[str] | None = None) -> dict[str, WorkerState]:
        return self.client.run(worker_state, self.plugin, workers=addresses, on_error="return")

    def workers(self) -> list[WorkerInfo]:
        info = self._scheduler_workers()
        states = self.states(list(info)) if info else {}
        processing = self.client.processing()
        out = []
        now = time.time()
        for addr, w in info.items():
            st = states.get(addr)
            busy = len(processing.get(addr, ()))
            status = str(w.get("status", "running")).replace("Status.", "")
            pid, memory = w.get("pid"), None
            if isinstance(st, WorkerState):
                lake = "attached" if st.attached else f"NOT attached: {st.error or 'still attaching'}"
                tasks, uptime, tables = (
                    st.tasks_run,
                    (round(now - st.started, 1) if st.started else None),
                    st.local_tables,
                )
                pid, memory = st.pid, st.memory_mib
            else:  # the worker did not answer (it is closing, or the call failed)
                lake, tasks, uptime, tables = (
                    f"unknown ({first_line(st) if isinstance(st, BaseException) else st})",
                    0,
                    None,
                    [],
                )
            out.append(
                WorkerInfo(
                    str(w["name"]),
                    addr,
                    pid,
                    status + (f", {busy} task(s)" if busy else ", idle"),
                    lake,
                    tasks,
                    uptime,
                    tables,
                    memory,
                )
            )
        return sorted(out, key=lambda x: name_order(x.name))

    def address_of(self, name: str) -> str:
        names = self.names()
        if name in names:
            return names[name]
        if name in names.values():  # an address given instead of a name
            return name
        running = ", ".join(sorted(names, key=name_order)) or "none"
        raise KitError(
            f"no running worker is named '{name}' (running: {running})",
            "run `workers` to list them, or `up --workers N` to start more",
        )

    # -- tasks ---------------------------------------------------------------------------------------------------
    def submit(
        self,
        texts: list[str] | str,
        *,
        worker: str | None = None,
        tag: CommitTag | None = None,
        timeout_s: float | None = None,
        priority: int = 0,
        among: list[str] | None = None,
    ):
        """Submit a task (a Dask future). `worker`: a worker's name (or address) it must run on; other workers
        never take it. `tag`: run all the statements in one transaction with its commit message, its token and
        extra carried by the commit (a task whose fate is unknown, because its worker died, is found in the lake
        by its token). `timeout_s`: the worker interrupts the running statement after that long. `priority`: queued
        tasks with a higher one are given to a free worker first. `among`: without `worker`, the workers (names)
        it may run on."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        return self.submit_call(
            run_statements, texts, tag, timeout_s=timeout_s, worker=worker, priority=priority, among=among
        )

    def submit_call(
        self, fn, *args, worker: str | None = None, among: list[str] | None = None, priority: int = 0, **kwargs
    ):
        """Submit `fn(plugin, *args, token=..., **kwargs)` as a task of the plane: a function run on a worker with
        its lake (see tasks.task_lake), pinned like `submit`."""
        chosen = [worker] if worker else among
        pin = {"workers": [self.address_of(w) for w in chosen], "allow_other_workers": False} if chosen else {}
        # pure=False: two identical statements are two tasks (Dask would otherwise run one and share its result);
        # retries=0: a failed task is reported, never repeated; the token makes a second run by Dask refuse
        return self.client.submit(
            fn, self.plugin, *args, token=uuid.uuid4().hex, **kwargs, pure=False, retries=0, priority=priority, **pin
        )

    def result(self, future, timeout_s: float | None = None, *, release: bool = True) -> TaskResult:
        """The task's result; a task whose worker died becomes a failed TaskResult naming the worker. The future is
        released once read (the worker holding it may then go without Dask computing it again); `release=False`
        leaves that to the caller, who may have a message to send first (see pipelines.runner)."""
        from distributed import KilledWorker

        try:
            result = future.result(timeout=timeout_s)
            if release:
                future.release()
            return result
        except KilledWorker as exc:
            last = getattr(exc, "last_worker", None)
            name = str(getattr(last, "name", None) or "?")
            address = str(getattr(last, "address", None) or "")
            return TaskResult(
                name,
                address,
                lost=True,
                error=TaskError(
                    f"worker {name} ({address}) died while it held this task; the task was not run again, because its "
                    "statements may have committed: check the lake before re-running it"
                ),
            )
        except (FutureTimeout, TimeoutError):
            raise KitError(
                f"the task did not finish within {timeout_s:.0f}s (it may still be running on its worker)",
                "run `workers` to see what the workers are doing",
            ) from None

    def run(
        self,
        texts: list[str] | str,
        *,
        worker: str | None = None,
        message: str | None = None,
        timeout_s: float | None = None,
    ) -> TaskResult:
        return self.result(self.submit(texts, worker=worker, tag=_tag(message)), timeout_s)

    def run_each(self, texts: list[str], *, message: str | None = None) -> list[TaskResult]:
        """One task per text, all submitted at once (they run in parallel on the free workers), in order."""
        from distributed import as_completed

        futures = [self.submit(t, tag=_tag(message)) for t in texts]
        order = {f.key: i for i, f in enumerate(futures)}
        results: list[TaskResult | None] = [None] * len(futures)
        for done in as_completed(futures):  # each result read (and released) as soon as it is there
            results[order[done.key]] = self.result(done)
        return results  # type: ignore[return-value]


def worker_number(name: str) -> int | None:
    """2 for the kit's worker w2; None for a name of another kind (a user's cluster names its workers freely)."""
    digits = name[1:]
    return int(digits) if name.startswith("w") and digits.isdigit() else None


def name_order(name: str) -> tuple[int, str]:
    """w2 before w10, other names after them."""
    number = worker_number(name)
    return (number if number is not None else 10**9, name)


def _tag(message: str | None) -> CommitTag | None:
    """One transaction with this commit message, or (None) every statement on its own."""
    return CommitTag(message) if message is not None else None
