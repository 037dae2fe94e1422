"""``kubectl kustomize manifests/`` renders a deployment that can actually run vwserver.

Rendered by the real kubectl (kustomize v5), then checked the way a reviewer would: what is in it
(hosting-cluster objects only, never the kcp API files), that the pieces point at each other
(Service and PDB select the pods, the probes and Service reach the container port, every volume
the config file names is mounted), that the pod is locked down, and that the config file in the
ConfigMap passes vwserver's own validation with the paths it will see in the pod.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from vwserver.config import parse_config

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, Any]]:
    """The rendered objects by kind (each kind occurs once)."""
    result = subprocess.run(
        ["kubectl", "kustomize", str(REPO / "manifests")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    kinds = [d["kind"] for d in docs]
    assert len(kinds) == len(set(kinds)), kinds
    return {d["kind"]: d for d in docs}


def test_hosting_cluster_objects_only(rendered: dict[str, dict[str, Any]]) -> None:
    assert set(rendered) == {
        "Namespace",
        "ServiceAccount",
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    }
    ns = rendered["Namespace"]["metadata"]["name"]
    for kind, obj in rendered.items():
        if kind != "Namespace":
            assert obj["metadata"]["namespace"] == ns, kind
    assert rendered["Namespace"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == (
        "restricted"
    )


def pod_spec(rendered: dict[str, dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = rendered["Deployment"]["spec"]["template"]["spec"]
    return spec


def container(rendered: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (c,) = pod_spec(rendered)["containers"]
    return dict(c)


def test_deployment_wiring(rendered: dict[str, dict[str, Any]]) -> None:
    deployment = rendered["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    spec = pod_spec(rendered)
    assert spec["serviceAccountName"] == rendered["ServiceAccount"]["metadata"]["name"]
    assert spec["automountServiceAccountToken"] is False
    c = container(rendered)
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert c["image"] == f"vwserver:{version}"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"https": 8443}
    for probe, path in [
        ("startupProbe", "/livez"),
        ("livenessProbe", "/livez"),
        ("readinessProbe", "/readyz"),
    ]:
        get = c[probe]["httpGet"]
        assert (get["path"], get["scheme"], ports.get(get["port"], get["port"])) == (
            path,
            "HTTPS",
            8443,
        ), probe
    for kind in ("requests", "limits"):
        assert set(c["resources"][kind]) == {"cpu", "memory"}, kind


def test_pod_is_locked_down(rendered: dict[str, dict[str, Any]]) -> None:
    spec = pod_spec(rendered)
    c = container(rendered)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # the pod's uid is the image's USER (a numeric uid, so runAsNonRoot can be verified)
    dockerfile = (REPO / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\d+)(?::(\d+))?\s*$", dockerfile, re.MULTILINE)
    assert users and users[-1] == (
        str(spec["securityContext"]["runAsUser"]),
        str(spec["securityContext"]["runAsGroup"]),
    )
    # writable: only the in-memory /tmp; everything else is mounted read-only
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in c["volumeMounts"]:
        if mount["mountPath"] == "/tmp":
            assert volumes[mount["name"]]["emptyDir"]["medium"] == "Memory"
        else:
            assert mount.get("readOnly") is True, mount


def test_service_and_pdb_select_the_pods(rendered: dict[str, dict[str, Any]]) -> None:
    pod_labels = rendered["Deployment"]["spec"]["template"]["metadata"]["labels"]
    c = container(rendered)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    service = rendered["Service"]["spec"]
    assert service["selector"].items() <= pod_labels.items()
    ((port, target),) = [(p["port"], p["targetPort"]) for p in service["ports"]]
    assert (port, ports.get(target, target)) == (443, 8443)
    pdb = rendered["PodDisruptionBudget"]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= pod_labels.items()
    assert 0 < pdb["minAvailable"] < rendered["Deployment"]["spec"]["replicas"]


def test_config_file_is_valid_and_its_files_are_mounted(
    rendered: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    spec = pod_spec(rendered)
    c = container(rendered)
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    # the --config argument is a key of the (hash-named) ConfigMap mounted at its directory
    args = c["args"]
    assert args[:2] == ["serve", "--config"]
    config_path = Path(args[2])
    (config_volume,) = [n for n, v in volumes.items() if "configMap" in v]
    assert volumes[config_volume]["configMap"]["name"] == rendered["ConfigMap"]["metadata"]["name"]
    assert config_path.parent == Path(mounts[config_volume])
    text = rendered["ConfigMap"]["data"][config_path.name]
    raw = yaml.safe_load(text)
    assert raw["listen"]["port"] == 8443
    # every file the config names lies in a mounted Secret: TLS pair and vwserver's kubeconfig
    secrets = {v["secret"]["secretName"]: mounts[n] for n, v in volumes.items() if "secret" in v}
    named = [raw["tls"]["certFile"], raw["tls"]["keyFile"], raw["upstream"]["kubeconfig"]]
    assert {str(Path(f).parent) for f in named} <= set(secrets.values())
    assert set(secrets) == {"vwserver-tls", "vwserver-kcp-kubeconfig"}
    # vwserver's own validation accepts it, with the files where the pod will have them
    for f in named:
        local = tmp_path / f.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text("")
    moved = yaml.safe_load(text.replace(": /", f": {tmp_path}/"))
    config = parse_config(moved, base_dir=tmp_path)
    assert config.tls is not None and config.controller is not None


def test_pod_outlives_the_graceful_shutdown(rendered: dict[str, dict[str, Any]]) -> None:
    """The kubelet kills the pod after terminationGracePeriodSeconds: vwserver's own shutdown
    (delay while endpoints update, then the grace period for requests in flight) must end first,
    with a margin for the controller's Lease release. The Deployment logs JSON."""
    c = container(rendered)
    config = yaml.safe_load(rendered["ConfigMap"]["data"][Path(c["args"][2]).name])
    shutdown = config["shutdownDelaySeconds"] + config["shutdownGracePeriodSeconds"]
    assert config["shutdownDelaySeconds"] > 0  # kube-proxy needs a moment to stop routing here
    assert pod_spec(rendered)["terminationGracePeriodSeconds"] >= shutdown + 5
    assert config["logFormat"] == "json"
