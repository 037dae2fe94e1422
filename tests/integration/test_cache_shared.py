"""The shared watch cache's engine (vwserver.cache.shared, .registry) against the fake APIExport
virtual workspace: one upstream list+watch on ``clusters/*`` feeds a store and any number of
subscriptions.

What is checked: the resource syncs and follows creates, updates and deletes; N subscriptions
are one upstream watch (the fake records every request); a subscription that does not read is
ended when its queue overflows while the others go on; a 410 upstream relists and ends every
subscription; bookmarks advance the resourceVersion consistent reads wait for; a subscription
from an older resourceVersion gets the window's changes, then live ones; the registry shares
resources, stops idle ones after ``idle_seconds`` of (fake) time and reports stats and metrics.

Every wait is bounded (``asyncio.timeout``); nothing asserts on elapsed time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from fakekcp.upstream import FakeUpstream, start_fake_upstream
from tests.support.clock import FakeClock, ManualClock
from vwserver.cache.entries import Change
from vwserver.cache.registry import CacheRegistry
from vwserver.cache.shared import Bookmark, SharedResource, Subscription
from vwserver.cache.store import Expired
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.metrics import ServerMetrics, upstream_name

WAIT = 10.0
API_PATH = "/apis/example.io/v1alpha1/widgets"


def widget(name: str, *, ns: str = "ns1", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": ns, "labels": dict(labels)},
        "spec": {"size": 1},
    }


@dataclass
class Env:
    fake: FakeUpstream
    vw: str
    client: KubeClient

    def resource(self, **options: Any) -> SharedResource:
        options.setdefault("clock", FakeClock())
        options.setdefault("backoff", Backoff(initial=0.01, maximum=0.05))
        return SharedResource(client=self.client, upstream=self.vw, api_path=API_PATH, **options)

    def watches(self) -> list[dict[str, str]]:
        return [
            r.query
            for r in self.fake.faults.requests
            if r.path.endswith("/widgets") and r.query.get("watch") == "true"
        ]

    def lists(self) -> list[dict[str, str]]:
        return [
            r.query
            for r in self.fake.faults.requests
            if r.path.endswith("/widgets") and r.query.get("watch") != "true"
        ]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    fake = FakeUpstream(bookmark_interval=0.1, history_size=5)
    async with start_fake_upstream(fake) as (_, vw), KubeClient(auth=ClientAuth(server=vw)) as c:
        for cluster in ("c1", "c2"):
            fake.create(cluster=cluster, obj=widget("w0", env="prod"))
            fake.create(cluster=cluster, obj=widget("w1", env="dev"))
        yield Env(fake, vw, c)


@contextlib.asynccontextmanager
async def running(resource: SharedResource) -> AsyncIterator[SharedResource]:
    resource.start()
    try:
        assert await resource.wait_synced(WAIT), resource.last_error
        yield resource
    finally:
        await resource.stop()


async def until(what: str, check: Callable[[], bool]) -> None:
    """Poll ``check`` (what the loop already recorded) for at most WAIT seconds."""
    try:
        async with asyncio.timeout(WAIT):
            while not check():  # noqa: ASYNC110 - polling state the event loop updates
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def take(subscription: Subscription, count: int) -> list[tuple[str, str, str]]:
    """The next ``count`` changes (bookmarks skipped): (type, cluster/name, env label)."""
    seen: list[tuple[str, str, str]] = []
    async with asyncio.timeout(WAIT):
        async for item in subscription:
            if isinstance(item, Bookmark):
                continue
            seen.append(describe(item))
            if len(seen) == count:
                break
    return seen


def describe(change: Change) -> tuple[str, str, str]:
    some = change.new or change.prev
    assert some is not None
    meta = some.meta
    return change.type, f"{meta.cluster}/{meta.name}", meta.labels.get("env", "")


def names(resource: SharedResource) -> list[str]:
    return [f"{e.meta.cluster}/{e.meta.name}" for e in resource.store.snapshot()]


async def test_syncs_and_follows_creates_updates_and_deletes(env: Env) -> None:
    async with running(env.resource()) as resource:
        assert names(resource) == ["c1/w0", "c1/w1", "c2/w0", "c2/w1"]
        assert resource.store.rv == env.fake.resource_version
        assert (resource.kind, resource.list_kind) == ("Widget", "WidgetList")
        assert resource.api_version == "example.io/v1alpha1"
        subscription = resource.subscribe(from_rv=resource.store.rv, queue_size=10)
        env.fake.create(cluster="c1", obj=widget("w2", env="prod"))
        moved = env.fake.get(cluster="c2", namespace="ns1", name="w0")
        assert moved is not None
        moved["metadata"]["labels"]["env"] = "dev"
        env.fake.update(cluster="c2", obj=moved)
        env.fake.delete(cluster="c1", namespace="ns1", name="w1")
        assert await take(subscription, 3) == [
            ("ADDED", "c1/w2", "prod"),
            ("MODIFIED", "c2/w0", "dev"),
            ("DELETED", "c1/w1", "dev"),
        ]
        assert names(resource) == ["c1/w0", "c1/w2", "c2/w0", "c2/w1"]
        stored = resource.store.get(("c2", "ns1", "w0"))
        assert stored is not None and stored.meta.labels == {"env": "dev"}
        same = resource.store.get(("c2", "ns1", "w1"))
        assert same is not None and same.meta.labels is stored.meta.labels  # decoded once, shared
        assert resource.store.rv == env.fake.resource_version
        subscription.close()
        assert subscription.ended == "closed" and resource.subscribers == 0


async def test_many_subscriptions_are_one_upstream_watch(env: Env) -> None:
    async with running(env.resource()) as resource:
        start = resource.store.rv
        subscriptions = [resource.subscribe(from_rv=start, queue_size=10) for _ in range(50)]
        readers = [asyncio.create_task(take(s, 2)) for s in subscriptions]
        env.fake.create(cluster="c1", obj=widget("a", env="prod"))
        env.fake.create(cluster="c2", obj=widget("b", env="dev"))
        results = await asyncio.gather(*readers)
        assert all(r == [("ADDED", "c1/a", "prod"), ("ADDED", "c2/b", "dev")] for r in results)
        assert len(env.lists()) == 1
        assert len(env.watches()) == 1
        watch = env.watches()[0]
        assert "labelSelector" not in watch and "fieldSelector" not in watch
        assert watch["allowWatchBookmarks"] == "true"
        assert resource.subscribers == 50


async def test_a_subscriber_that_falls_behind_is_ended_and_the_others_go_on(env: Env) -> None:
    metrics = ServerMetrics()
    async with running(env.resource(metrics=metrics)) as resource:
        start = resource.store.rv
        slow = resource.subscribe(from_rv=start, queue_size=2)  # never read
        fast = resource.subscribe(from_rv=start, queue_size=2)
        reader = asyncio.create_task(take(fast, 5))
        for i in range(5):
            env.fake.create(cluster="c1", obj=widget(f"n{i}", env="prod"))
            stored = 5 + i

            def read(stored: int = stored) -> bool:
                return fast.depth == 0 and len(resource.store) == stored

            await until(f"n{i} read", read)
        assert [name for _, name, _ in await reader] == [f"c1/n{i}" for i in range(5)]
        assert slow.overflowed and slow.ended == "overflowed" and fast.ended is None
        assert [item async for item in slow] == []  # ended: nothing more, at once
        assert resource.subscribers == 1 and slow.max_depth == 2
        sample = metrics.registry.get_sample_value(
            "vwserver_cache_watch_terminations_total",
            {**upstream_name(resource.url).labels(), "reason": "overflowed"},
        )
        assert sample == 1


async def test_a_410_upstream_relists_and_ends_every_subscription(env: Env) -> None:
    metrics = ServerMetrics()
    async with running(env.resource(metrics=metrics)) as resource:
        subscription = resource.subscribe(from_rv=resource.store.rv, queue_size=100)
        # kcp goes away: the watch breaks, every request fails for a while ...
        env.fake.faults.die_mid_watch_after = 0
        env.fake.faults.status_code = 503
        env.fake.create(cluster="c1", obj=widget("lost", env="prod"))
        await until("a failed retry", lambda: resource.last_error is not None)
        assert subscription.ended is None  # an outage alone ends no watch
        # ... and meanwhile more changes than its history holds: the resourceVersion expires
        env.fake.delete(cluster="c1", namespace="ns1", name="w0")
        for i in range(6):
            env.fake.create(cluster="c2", obj=widget(f"x{i}", env="dev"))
        env.fake.faults.reset()
        await until("relisted", lambda: subscription.ended is not None)
        assert subscription.relisted
        await until("caught up", lambda: resource.store.rv == env.fake.resource_version)
        assert "c1/w0" not in names(resource) and "c1/lost" in names(resource)
        assert "c2/x5" in names(resource)
        assert resource.store.oldest_rv == resource.store.rv  # the window starts over
        gone = metrics.registry.get_sample_value(
            "vwserver_cache_reflector_restarts_total",
            {**upstream_name(resource.url).labels(), "cause": "gone"},
        )
        assert gone == 1
        relisted = metrics.registry.get_sample_value(
            "vwserver_cache_watch_terminations_total",
            {**upstream_name(resource.url).labels(), "reason": "relisted"},
        )
        assert relisted == 1
        # after the relist it follows again
        after = resource.subscribe(from_rv=resource.store.rv, queue_size=10)
        env.fake.create(cluster="c1", obj=widget("again", env="prod"))
        assert await take(after, 1) == [("ADDED", "c1/again", "prod")]


async def test_bookmarks_advance_the_version_consistent_reads_wait_for(env: Env) -> None:
    async with running(env.resource()) as resource:
        subscription = resource.subscribe(from_rv=resource.store.rv, queue_size=10)
        env.fake.bind(cluster="c9")  # another resource moves the shard's resourceVersion
        target = env.fake.resource_version
        assert target > resource.store.rv
        assert await resource.wait_for(target, timeout=WAIT)
        async with asyncio.timeout(WAIT):
            bookmark = await anext(subscription)
        assert isinstance(bookmark, Bookmark) and bookmark.rv >= target
        assert not await resource.wait_for(target + 1000, timeout=0.05)
        # a bookmark that only confirms the last change still reaches the subscriber (which
        # may have filtered that change out): its progress
        env.fake.create(cluster="c1", obj=widget("w9", env="dev"))
        async with asyncio.timeout(WAIT):
            change = await anext(subscription)
            while isinstance(change, Bookmark):  # the periodic ones before the change
                assert change.rv == target
                change = await anext(subscription)
            assert change.rv == env.fake.resource_version
            confirmed = await anext(subscription)
        assert confirmed == Bookmark(change.rv)


async def test_a_subscription_from_an_older_version_gets_the_window_then_live_changes(
    env: Env,
) -> None:
    async with running(env.resource(window=3)) as resource:
        listed = resource.store.rv
        for i in range(2):
            env.fake.create(cluster="c1", obj=widget(f"p{i}", env="prod"))
        await until("both", lambda: len(resource.store) == 6)
        subscription = resource.subscribe(from_rv=listed, queue_size=10)
        env.fake.create(cluster="c2", obj=widget("live", env="dev"))
        assert await take(subscription, 3) == [
            ("ADDED", "c1/p0", "prod"),
            ("ADDED", "c1/p1", "prod"),
            ("ADDED", "c2/live", "dev"),
        ]
        for i in range(3):
            env.fake.create(cluster="c1", obj=widget(f"q{i}", env="prod"))
        await until("q2", lambda: len(resource.store) == 10)
        with pytest.raises(Expired):
            resource.subscribe(from_rv=listed, queue_size=10)  # the window moved on
        assert resource.subscribers == 1


async def test_stopping_ends_every_subscription(env: Env) -> None:
    resource = env.resource()
    async with running(resource):
        subscription = resource.subscribe(from_rv=resource.store.rv, queue_size=10)
        reader = asyncio.create_task(take(subscription, 1))
        await asyncio.sleep(0)
    assert await reader == []
    assert subscription.stopped and resource.stopped
    assert resource.subscribe(from_rv=0, queue_size=1).stopped
    await until("the upstream watch closed", lambda: env.fake.active_watches == 0)


# --- the registry ---------------------------------------------------------------------------------


async def test_the_registry_shares_resources_and_stops_idle_ones(env: Env) -> None:
    clock = ManualClock()
    metrics = ServerMetrics()
    registry = CacheRegistry(client=env.client, clock=clock, idle_seconds=300, metrics=metrics)
    try:
        first = await registry.acquire(upstream=env.vw, api_path=API_PATH)
        second = await registry.acquire(upstream=env.vw + "/", api_path=API_PATH)
        assert first is second and first.users == 2 and len(registry) == 1
        assert await first.wait_synced(WAIT)
        [stats] = registry.stats()
        assert stats["url"] == f"{env.vw}/clusters/*{API_PATH}"
        assert (stats["objects"], stats["synced"], stats["users"]) == (4, True, 2)
        assert stats["rv"] == env.fake.resource_version and stats["last_error"] is None
        text = metrics.render().decode()
        shown = upstream_name(first.url)
        assert (
            f'vwserver_cache_objects{{resource="{shown.path}",shard="{shown.shard}"}} 4.0' in text
        )
        assert env.vw.split("/")[2] not in text  # no kcp host:port in /metrics
        registry.release(first)
        registry.release(second)
        assert first.idle
        await clock.advance(299)
        assert not first.stopped and len(registry) == 1
        # used again within the idle period: the period starts over when it is released again
        third = await registry.acquire(upstream=env.vw, api_path=API_PATH)
        assert third is first
        await clock.advance(100)
        subscription = third.subscribe(from_rv=third.store.rv, queue_size=10)
        registry.release(third)  # a subscription still runs: not idle
        await clock.advance(1000)
        assert not third.stopped and len(registry) == 1
        subscription.close()  # the last user is gone: the idle period starts
        await clock.advance(299)
        assert not third.stopped
        await clock.advance(2)
        await until("stopped", lambda: third.stopped)
        assert len(registry) == 0 and registry.stats() == []
        await until("the upstream watch closed", lambda: env.fake.active_watches == 0)
        # the next client starts a new one
        fresh = await registry.acquire(upstream=env.vw, api_path=API_PATH)
        assert fresh is not first and await fresh.wait_synced(WAIT)
        with pytest.raises(RuntimeError):
            registry.release(first)  # released more often than acquired
    finally:
        await registry.aclose()
    assert fresh.stopped and len(registry) == 0


async def test_the_registry_keeps_resources_apart(env: Env) -> None:
    registry = CacheRegistry(client=env.client, clock=FakeClock())
    try:
        widgets = await registry.acquire(upstream=env.vw, api_path=API_PATH)
        bindings = await registry.acquire(
            upstream=env.vw, api_path="/apis/apis.kcp.io/v1alpha2/apibindings"
        )
        assert widgets is not bindings
        assert await widgets.wait_synced(WAIT) and await bindings.wait_synced(WAIT)
        assert {e.meta.name for e in bindings.store.snapshot()} == {"widgets.example.io"}
        assert sorted(s["objects"] for s in registry.stats()) == [2, 4]
    finally:
        await registry.aclose()
    with pytest.raises(RuntimeError):
        await registry.acquire(upstream=env.vw, api_path=API_PATH)


async def test_a_first_list_still_running_is_kept_when_its_reader_gives_up(env: Env) -> None:
    """A large collection's first list can take longer than a reader waits for it (the reader
    then gets kcp's answer): the resource keeps listing, and the next reader finds it synced —
    only one whose list failed (a resource the upstream does not serve) is dropped at once."""
    registry = CacheRegistry(client=env.client, clock=ManualClock(), idle_seconds=300)
    env.fake.faults.delay = 0.5
    try:
        first = await registry.acquire(upstream=env.vw, api_path=API_PATH)
        assert not await first.wait_synced(0.05)  # the reader gives up
        registry.release(first)
        env.fake.faults.delay = 0
        assert await first.wait_synced(WAIT)
        assert not first.stopped and len(registry) == 1
        again = await registry.acquire(upstream=env.vw, api_path=API_PATH)
        assert again is first and again.synced
        registry.release(again)
        unserved = await registry.acquire(
            upstream=env.vw, api_path="/apis/example.io/v1alpha1/nope"
        )
        assert not await unserved.wait_synced(WAIT)  # the list failed: no waiting out retries
        registry.release(unserved)
        await until("the unserved resource dropped", lambda: unserved.stopped)
        assert len(registry) == 1
    finally:
        await registry.aclose()
