"""Upstream requests per write through a slice, against real kcp (issue 23): one write where the
shared cache has the checked object (update, status update and patches, merge and JSON patch,
delete, an apply whose result needs no dry run), one GET more where it does not. A cache behind kcp costs a
GET and a write more and the client never sees the conflict; a cache behind a move out of the
slice writes nothing and answers as for a missing object.

The proxy's count is vwserver's own ``vwserver_upstream_requests_total``; the table is
:data:`tests.support.write_cost.WRITES` (also run against the fake: test_write_cost.py).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from devenv.bootstrap import Bootstrap
from devenv.kcp import KcpInstance
from tests.security.test_write_options_kcp import Kit, unique
from tests.support.slices import slices_over_kcp
from tests.support.write_cost import (
    APPLY,
    APPLY_FINALIZER,
    JSON,
    JSON_PATCH,
    MERGE,
    WRITES,
    Write,
    apply_config,
    behind,
    cost,
    stream_paused,
    until_cached,
    upstream_requests,
    widgets_cache,
)
from vwserver.cache.registry import CacheRegistry
from vwserver.clock import SystemClock
from vwserver.holds import HOLDS_ANNOTATION
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import load_kubeconfig
from vwserver.proxy.patches import apply_json_patch, apply_merge_patch
from vwserver.selector import Selector

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

UNCACHED = "prod-direct"  # the same selector, reads (and write checks) always from kcp


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def cost_kit(kcp: KcpInstance, world: Bootstrap) -> AsyncIterator[tuple[Kit, CacheRegistry]]:
    ws = world.consumer("consumer-a")
    namespace = unique("cost")
    slices = {"prod": Selector.parse("env=prod"), UNCACHED: Selector.parse("env=prod")}
    auth = await load_kubeconfig(kcp.kubeconfig, context=kcp.admin_context)
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(KubeClient(auth=auth))
        registry = CacheRegistry(client=client, clock=SystemClock())
        stack.push_async_callback(registry.aclose)
        base = await stack.enter_async_context(
            slices_over_kcp(
                kcp, world, slices=slices, page_size=50, cache=registry, uncached=(UNCACHED,)
            )
        )
        admin = await stack.enter_async_context(
            aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=kcp.ssl_context()),
                headers={"Authorization": f"Bearer {kcp.admin_token}"},
                timeout=aiohttp.ClientTimeout(total=30),
            )
        )
        session = await stack.enter_async_context(
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        )
        await kcp.kubectl("create", "namespace", namespace, server=ws.url)
        kit = Kit(kcp, ws, namespace, admin, session, base, world)
        try:
            # A LIST through the cached slice starts the widgets' shared cache (as a
            # controller's watch would).
            async with session.get(kit.through()) as resp:
                assert resp.status == 200, await resp.text()
            assert widgets_cache(registry).synced
            yield kit, registry
        finally:
            with contextlib.suppress(Exception):
                await kcp.kubectl("delete", "namespace", namespace, "--wait=false", server=ws.url)


def _key(kit: Kit, name: str) -> tuple[str, str, str]:
    return (kit.ws.cluster, kit.namespace, name)


async def _created(kit: Kit, registry: CacheRegistry, name: str) -> dict[str, Any]:
    obj = await kit.create(name)
    rv = int(obj["metadata"]["resourceVersion"])
    await until_cached(registry, _key(kit, name), newer_than=rv - 1)
    return obj


@pytest.mark.parametrize("write", WRITES, ids=[w.name for w in WRITES])
async def test_a_write_costs_kcp_one_request_when_cached(
    cost_kit: tuple[Kit, CacheRegistry], write: Write
) -> None:
    kit, registry = cost_kit
    for slice_name, expected in (("prod", write.cached), (UNCACHED, write.uncached)):
        name = unique("w")
        obj = await _created(kit, registry, name)
        url = f"{kit.through(slice_name)}/{name}"
        spent, status, doc = await cost(kit.client, kit.base, url, write, obj)
        assert status in write.ok, (slice_name, doc)
        assert spent == expected, slice_name
        if write.content_type in (MERGE, JSON_PATCH) and not write.path:
            # kcp stored what the proxy computed and checked: no admission changed the
            # membership fields of these widgets.
            body = write.body(obj)
            local = (apply_merge_patch if write.content_type == MERGE else apply_json_patch)(
                obj, body
            )
            for key in ("labels", "annotations", "finalizers"):
                assert doc["metadata"].get(key) == local["metadata"].get(key), key
        if write.method == "DELETE":
            assert await kit.stored(name) is None or (await kit.stored(name) or {}).get(
                "metadata", {}
            ).get("deletionTimestamp")
        await kit.forget(name)


async def test_create_costs_kcp_one_request(cost_kit: tuple[Kit, CacheRegistry]) -> None:
    kit, _ = cost_kit
    for slice_name in ("prod", UNCACHED):
        name = unique("c")
        body = {"apiVersion": "example.io/v1alpha1", "kind": "Widget", "metadata": {"name": name}}
        create = Write("create", "POST", JSON, lambda _, body=body: body, 1, 1, ok=(201,))
        spent, status, doc = await cost(kit.client, kit.base, kit.through(slice_name), create, {})
        assert status == 201, doc
        assert spent == 1
        await kit.forget(name)


@pytest.mark.parametrize(
    "write", [w for w in WRITES if w.method != "DELETE"], ids=lambda w: str(w.name)
)
async def test_a_cache_behind_kcp_costs_a_fresh_read_never_a_conflict(
    cost_kit: tuple[Kit, CacheRegistry], write: Write
) -> None:
    kit, registry = cost_kit
    name = unique("behind")
    obj = await _created(kit, registry, name)
    older = widgets_cache(registry).store.get(_key(kit, name))
    assert older is not None
    async with kit.admin.patch(
        f"{kit.direct}/{name}",
        data=json.dumps({"spec": {"size": 5}}),
        headers={"Content-Type": MERGE},
    ) as resp:
        assert resp.status == 200, await resp.text()
    await until_cached(registry, _key(kit, name), newer_than=older.meta.resource_version)
    behind(registry, older)
    blind = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    url = f"{kit.through()}/{name}"
    spent, status, doc = await cost(kit.client, kit.base, url, write, {**obj, "metadata": blind})
    assert status == 200, doc
    # The write under the cache's resourceVersion (409; a JSON patch's failed test: 422; a
    # status apply's or an apply's 409, then a GET to tell it from a field conflict), the GET,
    # the write.
    assert spent == 3
    await kit.forget(name)


async def test_a_cache_behind_a_move_out_writes_nothing_and_answers_as_missing(
    cost_kit: tuple[Kit, CacheRegistry],
) -> None:
    kit, registry = cost_kit
    name = unique("left")
    obj = await _created(kit, registry, name)
    older = widgets_cache(registry).store.get(_key(kit, name))
    assert older is not None
    patch = {"metadata": {"labels": {"env": "dev"}}}
    async with kit.admin.patch(
        f"{kit.direct}/{name}", data=json.dumps(patch), headers={"Content-Type": MERGE}
    ) as resp:
        assert resp.status == 200, await resp.text()
        moved = await resp.json()
    await until_cached(registry, _key(kit, name), newer_than=older.meta.resource_version)
    for write in WRITES:
        behind(registry, older)
        url = f"{kit.through()}/{name}"
        _, status, doc = await cost(kit.client, kit.base, url, write, obj)
        assert status == 404, (write.name, doc)
        assert doc["reason"] == "NotFound"
        assert name in doc["message"]
    after = await kit.stored(name)
    assert (
        after is not None
        and after["metadata"]["resourceVersion"] == moved["metadata"]["resourceVersion"]
    )
    await kit.forget(name)


async def test_a_controller_s_back_to_back_writes_cost_one_request_each(
    cost_kit: tuple[Kit, CacheRegistry],
) -> None:
    """A controller writes the same object again as soon as kcp answered (a spec patch, then
    its status): the cache's stream may not have delivered the first write yet, and a check
    against that older version would cost a 409, a GET and a second write. The proxy checks
    against the version kcp answered its own write with (SharedResource.wrote): one upstream
    request per write, every time."""
    kit, registry = cost_kit
    name = unique("b2b")
    await _created(kit, registry, name)
    url = f"{kit.through()}/{name}"
    rounds = 15
    before = await upstream_requests(kit.client, kit.base)
    # The stream delivers none of these writes until the end: the worst case of its lag.
    with stream_paused(registry):
        for i in range(rounds):
            for path, body in (
                ("", {"spec": {"size": i}}),
                ("/status", {"status": {"phase": f"p{i}"}}),
            ):
                async with kit.client.patch(
                    url + path, data=json.dumps(body), headers={"Content-Type": MERGE}
                ) as resp:
                    assert resp.status == 200, await resp.text()
    spent = await upstream_requests(kit.client, kit.base) - before
    assert spent == 2 * rounds
    await kit.forget(name)


async def test_back_to_back_applies_cost_one_request_each(
    cost_kit: tuple[Kit, CacheRegistry],
) -> None:
    """An applier applies again as soon as kcp answered, with the cache's stream held back:
    each apply (its result in the slice whatever field ownership decides: no dry run) is
    checked against kcp's answer to the last one — one upstream request per apply, and kcp
    stores the last configuration."""
    kit, registry = cost_kit
    name = unique("b2b-apply")
    # force=true, as controllers apply (and the bench): through a slice kcp records an apply's
    # spec fields under the manager's Update operation, so a second apply changing them
    # conflicts with the manager itself — with or without the dry run (seen on kcp v0.32).
    stored = await _created(kit, registry, name)
    url = f"{kit.through()}/{name}"
    rounds = 10
    before = await upstream_requests(kit.client, kit.base)
    with stream_paused(registry):
        for i in range(rounds):
            async with kit.client.patch(
                url,
                data=apply_config(stored, color=f"c{i}"),
                params={"fieldManager": "cost", "force": "true"},
                headers={"Content-Type": APPLY},
            ) as resp:
                assert resp.status == 200, await resp.text()
    spent = await upstream_requests(kit.client, kit.base) - before
    assert spent == rounds
    after = await kit.stored(name)
    assert after is not None
    assert after["spec"]["color"] == f"c{rounds - 1}"
    await kit.forget(name)


async def test_an_apply_whose_holds_change_keeps_its_dry_run_on_kcp(
    cost_kit: tuple[Kit, CacheRegistry],
) -> None:
    """An apply that adds a finalizer: the hold the proxy records needs kcp's result — a dry
    run, then the write with the holds annotation (two requests when cached)."""
    kit, registry = cost_kit
    name = unique("apply-fin")
    stored = await _created(kit, registry, name)
    spent, status, doc = await cost(
        kit.client, kit.base, f"{kit.through()}/{name}", APPLY_FINALIZER, stored
    )
    assert status == 200, doc
    assert spent == APPLY_FINALIZER.cached
    after = await kit.stored(name)
    assert after is not None
    assert after["metadata"]["finalizers"] == ["example.io/cost"]
    assert "example.io/cost" in after["metadata"]["annotations"][HOLDS_ANNOTATION]
    await kit.forget(name)
