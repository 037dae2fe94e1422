"""The slice controller: watches FilteredAPIExportEndpointSlices in every workspace that binds
vwserver's API, keeps their status true, and keeps the proxy's route table in step.

Where the slices come from: vwserver's own APIExport (``sync.edge-connect.eu`` in the workspace
the config names). Its APIExportEndpointSlice lists the export's virtual-workspace URL(s) — only
once some workspace binds the API — and a list/watch on ``clusters/*`` there sees every slice of
every binding workspace. Status is written back through the same virtual workspace.

Per slice, a reconcile first asks whether the export's owner consents to this slice's workspace
(:mod:`vwserver.controller.consent`): implied when ``spec.export.path`` is empty, the slice's own
logical cluster, or a workspace path that resolves to it (kcp's ``LogicalCluster`` of that
workspace — a workspace, not the export); else a SubjectAccessReview in the named workspace,
asked on every reconcile. Only after consent does it read anything of the export (the APIExport,
its endpoint slice, their watches): before that, a missing export and an existing one cost the
same requests and get the same status (issue #22: status must be no oracle of what exists
elsewhere). Then it validates the selector and derives status and route with the pure
:mod:`vwserver.controller.slice_status`.

Work for tenants is bounded per tenant (any workspace that binds vwserver's API can create
slices): per slice workspace at most ``max_slices_per_workspace`` slices (the oldest) and
``max_exports_per_workspace`` distinct export references are looked at, the rest get
``Ready=False`` (``TooManySlices`` / ``TooManyExports``) once and cost nothing more; consent
reviews are rate-bounded per slice workspace (a slice over its budget waits in the queue, no
request made); the queue is fair (round-robin across slice workspaces, at most
:data:`ACTIVE_PER_WORKSPACE` of one workspace's slices in reconcile at a time); and the slices
in their export's own workspace (the providers' own) are reconciled by workers and through a
connection pool of their own, which no tenant's slices can occupy. Such a slice is never retired
because a re-check failed (nothing can revoke implied consent; a vanished export is seen by a
reconcile that succeeds). The loop is :mod:`vwserver.k8s`'s: reflectors feed a
:class:`~vwserver.k8s.queue.WorkQueue`, so reconciles of one slice never run concurrently (one
worker per key at a time), and every wait is on the injected :class:`~vwserver.clock.Clock`.
A slice that is not ready is retried with backoff (it becomes ready within a couple of seconds
of its export appearing, or of the grant); a ready one is re-checked every ``resync`` seconds,
which picks up a changed or vanished upstream URL and a revoked grant.
Routes change atomically (:meth:`vwserver.routes.Routes.replace`), and a deleted slice's route,
or a ready route replaced by a not-ready one, is retired, which ends its open watches. A ready
slice elsewhere (consent by grant) whose re-check fails stops serving once its last confirmation
is a resync old (fail closed: a grant is never trusted longer than that).

Metrics: every reconcile is counted by its result, and the queue depth is read from the
queue when ``/metrics`` is scraped (a callback, so enqueueing costs nothing extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from vwserver.auth.reviews import post_review, review_allows
from vwserver.clock import Clock, SystemClock, rfc3339
from vwserver.controller import consent
from vwserver.controller.handoff import StuckHolds
from vwserver.controller.scope import ShardScope, merged, own_part, owned, same_part
from vwserver.controller.slice_status import (
    TOO_MANY_EXPORTS,
    TOO_MANY_SLICES,
    ExportLookup,
    WatchHealth,
    desired,
    export_ref,
    slice_key,
    status_changed,
)
from vwserver.errors import (
    ApiConflict,
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
from vwserver.k8s.queue import TokenBucket, WorkQueue
from vwserver.k8s.reflector import Reflector
from vwserver.metrics import ServerMetrics
from vwserver.routes import Route, Routes, RouteTable

log = logging.getLogger(__name__)

Key = tuple[str, str]
Group = tuple[str, bool]
"""A key's group in the work queue: (slice workspace, consent implied)."""
WORKERS = 4
"""Workers for every slice."""
RESERVED_WORKERS = 2
"""Further workers only for slices whose consent is implied (the providers' own)."""
ACTIVE_PER_WORKSPACE = 2
"""At most this many slices of one workspace (and kind of consent) in reconcile at once."""
RETIRE_ATTEMPTS = 3
"""Writes of a retiring replica set per slice (each conflict re-reads the slice)."""
TENANT_CONNECTIONS = 16
"""The connection pool for requests made for slices naming another workspace's export."""


@dataclass(frozen=True, kw_only=True)
class ControllerSettings:
    export_path: str
    """Workspace (path or ID) of vwserver's own APIExport."""
    export_name: str = kcp.SLICES.group
    external_url: str
    """How clients reach this vwserver; the prefix of every ``status.endpoints[].url``."""
    resync: float = 30.0
    retry: Backoff = field(default_factory=lambda: Backoff(initial=0.5, maximum=15.0))
    max_slices_per_workspace: int = 50
    max_exports_per_workspace: int = 20
    consent_reviews_per_second: float = 5.0
    """Per slice workspace (burst: twice as many)."""
    scope: ShardScope | None = None
    """The shards this replica serves (None: all). With a scope, only the scope's part of the
    status is written, under the scope's field manager (:mod:`.scope`)."""


@dataclass(frozen=True, slots=True)
class _Entry:
    """What the caps look at of one slice."""

    order: tuple[str, str]
    """(creationTimestamp, name): the oldest slices are the ones looked at."""
    ref: tuple[str, str]


class _Throttled(Exception):
    """The slice workspace's review budget is spent: look again after ``delay`` seconds (an
    internal signal, no API error)."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay)
        self.delay = delay


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
        tenant_client: KubeClient | None = None,
        writes_status: bool = True,
    ) -> None:
        """``client``: vwserver's identity for the slices' watch, the exports' watches, status
        writes and every request for slices in their export's own workspace;
        ``tenant_client``: the same identity through another, smaller connection pool, for the
        requests made for every other slice (default: ``client``). ``writes_status=False``:
        keep the route table only, never write a slice's status (a worker beside the one that
        writes, :mod:`vwserver.workers`; ``leader`` must then be None)."""
        if leader is not None and not writes_status:
            raise ValueError("a controller that writes no status cannot stand for the Lease")
        self._writes_status = writes_status
        self._stuck_holds = stuck_holds
        self._upstream_watches = upstream_watches
        self._upstream_check = upstream_check
        self._upstream_seen: dict[Key, WatchHealth] = {}
        """The watch health each slice's status was last computed with."""
        self._client = client
        self._tenant_client = tenant_client if tenant_client is not None else client
        self._routes = routes
        self._settings = settings
        self._static = static or RouteTable()
        self._leader = leader
        self._clock = clock or SystemClock()
        self._slices: dict[str, Reflector[Cache[Key]]] = {}
        """Per virtual-workspace URL of vwserver's export (one per shard with a binding)."""
        self._dynamic: dict[Key, Route] = {}
        self._verified: dict[Key, float] = {}
        """When each ready slice's export and consent were last confirmed (``clock``)."""
        self._implied: set[Key] = set()
        """Slices whose last reconcile found them in their export's own workspace."""
        self._consented: dict[Key, tuple[str, str]] = {}
        """Slices whose export's owner consented at their last reconcile, with that export:
        the only exports whose APIExport and endpoint slice are watched."""
        self._index: dict[str, dict[str, _Entry]] = {}
        """Per slice workspace, per slice name: what the caps look at."""
        self._over: dict[str, dict[str, tuple[str, str]]] = {}
        """Per slice workspace: the slices beyond a cap, with (reason, message)."""
        self._budgets: dict[str, TokenBucket] = {}
        """Per slice workspace: the budget of consent reviews."""
        self._problems: dict[Key, str] = {}
        """Why the consent review of a slice could not be made, as last logged."""
        self.queue: WorkQueue[Key] = WorkQueue(
            clock=self._clock,
            backoff=settings.retry,
            group=self._group,
            max_active_per_group=ACTIVE_PER_WORKSPACE,
        )
        self._metrics = metrics if metrics is not None else ServerMetrics()
        self._metrics.queue_depth.set_function(self.queue.__len__)
        self._metrics.controller_watches.set_function(self.upstream_watches)
        for pool, pool_client in (("provider", client), ("tenants", self._tenant_client)):
            self._metrics.controller_connections.labels(pool).set_function(
                functools.partial(_connections, pool_client)
            )
        self._vw_urls: tuple[str, ...] = ()
        self._export_watches: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.synced = asyncio.Event()
        """Set once the first complete list of slices has been seen (``/readyz``)."""
        self._endpoints_error: str | None = None
        self._retired = False
        """Set by :meth:`retire`: no status write after it."""

    # --- running ---------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            if self._leader is not None:
                tasks.create_task(self._lead(self._leader))
            for _ in range(WORKERS):
                tasks.create_task(self._worker())
            for _ in range(RESERVED_WORKERS):
                tasks.create_task(self.queue.work(self._process, accept=_implied_group))
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
        """Find our export's virtual-workspace URL(s), list/watch slices through each, and keep
        following them (re-read every ``resync`` seconds).

        kcp fact (sharded): the APIExportEndpointSlice lists a shard's VW URL only while a
        workspace on that shard binds the export, and a shard's VW serves only the workspaces
        on that shard. So the URL of a shard appears when the first workspace there binds
        vwserver's API — its slices are seen only through that URL — and goes when the last
        one unbinds (its slices went with the bindings; their routes are dropped).
        """
        failures = 0
        tasks: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                try:
                    urls = await self._own_endpoints()
                    self._endpoints_error = None
                except (ApiError, UpstreamUnavailable) as e:
                    urls = self._vw_urls  # a failed read is not "no shards"
                    self._endpoints_error = str(e)
                    log.warning("reading vwserver's APIExportEndpointSlice: %s", e)
                if urls != self._vw_urls:
                    self._follow_own_endpoints(urls, tasks)
                if not self._vw_urls:
                    # Without a binding there is no endpoint, and so no slice anywhere yet.
                    self.synced.set()
                    failures += 1
                    await self._clock.sleep(self._settings.retry.delay(failures))
                    continue
                if not self.synced.is_set():
                    await asyncio.gather(*(r.synced.wait() for r in self._slices.values()))
                    self.synced.set()
                await self._clock.sleep(self._settings.resync)
                for task in tasks.values():  # a watch that crashed ends the controller
                    if task.done() and not task.cancelled() and task.exception() is not None:
                        raise RuntimeError("a watch of slices failed") from task.exception()
        finally:
            for task in tasks.values():
                task.cancel()
            for task in tasks.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def _follow_own_endpoints(
        self, urls: Sequence[str], tasks: dict[str, asyncio.Task[None]]
    ) -> None:
        """Start a slice watch for each new VW URL of vwserver's export, end those of URLs that
        went (and reconcile their slices, which are gone from the watches now)."""
        log.info("watching slices through %s", ", ".join(urls) or "no endpoint")
        for url in set(self._slices) - set(urls):
            gone = self._slices.pop(url)
            tasks.pop(url).cancel()
            for key in list(gone.handler.objects):
                self.queue.add(key)
        for url in urls:
            if url in self._slices:
                continue
            reflector = Reflector(
                name=f"slices @ {url}",
                client=self._client,
                url=kcp.SLICES.collection(kcp.clusters(url)),
                handler=Cache(key=slice_key, handler=_Enqueue(self._slice_changed)),
                clock=self._clock,
                backoff=self._settings.retry,
            )
            self._slices[url] = reflector
            tasks[url] = asyncio.create_task(reflector.run(), name=f"slices @ {url}")
        self._vw_urls = tuple(urls)

    def failing(self) -> list[str]:
        """What of the controller's reading of kcp fails right now (for ``/readyz``): the
        watch of slices (per virtual-workspace URL), or finding that URL. Details are in the
        log; these say what, not why (``/readyz`` is unauthenticated)."""
        failing = []
        if self._endpoints_error is not None:
            failing.append("the slice controller cannot read vwserver's APIExportEndpointSlice")
        broken = sum(1 for r in self._slices.values() if r.last_error is not None)
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

    def slice_object(self, key: Key) -> JSON | None:
        """The slice ``key`` as the controller's watches last delivered it (None: not seen)."""
        return self._object(key)

    def _object(self, key: Key) -> JSON | None:
        for reflector in self._slices.values():
            if (obj := reflector.handler.get(key)) is not None:
                return obj
        return None

    def _objects(self) -> Iterator[tuple[Key, JSON]]:
        for reflector in self._slices.values():
            yield from reflector.handler.objects.items()

    # --- reconciling -----------------------------------------------------------------------

    async def _worker(self) -> None:
        await self.queue.work(self._process)

    async def _process(self, key: Key) -> None:
        """Reconcile one key from the queue and decide when to look at it again."""
        reconciles = self._metrics.reconciles
        try:
            ready = await self.reconcile(key)
        except _Throttled as e:
            # No request was made: the slice's workspace spent its review budget.
            reconciles.labels("throttled").inc()
            self.queue.add_after(key, e.delay)
            return
        except (ApiError, UpstreamUnavailable) as e:
            reconciles.labels("error").inc()
            self._expire(key)
            delay = self.queue.add_rate_limited(key)
            log.warning("reconciling slice %s/%s: %s; retry in %.1fs", *key, e, delay)
            return
        reconciles.labels("deleted" if ready is None else "ready" if ready else "not_ready").inc()
        if ready is None or self._over_cap(key) is not None:
            # Deleted, or beyond a cap: looked at again only when its workspace's slices
            # change (:meth:`_slice_changed`).
            self.queue.forget(key)
        elif ready:
            self.queue.forget(key)
            self.queue.add_after(key, self._settings.resync)
        else:
            self.queue.add_rate_limited(key)

    async def reconcile(self, key: Key) -> bool | None:
        """Bring one slice's route and status in line; whether it is ready (None: deleted)."""
        obj = self._object(key)
        if obj is None:
            self._forget(key)
            if self._dynamic.pop(key, None) is not None:
                log.info("slice %s/%s deleted: no longer served", *key)
                self._publish()
            self._follow_exports()
            return None
        checked = self._clock.monotonic()
        over = self._over_cap(key)
        if over is not None:
            self._forget(key)
            lookup = ExportLookup(reason=over[0], error=over[1])
        else:
            lookup = await self._lookup(key, obj)
        self._follow_exports()
        current = obj.get("status") or {}
        scope = self._settings.scope
        outcome = desired(
            obj,
            lookup=lookup,
            external_url=self._settings.external_url,
            previous=current.get("conditions") or [],
            now=rfc3339(self._clock.now()),
            stuck_holds=self._stuck_holds,
            upstream_watches=self._upstream_watches_of(key),
            scope=scope,
        )
        if outcome.route.not_ready is None:
            self._verified[key] = checked
        else:
            self._verified.pop(key, None)
        self._set_route(key, outcome.route)
        if scope is None:
            changed = status_changed(current, outcome.status)
        else:
            changed = not same_part(
                own_part(current, owned(obj, scope.field_manager)), outcome.status
            )
        if changed and self._may_write_status():
            await self._write_status(obj, outcome.status)
        return outcome.route.not_ready is None

    def _forget(self, key: Key) -> None:
        """What the controller knew of a slice's export and consent."""
        self._verified.pop(key, None)
        self._upstream_seen.pop(key, None)
        self._consented.pop(key, None)
        self._implied.discard(key)
        self._problems.pop(key, None)

    def _group(self, key: Key) -> Hashable:
        """The key's group in the work queue (see :data:`Group`)."""
        group: Group = (key[0], key in self._implied)
        return group

    def _client_for(self, key: Key) -> KubeClient:
        return self._client if key in self._implied else self._tenant_client

    def followed_exports(self) -> set[tuple[str, str]]:
        """The exports (path, name) whose APIExport and endpoint slice are watched now."""
        return set(self._export_watches)

    def upstream_watches(self) -> int:
        """The controller's own list+watch loops against kcp now (``/metrics``)."""
        return len(self._slices) + 2 * len(self._export_watches)

    # --- bounding each workspace's slices --------------------------------------------------

    def _slice_changed(self, obj: JSON) -> None:
        """A slice was added, changed or deleted: queue it, and re-decide the caps of its
        workspace if what they look at changed (not on a status update)."""
        key = slice_key(obj)
        cluster, name = key
        entries = self._index.setdefault(cluster, {})
        present = self._object(key) is not None
        entry = _Entry(order=(_created(obj), name), ref=export_ref(obj)) if present else None
        if entries.get(name) != entry:
            if entry is None:
                entries.pop(name, None)
            else:
                entries[name] = entry
            if not entries:
                del self._index[cluster]
                self._budgets.pop(cluster, None)
            self._decide_caps(cluster)
        self.queue.add(key)

    def _decide_caps(self, cluster: str) -> None:
        """Which of ``cluster``'s slices are beyond a cap; queue those whose answer changed."""
        s = self._settings
        before = self._over.pop(cluster, {})
        over: dict[str, tuple[str, str]] = {}
        refs: set[tuple[str, str]] = set()
        entries = sorted(self._index.get(cluster, {}).items(), key=lambda kv: kv[1].order)
        for i, (name, entry) in enumerate(entries):
            if i >= s.max_slices_per_workspace:
                over[name] = (
                    TOO_MANY_SLICES,
                    f"workspace {cluster} has more than {s.max_slices_per_workspace} slices; "
                    f"vwserver looks at the {s.max_slices_per_workspace} oldest only "
                    "(controller.maxSlicesPerWorkspace): delete slices there to have this one "
                    "looked at",
                )
            elif entry.ref not in refs and len(refs) >= s.max_exports_per_workspace:
                over[name] = (
                    TOO_MANY_EXPORTS,
                    f"the slices of workspace {cluster} name more than "
                    f"{s.max_exports_per_workspace} distinct exports; vwserver looks at the "
                    "slices of the first ones only (controller.maxExportsPerWorkspace)",
                )
            else:
                refs.add(entry.ref)
        if over:
            self._over[cluster] = over
        for name in set(before) | set(over):
            if before.get(name) != over.get(name):
                self.queue.add((cluster, name))

    def _over_cap(self, key: Key) -> tuple[str, str] | None:
        """(reason, message) if the slice is beyond a cap of its workspace."""
        return self._over.get(key[0], {}).get(key[1])

    def _review_budget(self, cluster: str) -> TokenBucket:
        bucket = self._budgets.get(cluster)
        if bucket is None:
            rate = self._settings.consent_reviews_per_second
            bucket = self._budgets[cluster] = TokenBucket(
                rate=rate, burst=max(1, int(2 * rate)), clock=self._clock
            )
        return bucket

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
        if key in self._implied:
            # In its export's own workspace: nothing can revoke implied consent, so a re-check
            # that timed out (kcp busy, a tenant's flood) keeps the last decision. A vanished
            # export is seen by the next reconcile that succeeds.
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

    async def _lookup(self, key: Key, obj: JSON) -> ExportLookup:
        """Consent first, then the export: before the export's owner consented, nothing of
        the export is read, so a missing and an existing export cost the same requests and
        give the same answer (``granted=False``)."""
        path, name = export_ref(obj)
        if not name:
            self._forget(key)
            return ExportLookup(error="spec.export.name is empty", reason="InvalidReference")
        slice_cluster = key[0]
        export_cluster = slice_cluster if path == slice_cluster else ""
        if not export_cluster:
            # (a slice found in its export's own workspace last time is re-checked unbudgeted:
            # the budget bounds what a tenant makes vwserver ask, not the providers' re-checks)
            wait = 0.0 if key in self._implied else self._review_budget(slice_cluster).take()
            if wait > 0:
                raise _Throttled(wait)
            export_cluster = await self._resolve(path)
        granted: bool | None = None  # not asked: implied in the export's own workspace
        if consent.implied(slice_cluster=slice_cluster, export_cluster=export_cluster):
            self._implied.add(key)
        else:
            self._implied.discard(key)
            granted, problem = await self._consent(slice_cluster, export_cluster or path, name)
            if problem and self._problems.get(key) != problem:
                log.warning("slice %s/%s: %s", *key, problem)
            if problem:
                self._problems[key] = problem
            else:
                self._problems.pop(key, None)
            if not granted:
                # Refused (or unknown): nothing of the export is read for this slice.
                self._consented.pop(key, None)
                return ExportLookup(granted=False, consent_error=problem)
        self._consented[key] = (path, name)
        # Consented: from here on the status may say what is wrong with the export.
        client = self._client_for(key)
        where = f"APIExport {name} in workspace {path}"
        try:
            export = await client.get(kcp.APIEXPORTS.item(kcp.workspace(path), None, name))
        except (ApiUnauthorized, ApiForbidden) as e:
            return ExportLookup(
                error=f"{where}: vwserver is not allowed to read it ({e.message})",
                reason="APIExportForbidden",
            )
        if export is None:
            return ExportLookup(error=f"{where} not found", reason="APIExportNotFound")
        if granted is None and kcp.logical_cluster(export) != slice_cluster:
            # The workspace was resolved a moment ago to the slice's own; the export says
            # otherwise (the workspace was replaced in between): not implied after all.
            self._implied.discard(key)
            self._consented.pop(key, None)
            return ExportLookup(granted=False)
        eps = await client.get(kcp.APIEXPORT_ENDPOINT_SLICES.item(kcp.workspace(path), None, name))
        urls = tuple(kcp.endpoint_urls(eps))
        claimed, exported = kcp.export_claims(export)
        return ExportLookup(
            export_cluster=kcp.logical_cluster(export),
            granted=granted,
            urls=urls,
            claimed=claimed,
            exported=exported,
        )

    async def _resolve(self, path: str) -> str:
        """The logical cluster of the workspace ``path`` names (a workspace path or an ID),
        or "" when kcp does not tell vwserver (no such workspace, or not readable): read from
        the workspace's ``LogicalCluster``, never from the export. Only used to tell whether
        consent is implied; the answer never reaches a status."""
        if ":" not in path:
            return path  # a logical-cluster ID ("root" is both)
        try:
            lc = await self._tenant_client.get(
                kcp.LOGICAL_CLUSTERS.item(kcp.workspace(path), None, kcp.LOGICAL_CLUSTER_NAME)
            )
        except ApiError as e:
            if e.transient:
                raise
            return ""
        return kcp.logical_cluster(lc) if lc is not None else ""

    async def _consent(
        self, slice_cluster: str, export_workspace: str, export_name: str
    ) -> tuple[bool, str]:
        """Does the export's workspace (a logical cluster, or the path the slice names when
        it did not resolve) grant the slice's workspace? Asked anew every time (no cache: a
        revoked grant ends the slice at its next reconcile); the export is not read for it.

        (True, ""): granted; (False, ""): not granted; (False, why): kcp refused vwserver's
        review (also what a workspace that does not exist gets). A transient failure raises
        (the worker retries, see :meth:`_expire`).
        """
        try:
            status = await post_review(
                self._tenant_client,
                cluster=export_workspace,
                api="authorization.k8s.io/v1",
                resource="subjectaccessreviews",
                body=consent.review(slice_cluster=slice_cluster, export_name=export_name),
                log_refusal=False,
            )
        except BadGateway as e:  # logged by _lookup, once per slice and problem
            cause = e.__cause__
            code, why = (cause.code, cause.message) if isinstance(cause, ApiError) else (0, "")
            return False, (
                f"kcp refused vwserver's SubjectAccessReview in workspace {export_workspace}"
                f" ({code} {why}): no such workspace, or vwserver's identity needs create on "
                "subjectaccessreviews there; the slice's status says NotPermitted either way"
            )
        return review_allows(status), ""

    def _may_write_status(self) -> bool:
        if not self._writes_status or self._retired:
            return False
        return self._leader is None or self._leader.is_leader

    def _slice_home(self, key: Key) -> str:
        """The virtual-workspace URL through which the slice ``key`` was seen.

        kcp fact (sharded, v0.32.3): each shard's APIExport VW serves only the logical clusters
        on that shard — a request for a cluster on another shard is 403 Forbidden there
        (tests/shards/test_testbed_shards.py). So a slice's status must be written through the
        VW URL of the shard that holds the slice's workspace, which is the URL whose watch
        delivered it; vwserver's own export has one URL per shard with a binding.
        """
        for url, reflector in self._slices.items():
            if reflector.handler.get(key) is not None:
                return url
        return self._vw_urls[0] if self._vw_urls else ""

    async def _write_status(self, obj: JSON, status: dict[str, Any]) -> None:
        cluster, name = key = slice_key(obj)
        base = kcp.clusters(self._slice_home(key), cluster)
        path = kcp.SLICES.item(base, None, name, subresource="status")
        scope = self._settings.scope
        if scope is None:
            await self._client_for(key).merge_patch(path, {"status": status})
        else:
            # This replica set's part replaced, the other sets' entries as they are; only if
            # the object is still the one read (else 409, and the reconcile is retried).
            whole = merged(obj.get("status") or {}, owned(obj, scope.field_manager), status)
            version = (obj.get("metadata") or {}).get("resourceVersion")
            await self._client_for(key).merge_patch(
                path,
                {"metadata": {"resourceVersion": version}, "status": whole},
                field_manager=scope.field_manager,
            )
        self._metrics.status_writes.inc()

    async def retire(self) -> int:
        """Remove this replica set's part of every slice's status (its endpoints, its
        conditions), keeping what the other replica sets own (:func:`.scope.merged`). Called
        on a graceful shutdown of a shard-scoped replica that may write status (the Lease
        holder, when there is a Lease) before its controller stops; nothing without a scope
        (one writer owns the whole status). Returns how many slices were written; a failure is
        logged, never raised (shutdown goes on: the part stays until this replica set writes
        again, see the README)."""
        scope = self._settings.scope
        if scope is None or not self._may_write_status():
            return 0
        self._retired = True
        written = 0
        for key, obj in list(self._objects()):
            mine = owned(obj, scope.field_manager)
            if not (mine.endpoints or mine.conditions):
                continue
            try:
                await self._retire_from(key, obj)
                written += 1
            except (ApiError, UpstreamUnavailable) as e:
                log.warning("removing replica set %s from slice %s/%s: %s", scope.name, *key, e)
        log.info("replica set %s removed from the status of %d slice(s)", scope.name, written)
        return written

    async def _retire_from(self, key: Key, obj: JSON) -> None:
        """Write this replica set's part out of one slice's status; on a conflict (another
        replica set wrote since the watch delivered ``obj``) read the slice again and retry."""
        for _ in range(RETIRE_ATTEMPTS - 1):
            try:
                await self._write_status(obj, {})
                return
            except ApiConflict:
                base = kcp.clusters(self._slice_home(key), key[0])
                fresh = await self._client_for(key).get(kcp.SLICES.item(base, None, key[1]))
                if fresh is None:
                    return  # deleted: nothing to remove
                obj = fresh
        await self._write_status(obj, {})

    def _publish(self) -> None:
        """Static routes plus every known slice, swapped in as one new table."""
        routes = {r.key: r for r in self._static}
        routes.update(self._dynamic)
        self._routes.replace(RouteTable(routes.values()))

    # --- following the exports the slices reference ----------------------------------------

    def _follow_exports(self) -> None:
        """Watch the APIExport and APIExportEndpointSlice of every export a slice may serve (its
        owner consented), so that a slice reacts at once when its export appears, changes or
        goes away — including the endpoint URL that kcp publishes only when the first
        APIBinding exists. Never for an export before its owner consented: those are looked
        at by the requeue/resync timers only (which stay as a safety net for all)."""
        wanted = set(self._consented.values())
        for ref in set(self._export_watches) - wanted:
            self._export_watches.pop(ref).cancel()
        for ref in wanted - set(self._export_watches):
            self._export_watches[ref] = asyncio.create_task(
                self._watch_export(ref), name=f"export {ref[0]}/{ref[1]}"
            )

    async def _watch_export(self, ref: tuple[str, str]) -> None:
        path, name = ref

        def touched() -> None:
            for key, consented in list(self._consented.items()):
                if consented == ref:
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


def _implied_group(group: Hashable) -> bool:
    """The reserved workers' keys: slices in their export's own workspace (see :data:`Group`)."""
    return isinstance(group, tuple) and len(group) == 2 and group[1] is True


def _connections(client: KubeClient | None) -> int:
    return client.connections if client is not None else 0


def _created(obj: JSON) -> str:
    """A slice's creationTimestamp (RFC 3339 in UTC sorts as text)."""
    return str((obj.get("metadata") or {}).get("creationTimestamp") or "")


def route_upstreams(route: Route) -> tuple[str, ...]:
    """Every upstream URL a route serves from (its shards', or its one)."""
    return tuple(route.shards.values()) or ((route.upstream_url,) if route.upstream_url else ())


class _Enqueue:
    """A :class:`~vwserver.k8s.cache.CacheHandler` that tells the controller whatever changed."""

    def __init__(self, changed: Callable[[JSON], None]) -> None:
        self._changed = changed

    def on_upsert(self, obj: JSON) -> None:
        self._changed(obj)

    def on_delete(self, obj: JSON) -> None:
        self._changed(obj)


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
