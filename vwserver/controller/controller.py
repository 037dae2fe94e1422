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
:mod:`vwserver.controller.reconcile`. Reconciles of one slice never run concurrently (one worker
per key at a time). A slice that is not ready is retried with backoff (it becomes ready within a
couple of seconds of its export appearing, or of the grant); a ready one is re-checked every
``resync`` seconds, which picks up a changed or vanished upstream URL and a revoked grant.
Routes change atomically (:meth:`vwserver.routes.Routes.replace`), and a deleted slice's route,
or a ready route replaced by a not-ready one, is retired, which ends its open watches. A ready
slice whose re-check fails stops serving once its last confirmation is a resync old (fail
closed: consent is never trusted longer than that).

Metrics (issue #7): every reconcile is counted by its result, and the queue depth is read from the
queue when ``/metrics`` is scraped (a callback, so enqueueing costs nothing extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from vwserver.auth.reviews import post_review, review_allows
from vwserver.clock import rfc3339
from vwserver.controller import consent
from vwserver.controller.informer import Backoff, Informer
from vwserver.controller.reconcile import (
    CLUSTER_ANNOTATION,
    GROUP,
    RESOURCE,
    VERSION,
    ExportLookup,
    desired,
    export_ref,
    slice_key,
    status_changed,
)
from vwserver.errors import BadGateway, UpstreamUnavailable
from vwserver.k8s.client import JSON, ApiError, KubeClient
from vwserver.k8s.lease import LeaderElector
from vwserver.metrics import ServerMetrics
from vwserver.routes import Route, Routes, RouteTable

log = logging.getLogger(__name__)

Key = tuple[str, str]


@dataclass(frozen=True, kw_only=True)
class ControllerSettings:
    export_path: str
    """Workspace (path or ID) of vwserver's own APIExport."""
    export_name: str = GROUP
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
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._routes = routes
        self._settings = settings
        self._static = static or RouteTable()
        self._leader = leader
        self._wall = wall
        self._clock = clock
        self._objects: dict[Key, JSON] = {}
        self._dynamic: dict[Key, Route] = {}
        self._failures: dict[Key, int] = {}
        self._verified: dict[Key, float] = {}
        """When each ready slice's export and consent were last confirmed (``clock``)."""
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._metrics = metrics if metrics is not None else ServerMetrics()
        self._metrics.queue_depth.set_function(self._queue.qsize)
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._vw_urls: tuple[str, ...] = ()
        self._export_watches: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.synced = asyncio.Event()
        """Set once the first complete list of slices has been seen (``/readyz``)."""

    # --- running ---------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            if self._leader is not None:
                tasks.create_task(self._lead(self._leader))
            for _ in range(4):
                tasks.create_task(self._worker())
            tasks.create_task(self._watch_slices())

    async def _lead(self, leader: LeaderElector) -> None:
        """Hold the Lease whenever possible; only then is status written (issue #4 §5)."""
        try:
            while True:
                await leader.acquire()
                await leader.hold()
        finally:
            await leader.release()

    async def _watch_slices(self) -> None:
        """Find our export's virtual-workspace URL(s), then list/watch slices through them."""
        failures = 0
        while not self._vw_urls:
            try:
                self._vw_urls = await self._own_endpoints()
            except (ApiError, UpstreamUnavailable) as e:
                log.warning("reading vwserver's APIExportEndpointSlice: %s", e)
            if not self._vw_urls:
                # Without a binding there is no endpoint, and so no slice anywhere yet.
                self.synced.set()
                failures += 1
                await asyncio.sleep(self._settings.retry.delay(failures))
        log.info("watching slices through %s", ", ".join(self._vw_urls))
        async with asyncio.TaskGroup() as tasks:
            for url in self._vw_urls:
                path = f"{url}/clusters/*/apis/{GROUP}/{VERSION}/{RESOURCE}"
                informer = Informer(
                    client=self._client,
                    path=path,
                    on_list=self._on_list,
                    on_event=self._on_event,
                    backoff=self._settings.retry,
                )
                tasks.create_task(informer.run())

    async def _own_endpoints(self) -> tuple[str, ...]:
        s = self._settings
        eps = await self._client.get(
            f"/clusters/{s.export_path}/apis/apis.kcp.io/v1alpha1/apiexportendpointslices/"
            f"{s.export_name}"
        )
        endpoints = ((eps or {}).get("status") or {}).get("endpoints") or []
        return tuple(str(e["url"]).rstrip("/") for e in endpoints if e.get("url"))

    # --- informer callbacks (synchronous: they only record and enqueue) ---------------------

    def _on_list(self, items: list[JSON]) -> None:
        seen = {slice_key(obj): obj for obj in items}
        for key in set(self._objects) - set(seen):
            self._objects.pop(key, None)
            self._enqueue(key)
        for key, obj in seen.items():
            self._objects[key] = obj
            self._enqueue(key)
        self.synced.set()

    def _on_event(self, kind: str, obj: JSON) -> None:
        key = slice_key(obj)
        if kind == "DELETED":
            self._objects.pop(key, None)
        else:
            self._objects[key] = obj
        self._enqueue(key)

    def _enqueue(self, key: Key) -> None:
        if timer := self._timers.pop(key, None):
            timer.cancel()
        if key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def _enqueue_after(self, key: Key, delay: float) -> None:
        if timer := self._timers.pop(key, None):
            timer.cancel()
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(delay, self._enqueue, key)

    # --- reconciling -----------------------------------------------------------------------

    async def _worker(self) -> None:
        reconciles = self._metrics.reconciles
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            try:
                ready = await self.reconcile(key)
            except (ApiError, UpstreamUnavailable) as e:
                reconciles.labels("error").inc()
                self._expire(key)
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                delay = self._settings.retry.delay(failures)
                log.warning("reconciling slice %s/%s: %s; retry in %.1fs", *key, e, delay)
                self._enqueue_after(key, delay)
                continue
            result = "deleted" if ready is None else "ready" if ready else "not_ready"
            reconciles.labels(result).inc()
            if ready is None:
                continue
            if ready:
                self._failures.pop(key, None)
                self._enqueue_after(key, self._settings.resync)
            else:
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                self._enqueue_after(key, self._settings.retry.delay(failures))

    async def reconcile(self, key: Key) -> bool | None:
        """Bring one slice's route and status in line; whether it is ready (None: deleted)."""
        self._follow_exports()
        obj = self._objects.get(key)
        if obj is None:
            self._verified.pop(key, None)
            if self._dynamic.pop(key, None) is not None:
                log.info("slice %s/%s deleted: no longer served", *key)
                self._publish()
            self._failures.pop(key, None)
            return None
        checked = self._clock()
        lookup = await self._lookup(obj)
        current = obj.get("status") or {}
        outcome = desired(
            obj,
            lookup=lookup,
            external_url=self._settings.external_url,
            previous=current.get("conditions") or [],
            now=rfc3339(self._wall()),
        )
        assert outcome.route is not None
        if outcome.route.not_ready is None:
            self._verified[key] = checked
        else:
            self._verified.pop(key, None)
        self._set_route(key, outcome.route)
        if status_changed(current, outcome.status) and self._may_write_status():
            await self._write_status(obj, outcome.status)
        return outcome.route.not_ready is None

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
        route, obj = self._dynamic.get(key), self._objects.get(key)
        verified = self._verified.get(key)
        if route is None or obj is None or route.not_ready is not None or verified is None:
            return
        if self._clock() - verified < self._settings.resync:
            return  # confirmed recently: ride out a short hiccup
        self._verified.pop(key, None)
        lookup = ExportLookup(
            error="cannot re-check the slice's export and its owner's consent now (kcp did not "
            "answer; see vwserver's log)",
            reason="APIExportUnverified",
        )
        outcome = desired(
            obj, lookup=lookup, external_url=self._settings.external_url, now=rfc3339(self._wall())
        )
        assert outcome.route is not None
        self._set_route(key, outcome.route)

    async def _lookup(self, obj: JSON) -> ExportLookup:
        path, name = export_ref(obj)
        if not name:
            return ExportLookup(error="spec.export.name is empty", reason="InvalidReference")
        where = f"APIExport {name} in workspace {path}"
        try:
            export = await self._client.get(
                f"/clusters/{path}/apis/apis.kcp.io/v1alpha2/apiexports/{name}"
            )
        except ApiError as e:
            if e.code in (401, 403):
                return ExportLookup(
                    error=f"{where}: vwserver is not allowed to read it ({e.message})",
                    reason="APIExportForbidden",
                )
            raise
        if export is None:
            return ExportLookup(error=f"{where} not found", reason="APIExportNotFound")
        export_cluster = str(
            ((export.get("metadata") or {}).get("annotations") or {}).get(CLUSTER_ANNOTATION, "")
        )
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
            f"/clusters/{path}/apis/apis.kcp.io/v1alpha1/apiexportendpointslices/{name}"
        )
        endpoints = ((eps or {}).get("status") or {}).get("endpoints") or []
        urls = tuple(str(e["url"]).rstrip("/") for e in endpoints if e.get("url"))
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
            return None, f"the APIExport has no {CLUSTER_ANNOTATION} annotation"
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
        base = self._vw_urls[0] if self._vw_urls else ""
        path = f"{base}/clusters/{cluster}/apis/{GROUP}/{VERSION}/{RESOURCE}/{name}/status"
        await self._client.request(
            "PATCH",
            path,
            body={"status": status},
            content_type="application/merge-patch+json",
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
        endpoint URL that kcp publishes only when the first APIBinding exists (issue #4 §2).
        The requeue/resync timers stay as a safety net."""
        wanted = {export_ref(obj) for obj in self._objects.values()}
        wanted.discard(("", ""))
        for ref in set(self._export_watches) - wanted:
            self._export_watches.pop(ref).cancel()
        for ref in wanted - set(self._export_watches):
            self._export_watches[ref] = asyncio.create_task(
                self._watch_export(ref), name=f"export {ref[0]}/{ref[1]}"
            )

    async def _watch_export(self, ref: tuple[str, str]) -> None:
        path, name = ref

        def touched(*_: object) -> None:
            for key, obj in list(self._objects.items()):
                if export_ref(obj) == ref:
                    self._enqueue(key)

        selector = [("fieldSelector", f"metadata.name={name}")]
        async with asyncio.TaskGroup() as tasks:
            for collection in ("v1alpha2/apiexports", "v1alpha1/apiexportendpointslices"):
                informer = Informer(
                    client=self._client,
                    path=f"/clusters/{path}/apis/apis.kcp.io/{collection}",
                    query=selector,
                    on_list=touched,
                    on_event=touched,
                    backoff=self._settings.retry,
                )
                tasks.create_task(informer.run())

    async def aclose(self) -> None:
        for task in self._export_watches.values():
            task.cancel()
        for task in self._export_watches.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._export_watches.clear()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        with contextlib.suppress(Exception):
            self._routes.replace(self._static)
