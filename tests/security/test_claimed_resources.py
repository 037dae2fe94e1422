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
* **Both read paths**: ``eu`` reads LIST/WATCH from the shared cache, ``eu-kcp`` (the same
  rules) from kcp; ``cm``/``cm-kcp`` show configmaps by one selector rule (pushed down to kcp).
  The existence oracle, the live references (JSON, Table, PartialObjectMetadata) and the race
  between a LIST and its WATCH (a reference change in between is not lost: it failed on both
  paths before the fix) run on both; from the cache a transition costs 0 upstream requests and
  a consistent LIST at most kcp's one ``limit=1`` freshness read.
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
from tests.security.test_existence_oracle import CASES, POM, Case, Target, ask, compare
from tests.support.cache import CachedProxy, cached_proxy
from vwserver.holds import HOLDS_ANNOTATION, slice_id
from vwserver.related import parse_rules
from vwserver.routes import Route, RouteTable
from vwserver.selector import Selector

SECRET = ResourceSpec(
    group="", version="v1", plural="secrets", kind="Secret", status_subresource=False
)
CONFIGMAP = ResourceSpec(
    group="", version="v1", plural="configmaps", kind="ConfigMap", status_subresource=False
)
CLAIMED = frozenset({("", "secrets"), ("", "configmaps")})
CM_RULES = parse_rules([{"resource": "configmaps", "selector": {"matchLabels": {"app": "db"}}}])
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
            # eu again, every read of a claimed resource from kcp (the pass-through)
            Route(
                cluster=SLICE_CLUSTER,
                name="eu-kcp",
                selector=Selector.parse("region=eu"),
                upstream_url=upstream,
                claimed=CLAIMED,
                related=RULES,
                cache=False,
            ),
            # configmaps by one label-selector rule, from the cache and from kcp
            *(
                Route(
                    cluster=SLICE_CLUSTER,
                    name=name,
                    selector=Selector.parse("region=eu"),
                    upstream_url=upstream,
                    claimed=CLAIMED,
                    related=CM_RULES,
                    cache=cache,
                )
                for name, cache in (("cm", True), ("cm-kcp", False))
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


def configmap(name: str, *, app: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "ns1", "labels": {"app": app}},
        "data": {"k": "v"},
    }


def seed(fake: FakeUpstream) -> None:
    for name in ("s-eu", "s-us", "s-free"):
        fake.create(cluster="c1", obj=secret(name))
    fake.create(cluster="c1", obj=configmap("cm-db", app="db"))
    fake.create(cluster="c1", obj=configmap("cm-web", app="web"))
    fake.create(cluster="c1", obj=widget("w-eu", region="eu", secret="s-eu"))
    fake.create(cluster="c1", obj=widget("w-us", region="us", secret="s-us"))


@pytest.fixture
async def world() -> AsyncIterator[CachedProxy]:
    async with cached_proxy(
        FakeUpstream(bookmark_interval=0.2, resources=[ResourceSpec(), SECRET, CONFIGMAP]),
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


HIDDEN = [
    # (slice, resource, an object it does not show, a name nothing has, of the same length)
    ("eu", "secrets", "s-us", "s-xx"),  # LIST/WATCH from the cache
    ("eu-kcp", "secrets", "s-us", "s-xx"),  # every read from kcp
    ("cm", "configmaps", "cm-web", "cm-xxx"),  # a selector rule, from the cache
    ("cm-kcp", "configmaps", "cm-web", "cm-xxx"),  # a selector rule pushed down to kcp
]


@pytest.mark.parametrize("hidden", HIDDEN, ids=[f"{h[0]}-{h[1]}" for h in HIDDEN])
@pytest.mark.parametrize("case", ORACLE_CASES, ids=[c.id for c in ORACLE_CASES])
async def test_a_secret_outside_the_slice_answers_like_a_missing_one(
    world: CachedProxy, case: Case, hidden: tuple[str, str, str, str]
) -> None:
    slice_name, resource, name, missing = hidden
    fake = world.fake
    stored = fake.get(cluster="c1", namespace="ns1", name=name, resource=resource)
    assert stored is not None
    target = Target(
        name=name,
        namespace="ns1",
        uid=stored["metadata"]["uid"],
        rv=stored["metadata"]["resourceVersion"],
        api_version="v1",
    )
    base = core(world, slice_name)
    foreign, absent = await asyncio.gather(
        ask(world.session, base, case, name, target, resource=resource),
        ask(world.session, base, case, missing, target, resource=resource),
    )
    problems = compare(case, foreign, absent, (name, missing))
    after = fake.get(cluster="c1", namespace="ns1", name=name, resource=resource)
    if after != stored:
        problems.append(f"the object outside the slice changed: {stored} -> {after}")
    assert not problems, "\n  ".join(problems)


async def list_rv(w: CachedProxy, slice_name: str = "eu") -> str:
    async with w.session.get(f"{core(w, slice_name)}/namespaces/ns1/secrets") as r:
        body = await r.json()
        assert r.status == 200, body
    return str(body["metadata"]["resourceVersion"])


async def events(
    w: CachedProxy,
    *,
    accept: str = "application/json",
    slice_name: str = "eu",
    rv: str | None = None,
    opened: bool = True,
) -> tuple[asyncio.Queue[tuple[str, str]], asyncio.Task[None]]:
    """A watch of ns1's secrets through the slice from ``rv`` (None: a LIST's, made first),
    its events as (type, name) in a queue; ``opened``: return once its response started."""
    url = f"{core(w, slice_name)}/namespaces/ns1/secrets"
    if rv is None:
        rv = await list_rv(w, slice_name)
    queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true"}
    started = asyncio.Event()

    async def read() -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with (
            aiohttp.ClientSession(timeout=timeout) as s,
            s.get(url, params=params, headers={"Accept": accept}) as r,
        ):
            assert r.status == 200
            started.set()
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
    if opened:
        await asyncio.wait_for(started.wait(), 20)
    return queue, task


async def next_event(queue: asyncio.Queue[tuple[str, str]]) -> tuple[str, str]:
    """The next event that is no BOOKMARK (within 20 s, bookmarks or not)."""
    async with asyncio.timeout(20):
        while True:
            event = await queue.get()
            if event[0] != "BOOKMARK":
                return event


@pytest.mark.parametrize("slice_name", ["eu", "eu-kcp"])
@pytest.mark.parametrize("accept", ["application/json", TABLE, POM])
async def test_watch_follows_references(world: CachedProxy, accept: str, slice_name: str) -> None:
    """From the cache (eu) and from kcp (eu-kcp), in every representation."""
    fake = world.fake
    queue, task = await events(world, accept=accept, slice_name=slice_name)
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


# --- the cache path, the race between a LIST and its WATCH, upstream work ------------------------


async def until_listed(w: CachedProxy, slice_name: str, want: set[str]) -> None:
    for _ in range(200):
        if await listed(w, slice_name) == want:
            return
        await asyncio.sleep(0.05)
    assert await listed(w, slice_name) == want


async def got_events(queue: asyncio.Queue[tuple[str, str]], count: int) -> set[tuple[str, str]]:
    return {await next_event(queue) for _ in range(count)}


@pytest.mark.parametrize("slice_name", ["eu", "eu-kcp"])
async def test_a_reference_change_between_the_list_and_the_watch_is_not_lost(
    world: CachedProxy, slice_name: str
) -> None:
    """The race an informer runs into (tests/e2e/test_syncer_related_kcp.py): it LISTs, a
    database starts naming a Secret that exists already, and only then does its WATCH from the
    LIST's resourceVersion start. The Secret has no change of its own for the watch to replay;
    the watch must still get its ADDED (and the DELETED of the Secret no longer named).
    Deterministic: the watch is opened only once the slice's index has made the change."""
    rv = await list_rv(world, slice_name)
    world.fake.update(cluster="c1", obj=widget("w-eu", region="eu", secret="s-free"))
    await until_listed(world, slice_name, {"s-free"})  # the index moved; no watch listened
    queue, task = await events(world, slice_name=slice_name, rv=rv)
    try:
        assert await got_events(queue, 2) == {("ADDED", "s-free"), ("DELETED", "s-eu")}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("slice_name", ["eu", "eu-kcp"])
async def test_a_secret_named_before_it_exists_arrives_when_it_is_created(
    world: CachedProxy, slice_name: str
) -> None:
    """The reference comes first, the Secret later (its transition found nothing in the cache
    to send): the Secret's own ADDED reaches the watch, decided with the index as it is then."""
    fake = world.fake
    queue, task = await events(world, slice_name=slice_name)
    try:
        fake.update(cluster="c1", obj=widget("w-eu", region="eu", secret="s-late"))
        assert await next_event(queue) == ("DELETED", "s-eu")
        fake.create(cluster="c1", obj=secret("s-late"))
        assert await next_event(queue) == ("ADDED", "s-late")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def secrets_requests(w: CachedProxy) -> list[str]:
    return [
        f"{r.method} {r.path}?{'&'.join(f'{k}={v}' for k, v in sorted(r.query.items()))}"
        for r in w.fake.faults.requests
    ]


@pytest.mark.parametrize("accept", ["application/json", TABLE, POM])
async def test_a_reference_transition_costs_no_upstream_request(
    world: CachedProxy, accept: str
) -> None:
    """From the cache, a transition's ADDED and DELETED carry the cache's version of the
    Secret: kcp is not asked anything (counted at the fake, which records every request)."""
    fake = world.fake
    queue, task = await events(world, accept=accept)
    try:
        fake.faults.requests.clear()
        for old, new in (("s-eu", "s-free"), ("s-free", "s-us"), ("s-us", "s-eu")):
            fake.update(cluster="c1", obj=widget("w-eu", region="eu", secret=new))
            assert await got_events(queue, 2) == {("ADDED", new), ("DELETED", old)}
        assert secrets_requests(world) == []  # 3 changes, 6 events, 0 upstream requests
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_claimed_list_from_the_cache_costs_the_freshness_read_at_most(
    world: CachedProxy,
) -> None:
    """A consistent LIST asks kcp one thing (its current resourceVersion, ``limit=1``); a
    LIST at resourceVersion 0 nothing; neither lists the Secrets of every consumer."""
    url = f"{core(world, 'eu')}/namespaces/ns1/secrets"
    await listed(world, "eu")  # the shared resource runs
    world.fake.faults.requests.clear()
    assert await listed(world, "eu") == {"s-eu"}
    asked = secrets_requests(world)
    assert len(asked) <= 1 and all("limit=1" in a for a in asked), asked
    world.fake.faults.requests.clear()
    async with world.session.get(url, params={"resourceVersion": "0"}) as r:
        assert r.status == 200
        assert [i["metadata"]["name"] for i in (await r.json())["items"]] == ["s-eu"]
    assert secrets_requests(world) == []


async def test_a_selector_rule_is_pushed_down_to_kcp(world: CachedProxy) -> None:
    """From kcp (cm-kcp), a resource whose only rule is a label selector is listed and
    watched with that selector: kcp sends only what the rule shows (one filtered request);
    a ``referencedBy`` rule cannot be said as a selector: nothing is pushed (eu-kcp). From
    the cache (cm) the same answers, and a label change is an ADDED."""
    fake = world.fake
    for name in ("cm", "cm-kcp"):
        url = f"{core(world, name)}/namespaces/ns1/configmaps"
        fake.faults.requests.clear()
        async with world.session.get(url) as r:
            body = await r.json()
            assert r.status == 200, body
        assert [i["metadata"]["name"] for i in body["items"]] == ["cm-db"]
        if name == "cm-kcp":
            lists = [r for r in fake.faults.requests if r.path.endswith("/configmaps")]
            assert len(lists) == 1 and lists[0].query.get("labelSelector") == "app=db", lists
    fake.faults.requests.clear()
    await listed(world, "eu-kcp")
    lists = [r for r in fake.faults.requests if r.path.endswith("/secrets")]
    assert lists and all("labelSelector" not in r.query for r in lists), lists


@pytest.mark.parametrize("slice_name", ["cm", "cm-kcp"])
async def test_a_selector_rule_watch_follows_labels(world: CachedProxy, slice_name: str) -> None:
    fake = world.fake
    url = f"{core(world, slice_name)}/namespaces/ns1/configmaps"
    async with world.session.get(url) as r:
        rv = (await r.json())["metadata"]["resourceVersion"]
    params = {"watch": "1", "resourceVersion": rv}
    async with world.session.get(url, params=params, timeout=aiohttp.ClientTimeout(20)) as r:
        assert r.status == 200
        fake.update(cluster="c1", obj=configmap("cm-web", app="db"))
        fake.update(cluster="c1", obj=configmap("cm-db", app="web"))
        seen: list[tuple[str, str]] = []
        async for line in r.content:
            event = json.loads(line)
            if event["type"] != "BOOKMARK":
                seen.append((event["type"], event["object"]["metadata"]["name"]))
            if len(seen) == 2:
                break
    assert seen == [("ADDED", "cm-web"), ("DELETED", "cm-db")]


async def test_a_watch_from_before_the_cache_window_is_told_to_relist(world: CachedProxy) -> None:
    """From the cache, a resourceVersion older than its window (and the slice's reference
    history) cannot be continued exactly: an ERROR event with 410 Expired, as the apiserver's
    watch cache answers; client-go relists."""
    url = f"{core(world, 'eu')}/namespaces/ns1/secrets"
    await listed(world, "eu")
    async with world.session.get(url, params={"watch": "1", "resourceVersion": "1"}) as r:
        assert r.status == 200
        lines = [json.loads(line) for line in (await r.read()).splitlines() if line.strip()]
    assert [(e["type"], e["object"]["code"]) for e in lines] == [("ERROR", 410)], lines
