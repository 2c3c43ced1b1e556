"""The podman platform: the overlay the k3d platform applies, played as real pods by podman (no Docker, no cluster).

`up` renders overlays/local with `kubectl kustomize` (one source of truth), builds or reuses the images
(podman_images), translates the objects (podman_adapter: every change listed), creates the podman secrets (data on
stdin) and volumes, runs `podman kube play`, then waits on the manifests' own startup and readiness probe commands
(`podman exec`, never a sleep) and on a real round trip through each port published on 127.0.0.1. Every podman call
reads the kit's containers.conf (CONTAINERS_CONF). Pods, volumes and secrets carry a prefix of their own per state
folder, so a test's kit and a user's never share one. `down` removes the pods (the volumes keep the data); `reset`
removes the volumes too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ducklake_kit.errors import KitError
from ducklake_kit.platforms import k8s, podman_adapter, podman_doctor, podman_images, postgres, procs, s3
from ducklake_kit.platforms.base import CATALOG_DB, Endpoints, PgEndpoint, Platform, S3Endpoint, ServiceStatus
from ducklake_kit.platforms.k3d import tool_path
from ducklake_kit.platforms.state import (
    PODMAN_PG_PORT,
    PODMAN_S3_PORT,
    Credentials,
    State,
    project_root,
    write_private,
)

PART_OF = "app.kubernetes.io/part-of=ducklake-kit"  # the label base/ puts on every pod and volume
PLAN_LABEL = "io.ducklake-kit.plan"  # a hash of what was played: an unchanged plan reuses running pods
COMMAND_TIMEOUT = 120.0
READY_TIMEOUT = float(os.environ.get("DUCKLAKE_READY_TIMEOUT", "60"))  # a round trip through a published port


def name_prefix(home: Path) -> str:
    """What this state folder's pods, volumes and secrets are named with: `ducklake-` for the checkout's own
    `.ducklake` (`ducklake-postgres-0`), `ducklake-<hash of the path>-` for any other folder, however it was chosen
    (`--home` or DUCKLAKE_HOME): two state folders never share a pod, a volume or a secret, and one folder's names
    do not depend on how it was named."""
    home = home.resolve()
    if home == ((project_root() or Path.cwd()) / ".ducklake").resolve():
        return f"{k8s.NAMESPACE}-"
    return f"{k8s.NAMESPACE}-{hashlib.sha256(str(home).encode()).hexdigest()[:6]}-"


class PodmanPlatform(Platform):
    name = "podman"

    def __init__(
        self,
        state: State | None = None,
        *,
        pg_port: int | None = None,
        s3_port: int | None = None,
        root: Path | None = None,
    ):
        base = state or State()
        self.state = State(base.home / "podman")
        self._root = root
        self.pg_port, self.s3_port = self.state.ports(pg_port, s3_port, (PODMAN_PG_PORT, PODMAN_S3_PORT))
        self.prefix = name_prefix(base.home)

    @property
    def root(self) -> Path:
        root = self._root or project_root()
        if root is None or not k8s.repo_path(root, k8s.OVERLAY).exists():
            raise KitError(
                "the podman platform needs the kit's checkout (overlays/local)", "run it from a clone of the repository"
            )
        return root

    def endpoints(self) -> Endpoints:
        creds = self.state.credentials()
        if creds is None:
            raise KitError(
                f"the podman lake has not been set up in {self.state.home}",
                "run `python ducklake_test.py --platform podman up` first",
            )
        return Endpoints(
            pg=PgEndpoint("127.0.0.1", self.pg_port, creds.pg_user, creds.pg_password),
            s3=S3Endpoint(f"127.0.0.1:{self.s3_port}", creds.s3_key_id, creds.s3_secret),
        )

    # -- podman ----------------------------------------------------------------------------------------
    def _podman(self, *args: str, stdin: bytes | None = None, check: bool = True, timeout: float = COMMAND_TIMEOUT):
        what = f"`podman {' '.join(args[:3])}`"
        return podman_doctor.run(
            ["podman", *args], what, stdin=stdin, check=check, timeout=timeout, slow="run `status`"
        )

    def _require(self) -> None:
        missing = [t for t in podman_doctor.check(required=True) if not t.ok]
        if tool_path("kubectl") is None:
            raise KitError("kubectl not found (--platform podman renders the overlay with it)", "run `just setup`")
        if missing:
            raise KitError(
                f"{', '.join(f'{t.name} ({t.version})' for t in missing)}: --platform podman needs them",
                missing[0].hint,
            )

    # -- the plan --------------------------------------------------------------------------------------
    def _render(self, creds: Credentials) -> list[dict]:
        """`kubectl kustomize overlays/local` on a private copy holding this platform's secrets.env (0600)."""
        with tempfile.TemporaryDirectory(prefix="ducklake-podman-render-") as tmp:
            for top in ("base", "databases", "overlays"):
                shutil.copytree(self.root / top, Path(tmp) / top, ignore=shutil.ignore_patterns("secrets.env"))
            values = {
                "POSTGRES_USER": creds.pg_user,
                "POSTGRES_PASSWORD": creds.pg_password,
                "S3_KEY_ID": creds.s3_key_id,
                "S3_SECRET": creds.s3_secret,
            }
            write_private(k8s.repo_path(Path(tmp), k8s.SECRETS_ENV), k8s.secrets_env_text(values))
            out = subprocess.run(
                [
                    tool_path("kubectl", pinned_first=True) or "kubectl",
                    "kustomize",
                    str(k8s.repo_path(Path(tmp), k8s.OVERLAY)),
                ],
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT,
            )
        if out.returncode != 0:
            raise KitError("`kubectl kustomize overlays/local` failed", "read the output below", detail=out.stderr)
        return podman_adapter.parse(out.stdout)

    def plan(self, creds: Credentials, *, build: bool = True) -> podman_adapter.PodmanPlan:
        objects = self._render(creds)
        images = None
        if build:
            wanted = [
                c["image"]
                for o in objects
                if o["kind"] == "StatefulSet"
                for c in o["spec"]["template"]["spec"]["containers"]
            ]
            images = podman_images.images_map(podman_images.build(wanted))
        host_ports = {k8s.POSTGRES_SERVICE: self.pg_port, k8s.S3_SERVICE: self.s3_port}
        return podman_adapter.translate(objects, host_ports=host_ports, images=images, prefix=self.prefix)

    @staticmethod
    def _digest(plan: podman_adapter.PodmanPlan) -> str:
        h = hashlib.sha256(plan.kube_yaml().encode())
        for secret in plan.secrets:
            h.update(secret.name.encode() + secret.stdin())
        return h.hexdigest()[:16]

    def _names(self) -> podman_adapter.PodmanPlan | None:
        """The plan without building images: the exact names of this kit's pods, volumes and secrets (None before
        the first `up`). Exact names, not a prefix: another state folder's names may begin with ours."""
        creds = self.state.credentials()
        return self.plan(creds, build=False) if creds else None

    def _pods(self, names: set[str]) -> dict[str, dict]:
        """Those of these pods that exist, by name, as `podman pod ps` reports them."""
        out = self._podman("pod", "ps", "--filter", f"label={PART_OF}", "--format", "json").stdout
        pods = json.loads(out or b"[]") or []
        return {p["Name"]: p for p in pods if p["Name"] in names}

    # -- lifecycle -------------------------------------------------------------------------------------
    def up(self) -> list[ServiceStatus]:
        """Build or reuse the images, play the pods (or reuse them when nothing changed), wait on their probes and on
        a round trip through each published port. Idempotent: safe to re-run."""
        self._require()
        self.state.ensure_dirs()
        creds = self.state.credentials(create=True)
        self.state.save_settings(pg_port=self.pg_port, s3_port=self.s3_port)
        plan = self.plan(creds)
        digest = self._digest(plan)
        for pod in plan.pods:
            pod.manifest["metadata"]["labels"][PLAN_LABEL] = digest
        running = self._pods({p.name for p in plan.pods})
        reuse = all(
            p.name in running
            and running[p.name].get("Status") == "Running"
            and (running[p.name].get("Labels") or {}).get(PLAN_LABEL) == digest
            for p in plan.pods
        )
        if not reuse:
            self._play(plan, running)
        for kind in ("startup", "readiness"):
            for probe in plan.probes(kind):
                self._wait_probe(probe)
        for pod in plan.pods:  # what podman really published, not what it was asked to
            problems = self._binding_problems(plan, pod.name)
            if problems:
                raise KitError(
                    f"pod {pod.name}: {'; '.join(problems)}",
                    f"run `down`, then `up`; if it stays, compare `podman pod inspect {pod.name}` with the plan",
                )
        ep = self.endpoints()
        self._wait_port("PostgreSQL", self.pg_port, lambda: postgres.ping(ep.pg, CATALOG_DB))
        self._wait_port("S3 (rclone)", self.s3_port, lambda: s3.list_buckets(ep.s3))
        postgres.ensure_database(ep.pg)  # made by the image on first start; idempotent
        s3.ensure_buckets(ep.s3)
        played = "running and unchanged, reused" if reuse else "played"
        rows = [
            ServiceStatus(
                "pods",
                True,
                f"{', '.join(p.name for p in plan.pods)}: {played}; {len(plan.translations)} translations "
                "of the overlay (see `status`)",
                extra={"translations": [t.line() for t in plan.translations]},
            )
        ]
        for port in plan.ports:
            name = "postgres" if port.service == k8s.POSTGRES_SERVICE else "s3"
            rows.append(
                ServiceStatus(
                    name,
                    True,
                    f"pod {port.pod} ready (startup and readiness probes passed); published on {port.host_ip} only, "
                    f"{port.host_ip}:{port.host_port} answers",
                    None,
                    port.host_port,
                )
            )
        return rows

    def _play(self, plan: podman_adapter.PodmanPlan, existing: dict[str, dict]) -> None:
        """Remove this kit's pods that exist (running, stopped or of an older plan), then play them all. Not `kube
        play --replace`: when one of the YAML's pods is missing, podman 4.3.1 may leave another in place and then fail
        on its name ("pod already exists"), as it did with the catalog's pod deleted (lab 17)."""
        for name in existing:
            self._podman("pod", "rm", "--force", name)
        for port in plan.ports:  # checked once our own pods hold none of them
            option = "--pg-port or DUCKLAKE_PG_PORT" if port.service == k8s.POSTGRES_SERVICE else "--s3-port"
            busy = procs.busy_port(port.host_port, f"the podman {port.service} pod", option)
            if busy:
                raise busy
        for secret in plan.secrets:  # recreated: a changed credential must not be read from an old one
            self._podman("secret", "rm", secret.name, check=False)
            self._podman("secret", "create", secret.name, "-", stdin=secret.stdin())
        for volume in plan.volumes:
            if self._podman("volume", "exists", volume.name, check=False).returncode != 0:
                labels = [arg for k, v in volume.labels.items() for arg in ("--label", f"{k}={v}")]
                self._podman("volume", "create", *labels, volume.name)
        self._podman("kube", "play", "-", stdin=plan.kube_yaml().encode(), timeout=300)

    def _wait_probe(self, probe: podman_adapter.Probe) -> None:
        def check() -> bool | None:
            out = self._podman("exec", probe.container, *probe.argv, check=False, timeout=probe.timeout_seconds + 5)
            if out.returncode == 0:
                return True
            raise RuntimeError((out.stderr or out.stdout).decode(errors="replace").strip()[-300:] or "failed")

        # the probe's own budget: as long as the kubelet would wait before giving up on the pod
        budget = probe.initial_delay_seconds + probe.period_seconds * probe.failure_threshold + probe.timeout_seconds
        try:
            procs.wait_until(check, what=f"the {probe.kind} probe of {probe.container}", timeout=budget)
        except KitError as exc:
            logs = self._podman("logs", "--tail", "30", probe.container, check=False)
            raise KitError(
                exc.what,
                f"read the container's log below, or `podman logs {probe.container}`",
                detail=(logs.stdout + logs.stderr).decode(errors="replace"),
            ) from None

    @staticmethod
    def _wait_port(label: str, port: int, probe) -> None:
        def check() -> bool | None:
            try:
                probe()  # it raises until it answers (an empty bucket list is an answer)
                return True
            except KitError as exc:
                if "refused the" in exc.what:
                    raise procs.GiveUp(exc) from None
                raise

        procs.wait_until(check, what=f"{label} at 127.0.0.1:{port}", timeout=READY_TIMEOUT)

    def down(self) -> list[str]:
        """Remove the pods and their secrets; the volumes keep the catalog and the lake (`reset` removes them)."""
        plan = self._names()
        if plan is None:
            return ["never set up here: nothing to stop"]
        msgs = []
        for name in self._pods({p.name for p in plan.pods}):
            self._podman("pod", "rm", "--force", name)
            msgs.append(f"pod {name}: removed (its volume keeps the data; `up` plays it again)")
        msgs += self._remove("secret", {s.name for s in plan.secrets})
        return msgs or ["no pods of this kit running: nothing to stop"]

    def _remove(self, kind: str, names: set[str]) -> list[str]:
        msgs = []
        for name in sorted(names):
            if self._podman(kind, "rm", name, check=False).returncode == 0:
                msgs.append(f"{kind} {name}: removed")
        return msgs

    def status(self) -> list[ServiceStatus]:
        plan = self._names()
        pods = self._pods({p.name for p in plan.pods}) if plan else {}
        creds = self.state.credentials()
        rows = []
        for service, name, port in (
            (k8s.POSTGRES_SERVICE, "postgres", self.pg_port),
            (k8s.S3_SERVICE, "s3", self.s3_port),
        ):
            pod_name = f"{self.prefix}{service}-0"
            pod = pods.get(pod_name)
            if pod is None or creds is None:
                rows.append(ServiceStatus(name, False, f"pod {pod_name} not running: run `up`", None, port))
                continue
            ready, ready_text = self._readiness(plan, pod_name)
            problems = self._binding_problems(plan, pod_name)
            bound_text = "; ".join(problems) if problems else "published on 127.0.0.1 only"
            ep = self.endpoints()
            try:
                postgres.ping(ep.pg, CATALOG_DB) if name == "postgres" else s3.list_buckets(ep.s3)
                answers, port_text = True, f"127.0.0.1:{port} answers"
            except KitError as exc:
                answers, port_text = False, exc.what
            detail = f"pod {pod_name} {pod.get('Status')}; {ready_text}; {bound_text}; {port_text}"
            rows.append(ServiceStatus(name, ready and not problems and answers, detail, None, port))
        if plan is not None:
            rows.append(
                ServiceStatus(
                    "adapter",
                    True,
                    f"{len(plan.translations)} translations of the overlay for podman (and, at `up`, each image "
                    "to its local build: image-built-locally)",
                    extra={"translations": [t.line() for t in plan.translations]},
                )
            )
        rows.append(
            ServiceStatus(
                "podman does not exercise",
                True,
                "; ".join(f"{n.what} ({n.instead})" for n in podman_adapter.NOT_EXERCISED),
            )
        )
        return rows

    def _binding_problems(self, plan: podman_adapter.PodmanPlan, pod: str) -> list[str]:
        """How the ports podman published for the pod differ from the plan's (`podman pod inspect`), [] when not."""
        out = self._podman("pod", "inspect", pod, "--format", "json", check=False)
        if out.returncode != 0:
            return [
                f"`podman pod inspect {pod}` failed: {(out.stderr or out.stdout).decode(errors='replace').strip()[-200:]}"
            ]
        data = json.loads(out.stdout or b"{}")
        data = (data[0] if data else {}) if isinstance(data, list) else data  # one object on podman 4, a list from 5.0
        return plan.binding_problems(pod, (data.get("InfraConfig") or {}).get("PortBindings"))

    def _readiness(self, plan: podman_adapter.PodmanPlan | None, pod: str) -> tuple[bool, str]:
        """The pod's readiness probe, run once now (no kubelet runs it between commands)."""
        probes = [p for p in plan.probes("readiness") if p.pod == pod] if plan else []
        for probe in probes:
            out = self._podman("exec", probe.container, *probe.argv, check=False, timeout=probe.timeout_seconds + 5)
            if out.returncode != 0:
                return False, f"readiness probe fails ({(out.stderr or out.stdout).decode().strip()[-200:]})"
        return True, "readiness probe passes" if probes else "no readiness probe"

    def reset(self) -> list[str]:
        """Remove the pods, their secrets and volumes (the catalog and the lake data) and this platform's state."""
        plan = self._names()
        msgs = [m for m in self.down() if not m.startswith(("no pods", "never set up"))]
        if plan is not None:
            msgs += self._remove("volume", {v.name for v in plan.volumes})
        if self.state.home.exists():
            shutil.rmtree(self.state.home)
            msgs.append(f"deleted {self.state.home}")
        return msgs
