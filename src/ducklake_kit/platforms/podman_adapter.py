"""The rendered Kustomize overlay, translated into what `podman kube play` runs. Pure: no podman calls here.

The podman platform plays the same objects the k3d platform applies (`kubectl kustomize overlays/local`: one source
of truth). `podman kube play` (Debian's 4.3.1) cannot take them as they are: it skips StatefulSets, Services and
Namespaces without a word, reads a Secret's env references only from a podman secret holding JSON (podman #16269),
leaves `$(VAR)` in env values unexpanded (rclone then got its auth key literally: every request 403), ignores
startup and readiness probes, turns a liveness probe into a healthcheck split on blanks, publishes a container port
on every interface, and asks a registry for an image it already has. `translate` makes each change explicitly and
records it as a `Translation`, so `status` and the docs print what was changed and why; `NOT_EXERCISED` lists what
a real cluster does that podman does not (the k3d job covers those). An object or field the adapter does not know
is refused in one line, never passed through to be silently dropped.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from ducklake_kit.errors import KitError

LOOPBACK = "127.0.0.1"
PROBE_KINDS = ("startupProbe", "readinessProbe", "livenessProbe")
# Kubernetes' defaults for a probe's fields the manifest leaves out.
PROBE_DEFAULTS = {
    "initialDelaySeconds": 0,
    "periodSeconds": 10,
    "timeoutSeconds": 1,
    "successThreshold": 1,
    "failureThreshold": 3,
}
# Container fields the translation reads or passes through unchanged; any other is refused (it would be
# dropped or half-done by kube play without a word).
CONTAINER_FIELDS = {
    "name",
    "image",
    "imagePullPolicy",
    "command",
    "args",
    "env",
    "ports",
    "resources",
    "securityContext",
    "volumeMounts",
    "workingDir",
    *PROBE_KINDS,
}
POD_SPEC_FIELDS = {"containers", "enableServiceLinks", "securityContext", "terminationGracePeriodSeconds"}


@dataclass(frozen=True)
class NotExercised:
    what: str
    instead: str  # what stands in for it on podman


# What a cluster does that the podman platform does not: the k3d platform (and its CI job) exercises these.
NOT_EXERCISED: tuple[NotExercised, ...] = (
    NotExercised("the API server", "no `kubectl apply`: the adapter translates the rendered objects itself"),
    NotExercised("controllers", "no StatefulSet controller: one pod per StatefulSet, played once; podman restarts it"),
    NotExercised("Services", "no cluster IP or DNS name: each Service becomes a port published on 127.0.0.1"),
    NotExercised("port-forward", "no `kubectl port-forward`: clients reach the published port directly"),
    NotExercised("PVC binding", "no storage class or PersistentVolume: each claim is a podman named volume"),
    NotExercised("kubelet probes", "no kubelet: the kit runs the manifests' own probe commands with `podman exec`"),
)


@dataclass(frozen=True)
class Translation:
    """One change the adapter made to an object so that podman runs it."""

    rule: str  # a stable name, e.g. "statefulset-to-pod"
    source: str  # Kind/name in the rendered overlay
    result: str  # what podman gets instead
    why: str

    def line(self) -> str:
        return f"{self.rule}: {self.source} -> {self.result} ({self.why})"


@dataclass(frozen=True)
class Probe:
    """A probe of the manifests, to be run by the kit: `podman exec <container> <argv...>`."""

    kind: str  # startup | readiness | liveness
    pod: str
    container: str  # the podman container's name: <pod>-<container>
    argv: tuple[str, ...]  # the exec command as the manifest lists it, never split on blanks
    initial_delay_seconds: int
    period_seconds: int
    timeout_seconds: int
    success_threshold: int
    failure_threshold: int


@dataclass(frozen=True)
class PodmanSecret:
    """A podman secret to create with `podman secret create NAME -`, its data given on stdin (never in argv)."""

    name: str
    source: str
    data: Mapping[str, bytes] = field(repr=False)  # repr=False: a printed plan never shows a credential

    def stdin(self) -> bytes:
        """The JSON kube play reads a secretKeyRef from: each key's value in base64, as a Secret's `data`."""
        return json.dumps({k: base64.b64encode(v).decode() for k, v in sorted(self.data.items())}).encode()


@dataclass(frozen=True)
class PodmanVolume:
    """A podman named volume standing in for a StatefulSet's PersistentVolumeClaim."""

    name: str  # <prefix><claim template>-<statefulset>-<ordinal>: the PVC's name on a cluster, prefixed
    pod: str
    mount_path: str
    requested: str  # the claim's storage request: informative only, a named volume has no size
    labels: Mapping[str, str]


@dataclass(frozen=True)
class PublishedPort:
    service: str
    pod: str
    container_port: int
    host_ip: str
    host_port: int


@dataclass(frozen=True)
class PlayedPod:
    name: str
    workload: str  # Kind/name it came from
    manifest: dict[str, Any]
    probes: tuple[Probe, ...]

    def containers(self) -> list[str]:
        return [f"{self.name}-{c['name']}" for c in self.manifest["spec"]["containers"]]


@dataclass(frozen=True)
class PodmanPlan:
    pods: tuple[PlayedPod, ...]
    secrets: tuple[PodmanSecret, ...]
    volumes: tuple[PodmanVolume, ...]
    ports: tuple[PublishedPort, ...]
    translations: tuple[Translation, ...]
    not_exercised: tuple[NotExercised, ...] = NOT_EXERCISED

    def kube_yaml(self) -> str:
        """The YAML for `podman kube play -` (stdin): the pods only. It holds no credential (see `secrets`)."""
        return yaml.safe_dump_all([p.manifest for p in self.pods], sort_keys=False)

    def probes(self, kind: str | None = None) -> list[Probe]:
        return [p for pod in self.pods for p in pod.probes if kind is None or p.kind == kind]

    def binding_problems(self, pod: str, bindings: Mapping[str, Any] | None) -> list[str]:
        """What differs between the ports podman really published for `pod` (`podman pod inspect`'s
        InfraConfig.PortBindings: {"5432/tcp": [{"HostIp": ..., "HostPort": ...}]}) and the plan's: a binding on any
        address but the loopback, a port the plan did not publish, a planned one missing. [] when they agree."""
        wanted = {f"{p.container_port}/tcp": (p.host_ip, str(p.host_port)) for p in self.ports if p.pod == pod}
        problems = []
        for port, binds in sorted((bindings or {}).items()):
            for b in binds or [{}]:
                host_ip, host_port = b.get("HostIp") or "", str(b.get("HostPort") or "")
                if host_ip != LOOPBACK:
                    problems.append(f"{port} is published on {host_ip or 'every address'}:{host_port}, not {LOOPBACK}")
                elif wanted.get(port) != (host_ip, host_port):
                    problems.append(f"{port} is published on {host_ip}:{host_port}, which the plan does not publish")
        for port, (host_ip, host_port) in sorted(wanted.items()):
            if not any(
                (b.get("HostIp"), str(b.get("HostPort"))) == (host_ip, host_port)
                for b in (bindings or {}).get(port) or []
            ):
                problems.append(f"{port} is not published on {host_ip}:{host_port}")
        return problems


class AdapterError(KitError):
    """The rendered overlay holds something the adapter does not translate."""

    def __init__(self, what: str, fix: str = "change the manifests, or run them with --platform k3d"):
        super().__init__(what, fix)


# ------------------------------------------------------------------------------------------ $(VAR) expansion


def expand(text: str, lookup: Mapping[str, str]) -> tuple[str, set[str]]:
    """Kubernetes' `$(VAR)` expansion (third_party/forked/golang/expansion): `$(NAME)` becomes NAME's value when
    lookup has it and stays as written when not; `$$` is one `$` (so `$$(NAME)` is the literal `$(NAME)`); any other
    `$` is kept. Returns the text and the names it replaced."""
    out: list[str] = []
    used: set[str] = set()
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c != "$" or i + 1 == n:
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            close = text.find(")", i + 2)
            if close == -1:  # unterminated: kept as written
                out.append("$(")
                i += 2
                continue
            name = text[i + 2 : close]
            if name in lookup:
                out.append(lookup[name])
                used.add(name)
            else:
                out.append(f"$({name})")
            i = close + 1
        else:
            out.append("$" + nxt)
            i += 2
    return "".join(out), used


# -------------------------------------------------------------------------------------------- the objects


def parse(rendered: str) -> list[dict[str, Any]]:
    """The objects of a multi-document YAML (what `kubectl kustomize` prints)."""
    try:
        docs = [d for d in yaml.safe_load_all(rendered) if d is not None]
    except yaml.YAMLError as exc:
        raise AdapterError(f"the rendered overlay is not YAML ({exc})", "render it with `kubectl kustomize`") from None
    for d in docs:
        if not isinstance(d, dict) or "kind" not in d or "name" not in d.get("metadata", {}):
            raise AdapterError("the rendered overlay holds a document that is not a Kubernetes object")
    return docs


def _ref(obj: Mapping[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def _secret_data(obj: Mapping[str, Any]) -> dict[str, bytes]:
    if obj.get("type", "Opaque") != "Opaque":
        raise AdapterError(f"{_ref(obj)} is of type {obj['type']}; the adapter translates Opaque Secrets only")
    data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    data.update({k: v.encode() for k, v in (obj.get("stringData") or {}).items()})  # as the API server merges them
    return data


def translate(
    objects: Sequence[Mapping[str, Any]],
    *,
    host_ports: Mapping[str, int],
    images: Mapping[str, str] | None = None,
    prefix: str | None = None,
) -> PodmanPlan:
    """The plan for podman: `host_ports` maps each Service's name to its loopback port; `images` maps a manifest's
    image to the locally built one (None: keep the manifests' names, which must then exist locally). `prefix`
    begins the name of every pod, volume and secret (podman's names are machine-wide; None: the overlay's
    namespace and a dash, e.g. `ducklake-`), so two kits (a user's and a test's) never share one."""
    by_kind: dict[str, list[Mapping[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    unknown = sorted(set(by_kind) - {"Namespace", "Secret", "Service", "StatefulSet"})
    if unknown:
        first = by_kind[unknown[0]][0]
        raise AdapterError(
            f"the overlay holds {_ref(first)}, a kind the podman adapter does not translate "
            "(it knows Namespace, Secret, Service and StatefulSet)"
        )
    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    missing = sorted(set(services) - set(host_ports))
    extra = sorted(set(host_ports) - set(services))
    if missing or extra:
        raise AdapterError(
            f"host ports are given for {extra or 'no unknown Service'} and missing for {missing or 'none'}",
            "give a loopback port for each Service of the overlay, and only for those",
        )
    namespaces = by_kind.get("Namespace", [])
    if prefix is None:
        prefix = f"{namespaces[0]['metadata']['name']}-" if len(namespaces) == 1 else ""
    translations: list[Translation] = []
    for ns in namespaces:
        translations.append(
            Translation(
                "namespace-to-prefix",
                _ref(ns),
                f"the name prefix {prefix!r} on pods, volumes and secrets",
                "podman has one machine-wide namespace and kube play skips Namespaces",
            )
        )
    secrets = {s["metadata"]["name"]: _secret_data(s) for s in by_kind.get("Secret", [])}
    plan_secrets = [PodmanSecret(prefix + name, f"Secret/{name}", data) for name, data in secrets.items()]
    for name in secrets:
        translations.append(
            Translation(
                "secret-to-podman-secret",
                f"Secret/{name}",
                f"podman secret {prefix}{name} (JSON of base64 values, created from stdin)",
                "kube play 4.3 stores a played Secret as YAML, then fails to read it as JSON (podman #16269)",
            )
        )
    pods, volumes = [], []
    for sts in by_kind.get("StatefulSet", []):
        pod, vols, derived, notes = _statefulset(sts, secrets, images or {}, prefix)
        pods.append(pod)
        volumes += vols
        plan_secrets += derived
        translations += notes
    ports = []
    for name, svc in services.items():
        port, note = _publish(svc, pods, host_ports[name])
        ports.append(port)
        translations.append(note)
    _unpublish_the_rest(pods, ports, translations)
    return PodmanPlan(tuple(pods), tuple(plan_secrets), tuple(volumes), tuple(ports), tuple(translations))


def _statefulset(
    sts: Mapping[str, Any], secrets: Mapping[str, Mapping[str, bytes]], images: Mapping[str, str], prefix: str
) -> tuple[PlayedPod, list[PodmanVolume], list[PodmanSecret], list[Translation]]:
    name, ref = sts["metadata"]["name"], _ref(sts)
    spec = sts["spec"]
    if spec.get("replicas", 1) != 1:
        raise AdapterError(f"{ref} asks for {spec['replicas']} replicas; on podman a StatefulSet runs one pod")
    pod_name = f"{prefix}{name}-0"  # a StatefulSet's first pod, as a cluster names it (after the prefix)
    template = copy.deepcopy(spec["template"])
    pod_spec = template["spec"]
    unknown = sorted(set(pod_spec) - POD_SPEC_FIELDS)
    if unknown:
        raise AdapterError(f"{ref}: the pod template's {unknown[0]} is not translated for podman")
    labels = dict(template.get("metadata", {}).get("labels", {}))
    notes: list[Translation] = []
    claims = {t["metadata"]["name"]: t for t in spec.get("volumeClaimTemplates", [])}
    volumes, pod_volumes = [], []
    for claim_name, claim in claims.items():
        volume = f"{prefix}{claim_name}-{name}-0"
        mounts = [m for c in pod_spec["containers"] for m in c.get("volumeMounts", []) if m["name"] == claim_name]
        requested = claim.get("spec", {}).get("resources", {}).get("requests", {}).get("storage", "")
        claim_labels = {**claim.get("metadata", {}).get("labels", {}), **labels}
        volumes.append(
            PodmanVolume(volume, pod_name, mounts[0]["mountPath"] if mounts else "", requested, claim_labels)
        )
        pod_volumes.append({"name": claim_name, "persistentVolumeClaim": {"claimName": volume}})
        notes.append(
            Translation(
                "claim-to-volume",
                f"{ref} volumeClaimTemplate {claim_name}",
                f"podman volume {volume}",
                "no PVC binding on podman; a named volume keeps the data when the pod is removed",
            )
        )
    pod_spec["volumes"] = pod_volumes
    derived: list[PodmanSecret] = []
    probes: list[Probe] = []
    for container in pod_spec["containers"]:
        cref = f"{ref} container {container['name']}"
        unknown = sorted(set(container) - CONTAINER_FIELDS)
        if unknown:
            raise AdapterError(f"{cref}: its {unknown[0]} is not translated for podman")
        for mount in container.get("volumeMounts", []):
            if mount["name"] not in claims:
                raise AdapterError(f"{cref} mounts {mount['name']}, which is not a volumeClaimTemplate")
        # Probes first: the kubelet expands their $(VAR) from the env as written, before _env rewrites it.
        container_probes, probe_note = _probes(container, pod_name, cref)
        secret, env_notes = _env(container, pod_name, cref, secrets, prefix)
        if secret is not None:
            derived.append(secret)
        notes += env_notes
        probes += container_probes
        if probe_note:
            notes.append(probe_note)
        notes += _image(container, cref, images)
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "labels": labels},
        "spec": pod_spec,
    }
    notes.insert(
        0,
        Translation(
            "statefulset-to-pod",
            ref,
            f"Pod {pod_name}",
            "kube play skips StatefulSets; the pod is named as the controller would name it",
        ),
    )
    return PlayedPod(pod_name, ref, manifest, tuple(probes)), volumes, derived, notes


def _env(
    container: dict[str, Any], pod: str, cref: str, secrets: Mapping[str, Mapping[str, bytes]], prefix: str
) -> tuple[PodmanSecret | None, list[Translation]]:
    """Expand `$(VAR)` in env values as the kubelet does: from the container's earlier entries only. A value that
    draws on a Secret goes into a podman secret of its own, so the played YAML never holds a credential."""
    if container.get("envFrom"):
        raise AdapterError(f"{cref}: envFrom is not translated for podman")
    resolved: dict[str, str] = {}
    from_secret: set[str] = set()  # names whose value is (or was built from) a Secret's value
    derived: dict[str, bytes] = {}
    derived_name = f"{pod}-{container['name']}-env"
    notes = []
    new_env = []
    for entry in container.get("env", []):
        name = entry["name"]
        source = entry.get("valueFrom")
        if source is not None:
            ref = source.get("secretKeyRef")
            if ref is None or set(source) != {"secretKeyRef"}:
                raise AdapterError(f"{cref}: env {name} reads {sorted(source)[0]}; only secretKeyRef is translated")
            if ref["name"] not in secrets or ref["key"] not in secrets[ref["name"]]:
                raise AdapterError(f"{cref}: env {name} reads {ref['name']}/{ref['key']}, which the overlay lacks")
            resolved[name] = secrets[ref["name"]][ref["key"]].decode()
            from_secret.add(name)
            new_env.append({"name": name, "valueFrom": {"secretKeyRef": {**ref, "name": prefix + ref["name"]}}})
            continue
        raw = entry.get("value", "")
        value, used = expand(raw, resolved)
        resolved[name] = value
        if used & from_secret:
            from_secret.add(name)
            derived[name] = value.encode()
            new_env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": derived_name, "key": name}}})
            result = f"secretKeyRef {derived_name}/{name}"
        else:
            new_env.append({"name": name, "value": value})
            result = f"the value {value!r}"
        if used:
            notes.append(
                Translation(
                    "env-var-expanded",
                    f"{cref} env {name}={raw!r}",
                    result,
                    "kube play does not expand $(VAR); expanded from the container's earlier env entries",
                )
            )
    container["env"] = new_env
    for part in ("command", "args"):
        expanded = []
        for arg in container.get(part, []):
            value, used = expand(arg, resolved)
            if used & from_secret:
                raise AdapterError(
                    f"{cref}: its {part} refer to a Secret's value with $(VAR), which would show in the process list",
                    "read the value from the environment instead (as RCLONE_AUTH_KEY does)",
                )
            expanded.append(value)
        if part in container:
            container[part] = expanded
    secret = PodmanSecret(derived_name, cref, derived) if derived else None
    return secret, notes


def _probes(container: dict[str, Any], pod: str, cref: str) -> tuple[list[Probe], Translation | None]:
    """The probes as argv lists for the kit to run; removed from the pod (kube play ignores startup and readiness,
    and would run liveness as a healthcheck split on blanks, restarting a healthy container)."""
    # The kubelet expands $(VAR) in a probe's command from the env's literal values only (valueFrom gives "").
    static = {e["name"]: e.get("value", "") for e in container.get("env", [])}
    probes = []
    for kind in PROBE_KINDS:
        probe = container.pop(kind, None)
        if probe is None:
            continue
        command = probe.get("exec", {}).get("command")
        if not command:
            raise AdapterError(f"{cref}: its {kind} is not an exec probe; the podman platform runs exec probes only")
        settings = {**PROBE_DEFAULTS, **{k: v for k, v in probe.items() if k in PROBE_DEFAULTS}}
        probes.append(
            Probe(
                kind.removesuffix("Probe"),
                pod,
                f"{pod}-{container['name']}",
                tuple(expand(part, static)[0] for part in command),
                settings["initialDelaySeconds"],
                settings["periodSeconds"],
                settings["timeoutSeconds"],
                settings["successThreshold"],
                settings["failureThreshold"],
            )
        )
    if not probes:
        return [], None
    names = ", ".join(p.kind for p in probes)
    note = Translation(
        "probes-run-by-kit",
        f"{cref} probes ({names})",
        f"`podman exec {pod}-{container['name']} <command>`, the command's argv as written",
        "kube play ignores startup/readiness probes and splits a liveness command on blanks",
    )
    return probes, note


def _image(container: dict[str, Any], cref: str, images: Mapping[str, str]) -> list[Translation]:
    notes = []
    image = container["image"]
    if images:
        if image not in images:
            raise AdapterError(
                f"{cref}: no local build of the image {image}", "build the podman images for these manifests"
            )
        container["image"] = images[image]
        notes.append(
            Translation(
                "image-built-locally", f"{cref} image {image}", f"image {images[image]}", "no registry is reachable"
            )
        )
    container["imagePullPolicy"] = "Never"
    notes.append(
        Translation(
            "image-never-pulled",
            f"{cref} imagePullPolicy",
            "Never",
            "kube play's default policy asks a registry even for an image it has",
        )
    )
    return notes


def _publish(svc: Mapping[str, Any], pods: Sequence[PlayedPod], host_port: int) -> tuple[PublishedPort, Translation]:
    ref = _ref(svc)
    spec = svc["spec"]
    if spec.get("type", "ClusterIP") != "ClusterIP" or len(spec.get("ports", [])) != 1:
        raise AdapterError(f"{ref}: the adapter publishes a ClusterIP Service of exactly one port")
    selector = spec.get("selector") or {}
    chosen = [
        p for p in pods if selector and all(p.manifest["metadata"]["labels"].get(k) == v for k, v in selector.items())
    ]
    if len(chosen) != 1:
        raise AdapterError(f"{ref} selects {len(chosen)} pods; on podman a Service publishes exactly one")
    pod = chosen[0]
    svc_port = spec["ports"][0]
    target = svc_port.get("targetPort", svc_port["port"])
    for container in pod.manifest["spec"]["containers"]:
        for port in container.get("ports", []):
            if target in (port["containerPort"], port.get("name")):
                port["hostIP"] = LOOPBACK
                port["hostPort"] = host_port
                published = PublishedPort(svc["metadata"]["name"], pod.name, port["containerPort"], LOOPBACK, host_port)
                note = Translation(
                    "service-to-host-port",
                    ref,
                    f"{LOOPBACK}:{host_port} -> {pod.name}:{port['containerPort']}",
                    "kube play skips Services; the port is published on loopback only",
                )
                return published, note
    raise AdapterError(f"{ref} targets port {target!r}, which no container of {pod.name} declares")


def _unpublish_the_rest(pods: Sequence[PlayedPod], ports: Sequence[PublishedPort], notes: list[Translation]) -> None:
    """kube play publishes a containerPort without hostPort on every interface (0.0.0.0): drop those."""
    for pod in pods:
        for container in pod.manifest["spec"]["containers"]:
            kept = []
            for port in container.get("ports", []):
                if "hostPort" in port:
                    kept.append(port)
                else:
                    notes.append(
                        Translation(
                            "port-not-published",
                            f"{pod.workload} container {container['name']} port {port['containerPort']}",
                            "not published",
                            "no Service targets it, and kube play would publish it on every interface",
                        )
                    )
            if "ports" in container:
                container["ports"] = kept
