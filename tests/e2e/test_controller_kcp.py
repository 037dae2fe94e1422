"""The embedded controller against real kcp (issue #4): slices created with kubectl become
routes and get status; kubectl uses the endpoint URL from that status.

Setup (once per module, on the session's kcp, :mod:`tests.e2e.controller_env`): a workspace
holding vwserver's own APIExport (``manifests/kcp/apiexport.yaml``), bound in the demo's provider
and consumer-a workspaces so that slices can be created there; an in-process vwserver (proxy +
controller) whose external URL is its own loopback address.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest_asyncio

from devenv.bootstrap import Bootstrap, Workspace, apply_retrying
from devenv.kcp import KcpInstance
from devenv.slices import export_grant, export_grant_binding, wait_slice_ready
from tests.e2e.controller_env import (
    Served,
    condition,
    create_workspace,
    eventually,
    serving,
    unique,
)
from tests.support.widgets import export_binding, widget_export
from vwserver.clock import SystemClock
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import load_kubeconfig
from vwserver.k8s.lease import LeaderElector


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(kcp: KcpInstance, world: Bootstrap) -> AsyncIterator[Served]:
    bind_in = (world.provider, world.consumer("consumer-a"))
    async with serving(kcp, world, bind_in=bind_in, resync=5.0) as served:
        yield served


async def wait_ready(served: Served, ws: Workspace, name: str, *, within: float) -> dict[str, Any]:
    return await wait_slice_ready(served.kcp, ws, name, within=within)


async def test_readyz_after_first_list(served: Served) -> None:
    async with aiohttp.ClientSession() as s, s.get(served.base + "/readyz") as r:
        assert r.status == 200


async def test_slice_by_path_becomes_ready_and_its_url_works(served: Served) -> None:
    world = served.world
    name = unique("prod")
    await served.create_slice(world.provider, name, selector={"matchLabels": {"env": "prod"}})
    status = await wait_ready(served, world.provider, name, within=10)
    assert status["observedGeneration"] == 1
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "SelectorValid": "True",
        "APIExportValid": "True",
        "Ready": "True",
    }
    (endpoint,) = status["endpoints"]
    url = endpoint["url"]
    assert url == (f"{served.base}/services/filtered-apiexport/{world.provider.cluster}/{name}")
    # the one-liner: kubectl --server "<status.endpoints[0].url>/clusters/*" get widgets -A
    out = await served.kcp.kubectl("get", "widgets", "-A", "-o", "json", server=f"{url}/clusters/*")
    items = json.loads(out.stdout)["items"]
    assert items
    assert {i["metadata"]["labels"]["env"] for i in items} == {"prod"}


async def test_slice_in_another_workspace_references_the_export_by_path(served: Served) -> None:
    """The legitimate cross-workspace case: the export's workspace grants the slice's
    (manifests/rbac/export-grants-slice-workspace.yaml); tests/security/test_consent_kcp.py
    covers the slice without a grant."""
    world = served.world
    ws = world.consumer("consumer-a")
    grant = export_grant(slice_cluster=ws.cluster, export_name=world.export_name)
    await apply_retrying(served.kcp, world.provider.url, grant, within=10)
    name = unique("dev")
    try:
        await served.create_slice(
            ws,
            name,
            selector={"matchExpressions": [{"key": "env", "operator": "In", "values": ["dev"]}]},
        )
        status = await wait_ready(served, ws, name, within=10)
        assert "granted to this workspace" in condition(status, "APIExportValid")["message"]
        url = status["endpoints"][0]["url"]
        assert f"/{ws.cluster}/{name}" in url
        out = await served.kcp.kubectl(
            "get", "widgets", "-A", "-o", "json", server=f"{url}/clusters/*"
        )
        assert {i["metadata"]["labels"]["env"] for i in json.loads(out.stdout)["items"]} == {"dev"}
    finally:
        binding = export_grant_binding(slice_cluster=ws.cluster, export_name=world.export_name)
        await served.kubectl(
            world.provider, "delete", "clusterrolebinding", binding, "--ignore-not-found"
        )


async def test_missing_export_is_reported_then_ready_once_it_exists(served: Served) -> None:
    world = served.world
    export = f"{unique('gadgets')}.example.io"
    name = unique("gadgets")
    await served.create_slice(
        world.provider, name, selector={"matchLabels": {"a": "b"}}, export_name=export
    )

    async def reported() -> dict[str, Any] | None:
        status = await served.slice_status(world.provider, name)
        valid = condition(status, "APIExportValid")
        return status if valid.get("status") == "False" else None

    status = await eventually(reported, within=10, what="APIExportValid=False")
    valid = condition(status, "APIExportValid")
    assert valid["reason"] == "APIExportNotFound"
    assert export in valid["message"]
    assert condition(status, "Ready")["status"] == "False"
    assert status.get("endpoints") == []
    # the URL of a slice that exists but is not ready answers 503 with the reason
    url = (
        f"{served.base}/services/filtered-apiexport/{world.provider.cluster}/{name}/clusters/*/api"
    )
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 503
        assert export in (await r.json())["message"]
    # create the export and bind it somewhere: the slice becomes Ready (the controller follows
    # the export's watches; tests/integration/test_controller_follows_exports.py isolates that)
    await _create_and_bind_export(served, export)
    await wait_ready(served, world.provider, name, within=10)


async def _create_and_bind_export(served: Served, export: str) -> None:
    """The export (reusing the Widget schema), bound in a new workspace so it gets a URL."""
    world = served.world
    doc = widget_export(export)
    await served.kubectl(world.provider, "apply", "-f", "-", input=json.dumps(doc))
    consumer = await create_workspace(served.kcp, unique("gadget-user"))
    binding = export_binding(provider_path=world.provider.path, export=export)
    await served.kubectl(consumer, "apply", "-f", "-", input=json.dumps(binding))


async def test_invalid_selector_is_reported(served: Served) -> None:
    world = served.world
    name = unique("bad")
    await served.create_slice(world.provider, name, selector={"matchLabels": {"not a key!": "x"}})

    async def reported() -> dict[str, Any] | None:
        status = await served.slice_status(world.provider, name)
        return status if status.get("conditions") else None

    status = await eventually(reported, within=10, what="conditions written")
    valid = condition(status, "SelectorValid")
    assert valid["status"] == "False"
    assert valid["reason"] == "InvalidSelector"
    assert "spec.objectSelector.matchLabels" in valid["message"]
    assert condition(status, "Ready")["status"] == "False"


async def test_deleting_a_slice_stops_serving_and_ends_watches(served: Served) -> None:
    world = served.world
    name = unique("gone")
    await served.create_slice(world.provider, name, selector={"matchLabels": {"env": "prod"}})
    status = await wait_ready(served, world.provider, name, within=10)
    url = status["endpoints"][0]["url"] + f"/clusters/*/{world.api_path}/{world.resource}"
    async with aiohttp.ClientSession() as s:
        async with s.get(url, params={"limit": "1"}) as r:
            rv = (await r.json())["metadata"]["resourceVersion"]
        async with s.get(url, params={"watch": "1", "resourceVersion": rv}) as watch:
            assert watch.status == 200
            await served.kubectl(world.provider, "delete", "filteredapiexportendpointslice", name)
            # the open watch ends (EOF) within a few seconds
            async with asyncio.timeout(10):
                while await watch.content.readline():
                    pass

        async def gone() -> bool:
            async with s.get(url) as r:
                return r.status == 404

        await eventually(gone, within=5, what="slice URL answers 404")


async def test_lease_in_a_kcp_workspace(served: Served) -> None:
    """Two replicas: exactly one holds the Lease (issue #4 §5), in the API's workspace."""
    auth = await load_kubeconfig(served.kcp.kubeconfig, context=served.kcp.admin_context)
    async with KubeClient(auth=auth) as client:
        name = unique("lease")
        a, b = (
            LeaderElector(
                client=client, base=f"{client.origin}/clusters/{served.api_ws.path}",
                namespace="default", name=name, identity=identity, clock=SystemClock(),
            )
            for identity in ("replica-a", "replica-b")
        )  # fmt: skip
        await asyncio.wait_for(a.acquire(), 20)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(b.acquire(), 3)  # held by a: b must not get it
        assert a.is_leader
        assert not b.is_leader
        out = await served.kcp.kubectl(
            "get", "lease", name, "-n", "default", "-o", "jsonpath={.spec.holderIdentity}",
            server=served.api_ws.url,
        )  # fmt: skip
        assert out.stdout == "replica-a"
        await a.release()
        await asyncio.wait_for(b.acquire(), 10)  # released: b takes over at once
        assert b.is_leader
