"""Objects that look like other representations, against real kcp: membership is decided on an
object's own metadata, whatever it carries (``vwserver.proxy.filtering``).

The shapes export (:mod:`tests.support.shapes`) has custom resources with top-level ``object``,
``rows``, ``items`` and ``spec.metadata`` members, one preserving unknown fields, and one of kind
``Table``. In a fresh namespace of the first consumer: an ``env=prod`` object of each (the
control), and an ``env=dev`` one whose planted members carry ``env=prod`` labels, the holds
annotation's name and a ``kcp.io/cluster``, and a secret in ``spec``. Through the prod slice —
served from the cache (which records holds, so kcp-answered LISTs are asked without the slice's
selector and vwserver alone decides) — every read in every representation must show the control
and nothing of the planted object: kcp-answered LISTs (a ``metadata.namespace`` field selector
keeps them from the cache; plain, Table, PartialObjectMetadataList, YAML, a client's own paging),
cached LISTs, GET in every shape, watches kcp answers (field selector, the deprecated
``/watch/`` path) and cached ones, plain and Table.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from devenv.bootstrap import Bootstrap, Workspace
from devenv.kcp import KcpInstance
from tests.support.shapes import API, KINDS, planted, shapes_world
from tests.support.slices import slice_url, slices_over_kcp
from vwserver.selector import Selector

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
POM = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"
POM_LIST = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
YAML = "application/yaml"
SECRET = f"s3cret-{uuid.uuid4().hex[:8]}"
WAIT = 30.0
JSON_BODY = {"Content-Type": "application/json"}


@dataclass
class Bed:
    kcp: KcpInstance
    world: Bootstrap
    ws: Workspace
    namespace: str
    base: str
    session: aiohttp.ClientSession

    def kcp_url(self, resource: str) -> str:
        return f"{self.ws.url}/{API}/namespaces/{self.namespace}/{resource}"

    def prod(self, resource: str, *, legacy_watch: bool = False, cluster: str = "") -> str:
        root = slice_url(self.base, self.world, "prod", cluster or self.ws.cluster)
        if legacy_watch:
            return f"{root}/{API}/watch/namespaces/{self.namespace}/{resource}"
        return f"{root}/{API}/namespaces/{self.namespace}/{resource}"

    async def create(self, resource: str, name: str, *, env: str) -> None:
        body = planted(
            resource,
            name,
            self.namespace,
            labels={"env": env},
            looks_like={"env": "prod"},
            cluster=self.ws.cluster,
            secret=SECRET if env == "dev" else "nothing to hide",
        )
        url, data = self.kcp_url(resource), json.dumps(body)
        async with self.session.post(url, data=data, headers=JSON_BODY) as r:
            assert r.status == 201, f"create {resource}/{name}: {r.status} {await r.text()}"


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def bed(kcp: KcpInstance, world: Bootstrap) -> AsyncIterator[Bed]:
    shapes = await shapes_world(kcp, world)
    ws = shapes.consumers[0]
    namespace = f"shapes-{uuid.uuid4().hex[:6]}"
    await kcp.kubectl("create", "namespace", namespace, server=ws.url)
    slices = {"prod": Selector.parse("env=prod"), "dev": Selector.parse("env=dev")}
    try:
        async with (
            slices_over_kcp(kcp, shapes, slices=slices, page_size=2, cache=True) as base,
            kcp.http_session(timeout=30) as session,
        ):
            bed = Bed(kcp, shapes, ws, namespace, base, session)
            for resource in KINDS:
                await bed.create(resource, "control", env="prod")
                await bed.create(resource, "planted", env="dev")
            yield bed
    finally:
        await kcp.kubectl("delete", "namespace", namespace, "--wait=false", server=ws.url)


def leaks(text: str) -> list[str]:
    return [word for word in ("planted", SECRET) if word in text]


NS_FIELD = "metadata.namespace={ns}"
# (id, Accept, query): kcp answers those with the namespace field selector, the cache the rest.
LISTS = [
    ("kcp-plain", None, {"fieldSelector": NS_FIELD}),
    ("kcp-plain-paged", None, {"fieldSelector": NS_FIELD, "limit": "1"}),
    ("kcp-table", TABLE, {"fieldSelector": NS_FIELD}),
    ("kcp-table-no-object", TABLE, {"fieldSelector": NS_FIELD, "includeObject": "None"}),
    ("kcp-table-object", TABLE, {"fieldSelector": NS_FIELD, "includeObject": "Object"}),
    ("kcp-pom-list", POM_LIST, {"fieldSelector": NS_FIELD}),
    ("yaml", YAML, {}),
    ("cached-plain", None, {}),
    ("cached-table", TABLE, {}),
    ("cached-pom-list", POM_LIST, {}),
]


@pytest.mark.parametrize("resource", list(KINDS))
@pytest.mark.parametrize(
    ("accept", "query"), [(a, q) for _, a, q in LISTS], ids=[i for i, *_ in LISTS]
)
async def test_lists_judge_items_by_their_own_metadata(
    bed: Bed, resource: str, accept: str | None, query: dict[str, str]
) -> None:
    params = {k: v.format(ns=bed.namespace) for k, v in query.items()}
    headers = {"Accept": accept} if accept else {}
    seen, continue_token = "", ""
    for _ in range(10):  # a client paging itself: every page
        page = {**params, **({"continue": continue_token} if continue_token else {})}
        async with bed.session.get(bed.prod(resource), params=page, headers=headers) as r:
            text = await r.text()
            assert r.status == 200, f"{r.status} {text}"
        seen += text
        if "limit" not in params or accept == YAML:
            break
        continue_token = json.loads(text)["metadata"].get("continue", "")
        if not continue_token:
            break
    assert "control" in seen, seen
    assert not leaks(seen), f"the prod slice showed the planted dev object: {seen}"


@pytest.mark.parametrize("resource", list(KINDS))
@pytest.mark.parametrize("accept", [None, TABLE, POM, YAML], ids=["object", "table", "pom", "yaml"])
async def test_get_judges_the_object_by_its_own_metadata(
    bed: Bed, resource: str, accept: str | None
) -> None:
    headers = {"Accept": accept} if accept else {}
    async with bed.session.get(f"{bed.prod(resource)}/control", headers=headers) as r:
        assert r.status == 200, await r.text()
    async with bed.session.get(f"{bed.prod(resource)}/planted", headers=headers) as r:
        text = await r.text()
        assert r.status == 404, f"GET of the planted dev object through prod: {r.status} {text}"
        assert SECRET not in text


async def _watch(
    session: aiohttp.ClientSession, url: str, params: dict[str, str], headers: dict[str, str]
) -> AsyncIterator[dict[str, Any]]:
    query = {**params, "timeoutSeconds": "60"}
    async with session.get(
        url, params=query, headers=headers, timeout=aiohttp.ClientTimeout(total=90)
    ) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if line.strip():
                yield json.loads(line)


WATCHES = [
    ("kcp-field-selector", False, None, {"fieldSelector": NS_FIELD}),
    ("kcp-field-selector-table", False, TABLE, {"fieldSelector": NS_FIELD}),
    ("kcp-legacy-path", True, None, {}),
    ("cached", False, None, {}),
    ("cached-table", False, TABLE, {}),
]


@pytest.mark.parametrize("resource", list(KINDS))
@pytest.mark.parametrize(
    ("legacy", "accept", "query"),
    [(lg, a, q) for _, lg, a, q in WATCHES],
    ids=[i for i, *_ in WATCHES],
)
async def test_watches_judge_events_by_their_own_metadata(
    bed: Bed, resource: str, legacy: bool, accept: str | None, query: dict[str, str]
) -> None:
    """A watch from now; then a planted dev object and a prod sentinel are created: the
    sentinel arrives, nothing of the planted one does."""
    params = {k: v.format(ns=bed.namespace) for k, v in query.items()}
    params["watch"] = "true"
    headers = {"Accept": accept} if accept else {}
    suffix = uuid.uuid4().hex[:6]
    sentinel = f"control-{suffix}"
    seen: list[str] = []

    async def read() -> None:
        url = bed.prod(resource, legacy_watch=legacy)
        async for event in _watch(bed.session, url, params, headers):
            seen.append(json.dumps(event))
            if sentinel in seen[-1]:
                return

    reader = asyncio.create_task(read())
    try:
        await asyncio.sleep(1.0)  # the watch is established (nothing is lost if not: from now)
        await bed.create(resource, f"planted-{suffix}", env="dev")
        await bed.create(resource, sentinel, env="prod")
        await asyncio.wait_for(reader, WAIT)
    finally:
        reader.cancel()
    text = "\n".join(seen)
    assert sentinel in text
    assert not leaks(text), f"the prod watch showed the planted dev object: {text}"
