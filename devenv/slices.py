"""Install vwserver's own API in kcp and create FilteredAPIExportEndpointSlices — the kcp-mode
half of the demo world, shared by ``make run`` and the controller's e2e tests.

vwserver's API (``manifests/kcp/apiexport.yaml``) lives in a workspace of its own; a provider
binds it in the workspace where it wants to create slices, and the embedded controller of
vwserver watches every slice through that export's virtual workspace.

The grants are the shipped examples in ``manifests/rbac/`` with names swapped in, so that the
demo and the tests prove those files work: :func:`slice_grant` (a user may use a slice) and
:func:`export_grant` (the export's workspace lets slices of another workspace serve it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from devenv.bootstrap import (
    Workspace,
    apply_retrying,
    get_field,
    get_json,
    poll,
    wait_workspace_ready,
    workspace_manifest,
)
from devenv.kcp import KcpInstance
from vwserver.controller import consent

REPO = Path(__file__).resolve().parents[1]
API_MANIFEST = REPO / "manifests" / "kcp" / "apiexport.yaml"
RBAC = REPO / "manifests" / "rbac"
API_EXPORT = "sync.edge-connect.eu"
KIND = "filteredapiexportendpointslice"


async def install_api(
    kcp: KcpInstance,
    *,
    workspace: str,
    within: float = 60.0,
    selector: Mapping[str, Any] | None = None,
) -> Workspace:
    """Workspace ``root:<workspace>`` with vwserver's APIExport, ready to be bound
    (``selector``: the workspace's ``spec.location.selector`` on a sharded kcp)."""
    doc = workspace_manifest(workspace, selector=selector)
    await apply_retrying(kcp, kcp.cluster_url("root"), json.dumps(doc), within=within)
    ws = await wait_workspace_ready(kcp, workspace, within=within)
    await apply_retrying(kcp, ws.url, API_MANIFEST, within=within)
    await poll(
        f"APIExport {API_EXPORT} identity",
        lambda: get_field(kcp, ws.url, "apiexport", API_EXPORT, "status", "identityHash"),
        within=within,
    )
    return ws


async def bind_api(
    kcp: KcpInstance, ws: Workspace, *, api: Workspace, within: float = 60.0
) -> None:
    """Bind vwserver's API in ``ws`` and wait until slices can be created there."""
    binding = {
        "apiVersion": "apis.kcp.io/v1alpha2",
        "kind": "APIBinding",
        "metadata": {"name": API_EXPORT},
        "spec": {"reference": {"export": {"path": api.path, "name": API_EXPORT}}},
    }
    await apply_retrying(kcp, ws.url, json.dumps(binding), within=within)

    async def bound() -> bool | None:
        phase = await get_field(kcp, ws.url, "apibinding", API_EXPORT, "status", "phase")
        return True if phase == "Bound" else None

    await poll(f"APIBinding {API_EXPORT} in {ws.path}", bound, within=within)

    async def served() -> bool | None:  # discovery catches up a moment after Bound
        await get_json(kcp, ws.url, f"{KIND}s")
        return True

    await poll(f"{KIND}s served in {ws.path}", served, within=within)


def slice_manifest(
    name: str,
    *,
    export_path: str,
    export_name: str,
    selector: dict[str, Any],
    related: list[dict[str, Any]] | None = None,
) -> str:
    """A FilteredAPIExportEndpointSlice; ``related``: its ``spec.relatedResources`` rules."""
    spec: dict[str, Any] = {
        "export": {"path": export_path, "name": export_name},
        "objectSelector": selector,
    }
    if related:
        spec["relatedResources"] = related
    return json.dumps(
        {
            "apiVersion": f"{API_EXPORT}/v1alpha1",
            "kind": "FilteredAPIExportEndpointSlice",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


async def wait_slice_ready(
    kcp: KcpInstance, ws: Workspace, name: str, *, within: float
) -> dict[str, Any]:
    """The slice's status once its Ready condition is True."""

    async def ready() -> dict[str, Any] | None:
        status: dict[str, Any] = (await get_json(kcp, ws.url, KIND, name)).get("status") or {}
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        return status if conditions.get("Ready") == "True" else None

    return await poll(f"slice {name} in {ws.path} Ready", ready, within=within)


def rbac_docs(name: str) -> list[dict[str, Any]]:
    """The documents of ``manifests/rbac/<name>``."""
    return [d for d in yaml.safe_load_all((RBAC / name).read_text()) if d]


def slice_grant(slice_name: str, user: str) -> str:
    """``manifests/rbac/example-slice-user.yaml`` for another slice and user."""
    role, binding = rbac_docs("example-slice-user.yaml")
    role["metadata"]["name"] = f"slice-{slice_name}-content"
    role["rules"][0]["resourceNames"] = [slice_name]
    binding["metadata"]["name"] = f"slice-{slice_name}-content-{user}"
    binding["roleRef"]["name"] = role["metadata"]["name"]
    binding["subjects"] = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    return yaml.safe_dump_all([role, binding])


def export_grant_binding(*, slice_cluster: str, export_name: str) -> str:
    """The ClusterRoleBinding :func:`export_grant` creates (delete it to revoke the grant)."""
    return f"vwserver:slices-of-{export_name}:{slice_cluster}"


def export_grant(*, slice_cluster: str, export_name: str) -> str:
    """``manifests/rbac/export-grants-slice-workspace.yaml`` for one export and slice workspace,
    to apply in the export's workspace."""
    role, binding = rbac_docs("export-grants-slice-workspace.yaml")
    role["metadata"]["name"] = f"vwserver:slices-of-{export_name}"
    role["rules"][0]["resourceNames"] = [export_name]
    binding["metadata"]["name"] = export_grant_binding(
        slice_cluster=slice_cluster, export_name=export_name
    )
    binding["roleRef"]["name"] = role["metadata"]["name"]
    binding["subjects"][0]["name"] = consent.subject(slice_cluster)
    return yaml.safe_dump_all([role, binding])
