"""``kubectl kustomize manifests/syncer`` renders a deployment that can actually run the syncer.

Rendered by the real kubectl (kustomize v5; required, never skipped), then checked the way a
reviewer would: the container runs ``sync --config <the mounted ConfigMap key>``, the config file
in the ConfigMap passes vwserver's own loader (read from a file, the Secret's paths moved under a
temp dir) and says ``downstream: {inCluster: true}``, the probes reach the configured health port
and paths, health listens on all interfaces, leader election matches the replica count and the
Lease's namespace is the one the Role grants, the ClusterRole covers every configured resource
with the verbs the syncer uses, the bindings name the pod's ServiceAccount, and the image and
security settings are those of ``manifests/deploy/`` (``vwserver serve``).

Whether that RBAC is *sufficient* (and each ClusterRole rule needed) is shown between real kcp
and a real kube-apiserver by ``tests/e2e/test_syncer_deploy_kcp.py``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from vwserver.syncer.config import SyncerConfig, load_syncer_config

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "manifests" / "syncer"

Doc = dict[str, Any]


def render(path: Path) -> list[Doc]:
    result = subprocess.run(
        ["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, Doc]:
    """The rendered objects by kind (each kind occurs once)."""
    docs = render(BASE)
    kinds = [d["kind"] for d in docs]
    assert len(kinds) == len(set(kinds)), kinds
    return {d["kind"]: d for d in docs}


@pytest.fixture(scope="module")
def serve_deployment() -> Doc:
    (deployment,) = [d for d in render(REPO / "manifests") if d["kind"] == "Deployment"]
    return deployment


def pod_spec(deployment: Doc) -> Doc:
    spec: Doc = deployment["spec"]["template"]["spec"]
    return spec


def container(deployment: Doc) -> Doc:
    (c,) = pod_spec(deployment)["containers"]
    return dict(c)


@pytest.fixture(scope="module")
def config_text(rendered: dict[str, Doc]) -> str:
    """The config file the container is started with, from the ConfigMap mounted for it."""
    c = container(rendered["Deployment"])
    args = c["args"]
    assert args[:2] == ["sync", "--config"] and len(args) == 3, args
    path = Path(args[2])
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(rendered["Deployment"])["volumes"]}
    (volume,) = [n for n, v in volumes.items() if "configMap" in v]
    assert volumes[volume]["configMap"]["name"] == rendered["ConfigMap"]["metadata"]["name"]
    assert path.parent == Path(mounts[volume])
    text: str = rendered["ConfigMap"]["data"][path.name]
    return text


@pytest.fixture(scope="module")
def config(config_text: str, tmp_path_factory: pytest.TempPathFactory) -> SyncerConfig:
    """The config loaded by vwserver's own loader from a file, with the absolute paths it names
    (the mounted Secret's files) moved under a temp dir that has them."""
    tmp = tmp_path_factory.mktemp("syncer-config")
    raw = yaml.safe_load(config_text)
    kubeconfig = raw["upstream"]["kubeconfig"]
    assert kubeconfig.startswith("/"), "a relative path would be relative to the ConfigMap mount"
    local = tmp / kubeconfig.lstrip("/")
    local.parent.mkdir(parents=True)
    local.write_text("")
    path = tmp / "config.yaml"
    path.write_text(config_text.replace(f": {kubeconfig}", f": {local}"))
    return load_syncer_config(path)


def test_downstream_cluster_objects_only(rendered: dict[str, Doc]) -> None:
    assert set(rendered) == {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
    }
    ns = rendered["Namespace"]["metadata"]["name"]
    for kind, obj in rendered.items():
        if kind not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == ns, kind
    labels = rendered["Namespace"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_config_is_valid_and_uses_the_pods_service_account(
    rendered: dict[str, Doc], config: SyncerConfig
) -> None:
    assert config.downstream.in_cluster is True
    assert config.downstream.kubeconfig is None
    # upstream: the kubeconfig is a key of the mounted Secret
    spec = pod_spec(rendered["Deployment"])
    c = container(rendered["Deployment"])
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    secrets = {
        v["secret"]["secretName"]: mounts[v["name"]] for v in spec["volumes"] if "secret" in v
    }
    assert set(secrets) == {"vwserver-syncer-kcp-kubeconfig"}
    kubeconfig = Path(
        yaml.safe_load(rendered["ConfigMap"]["data"]["config.yaml"])["upstream"]["kubeconfig"]
    )
    assert kubeconfig == Path(secrets["vwserver-syncer-kcp-kubeconfig"]) / "kubeconfig"
    # the ServiceAccount token is mounted (inCluster reads it), and it is the bound identity
    sa = rendered["ServiceAccount"]
    assert spec["serviceAccountName"] == sa["metadata"]["name"]
    assert spec.get("automountServiceAccountToken", True) is True
    assert sa.get("automountServiceAccountToken", True) is True
    assert config.log_format == "json"


def test_probes_reach_the_health_server(rendered: dict[str, Doc], config: SyncerConfig) -> None:
    assert config.health.enabled
    assert config.health.host == "0.0.0.0"  # the kubelet probes the pod IP
    c = container(rendered["Deployment"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"health": config.health.port}
    for probe, path in [
        ("startupProbe", "/livez"),
        ("livenessProbe", "/livez"),
        ("readinessProbe", "/readyz"),
    ]:
        get = c[probe]["httpGet"]
        port = ports.get(get["port"], get["port"])
        assert (get["path"], get["scheme"], port) == (path, "HTTP", config.health.port), probe


def test_leader_election_and_its_role(rendered: dict[str, Doc], config: SyncerConfig) -> None:
    replicas = rendered["Deployment"]["spec"]["replicas"]
    assert replicas == 2
    assert config.leader_election.enabled, "several replicas must not sync at the same time"
    ns = rendered["Namespace"]["metadata"]["name"]
    assert config.leader_election.namespace == ns
    role = rendered["Role"]
    assert role["metadata"]["namespace"] == ns
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
        }
    ]
    pdb = rendered["PodDisruptionBudget"]["spec"]
    pod_labels = rendered["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert pdb["selector"]["matchLabels"].items() <= pod_labels.items()
    assert 0 < pdb["minAvailable"] < replicas


def _verbs(rules: list[Doc], group: str, resource: str) -> set[str]:
    return {
        verb
        for rule in rules
        if group in rule.get("apiGroups", []) and resource in rule.get("resources", [])
        and not rule.get("resourceNames")
        for verb in rule["verbs"]
    }  # fmt: skip


def test_cluster_role_covers_the_configured_resources(
    rendered: dict[str, Doc], config: SyncerConfig
) -> None:
    rules = rendered["ClusterRole"]["rules"]
    for resource in config.resources:
        target = resource.target
        assert _verbs(rules, target.group, target.resource) == {
            "get", "list", "watch", "create", "patch", "delete",
        }, target  # fmt: skip
    assert _verbs(rules, "", "namespaces") == {"get", "create"}
    assert _verbs(rules, "", "events") == {"create"}
    # nothing beyond that: one rule per configured resource, namespaces and events
    assert len(rules) == len(config.resources) + 2


def test_bindings_name_the_service_account(rendered: dict[str, Doc]) -> None:
    sa = rendered["ServiceAccount"]["metadata"]
    subject = {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
    for binding, role in [("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")]:
        doc = rendered[binding]
        assert doc["subjects"] == [subject], binding
        assert doc["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role,
            "name": rendered[role]["metadata"]["name"],
        }, binding


def test_image_and_lockdown_are_those_of_serve(
    rendered: dict[str, Doc], serve_deployment: Doc
) -> None:
    ours, serve = container(rendered["Deployment"]), container(serve_deployment)
    assert ours["image"] == serve["image"]
    assert ours["securityContext"] == serve["securityContext"]
    assert ours["securityContext"]["readOnlyRootFilesystem"] is True
    assert ours["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    ours_pod, serve_pod = pod_spec(rendered["Deployment"]), pod_spec(serve_deployment)
    assert ours_pod["securityContext"] == serve_pod["securityContext"]
    assert ours_pod["securityContext"]["runAsNonRoot"] is True
    # writable: only the in-memory /tmp (as for serve); everything else is mounted read-only
    volumes = {v["name"]: v for v in ours_pod["volumes"]}
    for mount in ours["volumeMounts"]:
        if mount["mountPath"] == "/tmp":
            assert volumes[mount["name"]]["emptyDir"]["medium"] == "Memory"
        else:
            assert mount.get("readOnly") is True, mount
    for kind in ("requests", "limits"):
        assert set(ours["resources"][kind]) == {"cpu", "memory"}, kind
