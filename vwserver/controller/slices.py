"""The slice controller: watches FilteredAPIExportEndpointSlices in every workspace that binds
vwserver's API, keeps their status true, and keeps the proxy's route table in step.

Where the slices come from: vwserver's own APIExport (``sync.edge-connect.eu`` in the workspace
the config names). Its APIExportEndpointSlice lists the export's virtual-workspace URL(s) — only
once some workspace binds the API — and a list/watch on ``clusters/*`` there sees every slice of
every binding workspace. Status is written back through the same virtual workspace.

Per slice, a reconcile resolves ``spec.export`` (a workspace path or a logical-cluster ID; empty
means the slice's own workspace) to the APIExport, asks whether the export's owner consents to
this slice's workspace (:mod:`vwserver.controller.consent`: implied in the export's own workspace,
else a SubjectAccessReview in the export's workspace, asked on every reconcile), reads the
export's endpoint slice, validates the selector, and derives status and route with the pure
:mod:`vwserver.controller.slice_status`. The loop is :mod:`vwserver.k8s`'s: reflectors feed a
:class:`~vwserver.k8s.queue.WorkQueue`, so reconciles of one slice never run concurrently (one
worker per key at a time), and every wait is on the injected :class:`~vwserver.clock.Clock`.
A slice that is not ready is retried with backoff (it becomes ready within a couple of seconds
of its export appearing, or of the grant); a ready one is re-checked every ``resync`` seconds,
which picks up a changed or vanished upstream URL and a revoked grant.
Routes change atomically (:meth:`vwserver.routes.Routes.replace`), and a deleted slice's route,
or a ready route replaced by a not-ready one, is retired, which ends its open watches. A ready
slice whose re-check fails stops serving once its last confirmation is a resync old (fail
closed: consent is never trusted longer than that).

Metrics: every reconcile is counted by its result, and the queue depth is read from the
queue when ``/metrics`` is scraped (a callback, so enqueueing costs nothing extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from vwserver.auth.reviews import post_review, review_allows
from vwserver.clock import Clock, SystemClock, rfc3339
from vwserver.controller import consent
from vwserver.controller.handoff import StuckHolds
from vwserver.controller.slice_status import (
    ExportLookup,
    WatchHealth,
    desired,
    export_ref,
    slice_key,
    status_changed,
)
from vwserver.errors import (
    ApiError,
    ApiForbidden,
    ApiUnauthorized,
    BadGateway,
    UpstreamUnavailable,
)
from vwserver.k8s import kcp
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.cache import Cache
from vwserver.k8s.client import JSON, KubeClient
from vwserver.k8s.lease import LeaderElector
from vwserver.k8s.queue import WorkQueue
from vwserver.k8s.reflector import Reflector
from vwserver.metrics import ServerMetrics
from vwserver.routes import Route, Routes, RouteTable

log = logging.getLogger(__name__)

Key = tuple[str, str]
WORKERS = 4


@dataclass(frozen=True, kw_only=True)
class ControllerSettings:
    export_path: str
    """Workspace (path or ID) of vwserver's own APIExport."""
    export_name: str = kcp.SLICES.group
    external_url: str
    """How clients reach this vwserver; the prefix of every ``status.endpoints[].url``."""
    resync: float = 30.0
    retry: Backoff = field(default_factory=lambda: Backoff(initial=0.5, maximum=15.0))


class SliceController:
    def __init__(
        self,
        *,
        client: KubeClient,
        routes: Routes,
        settings: ControllerSettings,
        static: RouteTable | None = None,
        leader: LeaderElector | None = None,
        metrics: ServerMetrics | None = None,
        clock: Clock | None = None,
        stuck_holds: Callable[[str], StuckHolds | None] | None = None,
        upstream_watches: Callable[[Sequence[str]], WatchHealth] | None = None,
        upstream_check: float = 5.0,
    ) -> None:
        self._stuck_holds = stuck_holds
        self._upstream_watches = upstream_watches
        self._upstream_check = upstream_check
        self._upstream_seen: dict[Key, WatchHealth] = {}
        """The watch health each slice's status was last computed with."""
        self._client = client
        self._routes = routes
        self._settings = settings
        self._static = static or RouteTable()
        self._leader = leader
        self._clock = clock or SystemClock()
        self._slices: list[Reflector[Cache[Key]]] = []
        """One per virtual-workspace URL of vwserver's export (one per shard)."""
        self._dynamic: dict[Key, Route] = {}
        self._verified: dict[Key, float] = {}
        """When each ready slice's export and consent were last confirmed (``clock``)."""
        self.queue: WorkQueue[Key] = WorkQueue(clock=self._clock, backoff=settings.retry)
        self._metrics = metrics if metrics is not None else ServerMetrics()
        self._metrics.queue_depth.set_function(self.queue.__len__)
        self._vw_urls: tuple[str, ...] = ()
        self._export_watches: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.synced = asyncio.Event()
        """Set once the first complete list of slices has been seen (``/readyz``)."""
        self._endpoints_error: str | None = None

    # --- running ---------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            if self._leader is not None:
                tasks.create_task(self._lead(self._leader))
            for _ in range(WORKERS):
                tasks.create_task(self._worker())
            tasks.create_task(self._watch_slices())
            if self._upstream_watches is not None:
                tasks.create_task(self._follow_upstreams(self._upstream_watches))

    async def _lead(self, leader: LeaderElector) -> None:
        """Hold the Lease whenever possible; only then is status written (two replicas must
        not race on it)."""
        try:
            while True:
                await leader.acquire()
                # While another replica led, this one reconciled every change but wrote no
                # status; a ready slice is looked at again only at its next resync. Whatever
                # the last leader left unwritten (it may have died mid-way) is written now.
                for key, _ in list(self._objects()):
                    self.queue.add(key)
                await leader.hold()
        finally:
            await leader.release()

    async def _follow_upstreams(self, health: Callable[[Sequence[str]], WatchHealth]) -> None:
        """Reconcile a slice again when the health of the cache's watches of its export changes
        (its ``UpstreamReachable`` condition), rather than at its next resync."""
        while True:
            await self._clock.sleep(self._upstream_check)
            for key, route in list(self._dynamic.items()):
                seen = self._upstream_seen.get(key)
                if seen is not None and health(route_upstreams(route)) != seen:
                    self.queue.add(key)

    async def _watch_slices(self) -> None:
        """Find our export's virtual-workspace URL(s), then list/watch slices through them."""
        failures = 0
        while not self._vw_urls:
            try:
                self._vw_urls = await self._own_endpoints()
                self._endpoints_error = None
            except (ApiError, UpstreamUnavailable) as e:
                self._endpoints_error = str(e)
                log.warning("reading vwserver's APIExportEndpointSlice: %s", e)
            if not self._vw_urls:
                # Without a binding there is no endpoint, and so no slice anywhere yet.
                self.synced.set()
                failures += 1
                await self._clock.sleep(self._settings.retry.delay(failures))
        log.info("watching slices through %s", ", ".join(self._vw_urls))
        self._slices = [
            Reflector(
                name=f"slices @ {url}",
                client=self._client,
                url=kcp.SLICES.collection(kcp.clusters(url)),
                handler=Cache(key=slice_key, handler=_Enqueue(self.queue.add)),
                clock=self._clock,
                backoff=self._settings.retry,
            )
            for url in self._vw_urls
        ]
        async with asyncio.TaskGroup() as tasks:
            for reflector in self._slices:
                tasks.create_task(reflector.run())
            await asyncio.gather(*(r.synced.wait() for r in self._slices))
            self.synced.set()

    def failing(self) -> list[str]:
        """What of the controller's reading of kcp fails right now (for ``/readyz``): the
        watch of slices (per virtual-workspace URL), or finding that URL. Details are in the
        log; these say what, not why (``/readyz`` is unauthenticated)."""
        failing = []
        if self._endpoints_error is not None:
            failing.append("the slice controller cannot read vwserver's APIExportEndpointSlice")
        broken = sum(1 for r in self._slices if r.last_error is not None)
        if broken:
            failing.append(
                f"the slice controller's watch of slices fails ({broken} of {len(self._slices)})"
            )
        return failing

    async def _own_endpoints(self) -> tuple[str, ...]:
        s = self._settings
        eps = await self._client.get(
            kcp.APIEXPORT_ENDPOINT_SLICES.item(kcp.workspace(s.export_path), None, s.export_name)
        )
        return tuple(kcp.endpoint_urls(eps))

    def _object(self, key: Key) -> JSON | None:
        for reflector in self._slices:
            if (obj := reflector.handler.get(key)) is not None:
                return obj
        return None

    def _objects(self) -> Iterator[tuple[Key, JSON]]:
        for reflector in self._slices:
            yield from reflector.handler.objects.items()

    # --- reconciling -----------------------------------------------------------------------

    async def _worker(self) -> None:
        await self.queue.work(self._process)

    async def _process(self, key: Key) -> None:
        """Reconcile one key from the queue and decide when to look at it again."""
        reconciles = self._metrics.reconciles
        try:
            ready = await self.reconcile(key)
        except (ApiError, UpstreamUnavailable) as e:
            reconciles.labels("error").inc()
            self._expire(key)
            delay = self.queue.add_rate_limited(key)
            log.warning("reconciling slice %s/%s: %s; retry in %.1fs", *key, e, delay)
            return
        reconciles.labels("deleted" if ready is None else "ready" if ready else "not_ready").inc()
        if ready is None:
            self.queue.forget(key)
        elif ready:
            self.queue.forget(key)
            self.queue.add_after(key, self._settings.resync)
        else:
            self.queue.add_rate_limited(key)

    async def reconcile(self, key: Key) -> bool | None:
        """Bring one slice's route and status in line; whether it is ready (None: deleted)."""
        self._follow_exports()
        obj = self._object(key)
        if obj is None:
            self._verified.pop(key, None)
            self._upstream_seen.pop(key, None)
            if self._dynamic.pop(key, None) is not None:
                log.info("slice %s/%s deleted: no longer served", *key)
                self._publish()
            return None
        checked = self._clock.monotonic()
        lookup = await self._lookup(obj)
        current = obj.get("status") or {}
        outcome = desired(
            obj,
            lookup=lookup,
            external_url=self._settings.external_url,
            previous=current.get("conditions") or [],
            now=rfc3339(self._clock.now()),
            stuck_holds=self._stuck_holds,
            upstream_watches=self._upstream_watches_of(key),
        )
        if outcome.route.not_ready is None:
            self._verified[key] = checked
        else:
            self._verified.pop(key, None)
        self._set_route(key, outcome.route)
        if status_changed(current, outcome.status) and self._may_write_status():
            await self._write_status(obj, outcome.status)
        return outcome.route.not_ready is None

    def _upstream_watches_of(self, key: Key) -> Callable[[Sequence[str]], WatchHealth] | None:
        """:attr:`_upstream_watches`, remembering its answer for ``key`` (see
        :meth:`_follow_upstreams`)."""
        health = self._upstream_watches
        if health is None:
            return None

        def remembered(urls: Sequence[str]) -> WatchHealth:
            self._upstream_seen[key] = answer = health(urls)
            return answer

        return remembered

    def _set_route(self, key: Key, route: Route) -> None:
        before = self._dynamic.get(key)
        if before == route:
            return
        if before is not None and before.not_ready is None and route.not_ready is not None:
            log.info("slice %s/%s no longer served: %s", *key, route.not_ready)
        self._dynamic[key] = route
        self._publish()  # a replaced route is retired: its open watches end

    def _expire(self, key: Key) -> None:
        """A reconcile failed: a ready route whose export and consent were last confirmed a
        resync or more ago stops serving (503) until a reconcile succeeds again — a grant is
        never trusted longer than ``resync``, even while kcp cannot be asked."""
        route, obj = self._dynamic.get(key), self._object(key)
        verified = self._verified.get(key)
        if route is None or obj is None or route.not_ready is not None or verified is None:
            return
        if self._clock.monotonic() - verified < self._settings.resync:
            return  # confirmed recently: ride out a short hiccup
        self._verified.pop(key, None)
        lookup = ExportLookup(
            error="cannot re-check the slice's export and its owner's consent now (kcp did not "
            "answer; see vwserver's log)",
            reason="APIExportUnverified",
        )
        outcome = desired(
            obj,
            lookup=lookup,
            external_url=self._settings.external_url,
            now=rfc3339(self._clock.now()),
        )
        self._set_route(key, outcome.route)

    async def _lookup(self, obj: JSON) -> ExportLookup:
        path, name = export_ref(obj)
        if not name:
            return ExportLookup(error="spec.export.name is empty", reason="InvalidReference")
        where = f"APIExport {name} in workspace {path}"
        try:
            export = await self._client.get(kcp.APIEXPORTS.item(kcp.workspace(path), None, name))
        except (ApiUnauthorized, ApiForbidden) as e:
            return ExportLookup(
                error=f"{where}: vwserver is not allowed to read it ({e.message})",
                reason="APIExportForbidden",
            )
        if export is None:
            return ExportLookup(error=f"{where} not found", reason="APIExportNotFound")
        export_cluster = kcp.logical_cluster(export)
        slice_cluster = slice_key(obj)[0]
        granted: bool | None = None  # not asked: implied in the export's own workspace
        if not consent.implied(slice_cluster=slice_cluster, export_cluster=export_cluster):
            granted, problem = await self._consent(slice_cluster, export_cluster, name)
            if not granted:
                # Refused (or unknown): not even the endpoint URLs are read for this slice.
                return ExportLookup(
                    export_cluster=export_cluster, granted=granted, consent_error=problem
                )
        eps = await self._client.get(
            kcp.APIEXPORT_ENDPOINT_SLICES.item(kcp.workspace(path), None, name)
        )
        urls = tuple(kcp.endpoint_urls(eps))
        return ExportLookup(export_cluster=export_cluster, granted=granted, urls=urls)

    async def _consent(
        self, slice_cluster: str, export_cluster: str, export_name: str
    ) -> tuple[bool | None, str]:
        """Does the export's workspace grant the slice's workspace? Asked anew every time
        (no cache: a revoked grant ends the slice at its next reconcile).

        (True, ""): granted; (False, ""): not granted; (None, why): kcp refused vwserver's
        review. A transient failure raises (the worker retries, see :meth:`_expire`).
        """
        if not export_cluster:
            return None, f"the APIExport has no {kcp.CLUSTER_ANNOTATION} annotation"
        try:
            status = await post_review(
                self._client,
                cluster=export_cluster,
                api="authorization.k8s.io/v1",
                resource="subjectaccessreviews",
                body=consent.review(slice_cluster=slice_cluster, export_name=export_name),
            )
        except BadGateway as e:  # logged by post_review with kcp's message
            code = e.__cause__.code if isinstance(e.__cause__, ApiError) else 0
            return None, (
                f"kcp refused vwserver's SubjectAccessReview in logical cluster {export_cluster}"
                f" ({code}): vwserver's identity needs create on subjectaccessreviews there"
            )
        return review_allows(status), ""

    def _may_write_status(self) -> bool:
        return self._leader is None or self._leader.is_leader

    async def _write_status(self, obj: JSON, status: dict[str, Any]) -> None:
        cluster, name = slice_key(obj)
        base = kcp.clusters(self._vw_urls[0] if self._vw_urls else "", cluster)
        await self._client.merge_patch(
            kcp.SLICES.item(base, None, name, subresource="status"), {"status": status}
        )

    def _publish(self) -> None:
        """Static routes plus every known slice, swapped in as one new table."""
        routes = {r.key: r for r in self._static}
        routes.update(self._dynamic)
        self._routes.replace(RouteTable(routes.values()))

    # --- following the exports the slices reference ----------------------------------------

    def _follow_exports(self) -> None:
        """Watch the APIExport and APIExportEndpointSlice of every referenced export, so that a
        slice reacts at once when its export appears, changes or goes away — including the
        endpoint URL that kcp publishes only when the first APIBinding exists.
        The requeue/resync timers stay as a safety net."""
        wanted = {export_ref(obj) for _, obj in self._objects()}
        wanted.discard(("", ""))
        for ref in set(self._export_watches) - wanted:
            self._export_watches.pop(ref).cancel()
        for ref in wanted - set(self._export_watches):
            self._export_watches[ref] = asyncio.create_task(
                self._watch_export(ref), name=f"export {ref[0]}/{ref[1]}"
            )

    async def _watch_export(self, ref: tuple[str, str]) -> None:
        path, name = ref

        def touched() -> None:
            for key, obj in list(self._objects()):
                if export_ref(obj) == ref:
                    self.queue.add(key)

        async with asyncio.TaskGroup() as tasks:
            for resource in (kcp.APIEXPORTS, kcp.APIEXPORT_ENDPOINT_SLICES):
                reflector = Reflector(
                    name=f"{resource.resource} {path}/{name}",
                    client=self._client,
                    url=resource.collection(kcp.workspace(path)),
                    field_selector=f"metadata.name={name}",
                    handler=_Touch(touched),
                    clock=self._clock,
                    backoff=self._settings.retry,
                )
                tasks.create_task(reflector.run())

    async def aclose(self) -> None:
        for task in self._export_watches.values():
            task.cancel()
        for task in self._export_watches.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._export_watches.clear()
        self.queue.shutdown()
        with contextlib.suppress(Exception):
            self._routes.replace(self._static)


def route_upstreams(route: Route) -> tuple[str, ...]:
    """Every upstream URL a route serves from (its shards', or its one)."""
    return tuple(route.shards.values()) or ((route.upstream_url,) if route.upstream_url else ())


class _Enqueue:
    """A :class:`~vwserver.k8s.cache.CacheHandler` that queues the key of whatever changed."""

    def __init__(self, add: Callable[[Key], None]) -> None:
        self._add = add

    def on_upsert(self, obj: JSON) -> None:
        self._add(slice_key(obj))

    def on_delete(self, obj: JSON) -> None:
        self._add(slice_key(obj))


class _Touch:
    """A :class:`~vwserver.k8s.reflector.ReflectorHandler` that only says "something happened"
    (after every list too: an export's appearance must not wait for a resync)."""

    def __init__(self, touched: Callable[[], None]) -> None:
        self._touched = touched

    def on_list(self, items: list[JSON], resource_version: str) -> None:
        self._touched()

    def on_event(self, kind: str, obj: JSON) -> None:
        self._touched()

    def on_bookmark(self, resource_version: str) -> None:
        pass
