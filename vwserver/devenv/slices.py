"""Install vwserver's own API in kcp and create FilteredAPIExportEndpointSlices — the kcp-mode
half of the demo world, shared by ``make run`` and the controller's e2e tests.

vwserver's API (``manifests/kcp/apiexport.yaml``) lives in a workspace of its own; a provider
binds it in the workspace where it wants to create slices, and the embedded controller of
vwserver watches every slice through that export's virtual workspace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vwserver.devenv.bootstrap import (
    Workspace,
    apply_retrying,
    get_field,
    get_json,
    poll,
    wait_workspace_ready,
)
from vwserver.devenv.kcp import KcpInstance

REPO = Path(__file__).resolve().parents[2]
API_MANIFEST = REPO / "manifests" / "kcp" / "apiexport.yaml"
API_EXPORT = "sync.edge-connect.eu"
KIND = "filteredapiexportendpointslice"


async def install_api(kcp: KcpInstance, *, workspace: str, within: float = 60.0) -> Workspace:
    """Workspace ``root:<workspace>`` with vwserver's APIExport, ready to be bound."""
    doc = {
        "apiVersion": "tenancy.kcp.io/v1alpha1",
        "kind": "Workspace",
        "metadata": {"name": workspace},
    }
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
    name: str, *, export_path: str, export_name: str, selector: dict[str, Any]
) -> str:
    return json.dumps(
        {
            "apiVersion": f"{API_EXPORT}/v1alpha1",
            "kind": "FilteredAPIExportEndpointSlice",
            "metadata": {"name": name},
            "spec": {
                "export": {"path": export_path, "name": export_name},
                "objectSelector": selector,
            },
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
