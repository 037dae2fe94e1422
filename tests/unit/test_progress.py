"""Progress on demand (vwserver.k8s.progress): the pure decision as tables on fake time, and the
shared cache's reflector acting on it against the scripted API server of
tests/unit/test_reflector.py — a consistent read that found kcp ahead cuts the long watch, the
loop resumes from its last resourceVersion with short watches (nothing lost, nothing replayed,
no backoff), and returns to long watches when nobody asked for a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from tests.support.clock import FakeClock
from tests.support.serve import serve_app
from tests.unit.test_reflector import Answer, ScriptedServer, Stream, event, obj, page
from vwserver.cache.shared import SharedResource
from vwserver.k8s import progress
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.k8s.progress import PROGRESS_TIMEOUT, PROGRESS_WINDOW

WAIT = 5.0
API_PATH = "/apis/example.io/v1/widgets"

# --- the decision -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("until", "now", "expected"),
    [
        (progress.NEVER, 100.0, 100.0 + PROGRESS_WINDOW),  # first demand
        (130.0, 100.0, 160.0),  # a later demand extends the window
        (500.0, 100.0, 500.0),  # never shortens it
    ],
)
def test_a_demand_makes_watches_short_for_a_window(
    until: float, now: float, expected: float
) -> None:
    assert progress.demand(until, now=now) == expected


@pytest.mark.parametrize(
    ("now", "until", "long_timeout", "expected"),
    [
        (0.0, progress.NEVER, 417, 417),  # nobody asked: the loop's own jittered timeout
        (10.0, 60.0, 417, PROGRESS_TIMEOUT),  # inside the window: short
        (59.9, 60.0, 417, PROGRESS_TIMEOUT),
        (60.0, 60.0, 417, 417),  # the window is over
        (10.0, 60.0, 2, 2),  # a loop whose own timeout is shorter keeps it
    ],
)
def test_watch_timeout(now: float, until: float, long_timeout: int, expected: int) -> None:
    assert progress.watch_timeout(now=now, until=until, long_timeout=long_timeout) == expected


@pytest.mark.parametrize(
    ("now", "until", "watch_ends", "expected"),
    [
        (10.0, 70.0, None, False),  # no watch runs (listing, backing off): the next is short
        (10.0, 70.0, 310.0, True),  # a long watch: its pre-deadline bookmark is minutes away
        (10.0, 70.0, 10.0 + PROGRESS_TIMEOUT, False),  # a short one: it brings the bookmark
        (10.0, 70.0, 12.0, False),
        (80.0, 70.0, 310.0, False),  # nobody wants progress now
    ],
)
def test_cut(now: float, until: float, watch_ends: float | None, expected: bool) -> None:
    assert progress.cut(now=now, until=until, watch_ends=watch_ends) is expected


@pytest.mark.parametrize(
    ("lasted", "timeout", "expected"),
    [
        (0.0, 3, True),  # closed at once: a server that would make the loop spin
        (1.4, 3, True),
        (1.5, 3, False),
        (3.0, 3, False),  # a short watch that met its deadline on a quiet resource
        (299.0, 300, False),
    ],
)
def test_ended_early(lasted: float, timeout: int, expected: bool) -> None:
    assert progress.ended_early(lasted=lasted, timeout=timeout) is expected


# --- the shared cache's reflector ----------------------------------------------------------------


class TimedServer(ScriptedServer):
    """The scripted server, moving the (fake) clock on by ``during[n]`` seconds while its n-th
    request is served (0: the first list): a watch that lasts its timeout, a watch that runs
    past the progress window."""

    def __init__(self, *answers: Answer, clock: FakeClock, during: dict[int, float]) -> None:
        super().__init__(*answers)
        self.clock = clock
        self.during = during

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.clock.advance(self.during.get(len(self.requests), 0.0))
        return await super().handle(request)


@contextlib.asynccontextmanager
async def shared(
    *answers: Answer, during: dict[int, float] | None = None
) -> AsyncIterator[tuple[TimedServer, SharedResource, FakeClock]]:
    clock = FakeClock(start=1000.0)
    server = TimedServer(*answers, clock=clock, during=during or {})
    app = web.Application()
    app.router.add_get("/services/x/clusters/*" + API_PATH, server.handle)
    async with serve_app(app) as base, KubeClient(auth=ClientAuth(server=base)) as client:
        resource = SharedResource(
            client=client,
            clock=clock,
            upstream=base + "/services/x",
            api_path=API_PATH,
            backoff=Backoff(initial=1, maximum=8, rand=lambda: 1.0),
            rand=lambda: 0.0,
        )
        resource.start()
        try:
            yield server, resource, clock
        finally:
            await resource.stop()


def wanted(resource: SharedResource) -> bool:
    return resource.progress_wanted


def behind(resource: SharedResource) -> bool:
    return resource.behind_upstream


async def until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT):
        while not check():  # noqa: ASYNC110 - polling what the loop recorded
            await asyncio.sleep(0.005)


def watches(server: ScriptedServer) -> list[tuple[str, str]]:
    return [(q["resourceVersion"], q["timeoutSeconds"]) for q in server.watches()]


async def test_kcp_ahead_cuts_the_long_watch_and_resumes_short_from_the_last_version() -> None:
    async with shared(
        page(obj("a", "3"), rv="5"),
        Stream([event("ADDED", obj("b", "6"))], hang=True),  # a long watch, then silence
        # the short watch: the events the cut one had not delivered, kcp's pre-deadline
        # bookmark at its revision, and the end at the deadline
        Stream([event("MODIFIED", obj("b", "8")), event("BOOKMARK", obj("", "20"))]),
        Stream(hang=True),
        during={2: PROGRESS_WINDOW + 1},  # the short watch lasts past the window
    ) as (server, resource, clock):
        await until(lambda: resource.store.rv == 6)
        assert watches(server) == [("5", "300")]
        assert not wanted(resource)

        resource.upstream_at(6)  # kcp at the stream's version: nothing to ask for
        assert not wanted(resource)
        resource.upstream_at(20)  # a consistent read found kcp at 20
        assert behind(resource) and wanted(resource)

        await until(lambda: len(server.watches()) == 3)
        assert watches(server) == [("5", "300"), ("6", str(PROGRESS_TIMEOUT)), ("20", "300")]
        assert resource.store.rv == 20 and not behind(resource)
        assert [c.rv for c in resource.store.changes_since(5)] == [6, 8]
        assert len(server.lists()) == 1  # resumed, never relisted
        assert clock.sleeps == []  # no backoff for a cut watch


async def test_a_short_watch_that_met_its_deadline_on_a_quiet_resource_is_no_failure() -> None:
    async with shared(
        page(rv="5"),
        Stream(),  # short, empty: kcp had nothing beyond 5 (no bookmark), ended at 3 s
        Stream(),  # the same, but over at once: a server that closes every watch
        Stream(hang=True),
        during={1: PROGRESS_TIMEOUT},
    ) as (server, resource, clock):
        resource.upstream_at(9)  # before the first watch: it is short already
        await until(lambda: len(server.watches()) == 3)
        assert watches(server) == [("5", "3"), ("5", "3"), ("5", "3")]
        assert clock.sleeps == [1]  # only after the one that ended at once
