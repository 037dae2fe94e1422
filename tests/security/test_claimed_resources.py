"""Claimed resources (issue #25): nothing outside a slice's related-resource rules leaves it.

Against the fake upstream serving ``widgets`` (the export's own resource) and core ``secrets``
(a permission claim), with vwserver's shared cache (the reference index reads the widgets from
it). Slice ``eu`` (``region=eu``) shows the Secrets that its visible widgets name at
``spec.secretRef.name``; ``us`` likewise; ``none`` claims secrets without any rule.

* **Existence oracle**: every case of :mod:`tests.security.test_existence_oracle` (every verb,
  representation and query form on a named object) for a Secret referenced only by a ``us``
  widget and for a missing name answers the same through ``eu``; the Secret is unchanged.
* **No rule, nothing visible**: a slice that claims secrets without a rule lists none.
* **Live references**: a watch (JSON and Table) of secrets through ``eu`` gets ADDED when a
  visible widget starts naming a Secret and DELETED when it stops or leaves the slice; the
  ``us`` Secret never appears.
* **Write race**: a reference is removed while writes to the Secret are in flight; every write
  either happened while the Secret was visible or was refused, and none after the index let go
  of it succeeds.
* **Fuzz** (hypothesis): random reference graphs over widgets; a LIST of secrets through the
  slice is exactly the set that visible widgets name.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakekcp.store import ResourceSpec
from fakekcp.upstream import FakeUpstream
from tests.integration.conftest import PROXY_TOKEN, SLICE_CLUSTER
from tests.security.test_existence_oracle import CASES, Case, Target, ask, compare
from tests.support.cache import CachedProxy, cached_proxy
from vwserver.holds import HOLDS_ANNOTATION, slice_id
from vwserver.related import parse_rules
from vwserver.routes import Route, RouteTable
from vwserver.selector import Selector

SECRET = ResourceSpec(
    group="", version="v1", plural="secrets", kind="Secret", status_subresource=False
)
CLAIMED = frozenset({("", "secrets")})
RULES = parse_rules(
    [
        {
            "resource": "secrets",
            "referencedBy": {
                "path": "spec.secretRef.name",
                "group": "example.io",
                "version": "v1alpha1",
                "resource": "widgets",
            },
        }
    ]
)
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def routes(upstream: str) -> RouteTable:
    return RouteTable(
        [
            *(
                Route(
                    cluster=SLICE_CLUSTER,
                    name=region,
                    selector=Selector.parse(f"region={region}"),
                    upstream_url=upstream,
                    claimed=CLAIMED,
                    related=RULES,
                )
                for region in ("eu", "us")
            ),
            Route(
                cluster=SLICE_CLUSTER,
                name="none",
                selector=Selector.parse("region=eu"),
                upstream_url=upstream,
                claimed=CLAIMED,
            ),
        ]
    )


def widget(name: str, *, region: str, secret: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"size": 1}
    if secret is not None:
        spec["secretRef"] = {"name": secret}
    return {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": "ns1", "labels": {"region": region}},
        "spec": spec,
    }


def secret(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": "ns1"},
        "data": {"password": "c2VjcmV0"},
    }


def seed(fake: FakeUpstream) -> None:
    for name in ("s-eu", "s-us", "s-free"):
        fake.create(cluster="c1", obj=secret(name))
    fake.create(cluster="c1", obj=widget("w-eu", region="eu", secret="s-eu"))
    fake.create(cluster="c1", obj=widget("w-us", region="us", secret="s-us"))


@pytest.fixture
async def world() -> AsyncIterator[CachedProxy]:
    async with cached_proxy(
        FakeUpstream(bookmark_interval=0.2, resources=[ResourceSpec(), SECRET]),
        routes=routes,
        token=PROXY_TOKEN,
        within=30,
        seed=seed,
        world=CachedProxy,
    ) as w:
        yield w


def core(w: CachedProxy, slice_name: str) -> str:
    return f"{w.base}/services/filtered-apiexport/{SLICE_CLUSTER}/{slice_name}/clusters/c1/api/v1"


async def listed(w: CachedProxy, slice_name: str, *, accept: str = "application/json") -> set[str]:
    url = f"{core(w, slice_name)}/namespaces/ns1/secrets"
    async with w.session.get(url, headers={"Accept": accept}) as r:
        body = await r.json()
        assert r.status == 200, body
    if "rows" in body:
        return {row["object"]["metadata"]["name"] for row in body["rows"]}
    return {i["metadata"]["name"] for i in body["items"]}


async def test_only_referenced_secrets_are_listed(world: CachedProxy) -> None:
    assert await listed(world, "eu") == {"s-eu"}
    assert await listed(world, "us") == {"s-us"}
    assert await listed(world, "eu", accept=TABLE) == {"s-eu"}
    assert await listed(world, "none") == set()  # claimed, no rule: nothing


ORACLE_CASES = [c for c in CASES if not c.sub]


@pytest.mark.parametrize("case", ORACLE_CASES, ids=[c.id for c in ORACLE_CASES])
async def test_a_secret_outside_the_slice_answers_like_a_missing_one(
    world: CachedProxy, case: Case
) -> None:
    fake = world.fake
    stored = fake.get(cluster="c1", namespace="ns1", name="s-us", resource="secrets")
    assert stored is not None
    target = Target(
        name="s-us",
        namespace="ns1",
        uid=stored["metadata"]["uid"],
        rv=stored["metadata"]["resourceVersion"],
        api_version="v1",
    )
    base = core(world, "eu")
    foreign, missing = await asyncio.gather(
        ask(world.session, base, case, "s-us", target, resource="secrets"),
        ask(world.session, base, case, "s-xx", target, resource="secrets"),
    )
    problems = compare(case, foreign, missing, ("s-us", "s-xx"))
    after = fake.get(cluster="c1", namespace="ns1", name="s-us", resource="secrets")
    if after != stored:
        problems.append(f"the Secret outside the slice changed: {stored} -> {after}")
    assert not problems, "\n  ".join(problems)


async def events(
    w: CachedProxy, *, accept: str = "application/json"
) -> tuple[asyncio.Queue[tuple[str, str]], asyncio.Task[None]]:
    url = f"{core(w, 'eu')}/namespaces/ns1/secrets"
    async with w.session.get(url) as r:
        rv = (await r.json())["metadata"]["resourceVersion"]
    queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true"}

    async def read() -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with (
            aiohttp.ClientSession(timeout=timeout) as s,
            s.get(url, params=params, headers={"Accept": accept}) as r,
        ):
            assert r.status == 200
            async for line in r.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event["object"]
                if event["type"] == "BOOKMARK":
                    queue.put_nowait(("BOOKMARK", ""))
                elif obj.get("kind") == "Table":
                    for row in obj["rows"]:
                        queue.put_nowait((event["type"], row["object"]["metadata"]["name"]))
                else:
                    queue.put_nowait((event["type"], obj["metadata"]["name"]))

    task = asyncio.create_task(read())
    # The watch is open (and listens to the slice's references) once anything arrived: the
    # fake sends a bookmark every 0.2 s. A reference change before that would reach no
    # listener (see the README: transitions between a LIST and its watch are not replayed).
    first = await asyncio.wait_for(queue.get(), 20)
    assert first[0] == "BOOKMARK", first
    return queue, task


async def next_event(queue: asyncio.Queue[tuple[str, str]]) -> tuple[str, str]:
    while True:
        event = await asyncio.wait_for(queue.get(), 20)
        if event[0] != "BOOKMARK":
            return event


@pytest.mark.parametrize("accept", ["application/json", TABLE])
async def test_watch_follows_references(world: CachedProxy, accept: str) -> None:
    fake = world.fake
    queue, task = await events(world, accept=accept)
    try:
        fake.update(cluster="c1", obj=widget("w-eu", region="eu", secret="s-free"))
        got = {await next_event(queue), await next_event(queue)}
        assert got == {("ADDED", "s-free"), ("DELETED", "s-eu")}
        # the us widget names s-free too, then the eu widget leaves the slice: s-free leaves
        fake.update(cluster="c1", obj=widget("w-us", region="us", secret="s-free"))
        fake.update(cluster="c1", obj=widget("w-eu", region="us", secret="s-free"))
        assert await next_event(queue) == ("DELETED", "s-free")
        # a Secret of the us side changes: nothing for eu
        fake.update(cluster="c1", obj={**secret("s-us"), "data": {"x": "eQ=="}})
        fake.update(cluster="c1", obj=widget("w-eu", region="eu", secret="s-eu"))
        assert await next_event(queue) == ("ADDED", "s-eu")
        assert queue.empty() or all(name != "s-us" for _, name in [queue.get_nowait()])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_writes_race_a_removed_reference(world: CachedProxy) -> None:
    """Updates of s-eu through eu while w-eu stops naming it: each succeeds only while the
    index still shows s-eu; once the reference is gone (the index caught up) none succeeds,
    and the proxy never wrote to a Secret it did not show."""
    fake = world.fake
    url = f"{core(world, 'eu')}/namespaces/ns1/secrets/s-eu"
    codes: list[int] = []

    async def write(i: int) -> None:
        body = {**secret("s-eu"), "data": {"n": str(i).encode().hex()}}
        async with world.session.put(url, json=body) as r:
            codes.append(r.status)

    writes = [asyncio.create_task(write(i)) for i in range(20)]
    fake.update(cluster="c1", obj=widget("w-eu", region="eu", secret=None))
    await asyncio.gather(*writes)
    assert set(codes) <= {200, 409, 422}, codes
    for _ in range(100):
        if await listed(world, "eu") == set():
            break
        await asyncio.sleep(0.05)
    assert await listed(world, "eu") == set()
    before = fake.get(cluster="c1", namespace="ns1", name="s-eu", resource="secrets")
    async with world.session.put(url, json=secret("s-eu")) as r:
        assert r.status == 422, await r.text()
        assert "spec.relatedResources[0]" in (await r.json())["message"]
    async with world.session.delete(url) as r:
        assert r.status == 404, await r.text()
    assert fake.get(cluster="c1", namespace="ns1", name="s-eu", resource="secrets") == before


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["w-eu", "w-us", "w-x"]),
            st.sampled_from(["eu", "us"]),
            st.sampled_from(["s-eu", "s-us", "s-free", "s-none", None]),
        ),
        min_size=1,
        max_size=6,
    )
)
async def test_fuzz_listing_is_what_visible_widgets_name(
    world: CachedProxy, changes: list[tuple[str, str, str | None]]
) -> None:
    fake = world.fake
    state: dict[str, tuple[str, str | None]] = {"w-eu": ("eu", "s-eu"), "w-us": ("us", "s-us")}
    for name, region, ref in changes:
        obj = widget(name, region=region, secret=ref)
        if fake.get(cluster="c1", namespace="ns1", name=name) is None:
            fake.create(cluster="c1", obj=obj)
        else:
            fake.update(cluster="c1", obj=obj)
        state[name] = (region, ref)
    existing = {"s-eu", "s-us", "s-free"}
    want = {ref for region, ref in state.values() if region == "eu" and ref in existing}
    for _ in range(100):
        if await listed(world, "eu") == want:
            break
        await asyncio.sleep(0.05)
    assert await listed(world, "eu") == want
    # back to the seed for the next example
    for name in list(state):
        if name not in ("w-eu", "w-us"):
            fake.delete(cluster="c1", namespace="ns1", name=name)
    fake.update(cluster="c1", obj=widget("w-eu", region="eu", secret="s-eu"))
    fake.update(cluster="c1", obj=widget("w-us", region="us", secret="s-us"))


async def test_deletecollection_deletes_only_what_the_slice_shows(world: CachedProxy) -> None:
    fake = world.fake
    url = f"{core(world, 'eu')}/namespaces/ns1/secrets"
    async with world.session.delete(url) as r:
        body = await r.json()
        assert r.status == 200, body
    assert [i["metadata"]["name"] for i in body["items"]] == ["s-eu"]
    left = {
        n
        for n in ("s-eu", "s-us", "s-free")
        if fake.get(cluster="c1", namespace="ns1", name=n, resource="secrets") is not None
    }
    assert left == {"s-us", "s-free"}
    async with world.session.delete(f"{core(world, 'none')}/namespaces/ns1/secrets") as r:
        assert r.status == 200 and (await r.json())["items"] == []
    assert fake.get(cluster="c1", namespace="ns1", name="s-us", resource="secrets") is not None


async def test_a_secret_of_an_object_held_by_another_slice_stays_with_that_slice(
    world: CachedProxy,
) -> None:
    """Handoff: a widget relabelled from us to eu while the us slice still holds it (its
    finalizer, recorded in the holds annotation) is us's until us lets go — and so is the
    Secret it names: eu shows neither, us shows both."""
    fake = world.fake
    moved = widget("w-move", region="eu", secret="s-free")
    holder = slice_id(SLICE_CLUSTER, "us")
    moved["metadata"]["finalizers"] = ["example.io/cleanup"]
    moved["metadata"]["annotations"] = {
        HOLDS_ANNOTATION: json.dumps({holder: {"finalizers": ["example.io/cleanup"]}})
    }
    fake.create(cluster="c1", obj=moved)
    for _ in range(100):
        if await listed(world, "us") == {"s-us", "s-free"}:
            break
        await asyncio.sleep(0.05)
    assert await listed(world, "us") == {"s-us", "s-free"}
    assert await listed(world, "eu") == {"s-eu"}
    # us lets go (the hold ends): the widget and its Secret arrive in eu
    released = widget("w-move", region="eu", secret="s-free")
    fake.update(cluster="c1", obj=released)
    for _ in range(100):
        if await listed(world, "eu") == {"s-eu", "s-free"}:
            break
        await asyncio.sleep(0.05)
    assert await listed(world, "eu") == {"s-eu", "s-free"}
    assert await listed(world, "us") == {"s-us"}
