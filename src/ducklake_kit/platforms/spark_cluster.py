"""The Spark cluster `spark up` starts on this machine, from PySpark's own package (no Spark download):

    standalone   a master and N workers (1 core and WORKER_MEMORY each), separate JVMs started with
                 `spark-class org.apache.spark.deploy.master.Master` / `...deploy.worker.Worker` (the wheel has no
                 start-master.sh); ready when the master reports N workers ALIVE
    connect      a Spark Connect server (`spark-submit --class ...SparkConnectServer`, what
                 sbin/start-connect-server.sh runs, kept in the foreground so the kit supervises it) on the standalone
                 cluster when that is up, else on local[*]; ready when a client session answers a query

Same discipline as PostgreSQL, S3 and the worker plane: a pid file with the start time, logs in the state folder
(executors' work folders too, never inside site-packages), loopback only, busy ports named, `spark down` stops
exactly these. Generated credentials (0600): the standalone cluster's shared secret (`spark.authenticate`: an
application without it is refused) and the Connect server's token; both reach the JVMs through a properties file
and the environment, never through process arguments.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ducklake_kit.errors import KitError, first_line
from ducklake_kit.platforms import procs
from ducklake_kit.platforms.state import State, write_private

MODES = ("standalone", "connect")
DEFAULT_WORKERS = 2
DEFAULT_MASTER_PORT = 17077
DEFAULT_MASTER_UI_PORT = 18180  # the master's status page; its /json/ says which workers are ALIVE
DEFAULT_CONNECT_PORT = 15002
WORKER_CORES = 1
WORKER_MEMORY = "2g"  # what a worker offers its executors (by default a worker claims all of the machine's RAM)
EXECUTOR_MEMORY = "1g"
READY_TIMEOUT_S = float(os.environ.get("DUCKLAKE_SPARK_READY_TIMEOUT", "120"))
MASTER, CONNECT = "spark-master", "spark-connect"  # pid and log file names; workers: spark-worker-w1, ...
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
PORT_OPTIONS = {
    "master": "DUCKLAKE_SPARK_MASTER_PORT",
    "ui": "DUCKLAKE_SPARK_UI_PORT",
    "connect": "DUCKLAKE_SPARK_CONNECT_PORT",
}


def spark_home() -> Path:
    """PySpark's package folder: it carries bin/spark-class, bin/spark-submit and the jars."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _cmdline(rec: procs.PidRecord) -> list[str]:
    proc = rec.process()
    try:
        return proc.cmdline() if proc is not None else []
    except psutil.Error:
        return []


def _alive_workers(master_state: dict[str, Any]) -> int:
    return sum(1 for w in master_state.get("workers", []) if w.get("state") == "ALIVE")


def _worker_service(name: str) -> str:
    return f"spark-worker-{name}"


@dataclass
class SparkSecrets:
    auth_secret: str  # spark.authenticate.secret, shared by the master, the workers and every application
    connect_token: str  # the Spark Connect server's token (SPARK_CONNECT_AUTHENTICATE_TOKEN)


@dataclass
class ProcessStatus:
    name: str  # master | w1.. | connect
    running: bool
    pid: int | None
    detail: str
    port: int | None = None


@dataclass
class ClusterStatus:
    master_url: str | None  # spark://127.0.0.1:PORT when the standalone master runs
    ui_url: str | None
    connect_url: str | None  # sc://localhost:PORT (the token is not part of it) when the Connect server runs
    connect_master: str | None  # what the Connect server runs its jobs on
    alive_workers: int
    processes: list[ProcessStatus] = field(default_factory=list)
    detail: str = ""

    @property
    def started(self) -> list[ProcessStatus]:
        """The processes the kit started (alive, or gone since)."""
        return [p for p in self.processes if p.pid is not None or "gone" in p.detail]

    @property
    def healthy(self) -> bool:
        return all(p.running for p in self.started)

    def as_dict(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in asdict(self).items() if k != "processes"},
            "healthy": self.healthy,
            "processes": [asdict(p) for p in self.processes],
        }


class SparkCluster:
    """The kit's Spark processes in one state folder."""

    def __init__(
        self,
        state: State,
        *,
        master_port: int | None = None,
        ui_port: int | None = None,
        connect_port: int | None = None,
    ):
        self.state = state
        saved = state.settings()

        def port(given: int | None, key: str, default: int) -> int:
            return int(given or os.environ.get(PORT_OPTIONS[key]) or saved.get(f"spark_{key}_port") or default)

        self.master_port = port(master_port, "master", DEFAULT_MASTER_PORT)
        self.ui_port = port(ui_port, "ui", DEFAULT_MASTER_UI_PORT)
        self.connect_port = port(connect_port, "connect", DEFAULT_CONNECT_PORT)

    # -- layout ---------------------------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return self.state.home / "spark"

    @property
    def conf_dir(self) -> Path:
        """SPARK_CONF_DIR of every JVM of this cluster and of the drivers that use it: spark-defaults.conf (0600)."""
        return self.root / "conf"

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def connect_url(self) -> str:
        # `localhost`, not 127.0.0.1: the client sends a token over a plain channel only to localhost
        return f"sc://localhost:{self.connect_port}"

    def secrets(self) -> SparkSecrets:
        """Generated once, like the lake's credentials; kept 0600 in the state folder."""
        path = self.root / "secrets.json"
        if path.exists():
            return SparkSecrets(**json.loads(path.read_text()))
        made = SparkSecrets(secrets.token_urlsafe(32), secrets.token_urlsafe(32))
        write_private(path, json.dumps(asdict(made), indent=2))
        return made

    def client_env(self) -> dict[str, str]:
        """What a driver in another process needs to use the standalone cluster: its spark-defaults.conf (the secret)."""
        return {"SPARK_CONF_DIR": str(self.conf_dir), "SPARK_LOCAL_IP": "127.0.0.1"}

    def is_master_url(self, url: str) -> bool:
        """`url` names this cluster's master (127.0.0.1 or localhost, this port)."""
        rest = url.removeprefix("spark://").rstrip("/")
        host, _, port = rest.rpartition(":")
        return host in ("127.0.0.1", "localhost") and port == str(self.master_port)

    def defaults(self) -> dict[str, str]:
        """spark-defaults.conf: read by the master, the workers, the Connect server and the kit's own drivers."""
        return {
            "spark.authenticate": "true",
            "spark.authenticate.secret": self.secrets().auth_secret,
            "spark.master.rest.enabled": "false",  # no REST submission port (6066)
            "spark.ui.killEnabled": "false",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.memory": EXECUTOR_MEMORY,
            "spark.local.dir": str(self.root / "local"),
            "spark.worker.cleanup.enabled": "true",  # old applications' work folders go after a while
        }

    def _write_conf(self) -> None:
        for d in (self.root, self.conf_dir, self.root / "local", self.root / "work"):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o700)
        text = "".join(f"{k} {v}\n" for k, v in self.defaults().items())
        write_private(self.conf_dir / "spark-defaults.conf", text)

    def _env(self, service: str) -> dict[str, str]:
        # SPARK_NO_DAEMONIZE marks the cluster's own processes (and the executors and Python workers they start,
        # which inherit it) for `leftovers`; PYSPARK_PYTHON is what the Connect server's executors run (a driver not
        # started by spark-submit reads no spark.pyspark.python: executors would start `python3`, without duckdb)
        env = {
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(self.conf_dir),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(self.root / "local"),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_NO_DAEMONIZE": "1",
        }
        if service == CONNECT:
            env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = self.secrets().connect_token
        return env

    def _bin(self, name: str) -> str:
        path = spark_home() / "bin" / name
        if not path.exists():
            raise KitError(
                f"PySpark's package has no bin/{name} ({path})", "run `just setup` to reinstall the pinned pyspark"
            )
        return str(path)

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def up(self, mode: str = "standalone", workers: int | None = None) -> ClusterStatus:
        """Start what `mode` needs and is not running; reuse what answers. Idempotent."""
        if mode not in MODES:
            raise KitError(f"unknown Spark mode '{mode}'", f"choose one of: {', '.join(MODES)}")
        if mode == "connect" and workers is not None:
            raise KitError(
                "--spark-workers is for --mode standalone (the Connect server uses the standalone cluster's "
                "workers when it runs)",
                "run `spark up --spark-workers N` first, then `spark up --mode connect`",
            )
        n = int(self.state.settings().get("spark_workers", DEFAULT_WORKERS)) if workers is None else workers
        if n < 1:
            raise KitError(f"--spark-workers must be 1 or more, not {n}", "e.g. --spark-workers 2")
        from ducklake_kit.platforms.doctor import JAVA_FIX, java_problem

        why = java_problem()
        if why:
            raise KitError(why, JAVA_FIX)
        self.state.ensure_dirs()
        with self.state.lock():
            self._write_conf()
            self.state.save_settings(
                spark_master_port=self.master_port, spark_ui_port=self.ui_port, spark_connect_port=self.connect_port
            )
            if mode == "standalone":
                self._ensure_master()
                self._ensure_workers(n)
                self.state.save_settings(spark_workers=n)
            else:
                if self._standalone_started():
                    # the Connect server runs its jobs on the standalone cluster: a master or worker that died since
                    # is started again first, as plain `spark up` does (else the server runs on fewer cores, or on
                    # local[*])
                    self._ensure_master()
                    self._ensure_workers(n)
                self._ensure_connect()
        return self.status()

    def _standalone_started(self) -> bool:
        """`spark up` (standalone) ran in this state folder and `spark down` has not: its pid files are there, the
        processes alive or not."""
        return procs.read_pid(self.state.pid_file(MASTER)) is not None or bool(self.kit_workers())

    def _busy(self, port: int, what: str, key: str) -> None:
        busy = procs.busy_port(port, what, PORT_OPTIONS[key])
        if busy:
            raise busy

    def _reuse(self, service: str, port: int, ping) -> bool:
        """True when the process in `service`'s pid file runs on `port` and answers; anything else is stopped."""
        pid_file = self.state.pid_file(service)
        rec = procs.live_pid(pid_file)
        if rec and rec.port == port:
            try:
                procs.wait_until(
                    ping,
                    what=f"{service} (pid {rec.pid})",
                    timeout=READY_TIMEOUT_S,
                    log_file=self.state.log_file(service),
                )
                return True
            except KitError:
                pass
        procs.stop(pid_file)
        return False

    def _ensure_master(self) -> None:
        if self._reuse(MASTER, self.master_port, self._master_json):
            return
        self._busy(self.master_port, "the Spark master", "master")
        self._busy(self.ui_port, "the Spark master's status page", "ui")
        argv = [
            self._bin("spark-class"),
            MASTER_CLASS,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.master_port),
            "--webui-port",
            str(self.ui_port),
        ]
        self._start(MASTER, argv, self.master_port, self._master_json, "the Spark master")

    def _start(self, service: str, argv: list[str], port: int, ping, what: str) -> None:
        pid_file, log_file = self.state.pid_file(service), self.state.log_file(service)
        _rec, proc = procs.start(
            service,
            argv,
            pid_file=pid_file,
            log_file=log_file,
            port=port,
            how=procs.Launch(env=self._env(service), umask=0o077, cwd=self.root),
        )  # e.g. spark-warehouse/ lands in the state folder
        try:
            procs.wait_until(ping, what=f"{what} on port {port}", timeout=READY_TIMEOUT_S, proc=proc, log_file=log_file)
        except KitError:
            procs.stop(pid_file)
            raise

    def _master_state(self) -> dict[str, Any]:
        """A real round trip: the master's own account of itself (`status`) and its workers."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=3) as resp:
            return json.loads(resp.read())

    def _master_json(self) -> dict[str, Any] | None:
        """The master's account when it is ALIVE, else None (a readiness probe)."""
        data = self._master_state()
        return data if data.get("status") == "ALIVE" else None

    def _alive(self) -> int:
        try:
            return _alive_workers(self._master_json() or {})
        except OSError:
            return 0

    def kit_workers(self) -> list[str]:
        """w1.. : the workers started in this state folder (by pid file, alive or not)."""
        names = [
            p.name.removeprefix(f"{_worker_service('')}").removesuffix(".pid.json")
            for p in self.state.run_dir.glob(f"{_worker_service('*')}.pid.json")
        ]
        return sorted(names, key=lambda n: int(n[1:]) if n[1:].isdigit() else 0)

    def _ensure_workers(self, n: int) -> None:
        wanted = [f"w{i}" for i in range(1, n + 1)]
        extra = [w for w in self.kit_workers() if w not in wanted]
        procs.stop_all([self.state.pid_file(_worker_service(w)) for w in extra])
        started = []
        for name in wanted:
            pid_file = self.state.pid_file(_worker_service(name))
            rec = procs.live_pid(pid_file)
            if rec is not None and self.master_url in _cmdline(rec):
                continue  # alive and registered with this master (it registers again by itself if the master restarted)
            procs.stop(pid_file)  # gone, or started for a master on another port
            work = self.root / "work" / name
            work.mkdir(parents=True, exist_ok=True)
            argv = [
                self._bin("spark-class"),
                WORKER_CLASS,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--webui-port",
                "0",
                "--cores",
                str(WORKER_CORES),
                "--memory",
                WORKER_MEMORY,
                "--work-dir",
                str(work),
                self.master_url,
            ]
            procs.start(
                _worker_service(name),
                argv,
                pid_file=pid_file,
                log_file=self.state.log_file(_worker_service(name)),
                port=0,
                how=procs.Launch(env=self._env(_worker_service(name)), umask=0o077, cwd=self.root),
            )
            started.append(name)

        def ready() -> bool | None:
            registered = []
            for name in started:
                rec = procs.live_pid(self.state.pid_file(_worker_service(name)))
                if rec is None:
                    log = self.state.log_file(_worker_service(name))
                    raise procs.GiveUp(
                        KitError(
                            f"Spark worker {name} exited while starting",
                            f"read {log}",
                            detail=f"last lines of {log}:\n{procs.log_tail(log)}",
                        )
                    )
                registered.append(self._registered(rec))
            # each worker started now, by its own port: a worker killed a moment ago stays ALIVE at the master until its
            # heartbeats are missed (a minute), so a count alone would be satisfied before its successor registered
            return True if all(registered) and self._alive() >= n else None

        procs.wait_until(
            ready,
            what=f"{n} ALIVE Spark worker(s) at the master",
            timeout=READY_TIMEOUT_S,
            fix="read the workers' logs (spark-worker-w*.log) in the state folder's logs/",
        )

    def _registered(self, rec: procs.PidRecord) -> bool:
        """The master lists an ALIVE worker on a port this worker process listens on."""
        proc = rec.process()
        try:
            ports = (
                {c.laddr.port for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
                if proc
                else set()
            )
            workers = (self._master_json() or {}).get("workers", [])
        except (psutil.Error, OSError, ValueError):
            return False
        return any(w.get("state") == "ALIVE" and w.get("port") in ports for w in workers)

    def _connect_master(self) -> str:
        """What the Connect server runs on: the kit's standalone cluster when its master answers, else local[*]."""
        if procs.live_pid(self.state.pid_file(MASTER)) and self._alive() >= 1:
            return self.master_url
        return "local[*]"

    def _ensure_connect(self) -> None:
        master = self._connect_master()
        if self.state.settings().get("spark_connect_master") == master and self._reuse(
            CONNECT, self.connect_port, self._connect_ping
        ):
            return
        procs.stop(self.state.pid_file(CONNECT))  # a server on another master than wanted now is replaced
        self._busy(self.connect_port, "the Spark Connect server", "connect")
        argv = [
            self._bin("spark-submit"),
            "--class",
            CONNECT_CLASS,
            "--name",
            "Spark Connect server",
            "--master",
            master,
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            f"spark.connect.grpc.binding.port={self.connect_port}",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=4",
            # on the standalone cluster, a long-lived server must give its executors back when idle (also those
            # holding shuffle files), or a load from another driver would wait for cores
            "--conf",
            "spark.dynamicAllocation.enabled=true",
            "--conf",
            "spark.dynamicAllocation.shuffleTracking.enabled=true",
            "--conf",
            "spark.dynamicAllocation.executorIdleTimeout=15s",
            "--conf",
            "spark.dynamicAllocation.shuffleTracking.timeout=30s",
        ]
        self._start(CONNECT, argv, self.connect_port, self._connect_ping, "the Spark Connect server")
        self.state.save_settings(spark_connect_master=master)

    def _connect_ping(self) -> bool | None:
        """A real round trip: a client session (with the token) runs a query whose tasks need an executor."""
        from pyspark.sql.connect.session import SparkSession  # the Connect client itself: sets no process-wide mode

        if not procs.port_in_use(self.connect_port):
            return None  # not listening yet: a client would retry for a long while
        session = SparkSession.builder.remote(f"{self.connect_url}/;token={self.secrets().connect_token}").create()
        try:
            # no shuffle: an executor holding shuffle files stays 30 s (shuffleTracking.timeout), one without 15 s
            # (executorIdleTimeout), so a load started right after `spark up` gets the cluster's cores back sooner
            return True if sorted(r.id for r in session.range(0, 4, 1, 2).collect()) == [0, 1, 2, 3] else None
        finally:
            session.stop()

    def down(self) -> list[str]:
        """Stop the Connect server, the workers and the master (exactly the processes the kit started), then any
        process they left behind (an executor or its Python workers)."""
        if not self.state.run_dir.exists():
            return ["spark: not running"]
        with self.state.lock():
            workers = self.kit_workers()
            files = [self.state.pid_file(s) for s in (CONNECT, MASTER)]
            if not workers and not any(f.exists() for f in files) and not self.leftovers():
                return ["spark: not running"]
            msgs = [f"spark connect: {procs.stop(self.state.pid_file(CONNECT))}"]
            stopped = procs.stop_all([self.state.pid_file(_worker_service(w)) for w in workers])
            msgs += [f"spark worker {w}: {m}" for w, m in zip(workers, stopped)]
            msgs.append(f"spark master: {procs.stop(self.state.pid_file(MASTER))}")
            left = self.leftovers()
            for proc in left:
                try:
                    proc.send_signal(signal.SIGTERM)
                except psutil.Error:
                    pass
            _gone, alive = psutil.wait_procs(left, timeout=10)
            for proc in alive:
                try:
                    proc.kill()
                except psutil.Error:  # it exited meanwhile
                    pass
            if left:
                msgs.append(f"spark: stopped {len(left)} process(es) left behind (executors, Python workers)")
        return msgs

    def leftovers(self) -> list[psutil.Process]:
        """This user's processes started for this cluster: every JVM and Python worker of it has SPARK_CONF_DIR set
        to this state folder's conf folder (a driver that merely used the cluster is not one: see `client_env`)."""
        me, conf = os.getpid(), str(self.conf_dir)
        out = []
        for proc in psutil.process_iter(["pid", "uids"]):
            try:
                if proc.pid == me or proc.info["uids"].real != os.getuid():
                    continue
                env = proc.environ()
                if env.get("SPARK_CONF_DIR") == conf and env.get("SPARK_NO_DAEMONIZE") == "1":
                    out.append(proc)
            except (psutil.Error, TypeError):
                continue
        return out

    # -- status -------------------------------------------------------------------------------------------------
    def status(self, *, connect: bool = True) -> ClusterStatus:
        """`connect=False`: the Connect server is not asked (its round trip runs a query)."""
        procs_out: list[ProcessStatus] = []
        master_rec = procs.live_pid(self.state.pid_file(MASTER))
        data: dict[str, Any] = {}
        master_detail = "not running"
        if master_rec:
            try:
                raw = self._master_state()
                data = raw if raw.get("status") == "ALIVE" else {}
                master_detail = f"{raw.get('status')}, {_alive_workers(raw)} worker(s) ALIVE"
            except (OSError, ValueError) as exc:
                master_detail = f"running but not answering ({first_line(exc)})"
        elif procs.read_pid(self.state.pid_file(MASTER)):
            master_detail = "gone (its pid is not running): run `spark up`"
        procs_out.append(
            ProcessStatus(
                "master",
                bool(master_rec and data),
                master_rec.pid if master_rec else None,
                master_detail,
                self.master_port,
            )
        )
        for name in self.kit_workers():
            rec = procs.live_pid(self.state.pid_file(_worker_service(name)))
            procs_out.append(
                ProcessStatus(
                    name,
                    rec is not None,
                    rec.pid if rec else None,
                    f"{WORKER_CORES} core, {WORKER_MEMORY}" if rec else "gone: run `spark up`",
                )
            )
        connect_rec = procs.live_pid(self.state.pid_file(CONNECT))
        connect_ok = False
        connect_detail = "not running"
        if connect_rec and not connect:
            connect_detail = "running (not asked)"
        elif connect_rec:
            try:
                connect_ok = bool(self._connect_ping())
                connect_detail = "answers a query" if connect_ok else "running but not listening yet"
            except Exception as exc:  # noqa: BLE001 - any failure of the round trip means not answering
                connect_detail = f"running but not answering ({first_line(exc)[:120]})"
        elif procs.read_pid(self.state.pid_file(CONNECT)):
            connect_detail = "gone (its pid is not running): run `spark up --mode connect`"
        procs_out.append(
            ProcessStatus(
                "connect",
                connect_ok or bool(connect_rec and not connect),
                connect_rec.pid if connect_rec else None,
                connect_detail,
                self.connect_port,
            )
        )
        running = [p.name for p in procs_out if p.running]
        return ClusterStatus(
            master_url=self.master_url if master_rec and data else None,
            ui_url=f"http://127.0.0.1:{self.ui_port}" if master_rec and data else None,
            connect_url=self.connect_url if connect_ok else None,
            connect_master=self.state.settings().get("spark_connect_master") if connect_ok else None,
            alive_workers=_alive_workers(data),
            processes=procs_out,
            detail=("running: " + ", ".join(running)) if running else "not running (start it with `spark up`)",
        )
