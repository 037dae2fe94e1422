"""The reflector's raw mode (vwserver.k8s.reflector.RawReflector), which feeds the shared watch
cache, against the scripted API server of tests/unit/test_reflector.py: objects reach the
handler decoded once by the caller's decoder (entries with their original bytes), the list's
kind and apiVersion are kept, bookmarks and the resume rv come from the raw events, an ERROR
410 relists, and an object the decoder refuses is garbage (an error, then the watch resumes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from tests.support.clock import FakeClock
from tests.support.serve import serve_app
from tests.unit.test_reflector import PATH, Answer, ScriptedServer, Stream, event, obj, page
from vwserver.cache.entries import Entry, entry
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.k8s.reflector import RawReflector

WAIT = 5.0


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_list(self, items: list[Entry], resource_version: str) -> None:
        self.calls.append(("list", [(i.meta.name, i.raw) for i in items], resource_version))

    def on_event(self, kind: str, item: Entry) -> None:
        self.calls.append((kind, item.meta.name, item.raw))

    def on_bookmark(self, resource_version: str) -> None:
        self.calls.append(("bookmark", resource_version))


@contextlib.asynccontextmanager
async def running(
    *answers: Answer,
) -> AsyncIterator[tuple[ScriptedServer, RawReflector[Entry], list[str]]]:
    server = ScriptedServer(*answers)
    app = web.Application()
    app.router.add_get(PATH, server.handle)
    restarts: list[str] = []
    async with serve_app(app) as base, KubeClient(auth=ClientAuth(server=base)) as client:
        reflector = RawReflector(
            name="raw",
            client=client,
            url=base + PATH,
            handler=Recorder(),
            decode=entry,
            version=lambda e: e.meta.resource_version,
            clock=FakeClock(),
            backoff=Backoff(initial=1, maximum=8, rand=lambda: 1.0),
            on_restart=restarts.append,
            rand=lambda: 0.0,
            page_size=1,
        )
        task = asyncio.create_task(reflector.run())
        try:
            yield server, reflector, restarts
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def calls(reflector: RawReflector[Entry]) -> list[tuple[Any, ...]]:
    handler = reflector.handler
    assert isinstance(handler, Recorder)
    return handler.calls


async def until(check: Any) -> None:
    async with asyncio.timeout(WAIT):
        while not check():  # noqa: ASYNC110 - polling what the loop recorded
            await asyncio.sleep(0.005)


def raw(o: dict[str, Any]) -> bytes:
    return json.dumps(o).encode()


async def test_objects_arrive_decoded_once_with_their_bytes() -> None:
    a, b, c = obj("a", "3"), obj("b", "4"), obj("c", "11")
    async with running(
        page(a, cont="t1"),
        page(b, rv="10"),
        Stream([event("ADDED", c), event("BOOKMARK", obj("", "15"))], hang=True),
    ) as (server, reflector, _):
        await until(lambda: ("bookmark", "15") in calls(reflector))
        assert calls(reflector) == [
            ("list", [("a", raw(a)), ("b", raw(b))], "10"),
            ("ADDED", "c", raw(c)),
            ("bookmark", "15"),
        ]
        assert reflector.list_kind == "WidgetList" and reflector.resource_version == "15"
        assert [q.get("continue") for q in server.lists()] == [None, "t1"]
        assert server.watches()[0]["resourceVersion"] == "10"


async def test_an_error_event_410_relists() -> None:
    async with running(
        page(obj("a", "3"), rv="5"),
        Stream([event("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"})]),
        page(obj("b", "8"), rv="20"),
        Stream(hang=True),
    ) as (server, reflector, restarts):
        await until(lambda: len(server.watches()) == 2)
        assert [c[0] for c in calls(reflector)] == ["list", "list"]
        assert restarts == ["gone"]
        assert server.watches()[1]["resourceVersion"] == "20"


async def test_an_object_the_decoder_refuses_is_garbage_then_the_watch_resumes() -> None:
    no_rv = {"metadata": {"name": "x"}}
    async with running(
        page(rv="5"),
        Stream([event("ADDED", obj("ok", "6")), event("ADDED", no_rv)]),
        Stream([b'{"type":"ADDED","object":[1]}\n']),  # an object that is no object
        Stream(hang=True),
    ) as (server, reflector, restarts):
        await until(lambda: len(server.watches()) == 3)
        assert restarts == ["error", "error"]
        await until(lambda: reflector.last_error is None)  # the third watch was answered
        assert [c[:2] for c in calls(reflector)][1:] == [("ADDED", "ok")]
        assert [w["resourceVersion"] for w in server.watches()] == ["5", "6", "6"]
