"""Cross-tenant slices (confused deputy), against real kcp: a FilteredAPIExportEndpointSlice
outside the export's workspace serves the export only while the export's owner grants the
slice's workspace (:mod:`vwserver.controller.consent`).

The attack: bob has no right on the provider's export (kcp's APIExport virtual workspace answers
him 403). In a workspace of his own he binds vwserver's API, gives himself the content of a
slice there, and creates the slice naming the provider's export — even claiming the provider's
logical cluster in its ``kcp.io/cluster`` annotation. vwserver reads exports with its own
identity, so without the consent check it would serve him the provider's objects.

Setup (once per module, on the session's kcp and demo world): a fresh workspace for bob, bound to
vwserver's API; an in-process vwserver (:mod:`tests.e2e.controller_env`) that authenticates and
authorizes callers with kcp (the Guard) and re-checks ready slices every ``RESYNC`` seconds.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest_asyncio

from devenv.bootstrap import Bootstrap, Workspace, apply_retrying
from devenv.kcp import KcpInstance
from devenv.slices import (
    export_grant,
    export_grant_binding,
    slice_grant,
    slice_manifest,
    wait_slice_ready,
)
from tests.e2e.controller_env import (
    Served,
    condition,
    create_workspace,
    eventually,
    serving,
    unique,
)
from vwserver.auth.access import AccessReviewer
from vwserver.auth.guard import Guard
from vwserver.auth.tokens import TokenReviewer
from vwserver.k8s.client import KubeClient

RESYNC = 2.0
TIMEOUT = 20.0
SLICE = "borrowed-prod"
WIDGETS = "/apis/example.io/v1alpha1/widgets"


@dataclass
class Attack:
    served: Served
    ws: Workspace
    """bob's workspace, where the slice lives."""

    @property
    def world(self) -> Bootstrap:
        return self.served.world

    def url(self, cluster: str = "*", path: str = WIDGETS) -> str:
        return (
            f"{self.served.base}/services/filtered-apiexport/{self.ws.cluster}/{SLICE}"
            f"/clusters/{cluster}{path}"
        )

    @property
    def bob(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.world.tokens['bob']}"}

    async def status(self) -> dict[str, Any]:
        return await self.served.slice_status(self.ws, SLICE)


def _guard(client: KubeClient) -> Guard:
    return Guard(tokens=TokenReviewer(client=client), access=AccessReviewer(client=client))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def attack(kcp: KcpInstance, world: Bootstrap) -> AsyncIterator[Attack]:
    ws = await create_workspace(kcp, unique("bob"))
    async with serving(kcp, world, bind_in=(ws,), resync=RESYNC, guard=_guard) as served:
        yield Attack(served, ws)


async def _not_permitted(attack: Attack) -> dict[str, Any]:
    async def refused() -> dict[str, Any] | None:
        status = await attack.status()
        valid = condition(status, "APIExportValid")
        return status if valid.get("reason") == "NotPermitted" else None

    return await eventually(refused, within=TIMEOUT, what="APIExportValid NotPermitted")


async def _answer(session: aiohttp.ClientSession, url: str, code: int) -> Any:
    """The body of a GET, once vwserver answers it with ``code`` (bob's fresh RBAC reaches kcp's
    authorizer after a moment, and the Guard caches a denial for seconds)."""

    async def probe() -> Any:
        async with session.get(url) as r:
            return [json.loads(await r.read())] if r.status == code else None

    return (await eventually(probe, within=TIMEOUT, what=f"{code} from {url}"))[0]


async def test_a_slice_elsewhere_serves_the_export_only_while_its_owner_grants_it(
    attack: Attack, observe: Callable[[str], None]
) -> None:
    world, kcp, ws = attack.world, attack.served.kcp, attack.ws
    provider = world.provider
    direct = f"{world.vw_url}/clusters/*{WIDGETS}"
    async with kcp.http_session(token=world.tokens["bob"]) as s, s.get(direct) as r:
        assert r.status == 403  # bob may not read the export from kcp

    # bob's workspace: the slice's content for bob, and the slice naming the provider's export,
    # with the provider's logical cluster claimed in its annotation (kcp overwrites it).
    await apply_retrying(kcp, ws.url, slice_grant(SLICE, "bob"), within=TIMEOUT)
    manifest = json.loads(
        slice_manifest(
            SLICE,
            export_path=provider.path,
            export_name=world.export_name,
            selector={"matchLabels": {"env": "prod"}},
        )
    )
    manifest["metadata"]["annotations"] = {"kcp.io/cluster": provider.cluster}
    await attack.served.kubectl(ws, "apply", "-f", "-", input=json.dumps(manifest))
    stored = await attack.served.kubectl(
        ws, "get", "filteredapiexportendpointslice", SLICE, "-o", "json"
    )
    assert stored["metadata"]["annotations"]["kcp.io/cluster"] == ws.cluster

    # Refused: NotPermitted, no endpoint, and vwserver answers 503 — never an object.
    status = await _not_permitted(attack)
    valid, ready = condition(status, "APIExportValid"), condition(status, "Ready")
    assert (valid["status"], ready["status"], ready["reason"]) == ("False", "False", "NotPermitted")
    subject = f"system:vwserver:workspace:{ws.cluster}"
    for part in (provider.path, ws.cluster, world.export_name, subject):
        assert part in valid["message"], part
    assert status["endpoints"] == []
    victim = next(w for w in world.widgets if w.labels["env"] == "prod")
    obj = f"/apis/example.io/v1alpha1/namespaces/{victim.namespace}/widgets/{victim.name}"
    async with aiohttp.ClientSession(headers=attack.bob) as session:
        body = await _answer(session, attack.url(), 503)
        assert "items" not in body
        assert subject in body["message"]  # the missing grant
        patch = {"metadata": {"labels": {"stolen": "yes"}}}
        headers = {"Content-Type": "application/merge-patch+json"}
        async with session.patch(attack.url(victim.cluster, obj), json=patch, headers=headers) as r:
            assert r.status == 503
        consumer = next(c for c in world.consumers if c.cluster == victim.cluster)
        stored = await attack.served.kubectl(
            consumer, "get", "widget", victim.name, "-n", victim.namespace, "-o", "json"
        )
        assert "stolen" not in stored["metadata"].get("labels", {})

        # The provider grants bob's workspace (manifests/rbac/export-grants-slice-workspace.yaml).
        grant = export_grant(slice_cluster=ws.cluster, export_name=world.export_name)
        binding = export_grant_binding(slice_cluster=ws.cluster, export_name=world.export_name)
        await apply_retrying(kcp, provider.url, grant, within=TIMEOUT)
        try:
            status = await wait_slice_ready(kcp, ws, SLICE, within=TIMEOUT)
            assert status["endpoints"][0]["url"].endswith(f"/{ws.cluster}/{SLICE}")
            listed = await _answer(session, attack.url(), 200)
            assert listed["items"]
            assert {i["metadata"]["labels"]["env"] for i in listed["items"]} == {"prod"}

            # Revoked while a watch is open: the watch ends and the slice is refused again
            # within a resync.
            rv = listed["metadata"]["resourceVersion"]
            params = {"watch": "true", "resourceVersion": rv}
            async with session.get(attack.url(), params=params) as watch:
                assert watch.status == 200
                loop = asyncio.get_running_loop()
                revoked = loop.time()
                await kcp.kubectl("delete", "clusterrolebinding", binding, server=provider.url)
                async with asyncio.timeout(RESYNC + 8):
                    while await watch.content.readline():
                        pass
                observe(f"watch ended {loop.time() - revoked:.1f}s after the grant was revoked")
        finally:
            await kcp.kubectl(
                "delete", "clusterrolebinding", binding, "--ignore-not-found", server=provider.url
            )
        await _not_permitted(attack)
        await _answer(session, attack.url(), 503)
