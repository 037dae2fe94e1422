"""Every hold is bounded (issue 22, finding 11): a slice that sets no ``holdTimeoutSeconds``
holds a leaving object for :data:`~vwserver.holds.DEFAULT_HOLD_TIMEOUT_SECONDS`, then the
handoff loop ends the hold — on a fake clock, through the loop's own route lookup and scan."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

from tests.support.clock import FakeClock
from vwserver.cache.entries import entry
from vwserver.controller.handoff import Handoff, carried_out, decide
from vwserver.errors import UpstreamUnavailable
from vwserver.holds import (
    DEFAULT_HOLD_TIMEOUT_SECONDS,
    HOLDS_ANNOTATION,
    MAX_HOLD_TIMEOUT_SECONDS,
    holder_label,
)
from vwserver.metrics import ServerMetrics
from vwserver.routes import Route, Routes, RouteTable
from vwserver.selector import Selector

FIN = "a.example.io/cleanup"


class Recorder:
    """The loop's kcp client: records the patches it is asked to make."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, Any]] = []

    async def request(self, method: str, path: str, *, body: Any, content_type: str) -> Any:
        assert method == "PATCH"
        self.patches.append((path, body))
        return {}


def leaving_object(since: str) -> bytes:
    holds = {"ws/a": {"finalizers": [FIN], "leavingSince": since}}
    return json.dumps(
        {
            "metadata": {
                "name": "w",
                "namespace": "ns",
                "resourceVersion": "5",
                "labels": {"region": "b", holder_label("ws/a"): "true"},
                "annotations": {"kcp.io/cluster": "c1", HOLDS_ANNOTATION: json.dumps(holds)},
                "finalizers": [FIN],
            }
        }
    ).encode()


def loop(clock: FakeClock, raw: bytes, *, route: Route) -> tuple[Handoff, Any, Recorder]:
    client = Recorder()
    registry = SimpleNamespace(client=client)
    store = SimpleNamespace(snapshot=lambda: [entry(raw)])
    resource = SimpleNamespace(
        store=store,
        url="https://vw/x",
        api_path="/apis/example.io/v1alpha1/widgets",
        upstream="https://vw/x",
    )
    handoff = Handoff(registry=cast(Any, registry), routes=Routes(RouteTable([route])), clock=clock)
    return handoff, resource, client


def route_a(**kw: Any) -> Route:
    return Route(
        cluster="ws", name="a", selector=Selector.parse("region=a"), upstream_url="u", **kw
    )


async def test_a_slice_without_a_timeout_holds_for_the_default_bound() -> None:
    clock = FakeClock()
    since = clock.now().isoformat().replace("+00:00", "Z")
    assert route_a().hold_timeout == DEFAULT_HOLD_TIMEOUT_SECONDS == 3600
    clock.advance(DEFAULT_HOLD_TIMEOUT_SECONDS - 1)
    handoff, resource, client = loop(clock, leaving_object(since), route=route_a())
    await handoff.scan(resource)
    assert client.patches == []  # not yet: a second before the bound
    clock.advance(1)
    await handoff.scan(resource)
    ((path, ops),) = client.patches
    assert path.endswith("/clusters/c1/apis/example.io/v1alpha1/namespaces/ns/widgets/w")
    assert {"op": "replace", "path": "/metadata/finalizers", "value": []} in ops


async def test_a_slices_own_timeout_replaces_the_default() -> None:
    clock = FakeClock()
    since = clock.now().isoformat().replace("+00:00", "Z")
    clock.advance(61)
    handoff, resource, client = loop(clock, leaving_object(since), route=route_a(hold_timeout=60.0))
    await handoff.scan(resource)
    assert len(client.patches) == 1


def test_the_largest_timeout_is_decided_without_overflow() -> None:
    """A week (the maximum), or any value a stored object carries, never overflows the time
    arithmetic of the decision (a crash there would stop every slice's handoff)."""
    clock = FakeClock()
    since = clock.now().isoformat().replace("+00:00", "Z")
    annotations = {
        HOLDS_ANNOTATION: json.dumps({"ws/a": {"finalizers": [FIN], "leavingSince": since}})
    }
    selector = Selector.parse("region=a")
    for timeout, ends in ((MAX_HOLD_TIMEOUT_SECONDS, False), (1e300, False), (1.0, True)):
        decision = decide(
            labels={"region": "b"},
            annotations=annotations,
            finalizers=[FIN],
            selector_of=lambda sid: selector if sid == "ws/a" else None,
            timeout_of=lambda _sid, t=timeout: t,
            now=clock.now() + timedelta(days=1),
        )
        assert (decision is not None and decision.ended != []) == ends, timeout


class LostAnswers(Recorder):
    """A kcp that carries out each patch but whose answer never arrives (a client timeout);
    reads answer the object as it now is."""

    def __init__(self, after: dict[str, Any] | None) -> None:
        super().__init__()
        self.after = after

    async def request(self, method: str, path: str, *, body: Any, content_type: str) -> Any:
        await super().request(method, path, body=body, content_type=content_type)
        raise UpstreamUnavailable("kcp:6443 unreachable: TimeoutError()")

    async def get(self, path: str) -> dict[str, Any] | None:
        return self.after


async def test_an_ended_hold_whose_answer_was_lost_is_counted_once_read_back() -> None:
    """The write of an ended hold times out after kcp carried it out: the loop reads the
    object back and counts the hold (once) — the next scan finds nothing left to end. A write
    kcp did not make (the object read back unchanged) is not counted."""
    clock = FakeClock()
    since = clock.now().isoformat().replace("+00:00", "Z")
    clock.advance(61)
    ended = {"metadata": {"name": "w", "namespace": "ns", "resourceVersion": "6", "labels": {}}}
    for after, counted in ((ended, 1.0), (json.loads(leaving_object(since)), 0.0), (None, 0.0)):
        metrics = ServerMetrics()
        handoff, resource, _ = loop(clock, leaving_object(since), route=route_a(hold_timeout=60.0))
        client = LostAnswers(after)
        handoff._registry = cast(Any, SimpleNamespace(client=client))
        handoff._metrics = metrics
        await handoff.scan(resource)
        assert len(client.patches) == 1
        value = metrics.registry.get_sample_value(
            "vwserver_handoff_holds_ended_total", {"reason": "timeout"}
        )
        assert (value or 0.0) == counted, (after, value)


def test_carried_out_reads_the_decision_off_the_object() -> None:
    meta = entry(leaving_object("2026-01-01T00:00:00Z")).meta
    decision = decide(
        labels=meta.labels,
        annotations=meta.annotations,
        finalizers=meta.finalizers,
        selector_of=lambda sid: Selector.parse("region=a") if sid == "ws/a" else None,
        timeout_of=lambda _sid: 1.0,
        now=datetime(2026, 1, 2, tzinfo=UTC),
    )
    assert decision is not None and decision.ended
    done = {"metadata": {"resourceVersion": "6", "labels": {"region": "b"}}}
    assert carried_out(decision, before=meta, after=done)
    same_version = {"metadata": {**done["metadata"], "resourceVersion": "5"}}
    assert not carried_out(decision, before=meta, after=same_version)
    still_held = {"metadata": {**done["metadata"], "finalizers": [FIN]}}
    assert not carried_out(decision, before=meta, after=still_held)
    label_left = {"metadata": {**done["metadata"], "labels": {holder_label("ws/a"): "true"}}}
    assert not carried_out(decision, before=meta, after=label_left)


class Unreadable(LostAnswers):
    """As :class:`LostAnswers`, and kcp cannot be read either."""

    async def get(self, path: str) -> dict[str, Any] | None:
        raise UpstreamUnavailable("kcp:6443 unreachable: TimeoutError()")


async def test_an_unconfirmed_write_is_counted_from_the_next_version_the_cache_shows() -> None:
    clock = FakeClock()
    since = clock.now().isoformat().replace("+00:00", "Z")
    clock.advance(61)
    metrics = ServerMetrics()
    handoff, resource, _ = loop(clock, leaving_object(since), route=route_a(hold_timeout=60.0))
    client = Unreadable(None)
    handoff._registry = cast(Any, SimpleNamespace(client=client))
    handoff._metrics = metrics

    def ended() -> float:
        value = metrics.registry.get_sample_value(
            "vwserver_handoff_holds_ended_total", {"reason": "timeout"}
        )
        return value or 0.0

    await handoff.scan(resource)
    await handoff.scan(resource)  # the same version: no second write, nothing known yet
    assert len(client.patches) == 1 and ended() == 0.0
    made = json.loads(leaving_object(since))
    meta = made["metadata"]
    meta.update(resourceVersion="6", finalizers=[], labels={"region": "b"})
    del meta["annotations"][HOLDS_ANNOTATION]
    resource.store = SimpleNamespace(snapshot=lambda: [entry(json.dumps(made).encode())])
    await handoff.scan(resource)
    assert ended() == 1.0 and len(client.patches) == 1
    await handoff.scan(resource)
    assert ended() == 1.0
