"""The one list+watch loop (vwserver.k8s.reflector) and its cache, rule by rule, against a
scripted API server: paged list, watch from the list's resourceVersion, resume after a watch ends,
bookmarks, 410 relists, backoff with jitter, the idle timeout, garbage on the stream.

Each request to the scripted collection takes the next scripted answer (the last one repeats), so
a test says exactly what the server does and then checks what the reflector asked and reported.
Backoff sleeps go through a FakeClock (instant, recorded). tests/integration/test_reflector.py
runs the same loop against the fake APIExport virtual workspace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from tests.support.clock import FakeClock
from tests.support.serve import serve_app
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.cache import Cache
from vwserver.k8s.client import JSON, KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.k8s.reflector import Reflector

WAIT = 5.0
PATH = "/apis/example.io/v1/widgets"


def obj(name: str, rv: str) -> JSON:
    return {"metadata": {"name": name, "resourceVersion": rv}}


def page(*items: JSON, rv: str = "", cont: str = "") -> web.Response:
    meta = {"resourceVersion": rv, **({"continue": cont} if cont else {})}
    return web.json_response({"kind": "WidgetList", "metadata": meta, "items": list(items)})


def status(code: int, reason: str) -> web.Response:
    body = {
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": reason,
    }
    return web.json_response(body, status=code)


def event(kind: str, o: JSON) -> bytes:
    return json.dumps({"type": kind, "object": o}).encode() + b"\n"


@dataclass
class Stream:
    """A watch response: these lines, then the end (or, with ``hang``, silence)."""

    lines: list[bytes] = field(default_factory=list)
    hang: bool = False
    answer: bool = True  # False: not even the response headers (a stalled connection)


Answer = web.Response | Stream


class ScriptedServer:
    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[dict[str, str]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(dict(request.query))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, web.Response):
            return answer
        if not answer.answer:
            await asyncio.sleep(3600)
        response = web.StreamResponse()
        await response.prepare(request)
        for line in answer.lines:
            await response.write(line)
        if answer.hang:
            await asyncio.sleep(3600)
        return response

    def watches(self) -> list[dict[str, str]]:
        return [q for q in self.requests if q.get("watch") == "true"]

    def lists(self) -> list[dict[str, str]]:
        return [q for q in self.requests if q.get("watch") != "true"]


class Recorder:
    """A ReflectorHandler that writes down every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_list(self, items: list[JSON], resource_version: str) -> None:
        self.calls.append(("list", [i["metadata"]["name"] for i in items], resource_version))

    def on_event(self, kind: str, obj: JSON) -> None:
        self.calls.append((kind, obj["metadata"]["name"]))

    def on_bookmark(self, resource_version: str) -> None:
        self.calls.append(("bookmark", resource_version))


@dataclass
class Running:
    server: ScriptedServer
    reflector: Reflector[Recorder]
    clock: FakeClock
    restarts: list[str]

    @property
    def calls(self) -> list[tuple[Any, ...]]:
        return self.reflector.handler.calls

    async def until(self, what: str, check: Callable[[], bool]) -> None:
        async with asyncio.timeout(WAIT):
            while not check():  # noqa: ASYNC110 - polling what the loop recorded
                await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def running(*answers: Answer, **options: Any) -> AsyncIterator[Running]:
    server = ScriptedServer(*answers)
    app = web.Application()
    app.router.add_get(PATH, server.handle)
    clock, restarts = FakeClock(), []
    options.setdefault("backoff", Backoff(initial=1, maximum=8, rand=lambda: 1.0))
    async with serve_app(app) as base, KubeClient(auth=ClientAuth(server=base)) as client:
        reflector = Reflector(
            name="widgets",
            client=client,
            url=base + PATH,
            handler=Recorder(),
            clock=clock,
            on_restart=restarts.append,
            rand=lambda: 0.0,
            **options,
        )
        task = asyncio.create_task(reflector.run())
        try:
            yield Running(server, reflector, clock, restarts)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_lists_in_pages_then_watches_from_the_lists_version() -> None:
    async with running(
        page(obj("a", "3"), obj("b", "4"), cont="t1"),
        page(obj("c", "7"), rv="10"),
        Stream([event("ADDED", obj("d", "11"))], hang=True),
        page_size=2,
        label_selector="env=prod",
        field_selector="metadata.name!=x",
    ) as r:
        await r.until("the event", lambda: ("ADDED", "d") in r.calls)
        assert r.reflector.synced.is_set()
        assert r.calls == [("list", ["a", "b", "c"], "10"), ("ADDED", "d")]
        first, second, watch = r.server.requests
        selectors = {"labelSelector": "env=prod", "fieldSelector": "metadata.name!=x"}
        assert first == {**selectors, "limit": "2"}
        assert second == {**selectors, "limit": "2", "continue": "t1"}
        assert watch == {
            **selectors,
            "watch": "true",
            "resourceVersion": "10",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "300",  # watch_timeout * (1 + rand), rand = 0 here
        }
        assert r.reflector.resource_version == "11"


async def test_an_ended_watch_resumes_from_the_last_event_or_bookmark() -> None:
    async with running(
        page(rv="5"),
        Stream([event("MODIFIED", obj("x", "6")), event("BOOKMARK", obj("", "9"))]),
        Stream([event("DELETED", obj("x", "12"))]),
        Stream(hang=True),
    ) as r:
        await r.until("third watch", lambda: len(r.server.watches()) == 3)
        assert [w["resourceVersion"] for w in r.server.watches()] == ["5", "9", "12"]
        assert len(r.server.lists()) == 1  # never relisted
        assert r.calls == [
            ("list", [], "5"),
            ("MODIFIED", "x"),
            ("bookmark", "9"),
            ("DELETED", "x"),
        ]
        assert r.clock.sleeps == []  # watches that delivered events are resumed at once


@pytest.mark.parametrize(
    "gone",
    [
        Stream([event("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"})]),
        status(410, "Expired"),  # the watch request itself refused
    ],
    ids=["error-event", "status"],
)
async def test_gone_relists_at_once(gone: Answer) -> None:
    async with running(
        page(obj("a", "3"), rv="5"),
        gone,
        page(obj("b", "8"), rv="20"),
        Stream(hang=True),
    ) as r:
        await r.until("relist and watch", lambda: len(r.server.watches()) == 2)
        assert r.calls == [("list", ["a"], "5"), ("list", ["b"], "20")]
        assert [w["resourceVersion"] for w in r.server.watches()] == ["5", "20"]
        assert r.restarts == ["gone"]
        assert r.clock.sleeps == []
        assert r.reflector.last_error is None


async def test_an_expired_continue_token_relists_from_the_start_with_backoff() -> None:
    async with running(
        page(obj("a", "3"), cont="t1"),
        status(410, "Expired"),
        page(obj("a", "3"), obj("b", "4"), rv="9"),
        Stream(hang=True),
    ) as r:
        await r.until("the watch", lambda: len(r.server.watches()) == 1)
        assert [q.get("continue") for q in r.server.lists()] == [None, "t1", None]
        assert r.calls == [("list", ["a", "b"], "9")]  # never half a list
        assert r.clock.sleeps == [1]  # a list that is Gone again and again must not spin


async def test_failures_back_off_exponentially_and_the_watch_resumes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running(
        page(rv="5"),
        status(503, "ServiceUnavailable"),
        status(500, "InternalError"),
        status(403, "Forbidden"),
        status(429, "TooManyRequests"),
        status(503, "ServiceUnavailable"),
        Stream(hang=True),
    ) as r:
        await r.until("recovered", lambda: len(r.server.watches()) == 6)
        assert r.clock.sleeps == [1, 2, 4, 8, 8]  # rand = 1: the top of each jitter range
        assert r.restarts == ["error"] * 5
        assert [w["resourceVersion"] for w in r.server.watches()] == ["5"] * 6
        assert len(r.server.lists()) == 1
        assert "503" in caplog.text  # the failure, as a warning when it began
        # the last watch was answered: nothing fails now
        await r.until("no error", lambda: r.reflector.last_error is None)


async def test_jitter_spreads_each_delay_over_the_upper_half_of_its_ceiling() -> None:
    async with running(
        page(rv="5"),
        status(503, "ServiceUnavailable"),
        status(503, "ServiceUnavailable"),
        Stream(hang=True),
        backoff=Backoff(initial=1, maximum=8, rand=lambda: 0.0),
    ) as r:
        await r.until("recovered", lambda: len(r.server.watches()) == 3)
        assert r.clock.sleeps == [0.5, 1]


async def test_a_watch_that_ends_without_any_event_backs_off() -> None:
    async with running(page(rv="5"), Stream(), Stream(), Stream(hang=True)) as r:
        await r.until("third watch", lambda: len(r.server.watches()) == 3)
        assert r.clock.sleeps == [1, 2]  # a server closing every watch at once: no spinning
        assert r.restarts == []  # not an error


async def test_a_silent_watch_is_given_up_after_the_idle_timeout() -> None:
    async with running(
        page(rv="5"),
        Stream([event("ADDED", obj("a", "6"))], hang=True),  # then nothing, not even bookmarks
        Stream(hang=True),
        watch_timeout=0,
        idle_grace=0.3,
    ) as r:
        await r.until("second watch", lambda: len(r.server.watches()) == 2)
        assert r.server.watches()[1]["resourceVersion"] == "6"  # resumed, not relisted
        # the server had answered: a quiet stream is no error, and is resumed at once
        assert r.restarts == [] and r.reflector.last_error is None
        assert r.clock.sleeps == []


async def test_a_silent_watch_is_given_up_after_the_silence_limit_before_its_timeout() -> None:
    async with running(
        page(rv="5"),
        Stream(hang=True),  # asked for 300 s, silent from the start
        Stream(hang=True),
        silence_limit=0.3,
    ) as r:
        await r.until("second watch", lambda: len(r.server.watches()) == 2)
        assert [w["resourceVersion"] for w in r.server.watches()] == ["5", "5"]
        assert r.server.watches()[0]["timeoutSeconds"] == "300"
        assert r.restarts == [] and r.reflector.last_error is None
        assert len(r.server.lists()) == 1


async def test_a_watch_without_an_answer_is_an_unreachable_upstream(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running(
        page(rv="5"),
        Stream(answer=False),  # the connection stalls: not even response headers
        Stream([event("ADDED", obj("a", "6"))], hang=True),
        silence_limit=0.3,
    ) as r:
        await r.until("the error", lambda: r.restarts == ["error"])
        assert "no answer in 0.3s (retrying with backoff)" in caplog.text
        await r.until("second watch's event", lambda: ("ADDED", "a") in r.calls)
        assert r.clock.sleeps == [1]  # backed off once
        await r.until("recovered", lambda: r.reflector.last_error is None)


@pytest.mark.parametrize(
    "garbage",
    [
        b"not json\n",
        b"[1, 2]\n",
        event("SURPRISE", obj("a", "6")),
    ],
    ids=["undecodable", "not-an-event", "unknown-type"],
)
async def test_garbage_on_the_stream_is_an_error_then_the_watch_resumes(
    garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(page(rv="5"), Stream([garbage]), Stream(hang=True)) as r:
        await r.until("second watch", lambda: len(r.server.watches()) == 2)
        assert r.restarts == ["error"]
        assert "502" in caplog.text
        await r.until("no error", lambda: r.reflector.last_error is None)
        assert r.calls == [("list", [], "5")]


async def test_keepalive_lines_and_events_split_over_reads_are_framed() -> None:
    whole = event("ADDED", obj("a", "6"))
    async with running(
        page(rv="5"),
        Stream([b"\n", whole[:10], whole[10:] + b"\r\n", event("ADDED", obj("b", "7"))], hang=True),
    ) as r:
        await r.until("both events", lambda: len(r.calls) == 3)
        assert r.calls[1:] == [("ADDED", "a"), ("ADDED", "b")]


# --- the cache ----------------------------------------------------------------------------------


class Changes:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def on_upsert(self, obj: JSON) -> None:
        self.seen.append(("upsert", obj["metadata"]["name"], obj["metadata"]["resourceVersion"]))

    def on_delete(self, obj: JSON) -> None:
        self.seen.append(("delete", obj["metadata"]["name"], obj["metadata"]["resourceVersion"]))


def by_name(o: JSON) -> str | None:
    return o["metadata"]["name"] or None


def test_cache_diffs_a_relist_against_what_it_kept() -> None:
    changes = Changes()
    cache = Cache(key=by_name, handler=changes)
    cache.on_list([obj("a", "1"), obj("b", "2"), obj("c", "3")], "3")
    assert [c[1] for c in changes.seen] == ["a", "b", "c"]
    changes.seen.clear()
    # relist: a unchanged, b changed, c gone, d new
    cache.on_list([obj("a", "1"), obj("b", "5"), obj("d", "6")], "6")
    assert changes.seen == [("delete", "c", "3"), ("upsert", "b", "5"), ("upsert", "d", "6")]
    assert sorted(cache.objects) == ["a", "b", "d"]


def test_cache_follows_events_and_skips_keyless_objects() -> None:
    changes = Changes()
    cache = Cache(key=by_name, handler=changes)
    cache.on_event("ADDED", obj("a", "1"))
    cache.on_event("MODIFIED", obj("a", "2"))
    cache.on_event("ADDED", obj("", "3"))  # no key: not kept, not reported
    cache.on_bookmark("4")
    assert cache.get("a") == obj("a", "2")
    cache.on_event("DELETED", obj("a", "5"))
    assert cache.get("a") is None and len(cache) == 0
    assert changes.seen == [("upsert", "a", "1"), ("upsert", "a", "2"), ("delete", "a", "5")]
