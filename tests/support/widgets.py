"""Widgets of the demo export written and read directly in kcp (as kcp-admin, past vwserver), in
namespaces a test makes for itself and removes afterwards."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

from devenv.bootstrap import Workspace
from devenv.kcp import KcpInstance
from tests.support.go_clients import Key

API = "apis/example.io/v1alpha1"
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


def widget(name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"size": 0, "color": "red"},
    }


def widget_export(name: str) -> dict[str, Any]:
    """Another APIExport ``name`` of the demo's Widget schema (for the provider's workspace)."""
    resource = {
        "group": "example.io",
        "name": "widgets",
        "schema": "v1.widgets.example.io",
        "storage": {"crd": {}},
    }
    return {
        "apiVersion": "apis.kcp.io/v1alpha2",
        "kind": "APIExport",
        "metadata": {"name": name},
        "spec": {"resources": [resource]},
    }


def export_binding(*, provider_path: str, export: str) -> dict[str, Any]:
    """An APIBinding to ``export`` of the workspace at ``provider_path``."""
    return {
        "apiVersion": "apis.kcp.io/v1alpha2",
        "kind": "APIBinding",
        "metadata": {"name": export},
        "spec": {"reference": {"export": {"path": provider_path, "name": export}}},
    }


async def list_widgets(
    kcp: KcpInstance, workspaces: Sequence[Workspace], namespace: str
) -> dict[Key, dict[str, Any]]:
    """Every widget of ``namespace`` in ``workspaces``, read directly from kcp, by key."""
    found = {}
    async with kcp.http_session(timeout=30) as session:
        for ws in workspaces:
            async with session.get(f"{ws.url}/{API}/namespaces/{namespace}/widgets") as resp:
                assert resp.status == 200, await resp.text()
                for item in (await resp.json())["items"]:
                    found[f"{ws.cluster}|{namespace}/{item['metadata']['name']}"] = item
    return found


async def make_namespace(kcp: KcpInstance, workspaces: Sequence[Workspace], name: str) -> None:
    for ws in workspaces:
        await kcp.kubectl("create", "namespace", name, server=ws.url)


async def remove_namespace(kcp: KcpInstance, workspaces: Sequence[Workspace], name: str) -> None:
    """Strip the finalizers from every widget left in ``name`` (directly), then delete it."""
    for ws in workspaces:
        with contextlib.suppress(Exception):
            async with kcp.http_session(timeout=30) as session:
                collection = f"{ws.url}/{API}/namespaces/{name}/widgets"
                async with session.get(collection) as resp:
                    items = (await resp.json()).get("items", []) if resp.status == 200 else []
                for item in items:
                    if item["metadata"].get("finalizers"):
                        patch = json.dumps({"metadata": {"finalizers": None}})
                        url = f"{collection}/{item['metadata']['name']}"
                        async with session.patch(url, data=patch, headers=MERGE_PATCH):
                            pass
        await kcp.kubectl(
            "delete", "namespace", name, "--wait=false", "--ignore-not-found", server=ws.url,
            check=False,
        )  # fmt: skip
