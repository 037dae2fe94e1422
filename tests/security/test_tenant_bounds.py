"""The slice controller's work for one tenant is bounded and its answers are no oracle (issue #22,
findings 3 and 6), against a scripted kcp that records every request the controller makes.

Fast companions of ``test_tenant_bounds_kcp.py``: here the exact requests are visible, so the
rules can be checked as rules — nothing of an export is read before its owner consented; the
requests for a missing and for an existing export are the same; a slice beyond a cap costs no
request; each workspace's reviews are budgeted; a slice in its export's own workspace is not
retired when a re-check fails.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.clock import FakeClock
from vwserver.controller import slices as slices_module
from vwserver.controller.slice_status import TOO_MANY_EXPORTS, TOO_MANY_SLICES
from vwserver.controller.slices import ControllerSettings, SliceController
from vwserver.errors import UpstreamUnavailable, api_error
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.cache import Cache
from vwserver.k8s.client import JSON, KubeClient
from vwserver.routes import Routes

PROVIDER = "providerid"
PROVIDER_PATH = "root:provider"
EXPORT = "widgets.example.io"
_PATH = re.compile(
    r"^/clusters/(?P<ws>[^/]+)/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/(?P<rest>.*)$"
)


class ScriptedKcp:
    """Just enough of kcp for the controller's reconcile: workspaces (path → ID), exports,
    grants; every request recorded as (method, path)."""

    connections = 0

    def __init__(self) -> None:
        self.workspaces = {PROVIDER_PATH: PROVIDER, PROVIDER: PROVIDER}
        self.exports = {(PROVIDER, EXPORT)}
        self.grants: set[tuple[str, str, str]] = set()
        """(export cluster, export name, slice cluster)"""
        self.requests: list[tuple[str, str]] = []
        self.down = False

    def _cluster(self, ws: str) -> str | None:
        return self.workspaces.get(ws, ws if ws in self.workspaces.values() else None)

    async def get(self, path: str) -> JSON | None:
        self.requests.append(("GET", path))
        if self.down:
            raise UpstreamUnavailable("kcp is down")
        m = _PATH.match(path)
        assert m is not None, path
        cluster = self._cluster(m["ws"])
        kind, _, name = m["rest"].partition("/")
        if cluster is None:
            return None
        if kind == "logicalclusters":
            return {"metadata": {"annotations": {"kcp.io/cluster": cluster}}}
        if (cluster, name) not in self.exports:
            return None
        if kind == "apiexports":
            return {"metadata": {"name": name, "annotations": {"kcp.io/cluster": cluster}}}
        assert kind == "apiexportendpointslices", path
        url = f"https://kcp/services/apiexport/{cluster}/{name}"
        return {"status": {"endpoints": [{"url": url}]}}

    async def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> JSON:
        self.requests.append((method, path))
        if self.down:
            raise UpstreamUnavailable("kcp is down")
        m = _PATH.match(path)
        assert m is not None and m["rest"] == "subjectaccessreviews", path
        cluster = self._cluster(m["ws"])
        if cluster is None:
            raise api_error(404, {"reason": "NotFound", "message": "no such workspace"})
        attrs = body["spec"]["resourceAttributes"]
        slice_cluster = body["spec"]["user"].rpartition(":")[2]
        allowed = (cluster, attrs["name"], slice_cluster) in self.grants
        return {"status": {"allowed": allowed}}

    async def merge_patch(self, path: str, patch: JSON) -> JSON:
        self.requests.append(("PATCH", path))
        return {}

    def export_reads(self) -> list[str]:
        return [p for _, p in self.requests if "/apiexport" in p]


class _Shard:
    """Stands in for the controller's reflector of slices (only its cache is read)."""

    def __init__(self, handler: Cache[tuple[str, str]]) -> None:
        self.handler = handler
        self.last_error = None


def controller(
    kcp: ScriptedKcp, *, clock: FakeClock | None = None, **options: Any
) -> tuple[SliceController, Cache[tuple[str, str]]]:
    ctl = SliceController(
        client=cast(KubeClient, kcp),
        routes=Routes(),
        settings=ControllerSettings(
            export_path="root:vwserver",
            external_url="https://vw.example",
            resync=30,
            retry=Backoff(initial=3600, maximum=3600),
            **options,
        ),
        clock=clock or FakeClock(),
    )

    async def no_watch(ref: tuple[str, str]) -> None:
        await asyncio.Event().wait()  # the export's watches are not what is tested here

    ctl._watch_export = no_watch  # type: ignore[method-assign]
    cache: Cache[tuple[str, str]] = Cache(
        key=slices_module.slice_key, handler=slices_module._Enqueue(ctl._slice_changed)
    )
    # keyed by VW URL; "" keeps the status writes relative (/clusters/...) as the asserts expect
    ctl._slices = {"": _Shard(cache)}  # type: ignore[dict-item]
    return ctl, cache


def slice_obj(cluster: str, name: str, *, path: str, export: str, created: int = 0) -> JSON:
    return {
        "metadata": {
            "name": name,
            "generation": 1,
            "resourceVersion": "1",
            "creationTimestamp": f"2026-01-01T00:{created // 60:02d}:{created % 60:02d}Z",
            "annotations": {"kcp.io/cluster": cluster},
        },
        "spec": {
            "export": {"path": path, "name": export},
            "objectSelector": {"matchLabels": {"env": "prod"}},
        },
    }


def ready_reason(ctl: SliceController, key: tuple[str, str]) -> str | None:
    route = ctl._dynamic.get(key)
    assert route is not None
    return route.not_ready


def normalized(requests: list[tuple[str, str]], names: dict[str, str]) -> list[tuple[str, str]]:
    """``requests`` with each name replaced by its placeholder."""
    out = []
    for method, path in requests:
        for name, placeholder in names.items():
            path = path.replace(name, placeholder)
        out.append((method, path))
    return out


@pytest.fixture
def scripted() -> ScriptedKcp:
    return ScriptedKcp()


async def test_nothing_of_an_export_is_read_before_consent_and_missing_looks_like_existing(
    scripted: ScriptedKcp,
) -> None:
    ctl, cache = controller(scripted)
    answers = {}
    requests = {}
    for name, (path, export) in {
        "existing": (PROVIDER_PATH, EXPORT),
        "missing": (PROVIDER_PATH, "nope.example.io"),
        "existing-id": (PROVIDER, EXPORT),
        "missing-id": (PROVIDER, "nope.example.io"),
        "no-workspace": ("root:nope", EXPORT),
        "no-workspace-id": ("nopeid", EXPORT),
    }.items():
        cache.on_event("ADDED", slice_obj("eve", name, path=path, export=export))
        scripted.requests.clear()
        assert await ctl.reconcile(("eve", name)) is False
        # (the review goes to the workspace's ID where it resolves, else to the path named)
        placeholders = {name: "<slice>", path: "<ws>", export: "<export>", PROVIDER: "<ws>"}
        requests[name] = normalized(scripted.requests, placeholders)
        answers[name] = ready_reason(ctl, ("eve", name))
        assert "/apiexport" not in str(scripted.requests)  # nothing of the export read
        assert answers[name] is not None
        answers[name] = answers[name].replace(path, "<path>").replace(export, "<export>")
    assert len(set(answers.values())) == 1, answers
    # the same requests, in the same order, for a missing and an existing export
    assert requests["missing"] == requests["existing"]
    assert requests["missing-id"] == requests["existing-id"]
    assert requests["no-workspace"] == requests["existing"]
    assert ctl.followed_exports() == set()

    scripted.grants.add((PROVIDER, EXPORT, "eve"))
    assert await ctl.reconcile(("eve", "existing")) is True
    assert scripted.export_reads()  # read once consented
    assert ctl.followed_exports() == {(PROVIDER_PATH, EXPORT)}
    await ctl.aclose()


async def test_after_consent_a_missing_export_may_be_named(scripted: ScriptedKcp) -> None:
    ctl, cache = controller(scripted)
    scripted.grants.add((PROVIDER, "nope.example.io", "eve"))
    cache.on_event("ADDED", slice_obj("eve", "s", path=PROVIDER_PATH, export="nope.example.io"))
    await ctl.reconcile(("eve", "s"))
    assert "not found" in (ready_reason(ctl, ("eve", "s")) or "")
    await ctl.aclose()


async def test_a_slice_in_its_exports_workspace_by_path_is_implied_and_followed(
    scripted: ScriptedKcp,
) -> None:
    ctl, cache = controller(scripted)
    cache.on_event("ADDED", slice_obj(PROVIDER, "own", path=PROVIDER_PATH, export="gadgets"))
    await ctl.reconcile((PROVIDER, "own"))
    assert not [r for r in scripted.requests if "subjectaccessreviews" in r[1]]  # implied
    assert "not found" in (ready_reason(ctl, (PROVIDER, "own")) or "")  # its own: it may know
    assert ctl.followed_exports() == {(PROVIDER_PATH, "gadgets")}  # ready once it appears
    await ctl.aclose()


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    slices=st.lists(
        st.tuples(st.integers(0, 30), st.integers(0, 40)),  # (created second, export number)
        min_size=1,
        max_size=120,
    ),
    max_slices=st.integers(1, 60),
    max_exports=st.integers(1, 25),
)
async def test_only_the_oldest_slices_and_first_exports_of_a_workspace_cost_requests(
    slices: list[tuple[int, int]], max_slices: int, max_exports: int
) -> None:
    scripted = ScriptedKcp()
    ctl, cache = controller(
        scripted,
        max_slices_per_workspace=max_slices,
        max_exports_per_workspace=max_exports,
        consent_reviews_per_second=1e9,
    )
    objs = [
        slice_obj("flood", f"s{i:03d}", path=f"root:x{e}", export=f"e{e}", created=t)
        for i, (t, e) in enumerate(slices)
    ]
    for obj in objs:
        cache.on_event("ADDED", obj)
    order = sorted(objs, key=lambda o: (o["metadata"]["creationTimestamp"], o["metadata"]["name"]))
    looked_at, refs = [], []
    for obj in order[:max_slices]:
        ref = obj["spec"]["export"]["path"]
        if ref not in refs and len(refs) < max_exports:
            refs.append(ref)
        if ref in refs:
            looked_at.append(obj["metadata"]["name"])
    for obj in objs:
        name = obj["metadata"]["name"]
        scripted.requests.clear()
        await ctl.reconcile(("flood", name))
        reason = ready_reason(ctl, ("flood", name)) or ""
        if name in looked_at:
            assert scripted.requests[:1] and scripted.requests[0][0] == "GET", name  # looked at
        else:
            # beyond a cap: its status write is all it costs
            assert [m for m, _ in scripted.requests] == ["PATCH"], (name, scripted.requests)
            assert "controller.maxSlicesPerWorkspace" in reason or (
                "controller.maxExportsPerWorkspace" in reason
            )
    await ctl.aclose()


async def test_deleting_a_slice_brings_the_next_one_in(scripted: ScriptedKcp) -> None:
    ctl, cache = controller(scripted, max_slices_per_workspace=2)
    objs = [
        slice_obj("flood", f"s{i}", path="root:nope", export=EXPORT, created=i) for i in range(3)
    ]
    for obj in objs:
        cache.on_event("ADDED", obj)
    assert ctl._over_cap(("flood", "s2")) is not None
    assert ctl._over_cap(("flood", "s2"))[0] == TOO_MANY_SLICES  # type: ignore[index]
    while len(ctl.queue):
        key = await ctl.queue.get()
        ctl.queue.done(key)
    cache.on_event("DELETED", objs[0])
    assert ctl._over_cap(("flood", "s2")) is None
    assert ("flood", "s2") in ctl.queue._dirty  # looked at again
    await ctl.aclose()


async def test_distinct_exports_beyond_the_cap_are_too_many_exports(scripted: ScriptedKcp) -> None:
    ctl, cache = controller(scripted, max_exports_per_workspace=1)
    cache.on_event("ADDED", slice_obj("w", "a", path="root:nope", export="e1", created=1))
    cache.on_event("ADDED", slice_obj("w", "b", path="root:nope", export="e2", created=2))
    cache.on_event("ADDED", slice_obj("w", "c", path="root:nope", export="e1", created=3))
    assert ctl._over_cap(("w", "a")) is None
    assert ctl._over_cap(("w", "c")) is None  # same export as a
    over = ctl._over_cap(("w", "b"))
    assert over is not None
    assert over[0] == TOO_MANY_EXPORTS
    await ctl.aclose()


async def test_each_workspace_has_its_own_review_budget(scripted: ScriptedKcp) -> None:
    clock = FakeClock()
    ctl, cache = controller(scripted, clock=clock, consent_reviews_per_second=1)  # burst 2
    for i in range(5):
        cache.on_event("ADDED", slice_obj("flood", f"s{i}", path="root:nope", export=EXPORT))
    cache.on_event("ADDED", slice_obj("other", "s", path="root:nope", export=EXPORT))
    for i in range(5):
        await ctl._process(("flood", f"s{i}"))
    reviews = [p for m, p in scripted.requests if m == "POST"]
    assert len(reviews) == 2  # the burst; the rest wait in the queue, no request made
    # the rest wait for the budget (a second), not for the retry backoff (an hour)
    assert sum(1 for due in ctl.queue._waiting.values() if due <= clock.t + 1) == 3
    await ctl._process(("other", "s"))  # another workspace is not held up
    assert len([p for m, p in scripted.requests if m == "POST"]) == 3
    await ctl.aclose()


async def test_an_implied_slice_is_not_retired_when_a_recheck_fails(scripted: ScriptedKcp) -> None:
    clock = FakeClock()
    ctl, cache = controller(scripted, clock=clock)
    scripted.grants.add((PROVIDER, EXPORT, "eve"))
    cache.on_event("ADDED", slice_obj(PROVIDER, "own", path=PROVIDER_PATH, export=EXPORT))
    cache.on_event("ADDED", slice_obj("eve", "granted", path=PROVIDER_PATH, export=EXPORT))
    for key in ((PROVIDER, "own"), ("eve", "granted")):
        await ctl._process(key)
        assert ready_reason(ctl, key) is None
    scripted.down = True
    clock.advance(31)  # beyond a resync since the last confirmation
    for key in ((PROVIDER, "own"), ("eve", "granted")):
        await ctl._process(key)
    assert ready_reason(ctl, (PROVIDER, "own")) is None  # implied: keeps serving
    assert "cannot re-check" in (
        ready_reason(ctl, ("eve", "granted")) or ""
    )  # a grant: fails closed
    await ctl.aclose()


async def test_a_providers_recheck_is_not_held_up_by_the_review_budget(
    scripted: ScriptedKcp,
) -> None:
    ctl, cache = controller(scripted, consent_reviews_per_second=1)
    cache.on_event("ADDED", slice_obj(PROVIDER, "own", path=PROVIDER_PATH, export=EXPORT))
    await ctl._process((PROVIDER, "own"))
    assert ready_reason(ctl, (PROVIDER, "own")) is None
    budget = ctl._review_budget(PROVIDER)
    while budget.take() == 0:
        pass  # spent
    assert await ctl.reconcile((PROVIDER, "own")) is True  # re-checked all the same
    await ctl.aclose()
