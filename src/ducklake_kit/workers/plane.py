"""The worker plane's processes on this machine: one Dask scheduler (with its dashboard) and N workers named
w1..wN, each one process with one thread, all on loopback. Same discipline as PostgreSQL and S3: a pid file with
the start time, a log in the state folder, ready only after a real round trip, `down` stops exactly these.

Secure as the catalog is: the plane speaks mutual TLS with certificates made for this state folder (workers/tls.py),
so a local user without the kit's client certificate cannot connect, and when the kit runs as root the scheduler and
workers run as the service user (as PostgreSQL does), so a task never runs as root.

`--scheduler tcp://host:port` (or DUCKLAKE_SCHEDULER) uses a Dask cluster that is already running instead: the kit
starts nothing, registers the lake plugin there and uses its workers (the kit must be installed on them).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ducklake_kit.errors import KitError
from ducklake_kit.platforms import procs
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.platforms.service_user import check_reachable, make_python_reachable, service_user
from ducklake_kit.platforms.state import State
from ducklake_kit.workers import tls
from ducklake_kit.workers.client import (
    NO_RETRIES_ENV,
    SchedulerUnreachable,
    WorkerInfo,
    WorkerPlane,
    name_order,
    worker_number,
)
from ducklake_kit.workers.config import PlaneConfig
from ducklake_kit.workers.plugin import WorkerState

DEFAULT_WORKERS = 2
READY_TIMEOUT_S = float(os.environ.get("DUCKLAKE_READY_TIMEOUT", "60"))
SCHEDULER = "scheduler"  # pid and log file names: scheduler, worker-w1, worker-w2, ...


def worker_name(i: int) -> str:
    return f"w{i}"


def _worker_service(name: str) -> str:
    return f"worker-{name}"


@dataclass
class PlaneStatus:
    address: str
    dashboard: str | None
    managed: bool  # the kit started the scheduler and workers (False: a user's cluster)
    scheduler_pid: int | None
    healthy: bool
    detail: str
    workers: list[WorkerInfo] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # workers the kit started whose process is gone
    user: str | None = None  # the user the kit's scheduler runs as (the service user when the kit runs as root)

    @property
    def off(self) -> bool:
        """The kit's plane is not running by the user's choice (`up --workers 0`) or was never started."""
        return self.managed and self.healthy and not self.workers

    def as_dict(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "dashboard": self.dashboard,
            "managed": self.managed,
            "scheduler_pid": self.scheduler_pid,
            "healthy": self.healthy,
            "detail": self.detail,
            "workers": [w.as_dict() for w in self.workers],
            "missing": self.missing,
            "user": self.user,
        }


def _scheduler_argv(cfg: PlaneConfig) -> list[str]:
    # the TLS files come by path in the environment (tls.process_env), not here
    return [
        sys.executable,
        "-m",
        "dask",
        "scheduler",
        "--protocol",
        "tls",
        "--host",
        "127.0.0.1",
        "--port",
        str(cfg.scheduler_port),
        "--dashboard-address",
        f"127.0.0.1:{cfg.dashboard_port}",
    ]


def _worker_argv(state: State, cfg: PlaneConfig, name: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dask",
        "worker",
        cfg.address,
        "--name",
        name,
        "--nthreads",
        "1",
        "--no-nanny",
        # --no-dashboard still serves /health and /metrics, on every interface unless told otherwise
        "--no-dashboard",
        "--dashboard-address",
        "127.0.0.1:0",
        "--protocol",
        "tls",
        "--host",
        "127.0.0.1",
        "--local-directory",
        str(_plane_dir(state) / name),
        # a worker whose scheduler is gone for 60 s stops by itself, so no worker outlives its plane for long
        "--death-timeout",
        "60",
    ]


def _plane_dir(state: State) -> Path:
    """The plane's working folder (its processes' cwd and HOME, the workers' local directories)."""
    return state.home / "dask"


def _env(state: State, role: str) -> dict[str, str]:
    # the scheduler never re-runs a task whose worker died; logs are written as they happen; HOME is a folder the
    # (possibly demoted) process owns, for what DuckDB or Dask keep there
    return {**NO_RETRIES_ENV, "PYTHONUNBUFFERED": "1", "HOME": str(_plane_dir(state)), **tls.process_env(state, role)}


def _own_folder(path: Path, run_as: str | None) -> Path:
    """A folder of the plane's, private to the user its processes run as."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    if run_as:
        entry = pwd.getpwnam(run_as)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def _saved_workers(state: State) -> int:
    return int(state.settings().get("workers", DEFAULT_WORKERS))


def up(
    state: State,
    endpoints: Endpoints,
    workers: int | None = None,
    scheduler: str | None = None,
    *,
    remember: bool = True,
) -> PlaneStatus:
    """Start what is missing: the scheduler, then workers w1..wN (replacing dead ones, stopping any beyond N), and
    wait until each has the lake attached. Idempotent: what runs and answers is reused. `remember=False`: N is
    not saved as the plane's size (a benchmark that borrows extra workers)."""
    cfg = PlaneConfig.of(state, scheduler)
    n = _saved_workers(state) if workers is None else workers
    if n < 0:
        raise KitError(f"--workers must be 0 or more, not {n}", "e.g. --workers 2")
    if cfg.external_address:
        with WorkerPlane(cfg.address, endpoints, security=cfg.security()) as plane:
            _wait_attached(plane, list(plane.names()))
            return _status_of(plane, cfg, managed=False)
    state.ensure_dirs()
    if n == 0:  # no worker plane: stop one that runs
        with state.lock():
            stopped = [m for m in _down(state) if "stopped" in m]
        state.save_settings(workers=0)
        return PlaneStatus(cfg.address, None, True, None, True, "; ".join(["not started (--workers 0)", *stopped]))
    with state.lock():
        run_as = service_user()  # None unless the kit runs as root
        granted = make_python_reachable(run_as) if run_as else []
        if run_as:
            check_reachable(_plane_dir(state), run_as, "the worker plane")
        tls.ensure_certificates(state, run_as)
        code, stale = procs.code_fingerprint(), None
        if state.settings().get("plane_ca") != tls.fingerprint(state):
            _down(state)  # started with other certificates (or none, before the plane spoke TLS): start anew
        elif state.settings().get("plane_code") != code and (scheduler_running(state) or running_workers(state)):
            # its processes run the code they started with: after a pull or an upgrade they would take the new
            # code's tasks with the old functions, so they are started anew (a task running on them is lost, and
            # the kit's tokens say whether its commit landed)
            _down(state)
            stale = "restarted: the kit's code changed since the plane started"
        _own_folder(_plane_dir(state), run_as)
        scheduler_pid = _ensure_scheduler(state, cfg, run_as)
        state.save_settings(plane_ca=tls.fingerprint(state), plane_code=code)
        with WorkerPlane(cfg.address, endpoints, security=cfg.security()) as plane:
            wanted = [worker_name(i) for i in range(1, n + 1)]
            _stop_workers(state, sorted(set(_kit_workers(state)) - set(wanted), key=name_order))
            started = [name for name in wanted if _start_worker_if_needed(state, cfg, plane, name, run_as)]
            _wait_attached(plane, wanted, started, state)
            sizes = {"workers": n} if remember else {}
            state.save_settings(scheduler_port=cfg.scheduler_port, dashboard_port=cfg.dashboard_port, **sizes)
            out = _status_of(plane, cfg, managed=True, scheduler_pid=scheduler_pid)
            out.detail = f"started {', '.join(started)}" if started else "already running, reused"
            out.detail = f"{stale}; {out.detail}" if stale else out.detail
            if granted:
                out.detail += f"; granted user {run_as} passage through {', '.join(granted)} to run the kit's Python"
            return out


def _ensure_scheduler(state: State, cfg: PlaneConfig, run_as: str | None) -> int:
    pid_file, log_file = state.pid_file(SCHEDULER), state.log_file(SCHEDULER)
    rec = procs.live_pid(pid_file)
    if rec and rec.port == cfg.scheduler_port:
        try:
            procs.wait_until(
                lambda: _ping(cfg),
                what=f"the Dask scheduler (pid {rec.pid})",
                timeout=READY_TIMEOUT_S,
                log_file=log_file,
            )
            return rec.pid
        except KitError:
            procs.stop(pid_file)  # alive but not answering: replace it
    elif rec:
        procs.stop(pid_file)  # running on another port than asked: move it
    else:
        pid_file.unlink(missing_ok=True)
    for port, what, option in (
        (cfg.scheduler_port, "the Dask scheduler", "DUCKLAKE_SCHEDULER_PORT"),
        (cfg.dashboard_port, "the Dask dashboard", "DUCKLAKE_DASHBOARD_PORT"),
    ):
        busy = procs.busy_port(port, what, option)
        if busy:
            raise busy
    rec, proc = procs.start(
        SCHEDULER,
        _scheduler_argv(cfg),
        pid_file=pid_file,
        log_file=log_file,
        port=cfg.scheduler_port,
        how=procs.Launch(env=_env(state, "scheduler"), run_as=run_as, umask=0o077, cwd=_plane_dir(state)),
    )
    try:
        procs.wait_until(
            lambda: _ping(cfg),
            what=f"the Dask scheduler on port {cfg.scheduler_port}",
            timeout=READY_TIMEOUT_S,
            proc=proc,
            log_file=log_file,
        )
    except KitError:
        procs.stop(pid_file)
        raise
    return rec.pid


def _ping(cfg: PlaneConfig) -> bool | None:
    """A real round trip: a client connects and the scheduler answers."""
    from distributed import Client

    with Client(cfg.address, timeout=2, set_as_default=False, security=cfg.security()) as client:
        return bool(client.scheduler_info(n_workers=0)) or None


def _kit_workers(state: State) -> list[str]:
    """Names of the workers the kit started in this state folder (by pid file, alive or not)."""
    return [p.name.removeprefix("worker-").removesuffix(".pid.json") for p in state.run_dir.glob("worker-*.pid.json")]


def _start_worker_if_needed(state: State, cfg: PlaneConfig, plane: WorkerPlane, name: str, run_as: str | None) -> bool:
    pid_file = state.pid_file(_worker_service(name))
    rec = procs.live_pid(pid_file)
    joined = plane.names()
    if rec and name in joined:
        st = plane.states([joined[name]]).get(joined[name])
        if not (isinstance(st, WorkerState) and st.error):
            return False  # alive and joined: reused
        procs.stop(pid_file)  # its lake failed to attach (the catalog was down?): a new process attaches again
    elif rec:
        procs.stop(pid_file)  # alive but not joined to this scheduler: replace it
    pid_file.unlink(missing_ok=True)
    _own_folder(_plane_dir(state) / name, run_as)
    procs.start(
        _worker_service(name),
        _worker_argv(state, cfg, name),
        pid_file=pid_file,
        log_file=state.log_file(_worker_service(name)),
        port=cfg.scheduler_port,
        how=procs.Launch(env=_env(state, "worker"), run_as=run_as, umask=0o077, cwd=_plane_dir(state)),
    )
    return True


def _wait_attached(
    plane: WorkerPlane, names: list[str], started: list[str] | None = None, state: State | None = None
) -> None:
    """Until every named worker has joined and attached the lake; one that failed to attach stops `up` with its
    reason, one whose process exited with its log's tail."""

    def ready() -> bool | None:
        joined = plane.names()
        for name in names:
            if (
                state is not None
                and name in (started or [])
                and procs.live_pid(state.pid_file(_worker_service(name))) is None
            ):
                log = state.log_file(_worker_service(name))
                raise procs.GiveUp(
                    KitError(
                        f"worker {name} exited while starting",
                        f"read {log}",
                        detail=f"last lines of {log}:\n{procs.log_tail(log)}",
                    )
                )
            if name not in joined:
                return None
        states = plane.states([joined[n] for n in names]) if names else {}
        for st in states.values():
            if not isinstance(st, WorkerState):
                return None  # not answering yet
            if st.error:
                raise procs.GiveUp(
                    KitError(f"worker {st.name}: {st.error}", "run `status`: the catalog and S3 must answer")
                )
            if not st.attached:
                return None  # the plugin is still attaching
        return True

    procs.wait_until(
        ready,
        what=f"worker(s) {', '.join(names)}",
        timeout=READY_TIMEOUT_S,
        fix="read the workers' logs in the state folder's logs/",
    )


def down(state: State) -> list[str]:
    """Stop the workers, then the scheduler (exactly the processes the kit started). Nothing else to keep: the
    worker-local tables live in the workers' memory and go with them."""
    if not state.run_dir.exists():
        return ["worker plane: not running"]
    with state.lock():
        return _down(state)


def _down(state: State) -> list[str]:
    names = sorted(_kit_workers(state), key=name_order)
    msgs = _stop_workers(state, names)
    msgs.append(f"scheduler: {procs.stop(state.pid_file(SCHEDULER))}")
    return msgs


def stop_workers(state: State, names: list[str]) -> list[str]:
    """Stop some of the kit's workers (e.g. the ones a benchmark started), leaving the rest running."""
    with state.lock():
        return _stop_workers(state, names)


def _stop_workers(state: State, names: list[str]) -> list[str]:
    stopped = procs.stop_all([state.pid_file(_worker_service(name)) for name in names])
    return [f"worker {name}: {msg}" for name, msg in zip(names, stopped)]


def running_workers(state: State) -> list[str]:
    """The kit's workers whose process is alive, w1 first."""
    return sorted(
        (n for n in _kit_workers(state) if procs.live_pid(state.pid_file(_worker_service(n)))), key=name_order
    )


def scheduler_running(state: State) -> bool:
    return procs.live_pid(state.pid_file(SCHEDULER)) is not None


@contextmanager
def borrowed(state: State, endpoints: Endpoints, workers: int, scheduler: str | None = None) -> Iterator[PlaneStatus]:
    """At least `workers` workers for a benchmark run: the kit's plane is grown as needed (never below its
    highest-numbered worker, not remembered as its size), and afterwards put back as it was (the workers the run
    started stopped, the scheduler too when the run started it). A user's cluster (`scheduler`) is used as it is."""
    had_scheduler, had = scheduler_running(state), running_workers(state)
    highest = max((worker_number(n) or 0 for n in had), default=0)  # w4 with w3 gone: 4
    try:
        yield up(state, endpoints, max(workers, highest), scheduler, remember=False)
    finally:
        if not scheduler:
            if not had_scheduler:
                down(state)
            else:
                extra = [n for n in running_workers(state) if n not in had]
                if extra:
                    stop_workers(state, extra)


def status(state: State, endpoints: Endpoints, scheduler: str | None = None) -> PlaneStatus:
    cfg = PlaneConfig.of(state, scheduler)
    managed = cfg.external_address is None
    rec = procs.read_pid(state.pid_file(SCHEDULER)) if managed else None
    if managed and rec is None and _saved_workers(state) == 0:
        return PlaneStatus(cfg.address, None, True, None, True, "not started (up --workers 0)")
    if managed and rec is None and "workers" not in state.settings():
        return PlaneStatus(cfg.address, None, True, None, True, "never started in this state folder: `up` starts it")
    if managed and (rec is None or rec.process() is None):
        detail = "stopped: run `up`" if rec is None else f"not running (pid {rec.pid} is gone): run `up`"
        return PlaneStatus(cfg.address, cfg.dashboard, True, None, False, detail)
    try:
        plane = WorkerPlane(cfg.address, endpoints, timeout_s=5, security=cfg.security())
    except SchedulerUnreachable as exc:
        return PlaneStatus(cfg.address, cfg.dashboard, managed, rec.pid if rec else None, False, exc.what)
    with plane:
        return _status_of(plane, cfg, managed, rec.pid if rec else None, state)


def _status_of(
    plane: WorkerPlane, cfg: PlaneConfig, managed: bool, scheduler_pid: int | None = None, state: State | None = None
) -> PlaneStatus:
    workers = plane.workers()
    missing = []
    if managed and state is not None:
        joined = {w.name for w in workers}
        missing = [
            n
            for n in sorted(_kit_workers(state), key=name_order)
            if n not in joined or procs.live_pid(state.pid_file(_worker_service(n))) is None
        ]
    unattached = [w.name for w in workers if w.lake != "attached"]
    healthy = not missing and not unattached and bool(workers)
    if not workers:
        detail = "the scheduler answers but has no workers: run `up --workers N`"
    elif missing or unattached:
        detail = "; ".join(
            filter(
                None,
                [
                    f"gone: {', '.join(missing)} (run `up` to replace them)" if missing else "",
                    f"lake not attached on {', '.join(unattached)}" if unattached else "",
                ],
            )
        )
    else:
        detail = f"{len(workers)} worker(s), lake attached on each"
    user = None
    if managed and scheduler_pid is not None:
        with contextlib.suppress(psutil.Error):
            user = psutil.Process(scheduler_pid).username()
    return PlaneStatus(cfg.address, cfg.dashboard, managed, scheduler_pid, healthy, detail, workers, missing, user)
