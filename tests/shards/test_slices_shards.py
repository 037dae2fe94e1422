"""vwserver's slices on a sharded kcp (issue #24): endpoints per shard, reads and writes through
each shard's endpoint, and per-shard resourceVersions.

Setup (once per module, on the session's sharded kcp): vwserver's API in ``root:vwserver-api``
(root shard), bound in ``root:slices`` (second shard) and ``root:provider`` (root shard) so that
vwserver's own export has two endpoint URLs; an in-process vwserver (proxy + controller, shared
watch cache on, unauthenticated) reading kcp through the front-proxy as kcp-admin. The export's
workspace grants ``root:slices`` (``manifests/rbac/export-grants-slice-workspace.yaml``).
"""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest_asyncio

from devenv.bootstrap import SAMPLE_NAMESPACES, Workspace, apply_retrying, get_json, poll
from devenv.shards import ROOT_SHARD, SECOND_SHARD, SHARD_NAMES, on_shard
from devenv.slices import export_grant, wait_slice_ready
from tests.e2e.controller_env import Served, eventually, serving, unique
from tests.shards.conftest import ShardedWorld
from tests.support.widgets import export_binding as widget_export_binding
from tests.support.widgets import widget_export
from vwserver.auth.guard import Guard
from vwserver.controller.scope import ShardScope
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kcp import endpoint_urls, shard_id, slice_endpoint_urls

Observe = Callable[[str], None]
PROD = {"matchLabels": {"env": "prod"}}


@contextlib.asynccontextmanager
async def serving_slices(
    w: ShardedWorld,
    *,
    watch_health: bool = False,
    guard: Callable[[KubeClient], Guard] | None = None,
    scope: ShardScope | None = None,
    external_url: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[Served]:
    """vwserver in kcp mode over the sharded kcp (through the front-proxy), its API workspace
    on the root shard, the slice workspace granted the export: the shard suites' server
    (``guard``: authenticating and authorizing callers with it; default: nobody is asked;
    ``scope``, ``external_url``: a shard-scoped replica, see :func:`serving`;
    ``ssl_context``: served over HTTPS with it)."""
    front = w.bed.front
    grant = export_grant(slice_cluster=w.slices.cluster, export_name=w.world.export_name)
    await apply_retrying(front, w.world.provider.url, grant, within=60)
    async with serving(
        front,
        w.world,
        bind_in=(w.slices, w.world.provider),
        resync=3.0,
        api_location=on_shard(ROOT_SHARD),
        cache=True,
        watch_health=watch_health,
        guard=guard,
        scope=scope,
        external_url=external_url,
        ssl_context=ssl_context,
    ) as served:
        yield served


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(sharded_world: ShardedWorld) -> AsyncIterator[Served]:
    async with serving_slices(sharded_world) as served:
        yield served


@pytest_asyncio.fixture(loop_scope="session")
async def session(sharded_world: ShardedWorld) -> AsyncIterator[aiohttp.ClientSession]:
    async with sharded_world.bed.front.http_session(timeout=30) as s:
        yield s


async def call(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    async with session.request(method, url, data=data, headers=headers) as resp:
        text = await resp.text()
        return resp.status, (json.loads(text) if text.startswith("{") else text)


def widgets(w: ShardedWorld, base: str, cluster: str, namespace: str | None = None) -> str:
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}/clusters/{cluster}/{w.world.api_path}{ns}/{w.world.resource}"


def keys(body: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (
            i["metadata"]["annotations"]["kcp.io/cluster"],
            i["metadata"]["namespace"],
            i["metadata"]["name"],
        )
        for i in body["items"]
    }


async def kcp_vw_urls(w: ShardedWorld, export: str) -> list[str]:
    """The VW URLs kcp's APIExportEndpointSlice of ``export`` (in the provider) lists now."""
    doc = await get_json(w.bed.front, w.world.provider.url, "apiexportendpointslice", export)
    return endpoint_urls(doc)


async def endpoints_by_shard(
    w: ShardedWorld,
    served: Served,
    name: str,
    *,
    count: int,
    within: float = 60,
    export: str | None = None,
    ws: Workspace | None = None,
) -> dict[str, str]:
    """The slice's endpoint URLs once it lists ``count`` of them, by the shard each serves
    (``default``: the one URL without a shard segment); ``export``: the slice's, if not the
    demo's; ``ws``: the slice's workspace, if not ``root:slices``."""

    async def listed() -> list[str] | None:
        status = await served.slice_status(ws or w.slices, name)
        urls = [e["url"] for e in status.get("endpoints") or []]
        return urls if len(urls) == count else None

    urls = await eventually(listed, within=within, what=f"slice {name}: {count} endpoint(s)")
    vw_urls = await kcp_vw_urls(w, export or w.world.export_name)
    by_id = {shard_id(u): w.bed.shard_of_url(u) for u in vw_urls}
    out = {}
    for url in urls:
        _, found, sid = url.partition("/shards/")
        out[by_id[sid] if found else "default"] = url
    return out


async def another_export(w: ShardedWorld, prefix: str, *, granted: bool = True) -> str:
    """A new export of the demo's Widget schema in the provider's workspace (root shard),
    ``granted`` to the slice workspace (``root:slices``) or not; its name."""
    front = w.bed.front
    export = unique(prefix) + ".example.io"
    doc = widget_export(export)
    await apply_retrying(front, w.world.provider.url, json.dumps(doc), within=60)
    if granted:
        grant = export_grant(slice_cluster=w.slices.cluster, export_name=export)
        await apply_retrying(front, w.world.provider.url, grant, within=60)
    return export


def export_binding(w: ShardedWorld, export: str) -> dict[str, Any]:
    """An APIBinding to ``export`` of the provider's workspace."""
    return widget_export_binding(provider_path=w.world.provider.path, export=export)


async def prod_endpoints(w: ShardedWorld, served: Served) -> dict[str, str]:
    """A new slice (in ``root:slices``) of the demo's env=prod widgets: its endpoint URL per
    shard."""
    name = unique("prod")
    await served.create_slice(w.slices, name, selector=PROD)
    return await endpoints_by_shard(w, served, name, count=2)


async def suite_slice(
    w: ShardedWorld, served: Served, prefix: str
) -> tuple[str, dict[str, str], dict[str, str]]:
    """A ready slice in ``root:slices`` selecting ``env=prod`` and a label of its own
    (``suite=<name>``), so that only the test's own objects are in it: its name, its labels and
    its two endpoint URLs by shard."""
    name = unique(prefix)
    labels = {"env": "prod", "suite": name}
    await served.create_slice(w.slices, name, selector={"matchLabels": labels})
    await wait_slice_ready(w.bed.front, w.slices, name, within=60)
    return name, labels, await endpoints_by_shard(w, served, name, count=2)


async def test_a_slice_lists_one_endpoint_per_shard_and_each_serves_that_shard(
    sharded_world: ShardedWorld, served: Served, session: aiohttp.ClientSession
) -> None:
    """Issue #24 points 1 and 2: the slice (second shard) over the export (root shard) has one
    ``/shards/<id>`` endpoint per shard with a binding; a LIST through each shows exactly that
    shard's matching objects — the same as kcp's own VW of that shard with the selector."""
    w = sharded_world
    name = unique("prod")
    await served.create_slice(w.slices, name, selector=PROD)
    await wait_slice_ready(w.bed.front, w.slices, name, within=60)
    endpoints = await endpoints_by_shard(w, served, name, count=2)
    assert set(endpoints) == set(SHARD_NAMES)
    for shard, url in endpoints.items():
        code, ours = await call(session, "GET", widgets(w, url, "*"))
        assert code == 200, ours
        code, theirs = await call(
            session, "GET", widgets(w, w.vw_url(shard), "*") + "?labelSelector=env%3Dprod"
        )
        assert code == 200
        mine = w.consumer_on(shard)
        assert keys(ours) == keys(theirs)
        seen = {k[0] for k in keys(ours)}
        # Other modules of the session add workspaces on each shard (bound to this export, or
        # to another export of the same schema, which kcp v0.32.3's VW on clusters/* shows too):
        # the shard's own consumer is there, the other shard's never.
        assert mine.cluster in seen and not seen & w.clusters_not_on(shard), seen
        assert {i["metadata"]["labels"]["env"] for i in ours["items"]} == {"prod"}
        # One object, through the shard's endpoint, in the consumer that lives there.
        code, obj = await call(
            session, "GET", widgets(w, url, mine.cluster, SAMPLE_NAMESPACES[0]) + "/prod-eu"
        )
        assert (code, obj["metadata"]["labels"]["env"]) == (200, "prod")


async def test_a_cluster_on_the_other_shard_never_gets_the_other_shards_objects(
    sharded_world: ShardedWorld,
    served: Served,
    session: aiohttp.ClientSession,
    observe: Observe,
) -> None:
    """Issue #24 point 2: through one shard's endpoint, a consumer cluster that lives on the
    other shard. kcp's VW of that shard refuses it (403 Forbidden: no APIBinding there,
    tests/shards/test_testbed_shards.py). vwserver gives that same 403 to a GET and to a LIST
    (the cache, holding no object of that cluster, leaves it to kcp; every verb:
    tests/shards/test_foreign_shards.py). Never the other shard's objects."""
    w = sharded_world
    name = unique("prod")
    await served.create_slice(w.slices, name, selector=PROD)
    endpoints = await endpoints_by_shard(w, served, name, count=2)
    for shard, url in endpoints.items():
        (elsewhere,) = (c for c in w.world.consumers if c is not w.consumer_on(shard))
        one = widgets(w, "{}", elsewhere.cluster, SAMPLE_NAMESPACES[0]) + "/prod-eu"
        code, ours = await call(session, "GET", one.format(url))
        kcp_code, _ = await call(session, "GET", one.format(w.vw_url(shard)))
        assert (kcp_code, code, ours["kind"], ours["reason"]) == (403, 403, "Status", "Forbidden")
        for listing in (widgets(w, url, elsewhere.cluster), widgets(w, url, "*")):
            code, ours = await call(session, "GET", listing)
            observe(f"{shard}: LIST {listing.split('/clusters/')[-1]} via vwserver: {code}")
            if listing == widgets(w, url, elsewhere.cluster):
                assert code == 403, ours
                continue
            assert code == 200, ours
            clusters = {i["metadata"]["annotations"]["kcp.io/cluster"] for i in ours["items"]}
            assert elsewhere.cluster not in clusters


async def test_writes_through_each_shards_endpoint_land_on_that_shard(
    sharded_world: ShardedWorld, served: Served, session: aiohttp.ClientSession
) -> None:
    """Issue #24 point 2: create, patch and delete through each endpoint, in the consumer on
    that shard; kcp (through the front-proxy) sees each write."""
    w = sharded_world
    endpoints = await prod_endpoints(w, served)
    ns = SAMPLE_NAMESPACES[0]
    for shard, url in endpoints.items():
        mine = w.consumer_on(shard)
        obj_name = unique("written")
        doc = {
            "apiVersion": f"{w.world.group}/{w.world.version}",
            "kind": "Widget",
            "metadata": {"name": obj_name, "labels": {"env": "prod"}},
            "spec": {"size": 1, "color": shard},
        }
        code, created = await call(session, "POST", widgets(w, url, mine.cluster, ns), doc)
        assert code == 201, created
        got = await w.bed.front.kubectl(
            "get", "widget", obj_name, "-n", ns, "-o", "json", server=mine.url
        )
        assert json.loads(got.stdout)["spec"]["color"] == shard
        code, gone = await call(
            session, "DELETE", widgets(w, url, mine.cluster, ns) + f"/{obj_name}"
        )
        assert code == 200, gone


async def test_a_slice_in_a_root_shard_workspace_gets_its_status_too(
    sharded_world: ShardedWorld, served: Served
) -> None:
    """vwserver's own export has an endpoint per shard (``root:slices`` on the second shard,
    ``root:provider`` on the root shard bind it); a slice's status is written through the VW of
    the shard that holds the slice's workspace."""
    w = sharded_world
    name = unique("dev")
    await served.create_slice(w.world.provider, name, selector={"matchLabels": {"env": "dev"}})
    status = await wait_slice_ready(w.bed.front, w.world.provider, name, within=60)
    assert len(status["endpoints"]) == 2
    await poll(
        "both of vwserver's own endpoint URLs followed",
        lambda: _two(served),
        within=30,
    )


async def _two(served: Served) -> bool | None:
    return True if len(served.controller._vw_urls) == 2 else None


async def test_shards_endpoints_follow_the_bindings(
    sharded_world: ShardedWorld, served: Served, session: aiohttp.ClientSession
) -> None:
    """Issue #24 point 1: a second export, bound first on the root shard only: the slice has
    one endpoint; a binding on the second shard adds one; deleting it removes it again (as
    kcp's own endpoint slice does), and the root shard's ``/shards/<id>`` URL keeps serving."""
    w = sharded_world
    front = w.bed.front
    export = await another_export(w, "late")
    binding = json.dumps(export_binding(w, export))
    spaces = {
        shard: await w.bed.create_workspace(unique(f"late-{shard}"), shard=shard)
        for shard in SHARD_NAMES
    }
    await apply_retrying(front, spaces[ROOT_SHARD].url, binding, within=60)
    name = unique("late")
    await served.create_slice(w.slices, name, selector=PROD, export_name=export)
    (plain,) = slice_endpoint_urls(
        external_url=served.base, cluster=w.slices.cluster, name=name, upstreams=["one"]
    )
    assert await endpoints_by_shard(w, served, name, count=1, export=export) == {"default": plain}
    assert [w.bed.shard_of_url(u) for u in await kcp_vw_urls(w, export)] == [ROOT_SHARD]

    await apply_retrying(front, spaces[SECOND_SHARD].url, binding, within=60)
    two = await endpoints_by_shard(w, served, name, count=2, within=90, export=export)
    assert set(two) == set(SHARD_NAMES)

    # kcp fact: the shard's URL leaves kcp's endpoint slice when its last binding goes.
    await front.kubectl("delete", "apibinding", export, server=spaces[SECOND_SHARD].url)
    again = await endpoints_by_shard(w, served, name, count=1, within=90, export=export)
    assert again == {"default": plain}
    assert [w.bed.shard_of_url(u) for u in await kcp_vw_urls(w, export)] == [ROOT_SHARD]
    code, body = await call(session, "GET", widgets(w, two[ROOT_SHARD], "*"))
    assert code == 200, body
