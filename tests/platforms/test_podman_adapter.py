"""The podman adapter on the real rendered overlay (`kubectl kustomize overlays/local`, as k3d applies it): every
translation it makes, what it must never do (a credential in the played YAML, a port on every interface, a probe
split on blanks), and bad input refused in one line. No podman needed: the adapter is pure."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ducklake_kit.platforms import k8s
from ducklake_kit.platforms import podman_adapter as adapter
from ducklake_kit.platforms.podman import PodmanPlatform
from ducklake_kit.platforms.state import State
from tests.platforms.test_manifests import K8S_VERSION, Render, render_overlay

HOST_PORTS = {k8s.POSTGRES_SERVICE: 25432, k8s.S3_SERVICE: 29000}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Render:
    return render_overlay("local", tmp_path_factory.mktemp("render-podman"))


@pytest.fixture(scope="module")
def plan(rendered: Render) -> adapter.PodmanPlan:
    return adapter.translate(copy.deepcopy(rendered.objects), host_ports=HOST_PORTS)


def pod(plan: adapter.PodmanPlan, name: str) -> dict[str, Any]:
    return next(p.manifest for p in plan.pods if p.name == name)


def container(plan: adapter.PodmanPlan, pod_name: str) -> dict[str, Any]:
    (only,) = pod(plan, pod_name)["spec"]["containers"]
    return only


def manifest_container(rendered: Render, statefulset: str) -> dict[str, Any]:
    (only,) = rendered.find("StatefulSet", statefulset)["spec"]["template"]["spec"]["containers"]
    return only


def refused(objects: list[dict[str, Any]], **kwargs: Any) -> str:
    with pytest.raises(adapter.AdapterError) as info:
        adapter.translate(objects, **{"host_ports": HOST_PORTS, **kwargs})
    line = info.value.line()
    assert "\n" not in line and line.startswith("Error: ") and " Try: " in line, line
    return line


# ------------------------------------------------------------------------------------------- translations


def test_every_translation_is_listed(rendered: Render, plan: adapter.PodmanPlan) -> None:
    rules = [(t.rule, t.source) for t in plan.translations]
    secret = next(s["metadata"]["name"] for s in rendered.secrets())
    pg, s3 = "StatefulSet/postgres", "StatefulSet/rclone-s3"
    assert sorted(rules) == sorted(
        [
            ("namespace-to-prefix", f"Namespace/{k8s.NAMESPACE}"),
            ("secret-to-podman-secret", f"Secret/{secret}"),
            ("statefulset-to-pod", pg),
            ("statefulset-to-pod", s3),
            ("claim-to-volume", f"{pg} volumeClaimTemplate data"),
            ("claim-to-volume", f"{s3} volumeClaimTemplate data"),
            ("probes-run-by-kit", f"{pg} container postgres probes (startup, readiness, liveness)"),
            ("probes-run-by-kit", f"{s3} container rclone-s3 probes (startup, readiness, liveness)"),
            ("image-never-pulled", f"{pg} container postgres imagePullPolicy"),
            ("image-never-pulled", f"{s3} container rclone-s3 imagePullPolicy"),
            ("env-var-expanded", f"{s3} container rclone-s3 env RCLONE_AUTH_KEY='\"$(S3_KEY_ID),$(S3_SECRET)\"'"),
            ("service-to-host-port", "Service/postgres"),
            ("service-to-host-port", "Service/rclone-s3"),
        ]
    )
    for t in plan.translations:  # each one printable in one line, with its reason
        assert t.why and "\n" not in t.line()


def test_what_podman_does_not_exercise_is_listed(plan: adapter.PodmanPlan) -> None:
    assert [n.what for n in plan.not_exercised] == [
        "the API server",
        "controllers",
        "Services",
        "port-forward",
        "PVC binding",
        "kubelet probes",
    ]
    assert all(n.instead for n in plan.not_exercised)


def test_the_podman_page_lists_every_translation_and_what_podman_does_not_exercise(rendered: Render) -> None:
    # every rule the adapter makes on the overlay, with the images' and an unpublished port's
    objects = copy.deepcopy(rendered.objects)
    sts = next(o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["name"] == k8s.S3_STATEFULSET)
    sts["spec"]["template"]["spec"]["containers"][0]["ports"].append({"name": "metrics", "containerPort": 5572})
    images = {"postgres:16.15": "localhost/ducklake-kit/postgres:t", "rclone/rclone:1.75.2": "localhost/r:t"}
    plan = adapter.translate(objects, host_ports=HOST_PORTS, images=images)
    rules = {t.rule for t in plan.translations}
    assert len(rules) == 10, rules
    page = (Path(__file__).resolve().parents[2] / "docs" / "podman.md").read_text()
    section = page.split("## What the adapter translates\n", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("| `"))
    assert {rule for rule in rules if f"`{rule}`" not in table} == set(), "a translation missing from docs/podman.md"
    prose = " ".join(section.split())
    assert [n.what for n in adapter.NOT_EXERCISED if n.what not in prose] == []


def test_statefulsets_become_pods_named_as_the_controller_names_them(
    rendered: Render, plan: adapter.PodmanPlan
) -> None:
    assert [(p.name, p.workload) for p in plan.pods] == [
        ("ducklake-postgres-0", "StatefulSet/postgres"),
        ("ducklake-rclone-s3-0", "StatefulSet/rclone-s3"),
    ]
    for p in plan.pods:
        sts = rendered.find(*p.workload.split("/"))
        assert p.manifest["metadata"]["labels"] == sts["spec"]["template"]["metadata"]["labels"]
        assert p.containers() == [f"{p.name}-{c['name']}" for c in sts["spec"]["template"]["spec"]["containers"]]
    # kube play gets pods only: it would skip the rest, or mishandle the Secret
    assert [d["kind"] for d in yaml.safe_load_all(plan.kube_yaml())] == ["Pod", "Pod"]


def test_the_namespace_becomes_a_prefix_so_two_kits_share_no_name(rendered: Render, plan: adapter.PodmanPlan) -> None:
    other = adapter.translate(copy.deepcopy(rendered.objects), host_ports=HOST_PORTS, prefix="ducklake-t1-")

    def names(p: adapter.PodmanPlan) -> set[str]:
        return {x.name for x in (*p.pods, *p.volumes, *p.secrets)} | {c for x in p.pods for c in x.containers()}

    assert all(n.startswith(f"{k8s.NAMESPACE}-") for n in names(plan))
    assert all(n.startswith("ducklake-t1-") for n in names(other))
    assert not names(plan) & names(other)
    assert "ducklake-t1-postgres-0-env" not in names(other)  # only rclone's env draws on a Secret
    assert container(other, "ducklake-t1-rclone-s3-0")["env"][-1]["valueFrom"]["secretKeyRef"]["name"] == (
        "ducklake-t1-rclone-s3-0-rclone-s3-env"
    )


def test_each_state_folder_has_a_prefix_of_its_own_however_it_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the platform's own names, as `up`, `status` and `down` compute them (no podman call is made)
    def prefix(home: Path) -> str:
        return PodmanPlatform(State(home)).prefix

    checkout = Path(__file__).resolve().parents[2]
    one, two = tmp_path / "one", tmp_path / "two"
    by_option = prefix(one)
    monkeypatch.setenv("DUCKLAKE_HOME", str(one))  # the same folder chosen by the environment: the same names
    assert prefix(one) == by_option != f"{k8s.NAMESPACE}-"
    monkeypatch.setenv("DUCKLAKE_HOME", str(two))  # CI's podman folder and a user's never share a pod or a volume
    assert prefix(two) not in (by_option, f"{k8s.NAMESPACE}-")
    monkeypatch.delenv("DUCKLAKE_HOME")
    assert prefix(checkout / ".ducklake") == f"{k8s.NAMESPACE}-"  # the checkout's own: ducklake-postgres-0


def test_played_pods_are_valid_pods(plan: adapter.PodmanPlan) -> None:
    for doc in yaml.safe_load_all(plan.kube_yaml()):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_secret_becomes_podman_secret_json_of_exactly_its_values(
    rendered: Render, plan: adapter.PodmanPlan
) -> None:
    secret = next(s for s in plan.secrets if s.source.startswith("Secret/"))
    assert secret.name == "ducklake-" + next(o for o in rendered.secrets())["metadata"]["name"]
    refs = {
        e["valueFrom"]["secretKeyRef"]["name"]
        for c in ("ducklake-postgres-0",)
        for e in container(plan, c)["env"]
        if "valueFrom" in e
    }
    assert refs == {secret.name}  # the workloads read it under its podman name
    as_stored = json.loads(secret.stdin())
    assert {k: base64.b64decode(v).decode() for k, v in as_stored.items()} == rendered.env_values


def test_no_credential_in_the_played_yaml_or_a_printed_plan(rendered: Render, plan: adapter.PodmanPlan) -> None:
    printed = "\n".join([plan.kube_yaml(), repr(plan), *(t.line() for t in plan.translations)])
    for key, value in rendered.env_values.items():
        assert value not in printed, f"{key} shows"
        assert base64.b64encode(value.encode()).decode() not in printed, f"{key} shows in base64"


def test_env_is_expanded_as_kubernetes_does(rendered: Render, plan: adapter.PodmanPlan) -> None:
    env = container(plan, "ducklake-rclone-s3-0")["env"]
    assert [e["name"] for e in env] == [e["name"] for e in manifest_container(rendered, k8s.S3_STATEFULSET)["env"]]
    auth = next(e for e in env if e["name"] == "RCLONE_AUTH_KEY")
    derived = next(s for s in plan.secrets if s.name == auth["valueFrom"]["secretKeyRef"]["name"])
    expected = f'"{rendered.env_values["S3_KEY_ID"]},{rendered.env_values["S3_SECRET"]}"'
    assert derived.data == {"RCLONE_AUTH_KEY": expected.encode()}
    assert json.loads(derived.stdin()) == {"RCLONE_AUTH_KEY": base64.b64encode(expected.encode()).decode()}
    # literal values without a reference pass through as written
    pg_env = {e["name"]: e for e in container(plan, "ducklake-postgres-0")["env"]}
    assert pg_env["PGDATA"] == {"name": "PGDATA", "value": "/var/lib/postgresql/data/pgdata"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)", "a"),
        ("x$(A)-$(B)y", "xa-by"),
        ("$$(A)", "$(A)"),  # escaped: the literal text
        ("$$$(A)", "$a"),
        ("$(UNDEFINED)", "$(UNDEFINED)"),  # kept as written
        ("$A ${A} $? $", "$A ${A} $? $"),  # shell syntax is not Kubernetes'
        ("$(A", "$(A"),  # unterminated
        ("$(A$(B))", "$(A$(B))"),  # the name runs to the first ')': 'A$(B' is not defined
        ("$(EMPTY)x", "x"),
    ],
)
def test_expand(text: str, expected: str) -> None:
    assert adapter.expand(text, {"A": "a", "B": "b", "EMPTY": ""})[0] == expected


def test_expansion_reads_only_earlier_entries(rendered: Render) -> None:
    objects = copy.deepcopy(rendered.objects)
    pg = next(o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["name"] == k8s.POSTGRES_STATEFULSET)
    env = pg["spec"]["template"]["spec"]["containers"][0]["env"]
    env.insert(0, {"name": "EARLY", "value": "$(POSTGRES_DB)/x"})  # POSTGRES_DB comes later: not expanded
    env.append({"name": "LATE", "value": "$(POSTGRES_DB)/x $$(POSTGRES_DB)"})
    plan = adapter.translate(objects, host_ports=HOST_PORTS)
    values = {e["name"]: e.get("value") for e in container(plan, "ducklake-postgres-0")["env"]}
    assert values["EARLY"] == "$(POSTGRES_DB)/x"
    assert values["LATE"] == "ducklake_catalog/x $(POSTGRES_DB)"


def test_services_publish_on_loopback_only(rendered: Render, plan: adapter.PodmanPlan) -> None:
    assert [(p.service, p.pod, p.container_port, p.host_ip, p.host_port) for p in plan.ports] == [
        (k8s.POSTGRES_SERVICE, "ducklake-postgres-0", k8s.POSTGRES_PORT, "127.0.0.1", HOST_PORTS[k8s.POSTGRES_SERVICE]),
        (k8s.S3_SERVICE, "ducklake-rclone-s3-0", k8s.S3_PORT, "127.0.0.1", HOST_PORTS[k8s.S3_SERVICE]),
    ]
    # kube play publishes a port without hostPort on 0.0.0.0: every port it gets has a loopback hostIP
    for doc in yaml.safe_load_all(plan.kube_yaml()):
        for c in doc["spec"]["containers"]:
            for port in c.get("ports", []):
                assert port.get("hostIP") == "127.0.0.1" and port.get("hostPort"), port


PG_POD = "ducklake-postgres-0"
PG_PUBLISHED = {"5432/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(HOST_PORTS[k8s.POSTGRES_SERVICE])}]}


@pytest.mark.parametrize(
    ("bindings", "problems"),
    [
        (PG_PUBLISHED, []),  # `podman pod inspect` of a pod played from this plan, as podman 4.3 prints it
        (
            {"5432/tcp": [{"HostIp": "", "HostPort": "25432"}]},  # what kube play does with a port without hostIP
            [
                "5432/tcp is published on every address:25432, not 127.0.0.1",
                "5432/tcp is not published on 127.0.0.1:25432",
            ],
        ),
        (
            {"5432/tcp": [{"HostIp": "0.0.0.0", "HostPort": "25432"}]},
            ["5432/tcp is published on 0.0.0.0:25432, not 127.0.0.1", "5432/tcp is not published on 127.0.0.1:25432"],
        ),
        (
            {**PG_PUBLISHED, "9187/tcp": [{"HostIp": "127.0.0.1", "HostPort": "9187"}]},
            ["9187/tcp is published on 127.0.0.1:9187, which the plan does not publish"],
        ),
        (
            {"5432/tcp": [{"HostIp": "127.0.0.1", "HostPort": "5432"}]},
            [
                "5432/tcp is published on 127.0.0.1:5432, which the plan does not publish",
                "5432/tcp is not published on 127.0.0.1:25432",
            ],
        ),
        (None, ["5432/tcp is not published on 127.0.0.1:25432"]),  # a pod played without its ports
        ({}, ["5432/tcp is not published on 127.0.0.1:25432"]),
    ],
    ids=["as-planned", "every-address", "0.0.0.0", "an-extra-port", "another-host-port", "none", "empty"],
)
def test_published_ports_are_compared_with_the_plan(plan: adapter.PodmanPlan, bindings: Any, problems: list) -> None:
    # what `status` and `up` judge podman's real port bindings by: loopback only, exactly the plan's ports
    assert plan.binding_problems(PG_POD, bindings) == problems


def test_a_port_no_service_targets_is_not_published(rendered: Render) -> None:
    objects = copy.deepcopy(rendered.objects)
    sts = next(o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["name"] == k8s.S3_STATEFULSET)
    sts["spec"]["template"]["spec"]["containers"][0]["ports"].append({"name": "metrics", "containerPort": 5572})
    plan = adapter.translate(objects, host_ports=HOST_PORTS)
    assert [p["containerPort"] for p in container(plan, "ducklake-rclone-s3-0")["ports"]] == [k8s.S3_PORT]
    assert any(t.rule == "port-not-published" and "5572" in t.source for t in plan.translations)


def test_probes_are_the_manifests_argv_run_by_the_kit(rendered: Render, plan: adapter.PodmanPlan) -> None:
    for sts, pod_name in (
        (k8s.POSTGRES_STATEFULSET, "ducklake-postgres-0"),
        (k8s.S3_STATEFULSET, "ducklake-rclone-s3-0"),
    ):
        written = manifest_container(rendered, sts)
        probes = [p for p in plan.probes() if p.pod == pod_name]
        assert [p.kind for p in probes] == ["startup", "readiness", "liveness"]
        for p in probes:
            spec = written[f"{p.kind}Probe"]
            assert list(p.argv) == spec["exec"]["command"]  # never split on blanks
            assert len(p.argv) == 3 and " " in p.argv[2]
            assert (p.period_seconds, p.timeout_seconds, p.failure_threshold) == (
                spec["periodSeconds"],
                spec["timeoutSeconds"],
                spec["failureThreshold"],
            )
            assert p.container == f"{pod_name}-{written['name']}"
        # removed from the pod: kube play would make the liveness one a healthcheck split on blanks
        assert not set(adapter.PROBE_KINDS) & set(container(plan, pod_name))
    assert [p.failure_threshold for p in plan.probes("startup")] == [60, 30]


def test_probe_commands_expand_like_the_kubelet(rendered: Render) -> None:
    objects = copy.deepcopy(rendered.objects)
    pg = next(o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["name"] == k8s.POSTGRES_STATEFULSET)
    pg["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"] = [
        "check",
        "$(POSTGRES_DB)",
        "$(POSTGRES_PASSWORD)",  # from a Secret: the kubelet expands it to "" (literal values only)
        "$$(POSTGRES_DB)",
    ]
    plan = adapter.translate(objects, host_ports=HOST_PORTS)
    assert plan.probes("readiness")[0].argv == ("check", "ducklake_catalog", "", "$(POSTGRES_DB)")


def test_claims_become_named_volumes_at_the_manifests_mount(rendered: Render, plan: adapter.PodmanPlan) -> None:
    assert [(v.name, v.pod, v.requested) for v in plan.volumes] == [
        ("ducklake-data-postgres-0", "ducklake-postgres-0", "2Gi"),
        ("ducklake-data-rclone-s3-0", "ducklake-rclone-s3-0", "10Gi"),
    ]
    pgdata = next(e["value"] for e in container(plan, "ducklake-postgres-0")["env"] if e["name"] == "PGDATA")
    pg_volume = plan.volumes[0]
    assert pgdata.startswith(pg_volume.mount_path + "/")  # PGDATA sits on the volume, in a subdirectory
    assert container(plan, "ducklake-rclone-s3-0")["args"][2] == plan.volumes[1].mount_path  # rclone serves the volume
    for v in plan.volumes:
        assert pod(plan, v.pod)["spec"]["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": v.name}}]
        assert v.labels["app.kubernetes.io/part-of"] == "ducklake-kit"


def test_images_are_never_pulled_and_can_be_the_local_builds(rendered: Render, plan: adapter.PodmanPlan) -> None:
    assert {c["imagePullPolicy"] for p in plan.pods for c in p.manifest["spec"]["containers"]} == {"Never"}
    images = {"postgres:16.15": "localhost/ducklake-postgres:16.15", "rclone/rclone:1.75.2": "localhost/rclone:1.75.2"}
    built = adapter.translate(copy.deepcopy(rendered.objects), host_ports=HOST_PORTS, images=images)
    assert [container(built, p)["image"] for p in ("ducklake-postgres-0", "ducklake-rclone-s3-0")] == list(
        images.values()
    )
    assert sum(t.rule == "image-built-locally" for t in built.translations) == 2
    line = refused(copy.deepcopy(rendered.objects), images={"postgres:16.15": "x"})
    assert "no local build of the image rclone/rclone:1.75.2" in line


# --------------------------------------------------------------------------------------------- bad input


def _sts(objects: list[dict[str, Any]], name: str = k8s.POSTGRES_STATEFULSET) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["name"] == name)


def _c(objects: list[dict[str, Any]], name: str = k8s.POSTGRES_STATEFULSET) -> dict[str, Any]:
    return _sts(objects, name)["spec"]["template"]["spec"]["containers"][0]


BAD_INPUT = [
    (
        "unknown kind",
        lambda o: o.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}}),
        "ConfigMap/settings, a kind the podman adapter does not translate",
    ),
    ("replicas", lambda o: _sts(o)["spec"].update(replicas=2), "asks for 2 replicas"),
    (
        "httpGet probe",
        lambda o: _c(o).update(livenessProbe={"httpGet": {"path": "/", "port": 5432}}),
        "its livenessProbe is not an exec probe",
    ),
    (
        "configMapKeyRef",
        lambda o: _c(o)["env"].append({"name": "X", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}),
        "env X reads configMapKeyRef",
    ),
    (
        "missing secret key",
        lambda o: _c(o)["env"][0]["valueFrom"]["secretKeyRef"].update(key="NOPE"),
        "/NOPE, which the overlay lacks",
    ),
    (
        "secret in args",
        lambda o: _c(o, k8s.S3_STATEFULSET)["args"].extend(["--auth-key", "$(S3_SECRET)"]),
        "would show in the process list",
    ),
    ("unknown container field", lambda o: _c(o).update(lifecycle={}), "its lifecycle is not translated"),
    (
        "pod volume",
        lambda o: _sts(o)["spec"]["template"]["spec"].update(volumes=[{"name": "data", "emptyDir": {}}]),
        "the pod template's volumes is not translated",
    ),
]


@pytest.mark.parametrize(("case", "mutate", "message"), BAD_INPUT, ids=[b[0] for b in BAD_INPUT])
def test_bad_input_is_refused_in_one_line(rendered: Render, case: str, mutate: Any, message: str) -> None:
    objects = copy.deepcopy(rendered.objects)
    mutate(objects)
    assert message in refused(objects)


def test_host_ports_must_match_the_services(rendered: Render) -> None:
    line = refused(copy.deepcopy(rendered.objects), host_ports={k8s.POSTGRES_SERVICE: 1, "minio": 2})
    assert "['minio']" in line and "['rclone-s3']" in line


def test_parse_refuses_what_is_not_kubernetes_objects() -> None:
    with pytest.raises(adapter.AdapterError, match="not YAML"):
        adapter.parse("kind: [unclosed")
    with pytest.raises(adapter.AdapterError, match="not a Kubernetes object"):
        adapter.parse("- just\n- a list\n")
    assert adapter.parse("---\nkind: Namespace\nmetadata: {name: x}\n---\n") == [
        {"kind": "Namespace", "metadata": {"name": "x"}}
    ]
