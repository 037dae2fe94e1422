"""Upstream requests per write (issue 23), against the fake upstream: one write where the shared
cache has the checked object, a GET more where it does not; a race lost because the cache was
behind costs one GET and one write more, and the client never sees the conflict.

The same table against real kcp: tests/security/test_write_cost_kcp.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fakekcp.upstream import FakeUpstream
from tests.integration.conftest import PROXY_TOKEN, SLICE_CLUSTER, widget
from tests.support.cache import CachedAndDirect, cached_and_direct
from tests.support.write_cost import (
    APPLY,
    APPLY_FINALIZER,
    JSON,
    MERGE,
    WRITES,
    Write,
    apply_config,
    behind,
    cost,
    stream_paused,
    until_cached,
)
from vwserver.holds import HOLDS_ANNOTATION
from vwserver.routes import Route, RouteTable
from vwserver.selector import Selector

CLUSTER = "c1"
NS = "ns1"
API = "apis/example.io/v1alpha1"


def _routes(vw_url: str) -> RouteTable:
    return RouteTable(
        [
            Route(
                cluster=SLICE_CLUSTER,
                name="prod",
                selector=Selector.parse("env=prod"),
                upstream_url=vw_url,
            )
        ]
    )


@pytest.fixture
async def servers() -> AsyncIterator[CachedAndDirect]:
    """The slice ``prod`` served twice over one fake: with the shared cache (running: a LIST
    through the slice started it) and without."""

    def seed(fake: FakeUpstream) -> None:
        fake.bind(cluster=CLUSTER)
        for i in range(3):
            fake.create(cluster=CLUSTER, obj=widget(f"seed-{i}", env="prod"))

    async with cached_and_direct(
        FakeUpstream(bookmark_interval=0.2), routes=_routes, token=PROXY_TOKEN, seed=seed
    ) as both:
        async with both.session.get(_widgets(both.cached)) as resp:
            assert resp.status == 200, await resp.text()
        yield both


def _widgets(base: str) -> str:
    slice_base = f"{base}/services/filtered-apiexport/{SLICE_CLUSTER}/prod/clusters/{CLUSTER}"
    return f"{slice_base}/{API}/namespaces/{NS}/widgets"


async def _created(both: CachedAndDirect, name: str, *, cached: bool) -> tuple[dict[str, Any], str]:
    """A new widget in the slice, and the server to write it through: the cached one once its
    cache has the widget, else the one without the cache."""
    created = both.fake.create(cluster=CLUSTER, obj=widget(name, env="prod"))
    if not cached:
        return created, both.direct
    rv = int(created["metadata"]["resourceVersion"])
    await until_cached(both.registry, (CLUSTER, NS, name), newer_than=rv - 1)
    return created, both.cached


def _stored(both: CachedAndDirect, name: str) -> dict[str, Any]:
    found = both.fake.get(cluster=CLUSTER, namespace=NS, name=name)
    assert found is not None
    return found


@pytest.mark.parametrize("write", WRITES, ids=[w.name for w in WRITES])
@pytest.mark.parametrize("cached", [True, False], ids=["cached", "uncached"])
async def test_a_write_costs_one_upstream_request_when_cached(
    servers: CachedAndDirect, write: Write, cached: bool
) -> None:
    name = f"w-{abs(hash((write.name, cached))) % 10**6}"
    _, base = await _created(servers, name, cached=cached)
    url = f"{_widgets(base)}/{name}"
    spent, status, doc = await cost(servers.session, base, url, write, _stored(servers, name))
    assert status in write.ok, doc
    assert spent == (write.cached if cached else write.uncached)


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "uncached"])
async def test_an_apply_whose_holds_change_keeps_its_dry_run(
    servers: CachedAndDirect, cached: bool
) -> None:
    """An apply that adds a finalizer: the proxy records the hold, which it can compute only
    from kcp's result — the dry run, then the write (and a GET first without the cache)."""
    name = f"fin-{int(cached)}"
    created, base = await _created(servers, name, cached=cached)
    url = f"{_widgets(base)}/{name}"
    spent, status, doc = await cost(servers.session, base, url, APPLY_FINALIZER, created)
    assert status == 200, doc
    assert spent == (APPLY_FINALIZER.cached if cached else APPLY_FINALIZER.uncached)
    after = _stored(servers, name)["metadata"]
    assert after["finalizers"] == ["example.io/cost"]
    if cached:  # a slice that records holds (its views can show an object leaving)
        assert "example.io/cost" in after["annotations"][HOLDS_ANNOTATION]


async def test_back_to_back_applies_cost_one_request_each(servers: CachedAndDirect) -> None:
    """An applier that applies again as soon as kcp answered: the cache's stream has not
    delivered its last apply (held back here), and the proxy checks against the version kcp
    answered it with — one upstream request per apply, never a 409 and a GET more."""
    name = "b2b-apply"
    created, base = await _created(servers, name, cached=True)
    url = f"{_widgets(base)}/{name}"
    rounds = 10
    spent = 0.0
    with stream_paused(servers.registry):
        for i in range(rounds):
            apply = Write(
                "apply",
                "PATCH",
                APPLY,
                lambda s, i=i: apply_config(s, color=f"c{i}"),
                1,
                2,
                query=(("fieldManager", "cost"),),
            )
            one, status, doc = await cost(servers.session, servers.cached, url, apply, created)
            assert status == 200, doc
            spent += one
    assert spent == rounds
    assert _stored(servers, name)["spec"]["color"] == f"c{rounds - 1}"


async def test_create_costs_one_upstream_request(servers: CachedAndDirect) -> None:
    for i, base in enumerate((servers.cached, servers.direct)):
        body = widget(f"fresh-{i}", env="prod")
        create = Write("create", "POST", JSON, lambda _, body=body: body, 1, 1)
        spent, status, doc = await cost(servers.session, base, _widgets(base), create, {})
        assert status == 201, doc
        assert spent == 1


async def test_a_cache_behind_costs_a_fresh_read_and_the_client_never_sees_the_conflict(
    servers: CachedAndDirect,
) -> None:
    """The cache has an older version of the object (its watch event has not arrived): the
    write conditional on it fails with 409, kcp is read, and the write is sent again — three
    upstream requests, one answer, 200."""
    key = (CLUSTER, NS, "seed-0")
    older = await until_cached(servers.registry, key)
    changed = servers.fake.update(
        cluster=CLUSTER, obj={**_stored(servers, "seed-0"), "spec": {"size": 5}}
    )
    await until_cached(servers.registry, key, newer_than=older.meta.resource_version)
    behind(servers.registry, older)
    url = f"{_widgets(servers.cached)}/seed-0"
    merge = Write("merge patch", "PATCH", MERGE, lambda _: {"spec": {"color": "green"}}, 1, 2)
    spent, status, doc = await cost(servers.session, servers.cached, url, merge, changed)
    assert status == 200, doc
    assert spent == 3  # the write (409), the GET, the write
    after = _stored(servers, "seed-0")
    assert after["spec"] == {**changed["spec"], "color": "green"}


def _named(doc: Any, name: str) -> str:
    return json.dumps(doc).replace(name, "<name>")


async def test_a_cache_behind_a_move_out_of_the_slice_writes_nothing(
    servers: CachedAndDirect,
) -> None:
    """The cache still shows the object in the slice after it was relabelled out of it: the
    write the cache's version allows fails upstream (its precondition), and kcp's own read
    answers NotFound — exactly what a missing object gets (also for a client's own
    precondition: its conflict would tell that the object exists)."""
    key = (CLUSTER, NS, "seed-1")
    older = await until_cached(servers.registry, key)
    seen = json.loads(older.raw)  # what the client saw while it was in the slice
    moved = servers.fake.update(
        cluster=CLUSTER,
        obj={**seen, "metadata": {**seen["metadata"], "labels": {"env": "dev"}}},
    )
    await until_cached(servers.registry, key, newer_than=older.meta.resource_version)
    base = servers.cached
    for write in WRITES:
        behind(servers.registry, older)
        spent, status, doc = await cost(
            servers.session, base, f"{_widgets(base)}/seed-1", write, seen
        )
        assert status == 404, (write.name, doc)
        # The write the cache's version allowed (409; a JSON patch's failed test: 422; an
        # apply's dry run), the GET.
        assert spent == 2, write.name
        if write.name != "apply":  # an apply of a missing object creates it
            _, missing_status, missing = await cost(
                servers.session, base, f"{_widgets(base)}/no-such", write, seen
            )
            assert (status, _named(doc, "seed-1")) == (
                missing_status,
                _named(missing, "no-such"),
            ), write.name
    assert _stored(servers, "seed-1") == moved


async def test_a_clients_own_stale_precondition_gets_kcps_conflict(
    servers: CachedAndDirect,
) -> None:
    """A client's resourceVersion that is not the stored one is the client's 409, whether the
    cache knows the newer version (a GET confirms it) or not (kcp's own 409)."""
    name = "seed-2"
    stale = _stored(servers, name)
    servers.fake.update(cluster=CLUSTER, obj={**stale, "spec": {"size": 9}})
    url = f"{_widgets(servers.cached)}/{name}"
    put = Write("update", "PUT", JSON, lambda s: s, 1, 2)
    _, status, doc = await cost(servers.session, servers.cached, url, put, stale)
    assert status == 409, doc
    assert doc["reason"] == "Conflict"
    assert _stored(servers, name)["spec"] == {"size": 9}
