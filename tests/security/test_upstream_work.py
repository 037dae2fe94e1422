"""Upstream work per client request is bounded (issues 22 and 23), against the fake upstream.

A slice that records holds asks kcp twice, each time naming the slice: with its selector, and
with its holder label (:mod:`vwserver.proxy.lists`), and decides membership itself. Random
populations of objects — in the slice, outside it, held by it while leaving it, held by it and
in it, held by another slice that keeps them from it, carrying the slice's holder label without
a hold (a stray label: a filtered row) — are listed through the slice with a random client
limit, field selector, label selector and representation, following the continue chain to its
end. For every example:

(a) the pages together are exactly what the slice sees of the selection, in kcp's order,
    nothing twice (membership from :func:`vwserver.holds.sees`, which the handoff tests pin;
    what is proven here is the paging);
(b) no client page cost kcp more than :data:`~vwserver.proxy.lists.MAX_UPSTREAM_PAGES` LISTs
    (counted by vwserver's ``vwserver_upstream_requests_total``) beyond one per page size of
    objects kcp answers that the slice does not see before the page's first entry (and one
    more: they may be in either stream), and no page is longer than the limit — objects of
    other slices cost nothing;
(c) every upstream LIST named the slice — its selector or its holder label
    (:func:`~tests.security.support.unselected_lists`) — with the client's label selector
    (the slice's own keys left out next to the holder label) and field selectors (a field
    selector naming one namespace as that namespace's collection, as the apiserver reads it);
(d) no continue token names an object the slice does not see: each follows its page's last
    entry, and only the last page is empty.

The namespace field selector is what makes the cache leave these LISTs to kcp.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from fakekcp.store import ResourceSpec
from fakekcp.upstream import FakeUpstream, start_fake_upstream
from tests.integration.conftest import PROXY_TOKEN, SLICE_CLUSTER
from tests.security.support import env_int, unselected_lists
from tests.support.cache import CachedProxy, cached_proxy
from tests.support.properties import bounded_settings
from tests.support.serve import NO_AUTH, serve_app
from vwserver.holds import HOLDS_ANNOTATION, Member, holder_label, leaving_safe, sees, slice_id
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.proxy.lists import MAX_UPSTREAM_PAGES, decode_continue
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Route, Routes, RouteTable
from vwserver.selector import Selector
from vwserver.server import build_app

EXAMPLES = env_int("VWSERVER_UPSTREAM_WORK_EXAMPLES", 200)
CLUSTERS = ("c1", "c2")
SLICES = {"a": "region=a", "b": "region=b"}
FINALIZER = {"a": "a.example.io/cleanup", "b": "b.example.io/cleanup"}
SINCE = "2026-01-01T00:00:00Z"
API = "apis/example.io/v1alpha1"
ACCEPT = {
    "objects": "application/json",
    "table": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    "partial": "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json",
}
GADGET = {"apiVersion": "example.io/v1alpha1", "kind": "Gadget"}
KINDS = ("mine", "other", "unlabelled", "held-leaving", "held-mine", "held-by-other", "stray")


@dataclass(frozen=True)
class Obj:
    cluster: str
    namespace: int  # 0 or 1: which of the example's two namespaces
    name: str
    kind: str
    tier: str | None

    def body(self, namespace: str) -> dict[str, Any]:
        labels = {"tier": self.tier} if self.tier else {}
        annotations: dict[str, str] = {}
        finalizers: list[str] = []
        region = {"mine": "a", "other": "b", "held-leaving": "b", "held-mine": "a"}.get(
            self.kind, "a"
        )
        if self.kind != "unlabelled":
            labels["region"] = region
        if self.kind == "stray":  # another slice's object with a's holder label, no hold
            labels["region"] = "b"
            labels[holder_label(slice_id(SLICE_CLUSTER, "a"))] = "true"
        holder = {"held-leaving": "a", "held-mine": "a", "held-by-other": "b"}.get(self.kind)
        if holder:
            hold: dict[str, Any] = {"finalizers": [FINALIZER[holder]]}
            if not Selector.parse(SLICES[holder]).matches(labels):
                hold["leavingSince"] = SINCE
            annotations[HOLDS_ANNOTATION] = json.dumps({slice_id(SLICE_CLUSTER, holder): hold})
            labels[holder_label(slice_id(SLICE_CLUSTER, holder))] = "true"  # as vwserver writes
            finalizers.append(FINALIZER[holder])
        return {
            "apiVersion": "example.io/v1alpha1",
            "kind": "Widget",
            "metadata": {
                "name": self.name,
                "namespace": namespace,
                "labels": labels,
                "annotations": annotations,
                "finalizers": finalizers,
            },
            "spec": {"size": 1},
        }


@dataclass(frozen=True)
class Example:
    objects: list[Obj]
    limit: int
    wildcard: bool
    cluster: str
    namespace: int
    not_named: str | None  # a metadata.name!= term of the field selector
    labels: str  # the client's labelSelector
    accept: str


@st.composite
def examples(draw: st.DrawFn) -> Example:
    count = draw(st.integers(0, 80))
    names = [f"w{i:02d}" for i in range(count)]
    # Each example mixes a few kinds (often only ones the slice does not see, with one that
    # it does), in a few places: long stretches of objects the slice does not see.
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=3, unique=True))
    clusters = draw(st.lists(st.sampled_from(CLUSTERS), min_size=1, unique=True))
    spaces = draw(st.lists(st.integers(0, 1), min_size=1, unique=True))
    objects = [
        Obj(
            cluster=draw(st.sampled_from(clusters)),
            namespace=draw(st.sampled_from(spaces)),
            name=name,
            kind=draw(st.sampled_from(kinds)) if draw(st.integers(0, 9)) else "mine",
            tier=draw(st.sampled_from((None, "x", "y"))),
        )
        for name in names
    ]
    return Example(
        objects=objects,
        limit=draw(st.integers(1, 9)),
        wildcard=draw(st.booleans()),
        cluster=draw(st.sampled_from(clusters)),
        namespace=draw(st.sampled_from(spaces)),
        not_named=draw(st.one_of(st.none(), st.sampled_from(names))) if names else None,
        labels=draw(st.sampled_from(("", "", "tier=x", "tier!=x", "!tier"))),
        accept=draw(st.sampled_from(sorted(ACCEPT))),
    )


@dataclass
class World(CachedProxy):
    page_size: int
    examples: itertools.count[int]

    def upstream_lists(self) -> float:
        """The proxy's upstream GETs so far (its ``vwserver_upstream_requests_total``)."""
        text = self.metrics.render().decode()
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "vwserver_upstream_requests_total" and s.labels.get("method") == "GET"
        )


@pytest.fixture(params=[2, 5], ids=["page-2", "page-5"])
async def world(request: pytest.FixtureRequest) -> AsyncIterator[World]:
    """Slices ``a`` and ``b`` served from a shared cache (so that they record holds) over the
    fake upstream, with a small list page size (the parameter)."""

    def seed(fake: FakeUpstream) -> None:
        for cluster in CLUSTERS:
            fake.bind(cluster=cluster)

    def routes(vw_url: str) -> RouteTable:
        return RouteTable(
            Route(
                cluster=SLICE_CLUSTER,
                name=name,
                selector=Selector.parse(selector),
                upstream_url=vw_url,
            )
            for name, selector in SLICES.items()
        )

    async with cached_proxy(
        FakeUpstream(bookmark_interval=0.2),
        routes=routes,
        token=PROXY_TOKEN,
        within=30,
        seed=seed,
        page_size=request.param,
        world=lambda **parts: World(**parts, page_size=request.param, examples=itertools.count()),
    ) as world:
        yield world


_SELECTORS = {f"{SLICE_CLUSTER}/{name}": Selector.parse(s) for name, s in SLICES.items()}
MEMBER = Member(
    selector=Selector.parse(SLICES["a"]), id=slice_id(SLICE_CLUSTER, "a"), peers=_SELECTORS.get
)


def _names(doc: dict[str, Any]) -> list[str]:
    entries = doc["rows"] if doc["kind"] == "Table" else doc["items"]
    return [(e["object"] if doc["kind"] == "Table" else e)["metadata"]["name"] for e in entries]


async def run_example(world: World, ex: Example) -> None:
    n = next(world.examples)
    namespaces = (f"e{n}-0", f"e{n}-1")
    bodies = {}
    for obj in ex.objects:
        bodies[obj] = obj.body(namespaces[obj.namespace])
        world.fake.create(cluster=obj.cluster, obj=bodies[obj])
    fields = f"metadata.namespace={namespaces[ex.namespace]}"
    if ex.not_named:
        fields += f",metadata.name!={ex.not_named}"
    client = Selector.parse(ex.labels)
    # What kcp selects for the client, in kcp's key order (logical cluster, namespace, name) ...
    selected = sorted(
        (
            obj
            for obj in ex.objects
            if (ex.wildcard or obj.cluster == ex.cluster)
            and obj.namespace == ex.namespace
            and obj.name != ex.not_named
            and client.matches(bodies[obj]["metadata"]["labels"])
        ),
        key=lambda o: (o.cluster, o.name),
    )
    # ... and what of it the slice sees.
    wanted = [
        o.name
        for o in selected
        if sees(
            MEMBER,
            labels=bodies[o]["metadata"]["labels"],
            annotations=bodies[o]["metadata"]["annotations"],
            finalizers=bodies[o]["metadata"]["finalizers"],
        )
    ]
    # What kcp answers the slice's two queries with (the selected and the held stream): the
    # objects a page may have to read past.
    holder = holder_label(MEMBER.id)
    own = MEMBER.selector & client
    held = Selector.parse(holder) & leaving_safe(client, slice_selector=MEMBER.selector)
    answered = [
        o
        for o in selected
        if own.matches(bodies[o]["metadata"]["labels"])
        or held.matches(bodies[o]["metadata"]["labels"])
    ]
    cluster = "*" if ex.wildcard else ex.cluster
    url = f"{world.base}/services/filtered-apiexport/{SLICE_CLUSTER}/a/clusters/{cluster}/{API}/widgets"
    pages: list[tuple[list[str], float, str]] = []
    token = ""
    while True:
        params = {"limit": str(ex.limit), "fieldSelector": fields}
        if ex.labels:
            params["labelSelector"] = ex.labels
        if token:
            params["continue"] = token
        world.fake.faults.requests.clear()
        before = world.upstream_lists()
        headers = {"Accept": ACCEPT[ex.accept]}
        async with world.session.get(url, params=params, headers=headers) as resp:
            body = await resp.read()
            assert resp.status == 200, body
        cost = world.upstream_lists() - before
        doc = json.loads(body)
        names = _names(doc)
        assert len(names) <= ex.limit, (names, ex.limit)
        # (c) every upstream LIST named the slice, with the client's selectors
        lists = [r for r in world.fake.faults.requests if r.path.endswith("/widgets")]
        assert len(lists) == cost, lists
        assert (
            unselected_lists(
                [r.query for r in lists], slice_selector=MEMBER.selector, holder=holder
            )
            == []
        ), lists
        for r in lists:
            if ex.wildcard:
                assert r.query.get("fieldSelector") == fields, r.query
            else:  # a field selector naming one namespace is asked as that namespace's LIST
                assert r.path.endswith(f"/namespaces/{namespaces[ex.namespace]}/widgets"), r.path
                rest = f"metadata.name!={ex.not_named}" if ex.not_named else None
                assert r.query.get("fieldSelector") == rest, r.query
            pushed = Selector.parse(r.query.get("labelSelector", ""))
            assert pushed.render() in (own.render(), held.render()), r.query
        token = doc["metadata"].get("continue", "")
        pages.append((names, cost, token))
        if not token:
            break
    got = [name for names, _, _ in pages for name in names]
    # (a) exactly what the slice sees, in order, once
    assert got == wanted, (got, wanted, pages)
    position = {o.name: i for i, o in enumerate(answered)}
    end = 0  # where the previous page ended among kcp's entries
    for names, cost, token in pages:
        # (b) bounded: the cap, plus a page of objects the slice does not see per page size
        # read before the page's first entry (in either stream)
        first = position[names[0]] if names else len(answered)
        skipped = first - end
        bound = MAX_UPSTREAM_PAGES + (-(-skipped // world.page_size) + 1 if skipped else 0)
        assert cost <= bound, (pages, skipped)
        # (d) a page is empty only at the end, and its token follows its own last entry
        if token:
            assert names, pages
            assert _token_follows(token) == names[-1], (pages, _token_follows(token))
        if names:
            end = position[names[-1]] + 1


def _token_follows(token: str) -> str:
    """The name of the object a continue token (the proxy's, around fake kcp's) resumes
    after."""
    token = decode_continue(token).token
    doc = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    start: str = doc["start"]
    return start.rstrip("\0").rsplit("/", 1)[-1]


async def test_paged_lists_kcp_answers_are_complete_and_bounded(world: World) -> None:
    loop = asyncio.get_running_loop()
    ran: list[Example] = []

    @bounded_settings(EXAMPLES)
    @given(examples())
    def property_(ex: Example) -> None:
        ran.append(ex)
        future = asyncio.run_coroutine_threadsafe(run_example(world, ex), loop)
        future.result(timeout=60)

    # hypothesis drives the examples from a worker thread; the proxy and the fake live on this
    # event loop, which keeps running meanwhile.
    await asyncio.to_thread(property_)
    assert len(ran) >= min(EXAMPLES, 10)


async def test_a_namespace_field_selector_on_a_cluster_scoped_resource_is_asked_as_sent() -> None:
    """A LIST naming one namespace in its field selector is asked as that namespace's LIST; a
    cluster-scoped resource has none (404), so it is then asked as the client sent it — and
    answers what kcp answers for it (no object has that namespace)."""
    gadgets = ResourceSpec(plural="gadgets", kind="Gadget", namespaced=False)
    fake_upstream = FakeUpstream(resources=[ResourceSpec(), gadgets])
    async with start_fake_upstream(fake_upstream) as (fake, vw_url):
        fake.create(
            cluster="c1", obj={**GADGET, "metadata": {"name": "g1", "labels": {"region": "a"}}}
        )
        origin = vw_url.removesuffix(fake.base_path)
        auth = ClientAuth(server=origin, token=PROXY_TOKEN)
        route = Route(
            cluster=SLICE_CLUSTER,
            name="a",
            selector=Selector.parse("region=a"),
            upstream_url=vw_url,
        )
        app = build_app(
            routes=Routes(RouteTable([route])), upstream=UpstreamClient(auth=auth), guard=NO_AUTH
        )
        async with serve_app(app) as base, aiohttp.ClientSession() as session:
            prefix = f"{base}/services/filtered-apiexport/{SLICE_CLUSTER}/a/clusters/c1/{API}"
            for fields, names in (("metadata.namespace=ns1", []), ("metadata.namespace=", ["g1"])):
                fake.faults.requests.clear()
                params = {"fieldSelector": fields, "limit": "5"}
                async with session.get(f"{prefix}/gadgets", params=params) as resp:
                    assert resp.status == 200, await resp.text()
                    doc = await resp.json()
                assert [i["metadata"]["name"] for i in doc["items"]] == names
                paths = [r.path.split(f"/{API}", 1)[1] for r in fake.faults.requests]
                narrowed = ["/namespaces/ns1/gadgets"] if names == [] else []
                assert paths == [*narrowed, "/gadgets"], paths


async def test_every_pass_through_read_names_the_slice(world: World) -> None:
    """The other pass-through reads of a slice that records holds ask kcp with the slice's
    selector too: a watch the cache does not serve (a deprecated ``/watch/`` path), a LIST of
    every shape the cache leaves to kcp (YAML, a namespace field selector), a
    deletecollection's list — no upstream LIST or WATCH without the slice's selector or its
    holder label."""
    prefix = f"{world.base}/services/filtered-apiexport/{SLICE_CLUSTER}/a/clusters/c1/{API}"
    reads = [
        ("GET", f"{prefix}/watch/namespaces/w0/widgets", {"timeoutSeconds": "1"}, {}),
        ("GET", f"{prefix}/widgets", {"limit": "3"}, {"Accept": "application/yaml"}),
        ("GET", f"{prefix}/widgets", {"fieldSelector": "metadata.namespace=w0"}, {}),
        ("DELETE", f"{prefix}/namespaces/w0/widgets", {"labelSelector": "tier=none"}, {}),
    ]
    holder = holder_label(MEMBER.id)
    for method, url, params, headers in reads:
        world.fake.faults.requests.clear()
        async with world.session.request(method, url, params=params, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            await resp.read()
        # (the shared cache's own list and watch, on clusters/*, which a deletecollection's
        # dependents check may start, read everything by design: it serves every slice)
        asked = [
            r.query
            for r in world.fake.faults.requests
            if r.path.endswith("/widgets") and "/clusters/*/" not in r.path
        ]
        assert asked, (method, url)
        assert unselected_lists(asked, slice_selector=MEMBER.selector, holder=holder) == [], (
            method,
            url,
            asked,
        )
