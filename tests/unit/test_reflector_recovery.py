"""A reflector says it works again as soon as a watch delivers, not when that watch ends.

After a failure a reflector keeps why in ``last_error`` (``/readyz`` and ``/debug/cache`` show
it) and logs a warning. The watch that follows a recovered upstream stays open for minutes
(``timeoutSeconds`` is 300 to 600 s): if only its end cleared the error, every replica would
report an outage that is long over. So the first event of a watch — the upstream demonstrably
serving again — clears ``last_error`` and logs "working again", while the watch is still open.

Both reflector modes are checked (objects for the control loops, raw for the shared watch
cache), against the scripted API server of tests/unit/test_reflector.py: the watch after the
list is refused with a 503, the next one delivers one event and then stays silent and open.
The backoff after the failure waits on a ManualClock, so the failed state holds until the test
moves time on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import pytest
from aiohttp import web

from tests.support.clock import ManualClock
from tests.support.serve import serve_app
from tests.unit.test_reflector import PATH, ScriptedServer, Stream, event, obj, page, status
from vwserver.cache.entries import Entry, entry
from vwserver.clock import Clock
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.client import JSON, KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.k8s.reflector import RawReflector, Reflector

WAIT = 5.0
REFLECTOR_LOG = "vwserver.k8s.reflector"


class Loop(Protocol):
    """What the test reads of either reflector mode."""

    last_error: str | None

    async def run(self) -> None: ...


class Events:
    """A handler for both modes: the names of the objects events delivered, in order."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def on_list(self, items: list[Any], resource_version: str) -> None:
        pass

    def on_event(self, kind: str, item: JSON | Entry) -> None:
        self.names.append(item.meta.name if isinstance(item, Entry) else item["metadata"]["name"])

    def on_bookmark(self, resource_version: str) -> None:
        pass


Make = Callable[[KubeClient, str, Events, Clock], Loop]


def objects_mode(client: KubeClient, url: str, handler: Events, clock: Clock) -> Loop:
    return Reflector(
        name="widgets",
        client=client,
        url=url,
        handler=handler,
        clock=clock,
        backoff=Backoff(initial=1, maximum=8),
        rand=lambda: 0.0,
    )


def raw_mode(client: KubeClient, url: str, handler: Events, clock: Clock) -> Loop:
    return RawReflector(
        name="widgets",
        client=client,
        url=url,
        handler=handler,
        decode=entry,
        version=lambda e: e.meta.resource_version,
        clock=clock,
        backoff=Backoff(initial=1, maximum=8),
        rand=lambda: 0.0,
    )


@contextlib.asynccontextmanager
async def running(
    make: Make, server: ScriptedServer, clock: ManualClock
) -> AsyncIterator[tuple[Loop, Events]]:
    app = web.Application()
    app.router.add_get(PATH, server.handle)
    handler = Events()
    async with serve_app(app) as base, KubeClient(auth=ClientAuth(server=base)) as client:
        loop = make(client, base + PATH, handler, clock)
        task = asyncio.create_task(loop.run())
        try:
            yield loop, handler
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def until(what: str, check: Callable[[], bool]) -> None:
    try:
        async with asyncio.timeout(WAIT):
            while not check():  # noqa: ASYNC110 - polling what the loop recorded
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"not within {WAIT}s: {what}") from None


@pytest.mark.parametrize("make", [objects_mode, raw_mode], ids=["objects", "raw"])
async def test_the_first_event_of_a_watch_clears_the_error_while_the_watch_stays_open(
    make: Make, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=REFLECTOR_LOG)
    server = ScriptedServer(
        page(rv="5"),
        status(503, "ServiceUnavailable"),  # the first watch: the upstream fails
        Stream([event("ADDED", obj("a", "6"))], hang=True),  # then serves, and stays open
    )
    clock = ManualClock()
    async with running(make, server, clock) as (loop, handler):
        await until("the failed watch", lambda: bool(clock.deadlines))  # backing off
        failed = loop.last_error
        assert failed is not None and "503" in failed
        assert any("retrying with backoff" in r.getMessage() for r in caplog.records)

        await clock.advance(60)  # past the backoff: the next watch
        await until("the second watch's event", lambda: handler.names == ["a"])
        # The reflector takes the event before its handler does: no waiting from here on.
        assert loop.last_error is None
        assert any("working again" in r.getMessage() for r in caplog.records)
        assert len(server.watches()) == 2  # ... and that watch is still the open one
