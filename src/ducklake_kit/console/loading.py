"""The Load page's job: files of trips into the lake through the kit's own `load` (PySpark: its modes, its checks,
its one snapshot), run as a subprocess of the console, as the console's user, one at a time.

What the page is given (a path on this machine: one CSV or Parquet file, or a folder of them) is checked here first,
in one line each (exists, readable by the console's user, CSV or Parquet, the schema and values the load needs, by
the load's own `sources.user_files`), so a bad path never starts Spark. The load itself is

    python -c 'from ducklake_kit.cli import main; main()' --platform external --home <console>/load \
        load --source files --path FILE... --mode MODE --json

with the lake's endpoints in `<console>/load/external.toml` (0600, the console's user's): no secret in its arguments
or environment. Its reporter's lines (stderr under --json) are the page's progress; its JSON envelope (stdout) is the
page's result: the load's id, its snapshot, each file's rows, and every check the load computed.

The console chooses the load's id (`--load-id`): a load that ends without its envelope (cancelled from the page,
killed, crashed) is then asked of the lake, not guessed: once its processes are gone and PostgreSQL holds no session
of it (PGAPPNAME names them; a COMMIT it had sent could still be landing until then), its id in a snapshot's
commit_extra_info says it committed that snapshot, and its absence that it committed nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import psycopg

from ducklake_kit.errors import KitError, first_line
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.platforms.procs import end_group, group_alive
from ducklake_kit.platforms.state import write_private

MODES = ("skip", "append", "replace")  # taxi.load.MODES (that module imports Spark's helpers: not here)
SUFFIXES = (".csv", ".parquet")
ZONES_FILE = "taxi_zone_lookup.csv"  # next to the trips files: the load's zones, not a trips file
RUN_CLI = "from ducklake_kit.cli import main; main()"
GRACE_S = 10.0  # a cancelled load's processes have this long after SIGTERM (Spark's JVM shuts down), then SIGKILL
SESSIONS_GONE_S = 30.0  # how long PostgreSQL may take to end a dead load's sessions before the lake is asked
FAULT_ENV = ("DUCKLAKE_FAULT", "DUCKLAKE_FAULT_RESUME_FILE")  # the test hooks (faults.py) reach the load


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def trips_files(text: str) -> list[Path]:
    """The trips files a path names: the file itself, or a folder's .csv and .parquet files (not its subfolders, not
    its zone lookup). Each exists and is readable by this process's user (the console's); else one line."""
    given = text.strip()
    if not given:
        raise KitError("no path given", "type the path of a CSV or Parquet file, or of a folder of them")
    path = Path(given)
    if not path.is_absolute():
        raise KitError(f"{given} is not an absolute path", "give the whole path, from / (e.g. /data/trips/)")
    try:
        is_dir = path.is_dir()
        exists = is_dir or path.exists()
    except OSError as exc:
        raise KitError(f"cannot look at {path} ({exc.strerror})", "check the path") from None
    if not exists:
        raise KitError(
            f"no file or folder at {path}", "check the path (it is a path on the machine the console runs on)"
        )
    if is_dir:
        if not os.access(path, os.R_OK | os.X_OK):
            raise _unreadable(path)
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in SUFFIXES and p.name != ZONES_FILE)
        if not files:
            raise KitError(f"the folder {path} holds no .csv or .parquet file", "give a folder of TLC trips files")
    else:
        if path.suffix.lower() not in SUFFIXES:
            raise KitError(f"{path.name} is neither a .csv nor a .parquet file", "give a CSV or Parquet file of trips")
        files = [path]
    for f in files:
        if not f.is_file() or not os.access(f, os.R_OK):
            raise _unreadable(f)
    return files


def _unreadable(path: Path) -> KitError:
    return KitError(
        f"the console's user ({_user()}) cannot read {path}",
        "make it readable by that user (chmod o+r on the file, o+rx on its folders)",
    )


def check_files(files: list[Path]) -> None:
    """What the load checks before anything is landed (footer, schema, values), checked here in one line first."""
    from ducklake_kit.taxi import sources

    sources.user_files([str(f) for f in files])


@dataclass
class LoadJob:
    """One load the page started: its lines of progress as they come, then its envelope (or its one-line error).
    `id`: the load's own id (`load --load-id`), which its commit carries. A load that ended without its envelope has
    `stopped`: one line saying what the lake found (`committed`: its snapshot, or None: nothing)."""

    files: list[str]
    mode: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    started: float = field(default_factory=time.time)
    ended: float | None = None
    lines: list[str] = field(default_factory=list)
    envelope: dict[str, Any] | None = None
    error: str | None = None
    cancelled: bool = False  # the page's Cancel was pressed while it ran
    stopped: str | None = None
    committed: int | None = None

    @property
    def running(self) -> bool:
        return self.ended is None

    @property
    def ok(self) -> bool:
        return self.envelope is not None and self.envelope.get("status") == "ok"

    @property
    def result(self) -> dict[str, Any]:
        return (self.envelope or {}).get("result") or {}

    def seconds(self) -> float:
        return round((self.ended or time.time()) - self.started, 1)


def external_toml(ep: Endpoints) -> str:
    """The lake's endpoints as `--platform external` reads them (platforms.external: same keys, lower case)."""
    values = {
        "pg_dsn": ep.pg.libpq(),
        "s3_endpoint": ep.s3.url,
        "s3_key_id": ep.s3.key_id,
        "s3_secret": ep.s3.secret,
        "s3_region": ep.s3.region,
        "s3_url_style": ep.s3.url_style,
    }
    return "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())


class Loads:
    """The console's loads: at most one at a time; the last one stays for the page to show (leave the page and come
    back: the same job). `folder`: the load's state folder (its cache, its spark.log), the console's own."""

    def __init__(self, folder: Path, endpoints: Endpoints):
        self.folder = folder
        self.endpoints = endpoints
        self._lock = threading.Lock()
        self._job: LoadJob | None = None
        self._proc: subprocess.Popen | None = None
        self._starting = False

    def current(self) -> LoadJob | None:
        """The running load, or the last one."""
        return self._job

    def start(self, text: str, mode: str) -> LoadJob:
        """Check the path, then start the load in the background; KitError (one line) when a load runs already or
        the path is not one the load can take."""
        if mode not in MODES:
            raise KitError(f"unknown mode '{mode}'", f"choose one of: {', '.join(MODES)}")
        with self._lock:
            if self._starting or (self._job is not None and self._job.running):
                raise self._busy()
            self._starting = True
        try:
            files = trips_files(text)
            check_files(files)
            job = LoadJob([str(f) for f in files], mode)
            proc = self._spawn(job)
            self._job, self._proc = job, proc
        finally:
            self._starting = False
        threading.Thread(target=self._follow, args=(job, proc), name=f"load {job.id}", daemon=True).start()
        return job

    def stop(self) -> None:
        """End a running load with the console (`down`, a restart): its process group, its Spark with it (see
        `end_group`). The load commits one snapshot or nothing, so the lake stays as it was; its unregistered files
        are a dead load's (`maintain --dead-loads`)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            end_group(proc.pid, GRACE_S)

    def cancel(self) -> bool:
        """The page's Cancel: end the running load's process group (see `end_group`) on a thread of its own, and
        return at once; the load's follower then finds out from the lake whether it committed. False when no load
        runs."""
        job, proc = self._job, self._proc
        if job is None or proc is None or not job.running or proc.poll() is not None:
            return False
        job.cancelled = True
        threading.Thread(target=end_group, args=(proc.pid, GRACE_S), name=f"cancel {job.id}", daemon=True).start()
        return True

    def _busy(self) -> KitError:
        job = self._job
        if job is None or not job.running:
            return KitError("a load is being started", "wait a moment: this page shows it once it runs")
        since = time.strftime("%H:%M:%S", time.localtime(job.started))
        return KitError(
            f"a load is running already (since {since}: {len(job.files)} file(s), mode {job.mode}); one at a time",
            "wait for it to end (this page shows its progress), then start yours",
        )

    def _spawn(self, job: LoadJob) -> subprocess.Popen:
        if self.endpoints.data_path != Endpoints.data_path:
            raise KitError(
                f"this lake's data path is {self.endpoints.data_path}, which `--platform external` does not take",
                "load with the CLI: `load --source files --path ...`",
            )
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private(self.folder / "external.toml", external_toml(self.endpoints))
        argv = [sys.executable, "-c", RUN_CLI, "--platform", "external", "--home", str(self.folder), "load"]
        argv += ["--source", "files", *[a for f in job.files for a in ("--path", f)], "--mode", job.mode]
        argv += ["--load-id", job.id, "--json"]
        # the kit's environment without its DUCKLAKE_* settings (the lake is the one in external.toml) but its test
        # hooks; a wide terminal, so that Rich does not wrap the reporter's lines; the load's PostgreSQL sessions
        # named for it (libpq's PGAPPNAME), so that the console can see them end
        env = {k: v for k, v in os.environ.items() if not k.startswith("DUCKLAKE_") or k in FAULT_ENV}
        env.update(COLUMNS="1000", PYTHONUNBUFFERED="1", PGAPPNAME=app_name(job.id))
        return subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=self.folder,
            text=True,
            start_new_session=True,
        )

    def _follow(self, job: LoadJob, proc: subprocess.Popen) -> None:
        """The load's reporter lines into `job.lines` as they come, then its envelope."""
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        for line in proc.stderr:  # type: ignore[union-attr]
            text = line.rstrip().removeprefix("•").strip()
            if text:
                job.lines.append(text)
        code = proc.wait()
        reader.join()
        try:
            job.envelope = json.loads("".join(out)) if "".join(out).strip() else None
        except ValueError:
            job.envelope = None
        if job.envelope is None:
            self._find_out(job, proc.pid, code)
        elif job.envelope.get("status") == "error" and "error" in job.result:
            job.error = str(job.result["error"])
        job.ended = time.time()

    def _find_out(self, job: LoadJob, pgid: int, code: int) -> None:
        """A load that ended without its envelope: what the lake holds of it, found by its id, in `job.stopped`."""
        how = (
            "cancelled"
            if job.cancelled
            else (f"stopped by signal {-code}" if code < 0 else f"ended with exit code {code} and no result")
        )
        try:
            if group_alive(pgid):  # its Spark outlived it (the load itself was killed): ended too
                end_group(pgid, GRACE_S)
            sessions_gone(self.endpoints, app_name(job.id))
            from ducklake_kit.lake import Lake
            from ducklake_kit.taxi.load import snapshot_of_load  # Spark's helpers: only once a load ended so

            with Lake(self.endpoints) as lake:
                job.committed = snapshot_of_load(lake, job.id)
        except (KitError, OSError, duckdb.Error, psycopg.Error) as exc:
            job.stopped = KitError(
                f"the load was {how} and the lake could not say whether it committed ({first_line(exc)})",
                f"look on the Lake page's timeline for a snapshot whose message starts `load {job.id}:`",
            ).line()
            return
        logs = "" if job.cancelled else f"; read {self.folder}/logs for why"
        if job.committed is None:
            job.stopped = (
                f"load {job.id} {how}: nothing was committed, the lake is as it was (no snapshot carries its id). "
                f"Next: load again; `maintain --dead-loads` removes the files it wrote but never registered{logs}"
            )
        else:
            job.stopped = (
                f"load {job.id} {how} after its commit: snapshot {job.committed} holds its rows, but its checks did not "
                f"run. Next: load the same path again in mode skip: it loads nothing twice and checks what it finds{logs}"
            )


def app_name(load_id: str) -> str:
    """What the load's PostgreSQL sessions call themselves (application_name)."""
    return f"ducklake-kit console load {load_id}"


def sessions_gone(ep: Endpoints, name: str, timeout: float = SESSIONS_GONE_S) -> None:
    """Wait until PostgreSQL holds no session named `name`: a dead client's session may still be finishing a COMMIT
    it received, and only then is the lake's answer final. KitError after `timeout` seconds."""
    from ducklake_kit.platforms import postgres

    deadline = time.monotonic() + timeout
    with postgres.connect(ep.pg, timeout=10) as conn:
        while True:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name]).fetchone()
            if not row or not row[0]:
                return
            if time.monotonic() > deadline:
                raise KitError(f"PostgreSQL still holds {row[0]} session(s) of the load after {timeout:g} s")
            time.sleep(0.2)
