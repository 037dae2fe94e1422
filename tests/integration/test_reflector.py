"""A reflector keeping a cache (what the syncer runs) against the fake APIExport VW: list, watch,
resume, relist on 410 (the relist diffed against the cache), backoff through a fake clock, and
label-selector DELETED events carrying the last content. tests/unit/test_reflector.py checks
each rule against a scripted server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

from fakekcp.upstream import FakeUpstream, start_fake_upstream
from tests.support.clock import FakeClock
from vwserver.k8s.cache import Cache
from vwserver.k8s.client import JSON, KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.k8s.reflector import Reflector
from vwserver.syncer.naming import ObjectKey, upstream_key

WAIT = 10.0


class Recorder:
    def __init__(self) -> None:
        self.upserts: list[JSON] = []
        self.deletes: list[JSON] = []

    def on_upsert(self, obj: JSON) -> None:
        self.upserts.append(obj)

    def on_delete(self, obj: JSON) -> None:
        self.deletes.append(obj)

    def names(self, which: str) -> set[str]:
        return {o["metadata"]["name"] for o in getattr(self, which)}


def widget(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": "ns", "labels": labels},
        "spec": {"size": 1},
    }


async def until(what: str, check: Any) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while True:
        if check():
            return
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest_asyncio.fixture
async def fake() -> AsyncIterator[tuple[FakeUpstream, KubeClient, str]]:
    async with (
        start_fake_upstream(FakeUpstream(history_size=3, bookmark_interval=0.2)) as (fake, url),
        KubeClient(auth=ClientAuth(server=url)) as client,
    ):
        yield fake, client, f"{url}/clusters/*/apis/example.io/v1alpha1/widgets"


async def test_resume_backoff_and_relist_after_410(
    fake: tuple[FakeUpstream, KubeClient, str],
) -> None:
    upstream, client, url = fake
    upstream.create(cluster="c1", obj=widget("w1"))
    clock, handler, restarts = FakeClock(), Recorder(), []
    reflector = Reflector(
        name="t", client=client, url=url, handler=Cache(key=upstream_key, handler=handler),
        clock=clock, on_restart=restarts.append,
    )  # fmt: skip
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(reflector.synced.wait(), WAIT)
        assert handler.names("upserts") == {"w1"}
        upstream.create(cluster="c1", obj=widget("w2"))
        await until("w2 watched", lambda: "w2" in handler.names("upserts"))
        # kcp goes away: the open watch breaks, every new request fails
        upstream.faults.status_code = 503
        upstream.faults.die_mid_watch_after = 0
        upstream.create(cluster="c2", obj=widget("w3"))
        await until("several retries", lambda: len(clock.sleeps) >= 5)
        assert reflector.last_error is not None and "503" in reflector.last_error
        assert not reflector.synced.is_set() or reflector.handler.objects  # the old cache is kept
        # backoff grows (full jitter keeps each delay within [ceiling/2, ceiling])
        assert clock.sleeps[4] > clock.sleeps[0]
        assert max(clock.sleeps) <= 30
        # meanwhile more changes than the history holds: the resourceVersion expires
        upstream.delete(cluster="c1", namespace="ns", name="w1")
        for i in range(4, 9):
            upstream.create(cluster="c2", obj=widget(f"w{i}"))
        upstream.faults.reset()
        await until("relisted", lambda: "gone" in restarts and "w8" in reflector_names(reflector))
        assert "w1" in handler.names("deletes")  # seen by diffing the relist with the cache
        assert reflector_names(reflector) == {"w2", "w3", "w4", "w5", "w6", "w7", "w8"}
        # and it keeps watching from the relist
        upstream.create(cluster="c1", obj=widget("w9"))
        await until("w9", lambda: "w9" in reflector_names(reflector))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def reflector_names(reflector: Reflector[Cache[ObjectKey]]) -> set[str]:
    return {o["metadata"]["name"] for o in reflector.handler.objects.values()}


async def test_label_selector_watch_reports_leaving_objects_with_last_content(
    fake: tuple[FakeUpstream, KubeClient, str],
) -> None:
    upstream, client, url = fake
    upstream.create(cluster="c1", obj=widget("w1", region="eu"))
    handler = Recorder()
    reflector = Reflector(
        name="eu", client=client, url=url, handler=Cache(key=upstream_key, handler=handler),
        clock=FakeClock(), label_selector="region=eu",
    )  # fmt: skip
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(reflector.synced.wait(), WAIT)
        moved = upstream.get(cluster="c1", namespace="ns", name="w1")
        assert moved is not None
        moved["metadata"]["labels"] = {"region": "us"}
        upstream.update(cluster="c1", obj=moved)
        await until("left the view", lambda: handler.deletes)
        assert handler.deletes[0]["metadata"]["labels"] == {"region": "eu"}  # previous content
        assert not reflector.handler.objects
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
