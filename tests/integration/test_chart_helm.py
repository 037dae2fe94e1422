"""The Helm charts (``charts/vwserver``, ``charts/vwserver-syncer``), linted and rendered by the
real helm.

helm is built from the Go module proxy (``scripts/tools/build.sh helm``, cached). The charts are
the source of ``manifests/deploy/`` and ``manifests/syncer/`` (``scripts/gen-manifests.py``): the
drift check here fails when a kustomize base and its chart's default rendering differ, so the
kustomize tests (``tests/unit/test_manifests_kustomize.py``,
``tests/unit/test_syncer_manifests_kustomize.py``) and the syncer's deploy e2e test
(``tests/e2e/test_syncer_deploy_kcp.py``) check the charts' defaults too. On top of that:
``helm lint --strict`` with default and non-default values, every optional object switched on
(cert-manager Certificate, ServiceMonitor, NetworkPolicy) and off (PodDisruptionBudget), the
values reaching the objects, and the rendered config files passing vwserver's own loaders
(``vwserver check-config``, ``vwserver sync --check``) with the paths the pods will see. Server-side validation of the rendered objects by a real
kube-apiserver: ``tests/e2e/test_manifests_kubeapi.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.seed_story import RELATED

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "vwserver"
SYNCER_CHART = REPO / "charts" / "vwserver-syncer"

Doc = dict[str, Any]

# Non-default values exercising every switch and the values users set most.
CUSTOM: Doc = {
    "fullnameOverride": "vw",
    "image": {
        "repository": "registry.example.com/vwserver",
        "digest": "sha256:" + "ab" * 32,
        "pullPolicy": "Always",
    },
    "imagePullSecrets": [{"name": "regcred"}],
    "replicas": 3,
    "resources": {
        "requests": {"cpu": "250m", "memory": "256Mi"},
        "limits": {"cpu": "2", "memory": "1Gi"},
    },
    "tls": {
        "certManager": {
            "enabled": True,
            "issuerRef": {"name": "vw-ca", "kind": "ClusterIssuer"},
        }
    },
    "kcpKubeconfigSecret": "kcp-identity",
    "config": {
        "externalURL": "https://slices.example.org:8443",
        "controller": {"export": {"path": "root:providers:vw"}},
        "auth": {"mode": "passthrough"},
        "metrics": {"path": "/prom"},
        "upstream": {"context": "base"},
        "shutdownDelaySeconds": 10,
        "shutdownGracePeriodSeconds": 50,
        # The chart owns the paths of its mounts: a value here is overridden.
        "tls": {"certFile": "/elsewhere/tls.crt"},
    },
    "podDisruptionBudget": {"minAvailable": 2},
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "networkPolicy": {
        "enabled": True,
        "ingressFrom": [{"namespaceSelector": {"matchLabels": {"team": "slices"}}}],
        "egress": [{"ports": [{"port": 6443, "protocol": "TCP"}]}],
    },
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "podAnnotations": {"example.com/owner": "platform"},
}


# What charts/vwserver renders with default values.
SERVER_KINDS = {"ServiceAccount", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}

# Non-default values of the syncer chart: two resources, one synced into another type downstream.
SYNCER_CUSTOM: Doc = {
    "replicas": 3,
    "image": {"repository": "registry.example.com/vwserver", "tag": "0.1.0-rc1"},
    "kcpKubeconfigSecret": "syncer-identity",
    "config": {
        "name": "us",
        "upstream": {
            "endpointSlice": {
                "kind": "APIExportEndpointSlice",
                "workspace": "root:provider",
                "name": "widgets",
            }
        },
        "resources": [
            {"group": "example.io", "version": "v1", "resource": "widgets", "kind": "Widget"},
            {
                "group": "example.io",
                "version": "v1",
                "resource": "gadgets",
                "kind": "Gadget",
                "downstream": {
                    "group": "ops.example.com",
                    "version": "v2",
                    "resource": "devices",
                    "kind": "Device",
                },
            },
        ],
        "health": {"host": "0.0.0.0", "port": 9090},
        # The chart owns what must match its objects: these are overridden.
        "downstream": {"kubeconfig": "/elsewhere"},
        "leaderElection": {"enabled": True, "namespace": "elsewhere"},
    },
    "networkPolicy": {"enabled": True},
}


# The syncer chart with related resources (the seed story's: a password Secret copied down, the
# operator's connection-string Secret copied up), a ConfigMap only read (origin downstream) of
# a second resource, and the namespace cleanup switched on.
SYNCER_RELATED: Doc = {
    "config": {
        "resources": [
            {
                "group": "mongodbcommunity.mongodb.com",
                "version": "v1",
                "resource": "mongodbcommunity",
                "kind": "MongoDBCommunity",
                "related": RELATED,
            },
            {
                "group": "example.io",
                "version": "v1",
                "resource": "widgets",
                "kind": "Widget",
                "related": [
                    {
                        "name": "report",
                        "origin": "downstream",
                        "version": "v1",
                        "resource": "configmaps",
                        "kind": "ConfigMap",
                        "nameTemplate": "{{ .name }}-report",
                    },
                    {
                        "name": "certificate",
                        "origin": "kcp",
                        "group": "cert-manager.io",
                        "version": "v1",
                        "resource": "certificates",
                        "kind": "Certificate",
                        "reference": {"path": "spec.certificateRef.name"},
                    },
                ],
            },
        ],
    },
    "namespaceCleanup": {"enabled": True},
}
ALL_VERBS = ["get", "list", "watch", "create", "patch", "delete"]


def helm_run(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), *args], capture_output=True, text=True, timeout=120, check=False
    )


def render(
    helm: Path, tmp_path: Path, values: Doc | None = None, *, chart: Path = CHART
) -> dict[str, Doc]:
    """``helm template`` of a chart (release and namespace: its name), by kind (each once)."""
    args = ["template", chart.name, str(chart), "--namespace", chart.name]
    if values is not None:
        values_file = tmp_path / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        args += ["--values", str(values_file)]
    done = helm_run(helm, *args)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    kinds = [d["kind"] for d in docs]
    assert len(kinds) == len(set(kinds)), kinds
    return {d["kind"]: d for d in docs}


def check_config(
    text: str, tmp_path: Path, *, syncer: bool = False
) -> subprocess.CompletedProcess[str]:
    """``vwserver check-config`` (``vwserver sync --check``) on a rendered config file, its
    absolute paths moved under ``tmp_path`` where (empty) files stand in for the mounted
    Secrets' keys."""
    raw = yaml.safe_load(text)
    named = [raw["upstream"]["kubeconfig"]]
    if not syncer:
        named += [raw["tls"]["certFile"], raw["tls"]["keyFile"]]
    for f in named:
        local = tmp_path / f.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text("")
    config = tmp_path / "config.yaml"
    config.write_text(text.replace(": /etc/vwserver/", f": {tmp_path}/etc/vwserver/"))
    command = ["sync", "--check"] if syncer else ["check-config"]
    return subprocess.run(
        [sys.executable, "-m", "vwserver.cli", *command, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def config_of(rendered: dict[str, Doc]) -> str:
    return str(rendered["ConfigMap"]["data"]["config.yaml"])


def gen_manifests_check(repo: Path, helm: Path) -> subprocess.CompletedProcess[str]:
    """``scripts/gen-manifests.py --check`` of the tree ``repo``, with this helm."""
    return subprocess.run(
        [sys.executable, str(repo / "scripts" / "gen-manifests.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "VWSERVER_HELM": str(helm)},
        check=False,
    )


def test_generated_manifests_are_fresh(helm: Path) -> None:
    """manifests/deploy/ and manifests/syncer/ are the charts' default renderings, and the API
    manifests are the schema's."""
    result = gen_manifests_check(REPO, helm)
    assert result.returncode == 0, result.stderr


def test_drift_is_detected(helm: Path, tmp_path: Path) -> None:
    """The check compares the chart's rendering, not just the files' presence: a chart whose
    default replicas differ from manifests/deploy/ fails it."""
    chart = tmp_path / "repo"
    (chart / "scripts").mkdir(parents=True)
    (chart / "scripts" / "gen-manifests.py").write_text(
        (REPO / "scripts" / "gen-manifests.py").read_text()
    )
    for tree in ("charts", "manifests"):
        subprocess.run(["cp", "-r", str(REPO / tree), str(chart / tree)], check=True, timeout=30)
    values = chart / "charts" / "vwserver" / "values.yaml"
    text = values.read_text()
    assert "\nreplicas: 2\n" in text
    values.write_text(text.replace("\nreplicas: 2\n", "\nreplicas: 4\n"))
    result = gen_manifests_check(chart, helm)
    assert result.returncode == 1, result.stderr
    assert "manifests/deploy/deployment.yaml" in result.stderr


@pytest.mark.parametrize("chart", [CHART, SYNCER_CHART], ids=lambda c: c.name)
def test_chart_version_is_the_application_version(chart: Path) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    assert (meta["version"], meta["appVersion"]) == (version, version)


@pytest.mark.parametrize(
    ("chart", "custom"),
    [
        (CHART, None),
        (CHART, CUSTOM),
        (SYNCER_CHART, None),
        (SYNCER_CHART, SYNCER_CUSTOM),
        (SYNCER_CHART, SYNCER_RELATED),
    ],
    ids=[
        "vwserver-default",
        "vwserver-custom",
        "syncer-default",
        "syncer-custom",
        "syncer-related",
    ],
)
def test_lint(helm: Path, tmp_path: Path, chart: Path, custom: Doc | None) -> None:
    args = ["lint", "--strict", str(chart)]
    if custom is not None:
        values_file = tmp_path / "values.yaml"
        values_file.write_text(yaml.safe_dump(custom))
        args += ["--values", str(values_file)]
    done = helm_run(helm, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def test_default_objects_and_config(helm: Path, tmp_path: Path) -> None:
    rendered = render(helm, tmp_path)
    assert set(rendered) == SERVER_KINDS
    pod = rendered["Deployment"]["spec"]["template"]
    # a changed config rolls the pods
    assert pod["metadata"]["annotations"]["checksum/config"]
    done = check_config(config_of(rendered), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "ok (0 slice(s))" in done.stdout


def test_custom_values_reach_the_objects(helm: Path, tmp_path: Path) -> None:
    rendered = render(helm, tmp_path, CUSTOM)
    assert set(rendered) == SERVER_KINDS | {"Certificate", "ServiceMonitor", "NetworkPolicy"}
    for obj in rendered.values():
        assert obj["metadata"]["name"].startswith("vw"), obj["kind"]
        assert obj["metadata"]["namespace"] == "vwserver", obj["kind"]
    deployment = rendered["Deployment"]["spec"]
    assert deployment["replicas"] == 3
    pod = deployment["template"]
    spec = pod["spec"]
    (c,) = spec["containers"]
    assert c["image"] == "registry.example.com/vwserver@sha256:" + "ab" * 32
    assert c["imagePullPolicy"] == "Always"
    assert c["resources"] == CUSTOM["resources"]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["metadata"]["annotations"]["example.com/owner"] == "platform"
    # the drain (10 + 50) plus the margin for the Lease
    assert spec["terminationGracePeriodSeconds"] == 70
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    assert secrets == {"tls": "vw-tls", "kcp-kubeconfig": "kcp-identity"}

    # the Certificate writes the mounted TLS Secret, for the Service's names and externalURL's host
    cert = rendered["Certificate"]["spec"]
    assert cert["secretName"] == "vw-tls"
    assert cert["issuerRef"] == {
        "name": "vw-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }
    assert {"vw.vwserver.svc", "slices.example.org"} <= set(cert["dnsNames"])

    pdb = rendered["PodDisruptionBudget"]["spec"]
    assert pdb["minAvailable"] == 2
    pod_labels = pod["metadata"]["labels"]
    monitor = rendered["ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        rendered["Service"]["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["scheme"], endpoint["path"]) == ("https", "https", "/prom")
    assert endpoint["tlsConfig"]["serverName"] == "vw.vwserver.svc"
    policy = rendered["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = policy["ingress"]
    assert ingress["from"] == CUSTOM["networkPolicy"]["ingressFrom"]
    assert policy["egress"] == CUSTOM["networkPolicy"]["egress"]

    # the values' config, with the chart's mount paths winning, passes vwserver's own loader
    config = yaml.safe_load(config_of(rendered))
    assert config["tls"] == {
        "certFile": "/etc/vwserver/tls/tls.crt",
        "keyFile": "/etc/vwserver/tls/tls.key",
    }
    assert config["upstream"] == {"kubeconfig": "/etc/vwserver/kcp/kubeconfig", "context": "base"}
    assert config["auth"] == {"mode": "passthrough"}
    done = check_config(config_of(rendered), tmp_path)
    assert done.returncode == 0, done.stderr


def test_switches_off(helm: Path, tmp_path: Path) -> None:
    rendered = render(helm, tmp_path, {"podDisruptionBudget": {"enabled": False}})
    assert "PodDisruptionBudget" not in rendered


def test_invalid_config_fails_check_config(helm: Path, tmp_path: Path) -> None:
    """check-config is a real check of the rendered file: a value of the wrong type is refused,
    naming the field."""
    rendered = render(helm, tmp_path, {"config": {"listen": {"port": "https"}}})
    done = check_config(config_of(rendered), tmp_path)
    assert done.returncode == 2
    assert "listen.port" in done.stderr


def test_cert_manager_needs_an_issuer(helm: Path, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"tls": {"certManager": {"enabled": True}}}))
    done = helm_run(helm, "template", "vwserver", str(CHART), "--values", str(values))
    assert done.returncode != 0
    assert "tls.certManager.issuerRef.name is required" in done.stderr


def test_syncer_custom_values_reach_the_objects(helm: Path, tmp_path: Path) -> None:
    rendered = render(helm, tmp_path, SYNCER_CUSTOM, chart=SYNCER_CHART)
    assert set(rendered) == {
        "ServiceAccount",
        "ConfigMap",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "PodDisruptionBudget",
        "NetworkPolicy",
    }
    spec = rendered["Deployment"]["spec"]
    assert spec["replicas"] == 3
    (c,) = spec["template"]["spec"]["containers"]
    assert c["image"] == "registry.example.com/vwserver:0.1.0-rc1"
    assert c["ports"] == [{"name": "health", "containerPort": 9090, "protocol": "TCP"}]
    secrets = [
        v["secret"]["secretName"] for v in spec["template"]["spec"]["volumes"] if "secret" in v
    ]
    assert secrets == ["syncer-identity"]
    # one ClusterRole rule per synced resource, for its downstream type
    rules = rendered["ClusterRole"]["rules"]
    synced = [(r["apiGroups"], r["resources"]) for r in rules if "patch" in r["verbs"]]
    assert synced == [(["example.io"], ["widgets"]), (["ops.example.com"], ["devices"])]
    config = yaml.safe_load(config_of(rendered))
    assert config["downstream"] == {"inCluster": True}
    assert config["leaderElection"]["namespace"] == "vwserver-syncer"
    assert rendered["Role"]["metadata"]["namespace"] == "vwserver-syncer"
    done = check_config(config_of(rendered), tmp_path, syncer=True)
    assert done.returncode == 0, done.stderr
    assert "ok (2 resource(s))" in done.stdout


def test_syncer_default_config_passes_its_loader(helm: Path, tmp_path: Path) -> None:
    rendered = render(helm, tmp_path, chart=SYNCER_CHART)
    done = check_config(config_of(rendered), tmp_path, syncer=True)
    assert done.returncode == 0, done.stderr


def rules_of(rendered: dict[str, Doc]) -> list[tuple[str, str, list[str]]]:
    """The ClusterRole's rules as (group, resource, verbs), one resource each."""
    out = []
    for rule in rendered["ClusterRole"]["rules"]:
        (group,), (resource,) = rule["apiGroups"], rule["resources"]
        out.append((group, resource, rule["verbs"]))
    return out


def test_syncer_default_rbac_has_no_related_rules_and_no_broad_list(
    helm: Path, tmp_path: Path
) -> None:
    """Defaults: namespaces are created and read, never deleted, and nothing is listed beyond
    the synced resource (the namespace cleanup is opt-in)."""
    rules = rules_of(render(helm, tmp_path, chart=SYNCER_CHART))
    assert rules == [
        ("", "namespaces", ["get", "create"]),
        ("mongodbcommunity.mongodb.com", "mongodbcommunity", ALL_VERBS),
        ("", "events", ["create"]),
    ]


def test_syncer_related_resources_get_their_rules(helm: Path, tmp_path: Path) -> None:
    """Each related group/resource once: every verb when copies are written downstream (origin
    kcp; a resource with entries of both origins too), list+watch when it is only read (origin
    downstream); the namespace cleanup switched on: delete on namespaces and the broad list."""
    rendered = render(helm, tmp_path, SYNCER_RELATED, chart=SYNCER_CHART)
    assert rules_of(rendered) == [
        ("", "namespaces", ["get", "create", "delete"]),
        ("*", "*", ["list"]),
        ("mongodbcommunity.mongodb.com", "mongodbcommunity", ALL_VERBS),
        ("example.io", "widgets", ALL_VERBS),
        ("", "secrets", ALL_VERBS),  # password (kcp) and connection-string (downstream)
        ("cert-manager.io", "certificates", ALL_VERBS),
        ("", "configmaps", ["list", "watch"]),
        ("", "events", ["create"]),
    ]
    config = yaml.safe_load(config_of(rendered))
    assert config["resources"][0]["related"] == RELATED
    done = check_config(config_of(rendered), tmp_path, syncer=True)
    assert done.returncode == 0, done.stderr
    assert "ok (2 resource(s))" in done.stdout
