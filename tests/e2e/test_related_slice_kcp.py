"""Claimed resources through a slice against real kcp (issue #25, section 1).

A provider workspace exports ``databases.related.example.io`` and claims core ``secrets`` and
``configmaps``; a consumer binds it and accepts both claims. Slices ``eu`` and ``us`` (by
``region``) declare ``relatedResources``: Secrets referenced by ``spec.users[*].
passwordSecretRef.name`` of a visible Database, ConfigMaps referenced by
``spec.configRef.name``. Through the slices, with vwserver's shared cache (the reference index
reads the Databases from it):

* LIST/GET of secrets shows exactly the referenced ones; the other region's Secret and an
  unreferenced one answer like a missing one;
* a WATCH of secrets gets ADDED when a visible Database starts referencing a Secret and
  DELETED when it stops, and when the Database leaves the slice;
* a Secret of a ``region=us`` Database is never visible through the ``eu`` slice, in any event;
* writes: an update of a visible Secret passes, a create of an unreferenced one is a 422 naming
  the rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest_asyncio

from devenv.bootstrap import Bootstrap, Workspace, apply_retrying, get_field, get_json, poll
from devenv.kcp import KcpInstance
from devenv.slices import wait_slice_ready
from tests.conformance.harness import Answer, combined_query, fetch, matches
from tests.e2e.controller_env import Served, create_workspace, eventually, serving, unique
from vwserver.k8s.kubeconfig import load_kubeconfig
from vwserver.selector import Selector

GROUP = "related.example.io"
EXPORT = "databases.related.example.io"
NS = "apps"


def provider_docs() -> list[dict[str, Any]]:
    schema = {
        "apiVersion": "apis.kcp.io/v1alpha1",
        "kind": "APIResourceSchema",
        "metadata": {"name": f"v1.databases.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": "Database",
                "listKind": "DatabaseList",
                "plural": "databases",
                "singular": "database",
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    },
                }
            ],
        },
    }
    export = {
        "apiVersion": "apis.kcp.io/v1alpha2",
        "kind": "APIExport",
        "metadata": {"name": EXPORT},
        "spec": {
            "resources": [
                {
                    "group": GROUP,
                    "name": "databases",
                    "schema": f"v1.databases.{GROUP}",
                    "storage": {"crd": {}},
                }
            ],
            "permissionClaims": [
                {"group": "", "resource": "secrets", "verbs": ["*"]},
                {"group": "", "resource": "configmaps", "verbs": ["*"]},
            ],
        },
    }
    return [schema, export]


def binding(provider: Workspace) -> dict[str, Any]:
    accepted = [
        {
            "group": "",
            "resource": resource,
            "verbs": ["*"],
            "selector": {"matchAll": True},
            "state": "Accepted",
        }
        for resource in ("secrets", "configmaps")
    ]
    return {
        "apiVersion": "apis.kcp.io/v1alpha2",
        "kind": "APIBinding",
        "metadata": {"name": EXPORT},
        "spec": {
            "reference": {"export": {"path": provider.path, "name": EXPORT}},
            "permissionClaims": accepted,
        },
    }


RELATED = [
    {
        "resource": "secrets",
        "referencedBy": {
            "path": "spec.users[*].passwordSecretRef.name",
            "group": GROUP,
            "version": "v1",
            "resource": "databases",
        },
    },
    {
        "resource": "configmaps",
        "referencedBy": {
            "path": "spec.configRef.name",
            "group": GROUP,
            "version": "v1",
            "resource": "databases",
        },
    },
]


def database(name: str, *, region: str, secrets: list[str], config: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"users": [{"passwordSecretRef": {"name": s}} for s in secrets]}
    if config:
        spec["configRef"] = {"name": config}
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Database",
        "metadata": {"name": name, "namespace": NS, "labels": {"region": region}},
        "spec": spec,
    }


def secret(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "stringData": {"password": f"pw-of-{name}"},
    }


def configmap(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "data": {"k": "v"},
    }


GOLD = [{"resource": "configmaps", "selector": {"matchLabels": {"tier": "gold"}}}]
GOLD_SELECTOR = Selector.parse("tier=gold")


@dataclass
class World:
    served: Served
    provider: Workspace
    consumer: Workspace
    eu: str
    """The eu slice's URL up to ``/clusters/<consumer>``."""
    us: str
    gold: str
    """A slice whose rule for configmaps is a selector (``tier=gold``)."""
    vw: str
    """kcp's own virtual workspace of the export, up to ``/clusters/<consumer>``."""

    async def apply(self, *docs: dict[str, Any]) -> None:
        doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)})
        await self.served.kcp.kubectl("apply", "-f", "-", server=self.consumer.url, input=doc)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def rel(kcp: KcpInstance, world: Bootstrap) -> AsyncIterator[World]:
    provider = await create_workspace(kcp, unique("relprov"))
    consumer = await create_workspace(kcp, unique("relcons"))
    await apply_retrying(
        kcp,
        provider.url,
        json.dumps({"apiVersion": "v1", "kind": "List", "items": provider_docs()}),
        within=60,
    )
    await poll(
        "APIExport identity",
        lambda: get_field(kcp, provider.url, "apiexport", EXPORT, "status", "identityHash"),
        within=60,
    )
    await apply_retrying(kcp, consumer.url, json.dumps(binding(provider)), within=60)

    async def bound() -> bool | None:
        phase = await get_field(kcp, consumer.url, "apibinding", EXPORT, "status", "phase")
        return True if phase == "Bound" else None

    await poll("APIBinding Bound", bound, within=60)
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
    await apply_retrying(kcp, consumer.url, json.dumps(ns), within=60)
    async with serving(kcp, world, bind_in=(provider,), resync=5.0, cache=True) as served:
        urls = {}
        for region in ("eu", "us", "gold"):
            doc = {
                "apiVersion": "sync.edge-connect.eu/v1alpha1",
                "kind": "FilteredAPIExportEndpointSlice",
                "metadata": {"name": region},
                "spec": {
                    "export": {"path": provider.path, "name": EXPORT},
                    "objectSelector": {"matchLabels": {"region": region}},
                    "relatedResources": RELATED if region != "gold" else GOLD,
                },
            }
            await kcp.kubectl("apply", "-f", "-", server=provider.url, input=json.dumps(doc))
            status = await wait_slice_ready(kcp, provider, region, within=60)
            urls[region] = f"{status['endpoints'][0]['url']}/clusters/{consumer.cluster}"
        eps = await get_json(kcp, provider.url, "apiexportendpointslice", EXPORT)
        vw = f"{eps['status']['endpoints'][0]['url']}/clusters/{consumer.cluster}"
        w = World(served, provider, consumer, urls["eu"], urls["us"], urls["gold"], vw)
        await w.apply(
            secret("pw-eu"),
            secret("pw-us"),
            secret("pw-free"),
            configmap("cfg-eu"),
            configmap("cfg-gold-1", tier="gold"),
            configmap("cfg-gold-2", tier="gold"),
            configmap("cfg-silver", tier="silver"),
            database("db-eu", region="eu", secrets=["pw-eu"], config="cfg-eu"),
            database("db-us", region="us", secrets=["pw-us"]),
        )
        yield w


async def get(url: str, *, accept: str = "application/json") -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.get(url, headers={"Accept": accept}) as r:
        return r.status, await r.json(content_type=None)


async def names(url: str) -> set[str]:
    status, body = await get(url)
    assert status == 200, body
    return {i["metadata"]["name"] for i in body["items"]}


async def test_list_and_get_show_only_the_referenced_secrets(rel: World) -> None:
    secrets = f"{rel.eu}/api/v1/namespaces/{NS}/secrets"
    await eventually(
        lambda: _names_equal(secrets, {"pw-eu"}), within=30, what="the eu slice lists pw-eu only"
    )
    assert await names(f"{rel.us}/api/v1/namespaces/{NS}/secrets") == {"pw-us"}
    assert await names(f"{rel.eu}/api/v1/namespaces/{NS}/configmaps") == {"cfg-eu"}
    status, body = await get(f"{secrets}/pw-eu")
    assert status == 200 and body["data"]["password"]
    # the other region's Secret, an unreferenced one and a missing one: the same answer
    answers = []
    for name in ("pw-us", "pw-free", "no-such-secret"):
        status, body = await get(f"{secrets}/{name}")
        body["details"]["name"] = "X"
        body["message"] = body["message"].replace(name, "X")
        answers.append((status, body))
    assert answers[0] == answers[1] == answers[2]
    assert answers[0][0] == 404
    # every representation: a Table and PartialObjectMetadata list show pw-eu only
    table = "application/json;as=Table;v=v1;g=meta.k8s.io"
    status, body = await get(secrets, accept=table)
    assert status == 200
    assert [r["object"]["metadata"]["name"] for r in body["rows"]] == ["pw-eu"]
    pom = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
    status, body = await get(secrets, accept=pom)
    assert status == 200 and [i["metadata"]["name"] for i in body["items"]] == ["pw-eu"]


async def _names_equal(url: str, want: set[str]) -> bool:
    return await names(url) == want


@contextlib.asynccontextmanager
async def watching(url: str) -> AsyncIterator[asyncio.Queue[dict[str, Any]]]:
    """A watch of ``url`` (from now on); its events in a queue."""
    status, listed = await get(url)
    assert status == 200
    rv = listed["metadata"]["resourceVersion"]
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=None))
    # The response's headers are there before the test changes anything: by then the watch
    # listens to the slice's references (they are registered before its first read).
    response = await session.get(url, params={"watch": "1", "resourceVersion": rv})
    assert response.status == 200

    async def read() -> None:
        async for line in response.content:
            if line.strip():
                events.put_nowait(json.loads(line))

    task = asyncio.create_task(read())
    try:
        yield events
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        response.close()
        await session.close()


async def next_event(events: asyncio.Queue[dict[str, Any]], *, within: float = 30) -> Any:
    event = await asyncio.wait_for(events.get(), within)
    return event["type"], event["object"]["metadata"]["name"]


async def test_watch_follows_reference_changes_and_leaving_objects(rel: World) -> None:
    eu_url = f"{rel.eu}/api/v1/namespaces/{NS}/secrets"
    seen_eu: list[tuple[str, str]] = []
    async with watching(eu_url) as eu:
        # db-eu starts referencing pw-free: ADDED
        await rel.apply(database("db-eu", region="eu", secrets=["pw-eu", "pw-free"]))
        assert await next_event(eu) == ("ADDED", "pw-free")
        seen_eu.append(("ADDED", "pw-free"))
        # ... and stops referencing pw-eu: DELETED
        await rel.apply(database("db-eu", region="eu", secrets=["pw-free"]))
        assert await next_event(eu) == ("DELETED", "pw-eu")
        # a change of a visible Secret itself: MODIFIED
        await rel.apply({**secret("pw-free"), "stringData": {"password": "new"}})
        assert await next_event(eu) == ("MODIFIED", "pw-free")
        # db-us names pw-free too, and changes its own Secret: nothing for the eu watch
        await rel.apply(database("db-us", region="us", secrets=["pw-us", "pw-free"]))
        await rel.apply({**secret("pw-us"), "stringData": {"password": "other"}})
        # db-eu leaves the eu slice (relabelled us): pw-free leaves with it
        await rel.apply(database("db-eu", region="us", secrets=["pw-free"]))
        event = await next_event(eu)
        assert event == ("DELETED", "pw-free")
        # nothing of the us side ever reached the eu watch
        await asyncio.sleep(1)
        while not eu.empty():
            seen_eu.append(await next_event(eu))
        assert all(name != "pw-us" for _, name in seen_eu)
    # the us slice now shows pw-us and pw-free (db-us and db-eu are both us)
    assert await names(f"{rel.us}/api/v1/namespaces/{NS}/secrets") == {"pw-us", "pw-free"}
    assert await names(eu_url) == set()
    # back as it was
    await rel.apply(
        database("db-eu", region="eu", secrets=["pw-eu"], config="cfg-eu"),
        database("db-us", region="us", secrets=["pw-us"]),
    )
    await eventually(lambda: _names_equal(eu_url, {"pw-eu"}), within=30, what="eu restored")


async def test_writes_keep_claimed_objects_visible(rel: World) -> None:
    secrets = f"{rel.eu}/api/v1/namespaces/{NS}/secrets"
    await eventually(lambda: _names_equal(secrets, {"pw-eu"}), within=30, what="eu has pw-eu")
    async with aiohttp.ClientSession() as s:
        # an update of a visible Secret passes
        status, current = await get(f"{secrets}/pw-eu")
        current["data"]["extra"] = "eA=="
        async with s.put(f"{secrets}/pw-eu", json=current) as r:
            assert r.status == 200, await r.text()
        # a create of a Secret no visible object references: 422 naming the rule
        async with s.post(secrets, json=secret("pw-new")) as r:
            body = await r.json()
            assert r.status == 422, body
            assert "spec.relatedResources[0]" in body["message"]
        # an update of the other region's Secret: 404, as for a missing one
        status, theirs = await get(f"{rel.us}/api/v1/namespaces/{NS}/secrets/pw-us")
        assert status == 200
        async with s.put(f"{secrets}/pw-us", json=theirs) as r:
            assert r.status in (404, 422), await r.text()
        async with s.delete(f"{secrets}/pw-us") as r:
            assert r.status == 404, await r.text()
    status, _ = await get(f"{rel.us}/api/v1/namespaces/{NS}/secrets/pw-us")
    assert status == 200  # not deleted


TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
POM_LIST = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
CM = f"/api/v1/namespaces/{NS}/configmaps"
# The differential cases (tests/conformance/harness.py): (id, path, query, accept, one object)
DIFFERENTIAL: list[tuple[str, str, tuple[tuple[str, str], ...], str | None, bool]] = [
    ("list", CM, (), None, False),
    ("list-table", CM, (), TABLE, False),
    ("list-pom", CM, (), POM_LIST, False),
    ("list-client-selector", CM, (("labelSelector", "tier in (gold,silver)"),), None, False),
    ("list-field-name", CM, (("fieldSelector", "metadata.name=cfg-gold-2"),), None, False),
    ("list-limit", CM, (("limit", "1"),), None, False),
    ("get-gold", f"{CM}/cfg-gold-1", (), None, True),
    ("get-gold-table", f"{CM}/cfg-gold-1", (), TABLE, True),
    ("get-silver", f"{CM}/cfg-silver", (), None, True),
    ("get-silver-table", f"{CM}/cfg-silver", (), TABLE, True),
    ("get-unlabelled", f"{CM}/cfg-eu", (), None, True),
]


async def test_a_selector_rule_equals_kcp_with_the_selector(rel: World) -> None:
    """The differential harness for a claimed resource: through the ``gold`` slice (a selector
    rule on configmaps), every case answers what kcp's own virtual workspace answers with the
    rule's selector (a GET of an object it does not match: kcp's NotFound for a missing one)."""
    kcp = rel.served.kcp
    auth = await load_kubeconfig(kcp.kubeconfig, context=kcp.admin_context)
    token = auth.bearer_token()
    assert token is not None
    connector = aiohttp.TCPConnector(ssl=auth.ssl_context())
    async with aiohttp.ClientSession(connector=connector) as session:
        for case_id, path, query, accept, single in DIFFERENTIAL:
            kw: dict[str, Any] = {"accept": accept, "headers": {}, "token": token}
            through = await fetch(session, rel.gold + path, query=query, **kw)
            expected: Answer
            if not single:
                expected = await fetch(
                    session, rel.vw + path, query=combined_query(query, GOLD_SELECTOR), **kw
                )
            else:
                answer = await fetch(session, rel.vw + path, query=query, **kw)
                if matches(answer.body, GOLD_SELECTOR, table=accept == TABLE):
                    expected = answer
                else:
                    name = path.rsplit("/", 1)[1]
                    missing = path.rsplit("/", 1)[0] + "/no-such-cm"
                    expected = await fetch(
                        session, rel.vw + missing, query=query, rename=("no-such-cm", name), **kw
                    )
            assert through.status == expected.status, (case_id, through, expected)
            assert through.content_type == expected.content_type, (case_id, through, expected)
            assert through.body == expected.body, (case_id, through.body, expected.body)


def _only(body: Any, names: set[str], *, table: bool) -> Any:
    """A list answer of kcp's with only the objects named ``names`` (a Table: rows)."""
    if table:
        rows = [r for r in body["rows"] if r["object"]["metadata"]["name"] in names]
        return {**body, "rows": rows}
    return {**body, "items": [i for i in body["items"] if i["metadata"]["name"] in names]}


async def test_referenced_secrets_equal_kcps_list_of_the_referenced_names(rel: World) -> None:
    """The differential for a ``referencedBy`` rule: a LIST of secrets through ``eu`` (from the
    shared cache) answers what kcp's own virtual workspace answers for the secrets, kept to
    the names visible Databases reference (``pw-eu``) — in every representation."""
    kcp = rel.served.kcp
    auth = await load_kubeconfig(kcp.kubeconfig, context=kcp.admin_context)
    token = auth.bearer_token()
    assert token is not None
    path = f"/api/v1/namespaces/{NS}/secrets"
    secrets = f"{rel.eu}{path}"
    await eventually(lambda: _names_equal(secrets, {"pw-eu"}), within=30, what="eu has pw-eu")
    connector = aiohttp.TCPConnector(ssl=auth.ssl_context())
    async with aiohttp.ClientSession(connector=connector) as session:
        for accept in (None, POM_LIST, TABLE):
            kw: dict[str, Any] = {"accept": accept, "headers": {}, "token": token}
            through = await fetch(session, rel.eu + path, query=(), **kw)
            direct = await fetch(session, rel.vw + path, query=(), **kw)
            assert through.status == direct.status == 200, (accept, through, direct)
            expected = _only(direct.body, {"pw-eu"}, table=accept == TABLE)
            assert through.body == expected, (accept, through.body, expected)


async def test_a_selector_rule_watch_equals_kcps_selector_watch(rel: World) -> None:
    """The differential for WATCH: through ``gold`` (a selector rule, from the shared cache)
    and from kcp's own virtual workspace with ``labelSelector=tier=gold``, from their LISTs'
    resourceVersions, a relabel into the rule, a change and a relabel out give the same
    events."""
    kcp = rel.served.kcp
    auth = await load_kubeconfig(kcp.kubeconfig, context=kcp.admin_context)
    token = auth.bearer_token()
    assert token is not None
    headers = {"Authorization": f"Bearer {token}"}
    connector = aiohttp.TCPConnector(ssl=auth.ssl_context())
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        streams: list[asyncio.Queue[tuple[str, str]]] = []
        tasks: list[asyncio.Task[None]] = []
        responses: list[aiohttp.ClientResponse] = []
        for base, query in ((rel.gold, {}), (rel.vw, {"labelSelector": GOLD_SELECTOR.render()})):
            url = f"{base}{CM}"
            async with session.get(url, params=query, headers=headers) as r:
                assert r.status == 200, await r.text()
                rv = (await r.json())["metadata"]["resourceVersion"]
            params = {**query, "watch": "1", "resourceVersion": rv}
            response = await session.get(url, params=params, headers=headers)
            assert response.status == 200, await response.text()
            responses.append(response)
            queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
            streams.append(queue)

            async def read(resp: aiohttp.ClientResponse, q: asyncio.Queue[tuple[str, str]]) -> None:
                async for line in resp.content:
                    if line.strip():
                        event = json.loads(line)
                        if event["type"] != "BOOKMARK":
                            q.put_nowait((event["type"], event["object"]["metadata"]["name"]))

            tasks.append(asyncio.create_task(read(response, queue)))
        try:
            await rel.apply(configmap("cfg-silver", tier="gold"))
            await rel.apply({**configmap("cfg-silver", tier="gold"), "data": {"k": "changed"}})
            await rel.apply(configmap("cfg-silver", tier="silver"))
            got = [[await asyncio.wait_for(q.get(), 30) for _ in range(3)] for q in streams]
            assert got[0] == got[1], got
            assert [kind for kind, _ in got[0]] == ["ADDED", "MODIFIED", "DELETED"], got
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for response in responses:
                response.close()
