"""The shipped manifests and the chart, applied to a real kube-apiserver with strict validation.

kcp serves no Deployments, Services or PodDisruptionBudgets, so this is where the hosting
cluster's and the syncer's objects meet a real server (``devenv/kubeapi.py``: etcd +
kube-apiserver v1.37, built from the Go module proxy; no kubelet, the API objects are what is
checked): ``kubectl apply --server-side --validate=strict`` of ``kubectl kustomize manifests/``,
of ``kubectl kustomize manifests/syncer`` and of the chart rendered with default and non-default
values. Strict validation refuses unknown and duplicate fields and every schema error; the
Namespaces enforce the ``restricted`` Pod Security Standard, whose admission warns on a
Deployment whose pods it would refuse — no warning may appear. The objects read back keep what
was applied (nothing was dropped). Two controls show that both checks can fail: an unknown
field is refused, and a pod allowed to escalate privileges draws the Pod Security warning.
The syncer chart's RBAC is then asked, with a TokenRequest token of its ServiceAccount, what the
real RBAC authorizer grants: exactly the syncer's verbs.

The chart's Certificate and ServiceMonitor need cert-manager's and the Prometheus Operator's
CRDs, which this server does not have: they are rendered but not applied (their shape is checked
in ``tests/integration/test_chart_helm.py``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.bootstrap import poll
from devenv.kubeapi import KubeAPIServer
from devenv.shards import write_kubeconfig
from tests.integration.test_chart_helm import CHART, CUSTOM, SYNCER_CHART, SYNCER_RELATED

REPO = Path(__file__).resolve().parents[2]
NEEDS_CRDS = {"Certificate", "ServiceMonitor"}

Doc = dict[str, Any]


def kubectl(
    server: KubeAPIServer, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", f"--kubeconfig={server.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def apply(server: KubeAPIServer, docs: list[Doc]) -> subprocess.CompletedProcess[str]:
    return kubectl(
        server,
        "apply",
        "--server-side",
        "--validate=strict",
        "--field-manager=vwserver-tests",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(docs),
    )


def kustomize(path: Path) -> list[Doc]:
    done = subprocess.run(
        ["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def helm_template(helm: Path, tmp_path: Path, *, namespace: str, values: Doc) -> list[Doc]:
    return helm_template_chart(helm, tmp_path, chart=CHART, namespace=namespace, values=values)


def helm_template_chart(
    helm: Path, tmp_path: Path, *, chart: Path, namespace: str, values: Doc | None = None
) -> list[Doc]:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values or {}))
    done = subprocess.run(
        [
            str(helm),
            "template",
            chart.name,
            str(chart),
            f"--namespace={namespace}",
            f"--values={values_file}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def restricted_namespace(name: str) -> Doc:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            },
        },
    }


def contains(actual: Any, expected: Any) -> bool:
    """Every field of ``expected`` is in ``actual`` with the same value (the server may add
    defaults, never drop or change what was applied). Quantities compare as the server
    canonicalises them, which the shipped values already are."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and contains(actual[k], v) for k, v in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(contains(a, e) for a, e in zip(actual, expected, strict=True))
        )
    return bool(actual == expected or str(actual) == str(expected))


def assert_applied_cleanly(server: KubeAPIServer, docs: list[Doc]) -> None:
    done = apply(server, docs)
    assert done.returncode == 0, done.stderr
    # Pod Security admission warns on a workload whose pods the namespace would refuse.
    assert "Warning" not in done.stderr, done.stderr
    for doc in docs:
        meta = doc["metadata"]
        args = ["get", doc["kind"].lower() + "." + doc["apiVersion"].split("/")[0], meta["name"]]
        if "/" not in doc["apiVersion"]:
            args[1] = doc["kind"].lower()
        if "namespace" in meta:
            args.append(f"--namespace={meta['namespace']}")
        got = kubectl(server, *args, "-o", "yaml")
        assert got.returncode == 0, got.stderr
        live = yaml.safe_load(got.stdout)
        for key in ("spec", "data", "rules", "roleRef", "subjects"):
            if key in doc:
                assert contains(live[key], doc[key]), (doc["kind"], key, live[key], doc[key])


async def test_kustomize_base(kubeapi: KubeAPIServer) -> None:
    docs = kustomize(REPO / "manifests")
    assert {d["kind"] for d in docs} >= {"Namespace", "Deployment", "PodDisruptionBudget"}
    assert_applied_cleanly(kubeapi, docs)


async def test_syncer_base(kubeapi: KubeAPIServer) -> None:
    docs = kustomize(REPO / "manifests" / "syncer")
    assert {d["kind"] for d in docs} >= {"ClusterRole", "Deployment", "PodDisruptionBudget"}
    assert_applied_cleanly(kubeapi, docs)


@pytest.mark.parametrize("custom", [False, True], ids=["default", "custom"])
async def test_chart(kubeapi: KubeAPIServer, helm: Path, tmp_path: Path, custom: bool) -> None:
    namespace = f"chart-{'custom' if custom else 'default'}"
    docs = helm_template(helm, tmp_path, namespace=namespace, values=CUSTOM if custom else {})
    kinds = {d["kind"] for d in docs}
    assert kinds >= {"Deployment", "Service", "PodDisruptionBudget", "ConfigMap"}
    if custom:
        assert kinds >= NEEDS_CRDS | {"NetworkPolicy"}
    served = [d for d in docs if d["kind"] not in NEEDS_CRDS]
    assert_applied_cleanly(kubeapi, [restricted_namespace(namespace), *served])


async def test_strict_validation_refuses_an_unknown_field(kubeapi: KubeAPIServer) -> None:
    (deployment,) = [d for d in kustomize(REPO / "manifests") if d["kind"] == "Deployment"]
    deployment["metadata"]["name"] = "unknown-field"
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    done = apply(kubeapi, [deployment])
    assert done.returncode != 0
    # the server's own schema check (server-side apply builds a typed patch from it)
    assert (
        '.spec.template.spec.containers[name="vwserver"].securityContxt: '
        "field not declared in schema"
    ) in done.stderr


async def test_pod_security_warns_on_a_weaker_pod(
    kubeapi: KubeAPIServer, helm: Path, tmp_path: Path
) -> None:
    namespace = "chart-weaker"
    values = {"securityContext": {"allowPrivilegeEscalation": True}}
    docs = helm_template(helm, tmp_path, namespace=namespace, values=values)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    done = apply(kubeapi, [restricted_namespace(namespace), deployment])
    assert done.returncode == 0, done.stderr
    assert 'would violate PodSecurity "restricted:latest"' in done.stderr
    assert "allowPrivilegeEscalation" in done.stderr


@pytest.mark.parametrize("related", [False, True], ids=["default", "related"])
async def test_syncer_rbac_is_what_the_syncer_needs(
    kubeapi: KubeAPIServer, helm: Path, tmp_path: Path, related: bool
) -> None:
    """The syncer chart's RBAC, applied to a real Kubernetes API server and asked with a
    TokenRequest token of its ServiceAccount (what kubelet mounts): every verb of every rule is
    granted by the real RBAC authorizer — cluster-wide for the synced resources, the Lease only
    in the release's namespace — and nothing beyond (the copies' Secrets, updating namespaces,
    another namespace's Leases). The same rules run a syncer between kcp and a kube-apiserver
    in tests/e2e/test_syncer_deploy_kcp.py. With related resources and the namespace cleanup
    (``SYNCER_RELATED``, a release of its own): the related resources' verbs (Secrets written,
    ConfigMaps only read), ``delete`` on namespaces and ``list`` — only ``list`` — on
    everything."""
    namespace = "syncer-rbac-related" if related else "syncer-rbac"
    values = {**SYNCER_RELATED, "fullnameOverride": "syncer-related"} if related else None
    docs = helm_template_chart(
        helm, tmp_path, chart=SYNCER_CHART, namespace=namespace, values=values
    )
    assert_applied_cleanly(kubeapi, [restricted_namespace(namespace), *docs])
    (sa,) = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]
    token = kubectl(kubeapi, "create", "token", sa, f"--namespace={namespace}", "--duration=10m")
    assert token.returncode == 0, token.stderr
    as_syncer = write_kubeconfig(
        tmp_path / "syncer.kubeconfig",
        server=kubeapi.url,
        ca=kubeapi.ca,
        token=token.stdout.strip(),
    )

    def can(verb: str, resource: str, *, group: str = "", namespace: str = "") -> bool:
        """A SelfSubjectAccessReview as the syncer (kubectl auth can-i cannot name a group
        of a type the server does not serve: this server has no MongoDBCommunity CRD)."""
        attrs = {"verb": verb, "resource": resource, "group": group, "namespace": namespace}
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs},
        }
        done = subprocess.run(
            [
                "kubectl",
                f"--kubeconfig={as_syncer}",
                "create",
                # kubectl's own schema check lists CRDs, which the syncer may not; the server
                # validates the review anyway.
                "--validate=false",
                "-o",
                "json",
                "-f",
                "-",
            ],
            input=json.dumps(review),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return bool(json.loads(done.stdout)["status"].get("allowed", False))

    # The authorizer reads RBAC objects from a watch cache: wait until the binding shows.
    async def bound() -> bool | None:
        return await asyncio.to_thread(can, "create", "namespaces") or None

    await poll("the syncer's ClusterRoleBinding to take effect", bound, within=60)
    mongo = {"group": "mongodbcommunity.mongodb.com"}
    for verb in ("get", "list", "watch", "create", "patch", "delete"):
        assert can(verb, "mongodbcommunity", **mongo), verb  # all namespaces
    assert not can("update", "mongodbcommunity", **mongo)
    assert not can("update", "mongodbcommunity/status", **mongo)
    assert can("get", "namespaces") and can("create", "namespaces")
    assert not can("update", "namespaces")
    assert can("delete", "namespaces") == related
    assert can("create", "events", namespace="kcp-copies")
    lease = {"group": "coordination.k8s.io"}
    for verb in ("get", "create", "update"):
        assert can(verb, "leases", namespace=namespace, **lease), verb
        assert not can(verb, "leases", namespace="default", **lease), verb
    if not related:
        assert not can("get", "secrets")
        assert not can("list", "pods")
        return
    for verb in ("get", "list", "watch", "create", "patch", "delete"):
        assert can(verb, "secrets"), verb  # the password copies down
        assert can(verb, "certificates", group="cert-manager.io"), verb
    assert not can("update", "secrets")
    assert can("list", "configmaps") and can("watch", "configmaps")  # sources of copies up
    assert not can("get", "configmaps") and not can("create", "configmaps")
    # the namespace cleanup's emptiness check: list anything, nothing more
    assert can("list", "pods") and can("list", "anything", group="example.org")
    assert not can("get", "pods") and not can("watch", "pods") and not can("delete", "pods")
