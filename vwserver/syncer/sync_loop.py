"""The sync loop of one resource type: reflectors fill caches and a work queue, workers execute
plans.

One :class:`ResourceController` per configured resource, built from :mod:`vwserver.k8s`'s loop
parts. Upstream, one :class:`~vwserver.k8s.reflector.Reflector` with a
:class:`~vwserver.k8s.cache.Cache` per endpoint URL (every shard of an endpoint slice) on
``<endpoint>/clusters/*/...``; downstream, one on the target resource in all namespaces,
restricted to this syncer's objects by its owner label. Every event becomes a key ``(logical
cluster, namespace, name)`` of the *upstream* object (a downstream object names its source in its
annotations), so both directions of one object are handled by one worker at a time
(:class:`~vwserver.k8s.queue.WorkQueue`).

A worker reads both caches, asks :func:`vwserver.syncer.sync_plan.plan` what to do and executes
the actions. A failure is retried with per-key backoff and shown on the kcp object as condition
``Synced=False`` with the error's reason and message (and counted in the metrics): the MongoDB
example only logged, so consumers never learned why nothing happened.

Safety rules enforced here (the plan decides, this module double-checks against the server):

* a downstream object is only deleted with a ``uid`` precondition, and only if its labels name
  this syncer (the plan only proposes such objects);
* an orphan found by the sweep is deleted only after a live GET shows the upstream object absent;
* our finalizer is only removed after a live GET shows the downstream copy gone.

Objects that leave the filtered view while carrying our finalizer (see
:class:`~vwserver.syncer.sync_plan.Stuck`) are cleaned up downstream and reported: a warning log,
the ``vwserver_syncer_stuck_finalizers`` gauge, ``/debug/stuck`` on the health port and a Warning
Event next to where the downstream copy was — the kcp object itself is unreachable for us then.

Tenants are untrusted: what one consumer's objects make the syncer hold is bounded
(:mod:`vwserver.syncer.memory`); an error no retry fixes backs off to an hour
(:data:`PERMANENT_BACKOFF`) and the resync does not cut that short; ``Synced=False`` messages
name no address (:func:`error_message`); a consumer label/annotation the downstream side writes
is left to it, and one put back :data:`FLIP_LIMIT` times is no longer written
(:func:`~vwserver.syncer.sync_plan.left_downstream`) — on a copy of a related object too,
counted per copy (:meth:`ResourceController._count_related_flips`).

Quiet when idle: the answer to every write (status PATCH, server-side apply) is the object as
stored, and :func:`~vwserver.syncer.sync_plan.learn` reads from it which fields the schema on
that side prunes or defaults. Those facts are kept per resource and side for the life of the
controller (:attr:`ResourceController.upstream_schema`, :attr:`~ResourceController.
downstream_schema`, gauge ``vwserver_syncer_pruned_fields``, one log line per field) and passed to
every plan, so a schema without ``status.conditions`` costs one write, not one per reconcile.

Two syncers on the same objects: an object whose first claimed syncer finalizer (written by
that syncer's field manager, see :func:`~vwserver.syncer.naming.finalizer_owner`) is another
syncer's is left alone (:class:`~vwserver.syncer.sync_plan.Contested`): one warning per
object, the gauge ``vwserver_syncer_contested_objects``, and :meth:`ResourceController.contested` /
:meth:`~ResourceController.contention` for readiness.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from vwserver.clock import Clock, rfc3339
from vwserver.errors import (
    ApiConflict,
    ApiError,
    ApiNotFound,
    InvalidRelated,
    ObjectTooLarge,
    OwnershipError,
    SyncError,
    UpstreamUnavailable,
)
from vwserver.k8s import kcp
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.cache import Cache
from vwserver.k8s.client import JSON, KubeClient
from vwserver.k8s.queue import WorkQueue
from vwserver.k8s.reflector import Reflector
from vwserver.k8s.resources import EVENTS, NAMESPACES, ResourceType
from vwserver.syncer import related_plan, sync_plan
from vwserver.syncer.config import ResourceConfig, SyncerConfig
from vwserver.syncer.memory import UPSTREAM_PAGE, SharingCache, TenantBudget, TenantLedger
from vwserver.syncer.metrics import SyncerMetrics
from vwserver.syncer.namespaces import Janitor
from vwserver.syncer.naming import (
    LABEL_SYNCER,
    ObjectKey,
    downstream_namespace,
    finalizer,
    finalizer_owner,
    namespace_conflict,
    source_key,
    upstream_key,
)
from vwserver.syncer.related_io import Pair, RelatedWatch
from vwserver.syncer.related_spec import compile_all

log = logging.getLogger(__name__)

_MAX_MESSAGE = 1024
#: Rounds of putting back a label/annotation someone else changed on the copy, after which the
#: syncer stops writing that key for the object (and says so in its condition): never a fight.
FLIP_LIMIT = 3


@dataclass(frozen=True, slots=True)
class StuckObject:
    key: ObjectKey
    resource: str
    message: str
    since: str


@dataclass(frozen=True, slots=True)
class ContestedObject:
    """An upstream object this syncer leaves alone because ``owner``'s finalizer comes first."""

    key: ObjectKey
    resource: str
    owner: str
    message: str
    since: str


class _Wait(Exception):
    """Stop executing this plan and look at the key again after ``seconds``."""

    def __init__(self, seconds: float, reason: str) -> None:
        super().__init__(reason)
        self.seconds = seconds


def error_reason(error: Exception) -> str:
    """The ``reason`` of the ``Synced=False`` condition for an error (CamelCase, like Status
    reasons): ``NotOwned``, the API's own reason (``Forbidden``, ``Invalid``, ...),
    ``Unreachable``, or ``InternalError`` for a bug."""
    if isinstance(error, SyncError):
        return error.reason
    if isinstance(error, ApiError):
        return error.reason or f"HTTP{error.code}"
    if isinstance(error, UpstreamUnavailable):
        return "Unreachable"
    return "InternalError"


#: Errors no retry fixes until the object changes (a refused object, one over the size limit):
#: retried from 30 s doubling to an hour, not every minute — each retry of a big object is a
#: big write. A change of the object (its event) is still synced at once.
PERMANENT_BACKOFF = Backoff(initial=30.0, maximum=3600.0, jitter=0.1)

# Addresses in an API server's message (webhook URLs, "dial tcp 10.0.0.7:443", host:port).
_ADDRESS = re.compile(
    r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"']+"
    r"|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"
    r"|\[[0-9a-fA-F:]+\](?::\d+)?"
)


def permanent(error: Exception) -> bool:
    """Whether retrying cannot help until the object (or the downstream schema) changes: the
    API server refused the request itself (400, 413, 422), or the syncer did (a
    :class:`~vwserver.errors.SyncError` marked permanent)."""
    if isinstance(error, SyncError):
        return error.permanent
    return isinstance(error, ApiError) and error.code in (400, 413, 422)


def error_message(error: Exception, *, downstream_base: str, hide: Iterable[str] = ()) -> str:
    """The ``Synced=False`` message for an error, as a *tenant* may read it: which side failed
    and why, never an address — not the downstream cluster's URL or query (the URL an
    :class:`~vwserver.errors.ApiError` carries), not a host, IP address or URL in the server's
    own message (a webhook's address), not the strings in ``hide`` (the endpoints' hosts)."""
    down = urlsplit(downstream_base).netloc
    if isinstance(error, ApiError):
        side = "the downstream cluster" if error.url.startswith(downstream_base) else "kcp"
        text = f"{side} answered {error.code} {error.reason or 'error'}: {error.message}"
    elif isinstance(error, UpstreamUnavailable):
        side = "the downstream cluster" if down and down in str(error) else "kcp"
        text = f"{side} is unreachable"
    elif isinstance(error, SyncError):
        text = str(error)
    else:
        text = f"internal error ({type(error).__name__}); see the syncer's log"
    for secret in (down, *hide):
        if secret:
            text = text.replace(secret, "<address>")
    return _ADDRESS.sub("<address>", text)[:_MAX_MESSAGE]


def namespace_key(pair: Pair) -> ObjectKey:
    """The key of a namespace's own sync (no primary has an empty name): its related copies'
    sweep and its removal, when no primary is left there."""
    return ObjectKey(pair[0], pair[1], "")


def related_error(reason: str, message: str) -> SyncError:
    """The error a related object's problem is shown as (``Synced=False``, ``reason``)."""
    if reason == "ObjectTooLarge":
        return ObjectTooLarge(message)
    if reason == "NotOwned":
        return OwnershipError(message)
    return InvalidRelated(message)


def _dotted(path: sync_plan.FieldPath) -> str:
    """``("status", "conditions", "[]", "reason")`` → ``status.conditions[].reason``."""
    return ".".join(path).replace(".[]", "[]")


def _downstream_key(obj: JSON) -> tuple[str, str] | None:
    meta = obj.get("metadata") or {}
    if not meta.get("name"):
        return None
    return (str(meta.get("namespace", "")), str(meta["name"]))


class ResourceController:
    def __init__(
        self,
        *,
        config: SyncerConfig,
        resource: ResourceConfig,
        upstream: KubeClient,
        downstream: KubeClient,
        downstream_base: str,
        metrics: SyncerMetrics,
        clock: Clock,
    ) -> None:
        self.config = config
        self.resource = resource
        self.source = ResourceType(
            resource.group, resource.version, resource.resource, resource.kind
        )
        t = resource.target
        self.target = ResourceType(t.group, t.version, t.resource, t.kind)
        self.name = f"{resource.resource}.{resource.group}" if resource.group else resource.resource
        self._upstream = upstream
        self._downstream = downstream
        self._down_base = downstream_base
        self._metrics = metrics
        self._clock = clock
        self.queue: WorkQueue[ObjectKey] = WorkQueue(clock=clock)
        self.upstream_reflectors: dict[str, Reflector[Cache[ObjectKey]]] = {}
        self._upstream_tasks: dict[str, asyncio.Task[None]] = {}
        #: Per endpoint, the size bounds of what its reflector keeps (vwserver.syncer.memory).
        self._budgets: dict[str, TenantBudget] = {}
        #: What each consumer workspace's objects of this resource and their related objects
        #: hold, against ``maxClusterBytes``: one budget for all of them.
        self.ledger = TenantLedger(resource.max_cluster_bytes)
        self._endpoints_known = False
        self.downstream_reflector = Reflector(
            name=f"downstream {self.name}",
            client=downstream,
            url=self.target.collection(downstream_base),
            handler=SharingCache(
                key=_downstream_key,
                handler=_DownstreamEvents(self),
                upstream_of=self._source_of,
            ),
            clock=clock,
            label_selector=f"{LABEL_SYNCER}={config.name}",
            on_restart=lambda cause: metrics.watch_restarts.labels(
                self.name, "downstream", cause
            ).inc(),
        )
        #: Last state of upstream objects seen leaving the view, until their key is handled.
        self.tombstones: dict[ObjectKey, JSON] = {}
        self.stuck: dict[ObjectKey, StuckObject] = {}
        self._contested: dict[ObjectKey, ContestedObject] = {}
        self._namespaces_ok: set[str] = set()
        #: Per object, how often each user label/annotation was put back after someone else
        #: changed it on the copy, and the keys no longer written (FLIP_LIMIT reached).
        self._flips: dict[ObjectKey, dict[sync_plan.MetadataKey, int]] = {}
        self.withheld: dict[ObjectKey, frozenset[sync_plan.MetadataKey]] = {}
        #: The same for copies of related objects, per namespace and (related entry, copy
        #: name): a copy is shared by the namespace's primaries, so are its rounds.
        self._related_flips: dict[Pair, dict[tuple[str, str], dict[sync_plan.MetadataKey, int]]]
        self._related_flips = {}
        self.related_withheld: dict[Pair, dict[tuple[str, str], frozenset[sync_plan.MetadataKey]]]
        self.related_withheld = {}
        #: What kcp's schema of this resource does to the status we write (learned).
        self.upstream_schema = sync_plan.SchemaFacts()
        #: What the downstream schema does to the copies we apply (learned).
        self.downstream_schema = sync_plan.SchemaFacts()
        #: The primaries of each (logical cluster, namespace), as kcp shows them and as their
        #: downstream copies name them: a related object's change re-queues these.
        self._up_members: dict[Pair, set[ObjectKey]] = {}
        self._down_members: dict[Pair, set[ObjectKey]] = {}
        #: Downstream namespace → its (cluster, namespace), for sources of origin downstream.
        self._pairs: dict[str, Pair] = {}
        #: One sync at a time per namespace: the related plan is the namespace's.
        self._locks: dict[Pair, asyncio.Lock] = {}
        self.janitor = Janitor(
            client=downstream,
            base=downstream_base,
            prefix=config.namespace_prefix,
            clock=clock,
            on_delete=self._namespace_deleted,
        )
        self.related = [
            RelatedWatch(
                spec,
                syncer=config.name,
                field_manager=config.field_manager,
                namespace_prefix=config.namespace_prefix,
                upstream=upstream,
                downstream=downstream,
                downstream_base=downstream_base,
                clock=clock,
                metrics=metrics,
                metrics_name=self.name,
                max_object_bytes=resource.max_object_bytes,
                ledger=self.ledger,
                pair_of_namespace=self._pairs.get,
                changed=self._related_changed,
            )
            for spec in compile_all(resource)
        ]

    # --- state --------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """Every cache has completed a list (and the upstream endpoints are known)."""
        return (
            self._endpoints_known
            and self.downstream_reflector.synced.is_set()
            and all(i.synced.is_set() for i in self.upstream_reflectors.values())
            and all(r.synced for r in self.related)
        )

    def problems(self) -> list[str]:
        """Why this controller is not ready, for ``/readyz``."""
        out = []
        if not self._endpoints_known:
            out.append(f"{self.name}: upstream endpoints not known yet")
        reflectors: list[Reflector[Any]] = [
            self.downstream_reflector,
            *self.upstream_reflectors.values(),
            *(r for watch in self.related for r in watch.all_reflectors()),
        ]
        for reflector in reflectors:
            if not reflector.synced.is_set():
                detail = f" ({reflector.last_error})" if reflector.last_error else ""
                out.append(f"{reflector.name}: not synced{detail}")
        return out

    def contested(self) -> list[ContestedObject]:
        """Objects another syncer owns that this one sees (and leaves alone), oldest first."""
        return sorted(self._contested.values(), key=lambda c: (c.since, c.key))

    def contention(self) -> str | None:
        """One line for ``/readyz`` while objects are contested, else None: another syncer sees
        the same objects, a configuration error only a human can resolve."""
        if not self._contested:
            return None
        owners = ", ".join(sorted({c.owner for c in self._contested.values()}))
        example = min(self._contested)
        return (
            f"{self.name}: {len(self._contested)} object(s) owned by other syncer(s) ({owners}), "
            f"e.g. {example}; left alone: give the syncers disjoint endpoints"
        )

    def upstream_object(self, key: ObjectKey) -> tuple[JSON | None, str | None]:
        """The cached upstream object and the endpoint it came from."""
        for endpoint, reflector in self.upstream_reflectors.items():
            obj = reflector.handler.get(key)
            if obj is not None:
                return obj, endpoint
        return None, None

    def too_large(self, key: ObjectKey) -> str | None:
        """Why ``key`` is kept only as a stub (over a size bound), or None."""
        for budget in self._budgets.values():
            if (reason := budget.too_large.get(key)) is not None:
                return reason
        return None

    def _source_of(self, copy: JSON) -> JSON | None:
        key = source_key(copy)
        return None if key is None else self.upstream_object(key)[0]

    def downstream_object(self, key: ObjectKey) -> JSON | None:
        namespace = self._namespace_of(key)
        return self.downstream_reflector.handler.get((namespace, key.name))

    def _namespace_of(self, key: ObjectKey) -> str:
        return downstream_namespace(key.cluster, key.namespace, prefix=self.config.namespace_prefix)

    # --- endpoints ----------------------------------------------------------------------------

    def set_endpoints(self, urls: Iterable[str]) -> None:
        """Use exactly these upstream endpoint URLs (start and stop reflectors accordingly)."""
        wanted = [u.rstrip("/") for u in urls]
        for url in list(self.upstream_reflectors):
            if url not in wanted:
                log.info("%s: endpoint %s removed", self.name, url)
                self._upstream_tasks.pop(url).cancel()
                budget = self._budgets.pop(url, None)
                if budget is not None:
                    budget.begin_list()  # what its objects took of the tenants' budgets
                reflector = self.upstream_reflectors.pop(url)
                for obj in reflector.handler.objects.values():
                    if (key := upstream_key(obj)) is not None:
                        self.queue.add(key)
        for url in wanted:
            if url in self.upstream_reflectors:
                continue
            budget = self._budgets[url] = TenantBudget(
                key=upstream_key,
                max_object_bytes=self.resource.max_object_bytes,
                ledger=self.ledger,
            )
            reflector = Reflector(
                name=f"upstream {self.name} @ {url}",
                client=self._upstream,
                url=self.source.collection(kcp.clusters(url)),
                handler=Cache(key=upstream_key, handler=_UpstreamEvents(self)),
                clock=self._clock,
                admission=budget,
                page_size=UPSTREAM_PAGE,
                on_restart=lambda cause: self._metrics.watch_restarts.labels(
                    self.name, "upstream", cause
                ).inc(),
            )
            self.upstream_reflectors[url] = reflector
            self._upstream_tasks[url] = asyncio.create_task(
                reflector.run(), name=f"reflector {reflector.name}"
            )
        for watch in self.related:
            watch.set_endpoints(wanted)
        self._endpoints_known = True

    # --- running ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run reflectors, workers and the periodic resync until cancelled."""
        tasks = [
            asyncio.create_task(
                self.downstream_reflector.run(), name=f"reflector {self.downstream_reflector.name}"
            ),
            asyncio.create_task(self._resync_loop(), name=f"resync {self.name}"),
            *(
                asyncio.create_task(w.run(), name=f"related {self.name} {w.spec.name}")
                for w in self.related
            ),
            *(
                asyncio.create_task(self._worker(), name=f"worker {self.name} {i}")
                for i in range(self.config.workers)
            ),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # a crashed loop is a bug: let it surface
        finally:
            self.queue.shutdown()
            for task in (*tasks, *self._upstream_tasks.values()):
                task.cancel()
            await asyncio.gather(*tasks, *self._upstream_tasks.values(), return_exceptions=True)

    async def _resync_loop(self) -> None:
        while not self.synced:
            await self._clock.sleep(0.2)
        while True:
            self._metrics.informers_synced.labels(self.name).set(1)
            self.resync()
            await self._clock.sleep(self.config.resync_seconds)

    def resync(self) -> None:
        """Queue every known key: upstream objects and the sources of downstream objects (the
        sweep: a downstream object whose source is gone is deleted by its reconcile). A key
        waiting for the retry of a failure is left waiting: the resync must not cut a backoff
        short (a permanent error would be retried every ``resyncSeconds`` otherwise)."""
        for reflector in self.upstream_reflectors.values():
            for obj in reflector.handler.objects.values():
                if (key := upstream_key(obj)) is not None and not self.queue.backing_off(key):
                    self.queue.add(key)
        for obj in self.downstream_reflector.handler.objects.values():
            if (key := source_key(obj)) is not None and not self.queue.backing_off(key):
                self.queue.add(key)
        # namespaces holding copies of related objects but no primary: their sweep
        for watch in self.related:
            for copies in watch.copy_pairs():
                if not self._members(copies):
                    self.queue.add(namespace_key(copies))
        # namespaces found not empty when their last object went: look again
        for name in list(self.janitor.pending):
            found = self._pairs.get(name)
            if found is not None and not self._members(found):
                self.queue.add(namespace_key(found))
        self._update_gauges()

    def _update_gauges(self) -> None:
        self._metrics.queue_depth.labels(self.name).set(len(self.queue))
        upstream = sum(len(r.handler) for r in self.upstream_reflectors.values())
        self._metrics.objects.labels(self.name, "upstream").set(upstream)
        self._metrics.objects.labels(self.name, "downstream").set(
            len(self.downstream_reflector.handler)
        )
        self._metrics.stuck_finalizers.labels(self.name).set(len(self.stuck))
        self._metrics.contested_objects.labels(self.name).set(len(self._contested))
        self._metrics.pruned_fields.labels(self.name, "upstream").set(
            len(self.upstream_schema.pruned)
        )
        self._metrics.pruned_fields.labels(self.name, "downstream").set(
            len(self.downstream_schema.pruned)
        )

    async def _worker(self) -> None:
        await self.queue.work(self._process)

    async def _process(self, key: ObjectKey) -> None:
        """Sync one key from the queue and decide when to look at it again."""
        try:
            await self.sync(key)
        except _Wait as wait:
            self.queue.forget(key)
            self.queue.add_after(key, wait.seconds)
        except ApiConflict:
            # A stale cache (our write raced an event): look again shortly, not an error.
            self._metrics.reconciles.labels(self.name, "conflict").inc()
            self.queue.add_rate_limited(key)
        except (ApiError, SyncError, UpstreamUnavailable) as e:
            await self._failed(key, e)
        except Exception as e:
            # A bug, not a sync problem; still retried and shown on the object.
            log.exception("%s: unexpected error syncing %s", self.name, key)
            await self._failed(key, e)
        else:
            self.queue.forget(key)
            self._metrics.reconciles.labels(self.name, "ok").inc()
        finally:
            self._update_gauges()

    async def _failed(self, key: ObjectKey, error: Exception) -> None:
        delay = self.queue.add_rate_limited(
            key, backoff=PERMANENT_BACKOFF if permanent(error) else None
        )
        reason = error_reason(error)
        self._metrics.reconciles.labels(self.name, "error").inc()
        self._metrics.sync_errors.labels(self.name, reason).inc()
        log.warning("%s: sync of %s failed (retry in %.1fs): %s", self.name, key, delay, error)
        upstream, endpoint = self.upstream_object(key)
        if upstream is None or endpoint is None:
            return  # nothing left to report on (gone from our view)
        meta = upstream.get("metadata") or {}
        owner = finalizer_owner(
            meta.get("finalizers") or (), managed_fields=meta.get("managedFields")
        )
        if owner not in (None, self.config.name):
            return  # another syncer's object: its status is not ours to write
        condition = sync_plan.new_condition(
            status=False,
            reason=reason,
            message=error_message(
                error,
                downstream_base=self._down_base,
                hide=[urlsplit(u).netloc for u in self.upstream_reflectors],
            ),
            generation=meta.get("generation"),
        )
        patch = sync_plan.condition_patch(
            upstream, condition, now=self._clock.now(), schema=self.upstream_schema
        )
        if patch is None:
            return
        try:
            result = await self._upstream.merge_patch(
                self._upstream_url(key, endpoint, "status"), patch
            )
            self._metrics.writes.labels(self.name, "upstream", "status").inc()
        except (ApiError, UpstreamUnavailable) as e:
            log.warning("%s: cannot report the error on %s: %s", self.name, key, e)
        else:
            self._learn(key, patch, result, upstream=True)

    # --- one key ------------------------------------------------------------------------------

    async def sync(self, key: ObjectKey) -> None:
        pair = (key.cluster, key.namespace)
        lock = self._locks.setdefault(pair, asyncio.Lock())
        async with lock:
            await self._sync(key)

    async def _sync(self, key: ObjectKey) -> None:
        upstream, endpoint = self.upstream_object(key)
        if upstream is not None:
            self.tombstones.pop(key, None)
            self._clear_stuck(key)
        downstream = self.downstream_object(key)
        if upstream is not None and downstream is None and self._related_listing():
            # a new copy waits for the related caches' first lists: a Secret found by selector
            # is known only from them, and the copies down go before the primary's copy
            raise _Wait(0.5, "related objects not listed yet")
        self._confirm_schema(key, upstream, downstream)
        tombstone = self.tombstones.get(key)
        ctx = sync_plan.Context(
            syncer=self.config.name,
            finalizer=self.config.finalizer,
            resource=self.resource,
            namespace_prefix=self.config.namespace_prefix,
            exclude_prefixes=(
                *self.config.exclude_metadata_prefixes,
                *self.resource.metadata_exclude,
            ),
            may_delete_orphans=self.synced,
            now=self._clock.now(),
            upstream_schema=self.upstream_schema,
            downstream_schema=self.downstream_schema,
            withheld=self.withheld.get(key, frozenset()),
            too_large=None if upstream is None else self.too_large(key),
        )
        fetched = await self._fetch_related(key, upstream, downstream, endpoint=endpoint)
        ctx = self._with_related(key, ctx, fetched=fetched)
        if endpoint is None:
            endpoint = self._endpoint_of((key.cluster, key.namespace))
        if upstream is None:
            self._flips.pop(key, None)
            self.withheld.pop(key, None)
        actions = sync_plan.plan(key, upstream, downstream, tombstone=tombstone, ctx=ctx)
        if actions:
            log.debug("%s: %s: %s", self.name, key, [type(a).__name__ for a in actions])
        if not any(isinstance(a, sync_plan.Contested) for a in actions):
            self._clear_contested(key, gone=upstream is None)
        written: str | None = None  # the resourceVersion our status write made
        for action in actions:
            if isinstance(action, sync_plan.SetFinalizers) and written is not None:
                # our own status write moved the version on: the finalizer write is conditional
                # on the object as we left it, not as we read it (else a 409 and one more round)
                action = dataclasses.replace(action, resource_version=written)
            written = await self._execute(key, action, endpoint=endpoint)
        if upstream is None:
            self.tombstones.pop(key, None)

    async def _execute(
        self, key: ObjectKey, action: sync_plan.Action, *, endpoint: str | None
    ) -> str | None:
        """Carry out one action; the resourceVersion a status write left, else None."""
        name = self.name
        match action:
            case sync_plan.SetFinalizers(finalizers, rv, verify_gone):
                assert endpoint is not None
                if verify_gone is not None:
                    url = self.target.item(self._down_base, *verify_gone)
                    if await self._downstream.get(url) is not None:
                        raise _Wait(2.0, "downstream object still exists")
                # under the syncer's field manager: managedFields then names it as the
                # finalizer's author, which is what makes it a claim (naming.finalizer_owner)
                await self._upstream.merge_patch(
                    self._upstream_url(key, endpoint),
                    {"metadata": {"finalizers": list(finalizers), "resourceVersion": rv}},
                    field_manager=self.config.field_manager,
                )
                self._metrics.writes.labels(name, "upstream", "finalizer").inc()
                log.info(
                    "%s: %s: finalizer %s %s",
                    name,
                    key,
                    self.config.finalizer,
                    "removed" if verify_gone else "added",
                )
            case sync_plan.EnsureNamespace(namespace, metadata):
                await self._ensure_namespace(key, namespace, metadata)
            case sync_plan.Apply(namespace, obj_name, body, overwritten):
                if self._count_flips(key, overwritten):
                    raise _Wait(0.0, "metadata keys withheld; planning again without them")
                url = self.target.item(self._down_base, namespace, obj_name)
                try:
                    stored = await self._downstream.apply(
                        url, body, field_manager=self.config.field_manager
                    )
                except ApiNotFound:
                    self._namespaces_ok.discard(namespace)  # deleted behind our back
                    raise
                self._metrics.writes.labels(name, "downstream", "apply").inc()
                log.info("%s: %s: applied downstream %s/%s", name, key, namespace, obj_name)
                self._learn(key, body, stored, upstream=False)
            case sync_plan.Delete(namespace, obj_name, uid, confirm):
                if confirm and endpoint is None:
                    endpoint = self._any_endpoint(key)
                if confirm and endpoint is not None:
                    live = await self._upstream.get(self._upstream_url(key, endpoint))
                    if live is not None:
                        log.info("%s: %s: still exists upstream, not an orphan", name, key)
                        return None
                url = self.target.item(self._down_base, namespace, obj_name)
                # gone already (404), or replaced: the uid differs (409)
                with contextlib.suppress(ApiNotFound, ApiConflict):
                    await self._downstream.delete(url, uid=uid or None)
                self._metrics.writes.labels(name, "downstream", "delete").inc()
                log.info("%s: %s: deleted downstream %s/%s", name, key, namespace, obj_name)
            case sync_plan.PatchStatus(patch):
                assert endpoint is not None
                try:
                    result = await self._upstream.merge_patch(
                        self._upstream_url(key, endpoint, "status"), patch
                    )
                except ApiNotFound:
                    return None  # deleted or out of view meanwhile; its event follows
                self._metrics.writes.labels(name, "upstream", "status").inc()
                self._learn(key, patch, result, upstream=True)
                return str((result.get("metadata") or {}).get("resourceVersion") or "") or None
            case sync_plan.RelatedCopies(copies):
                pair = (key.cluster, key.namespace)
                for copy in copies:
                    watch = next(w for w in self.related if w.spec.name == copy.related)
                    if copy.down:
                        # the namespace of a copy down exists before the primary's copy
                        self.janitor.forget(copy.namespace)
                    if isinstance(copy, related_plan.CopyApply) and self._count_related_flips(
                        pair, copy
                    ):
                        raise _Wait(0.0, "metadata keys withheld; planning again without them")
                    await watch.execute(copy, cluster=key.cluster, endpoint=endpoint)
                    if isinstance(copy, related_plan.CopyDelete):
                        self._forget_related_flips(pair, (copy.related, copy.name))
            case sync_plan.RelatedFailed(reason, message):
                raise related_error(reason, message)
            case sync_plan.CleanNamespace(namespace):
                await self.janitor.check(namespace)
            case sync_plan.Wait(seconds, reason):
                raise _Wait(seconds, reason)
            case sync_plan.Blocked(message):
                raise OwnershipError(message)
            case sync_plan.TooLarge(message):
                raise ObjectTooLarge(message)
            case sync_plan.Stuck(message):
                await self._report_stuck(key, message)
            case sync_plan.Contested(owner, message):
                self._record_contested(key, owner, message)
        return None

    def _count_flips(self, key: ObjectKey, overwritten: frozenset[sync_plan.MetadataKey]) -> bool:
        """Count one more round of putting ``overwritten`` back; True when a key reached
        :data:`FLIP_LIMIT` and is withheld from now on (the apply is planned again without)."""
        if not overwritten:
            return False
        stop = _count_rounds(self._flips.setdefault(key, {}), overwritten)
        if not stop:
            return False
        self.withheld[key] = self.withheld.get(key, frozenset()) | stop
        log.warning(
            "%s: %s: %s changed on the downstream copy by another writer %d times; no longer "
            "written (reported in the Synced condition)",
            self.name,
            key,
            ", ".join(f"{kind[:-1]} {name}" for kind, name in sorted(stop)),
            FLIP_LIMIT,
        )
        return True

    def _count_related_flips(self, pair: Pair, copy: related_plan.CopyApply) -> bool:
        """:meth:`_count_flips` for a copy of a related object (the same :data:`FLIP_LIMIT`):
        True when a key is withheld from now on; reported in the ``Synced`` message of the
        primaries that reference it (a note of the related plan)."""
        if not copy.overwritten:
            return False
        which = (copy.related, copy.name)
        counts = self._related_flips.setdefault(pair, {}).setdefault(which, {})
        stop = _count_rounds(counts, copy.overwritten)
        if not stop:
            return False
        known = self.related_withheld.setdefault(pair, {})
        known[which] = known.get(which, frozenset()) | stop
        log.warning(
            "%s: related %s %s/%s: %s changed on the copy by another writer %d times; no "
            "longer written (reported in the Synced condition of the objects naming it)",
            self.name,
            copy.related,
            copy.namespace,
            copy.name,
            ", ".join(f"{kind[:-1]} {name}" for kind, name in sorted(stop)),
            FLIP_LIMIT,
        )
        return True

    def _forget_related_flips(self, pair: Pair, which: tuple[str, str]) -> None:
        """The copy is deleted: a new one starts with no rounds and writes every key."""
        tables: tuple[dict[Pair, dict[tuple[str, str], Any]], ...] = (
            self._related_flips,
            self.related_withheld,
        )
        for table in tables:
            entries = table.get(pair)
            if entries is not None:
                entries.pop(which, None)
                if not entries:
                    del table[pair]

    def _upstream_url(self, key: ObjectKey, endpoint: str, subresource: str | None = None) -> str:
        base = kcp.clusters(endpoint, key.cluster)
        return self.source.item(base, key.namespace or None, key.name, subresource=subresource)

    def _any_endpoint(self, key: ObjectKey) -> str | None:
        # A single endpoint is the common case; with several we cannot tell the shard, and a
        # 404 from the wrong one would be no proof: skip the confirmation GET then.
        return next(iter(self.upstream_reflectors)) if len(self.upstream_reflectors) == 1 else None

    async def _ensure_namespace(self, key: ObjectKey, namespace: str, metadata: JSON) -> None:
        if namespace in self._namespaces_ok:
            return
        url = NAMESPACES.item(self._down_base, None, namespace)
        existing = await self._downstream.get(url)
        if existing is None:
            body = {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": namespace, **metadata},
            }
            try:
                existing = await self._downstream.request(
                    "POST", NAMESPACES.collection(self._down_base), body=body
                )
                self._metrics.writes.labels(self.name, "downstream", "namespace").inc()
                log.info("%s: created downstream namespace %s for %s", self.name, namespace, key)
            except ApiConflict:
                existing = await self._downstream.get(url)  # created concurrently
                if existing is None:
                    raise
        problem = namespace_conflict(existing, cluster=key.cluster, namespace=key.namespace)
        if problem is not None:
            raise OwnershipError(problem)
        self._namespaces_ok.add(namespace)

    # --- related objects and namespaces -------------------------------------------------------

    def _members(self, pair: Pair) -> set[ObjectKey]:
        return self._up_members.get(pair, set()) | self._down_members.get(pair, set())

    def _index(self, members: dict[Pair, set[ObjectKey]], key: ObjectKey, *, add: bool) -> None:
        pair = (key.cluster, key.namespace)
        if add:
            members.setdefault(pair, set()).add(key)
            down = self._namespace_of(key)
            self._pairs.setdefault(down, pair)
            self.janitor.forget(down)
        elif (keys := members.get(pair)) is not None:
            keys.discard(key)
            if not keys:
                del members[pair]

    def _related_changed(self, pair: Pair) -> None:
        """A related object of the namespace ``pair`` changed (either side): every primary
        there is synced again (its related plan is the namespace's); with none, the namespace
        itself (its copies' sweep)."""
        members = self._members(pair)
        for key in members:
            self.queue.add(key)
        if not members:
            self.queue.add(namespace_key(pair))

    def _related_listing(self) -> bool:
        """Whether a related entry that copies down has not listed both its sides yet."""
        return any(not w.synced for w in self.related if w.spec.copies_down)

    def _endpoint_of(self, pair: Pair) -> str | None:
        for key in self._up_members.get(pair, ()):
            _, endpoint = self.upstream_object(key)
            if endpoint is not None:
                return endpoint
        return None

    async def _fetch_related(
        self,
        key: ObjectKey,
        upstream: JSON | None,
        downstream: JSON | None,
        *,
        endpoint: str | None,
    ) -> dict[str, dict[str, JSON]]:
        """Per related entry, the sources a new primary names that are not cached yet, read
        live (:func:`~vwserver.syncer.related_plan.missing_sources`): copies down go before
        the primary's copy even when the source's watch event comes after the primary's."""
        fetched: dict[str, dict[str, JSON]] = {}
        if endpoint is None or not self.related:
            return fetched
        pair = (key.cluster, key.namespace)
        down_ns = self._namespace_of(key)
        primary = related_plan.member(
            key,
            upstream,
            downstream,
            syncer=self.config.name,
            current=key,
            too_large=upstream is not None and self.too_large(key) is not None,
        )
        for watch in self.related:
            sources = watch.inputs(pair, down_ns).sources
            missing = related_plan.missing_sources(watch.spec, primary, sources)
            if missing:
                fetched[watch.spec.name] = await watch.fetch(pair, missing, endpoint=endpoint)
        return fetched

    def _with_related(
        self,
        key: ObjectKey,
        ctx: sync_plan.Context,
        *,
        fetched: Mapping[str, Mapping[str, JSON]] | None = None,
    ) -> sync_plan.Context:
        """``ctx`` with the related plan of ``key``'s namespace and whether nothing of ours is
        left there once ``key`` is gone; ``fetched``: :meth:`_fetch_related`'s."""
        pair = (key.cluster, key.namespace)
        down_ns = self._namespace_of(key)
        members = []
        others = False
        for k in self._members(pair):
            upstream, _ = self.upstream_object(k)
            downstream = self.downstream_object(k)
            if k != key and (upstream is not None or downstream is not None):
                others = True
            m = related_plan.member(
                k,
                upstream,
                downstream,
                syncer=self.config.name,
                current=key,
                too_large=upstream is not None and self.too_large(k) is not None,
            )
            if m is not None:
                members.append(m)
        outcome = None
        down_copies = 0
        if self.related:
            scope = related_plan.Scope(
                cluster=key.cluster,
                namespace=key.namespace,
                downstream_namespace=down_ns,
                syncer=self.config.name,
                current=key,
                may_delete=self.synced,
                exclude_prefixes=ctx.exclude_prefixes,
                withheld=self.related_withheld.get(pair, {}),
            )
            plan = related_plan.plan(
                [w.spec for w in self.related],
                {
                    w.spec.name: w.inputs(pair, down_ns, fetched=(fetched or {}).get(w.spec.name))
                    for w in self.related
                },
                members=members,
                scope=scope,
            )
            outcome = related_plan.outcome(plan)
            down_copies = plan.down_copies
        unused = self.synced and not others and down_copies == 0
        return dataclasses.replace(ctx, related=outcome, namespace_unused=unused)

    def _namespace_deleted(self, name: str) -> None:
        self._namespaces_ok.discard(name)
        self._metrics.writes.labels(self.name, "downstream", "namespace").inc()

    # --- what the schemas store -------------------------------------------------------------

    def _learn(self, key: ObjectKey, sent: JSON, stored: JSON, *, upstream: bool) -> None:
        """Remember what the schema did to a write (``stored``: the server's answer to it), and
        say so once per field: a pruned field is a schema mismatch someone may want to fix."""
        known = self.upstream_schema if upstream else self.downstream_schema
        facts = sync_plan.learn(sent, stored)
        pruned, defaulted = facts.pruned - known.pruned, facts.defaulted - known.defaulted
        if not pruned and not defaulted:
            return
        side = "kcp's schema" if upstream else "the downstream schema"
        for path in sorted(pruned):
            field = _dotted(path)
            if upstream and path == ("status", "conditions"):
                log.warning(
                    "%s: %s has no status.conditions (seen on %s): the Synced condition is not "
                    "written, sync errors are only visible in logs and metrics (add conditions "
                    "to the APIResourceSchema)",
                    self.name,
                    side,
                    key,
                )
            elif upstream:
                log.warning(
                    "%s: %s prunes %s (seen on %s): no longer written (add it to the "
                    "APIResourceSchema, or to statusExclude)",
                    self.name,
                    side,
                    field,
                    key,
                )
            else:
                log.warning(
                    "%s: %s prunes %s (seen on %s): the copies never have it; not counted as drift",
                    self.name,
                    side,
                    field,
                    key,
                )
        for path in sorted(defaulted):
            log.info(
                "%s: %s defaults %s (seen on %s): no longer removed",
                self.name,
                side,
                _dotted(path),
                key,
            )
        if upstream:
            self.upstream_schema = known | facts
        else:
            self.downstream_schema = known | facts
        self._update_gauges()

    def _confirm_schema(
        self, key: ObjectKey, upstream: JSON | None, downstream: JSON | None
    ) -> None:
        """Forget pruned fields an object has after all (the schema was changed to keep them)."""
        for is_upstream, obj in ((True, upstream), (False, downstream)):
            known = self.upstream_schema if is_upstream else self.downstream_schema
            if obj is None or not known.pruned:
                continue
            confirmed = known.confirmed_by(obj)
            if confirmed is known:
                continue
            for path in sorted(known.pruned - confirmed.pruned):
                log.info(
                    "%s: %s has %s: the schema stores it now; written and compared again",
                    self.name,
                    key,
                    _dotted(path),
                )
            if is_upstream:
                self.upstream_schema = confirmed
            else:
                self.downstream_schema = confirmed

    # --- another syncer's objects -------------------------------------------------------------

    def _record_contested(self, key: ObjectKey, owner: str, message: str) -> None:
        """Remember and report once (per object and owner) that another syncer owns ``key``."""
        known = self._contested.get(key)
        if known is not None and known.owner == owner:
            return
        self._contested[key] = ContestedObject(
            key=key,
            resource=self.name,
            owner=owner,
            message=message,
            since=rfc3339(self._clock.now()),
        )
        self._metrics.contested_objects.labels(self.name).set(len(self._contested))
        log.warning(
            "%s: CONTESTED: %s (give the syncers disjoint endpoints; if %s no longer sees the "
            "object, removing its finalizer %s hands it over)",
            self.name,
            message,
            owner,
            finalizer(owner),
        )

    def _clear_contested(self, key: ObjectKey, *, gone: bool) -> None:
        if self._contested.pop(key, None) is None:
            return
        self._metrics.contested_objects.labels(self.name).set(len(self._contested))
        if not gone:
            log.info("%s: %s is no longer owned by another syncer; syncing it", self.name, key)

    # --- the hard case: left the view holding our finalizer -------------------------------------

    async def _report_stuck(self, key: ObjectKey, message: str) -> None:
        if key in self.stuck:
            return
        self.stuck[key] = StuckObject(
            key=key, resource=self.name, message=message, since=rfc3339(self._clock.now())
        )
        self._metrics.stuck_finalizers.labels(self.name).set(len(self.stuck))
        log.warning("%s: STUCK FINALIZER: %s", self.name, message)
        await self._downstream_event(key, reason="FinalizerStuck", message=message)

    def _clear_stuck(self, key: ObjectKey) -> None:
        if self.stuck.pop(key, None) is not None:
            log.info("%s: %s is visible again; its finalizer is handled normally", self.name, key)
            self._metrics.stuck_finalizers.labels(self.name).set(len(self.stuck))

    async def _downstream_event(self, key: ObjectKey, *, reason: str, message: str) -> None:
        """A Warning Event in the downstream namespace the copy lived in: the one place besides
        logs and metrics this syncer can still write about an object it can no longer see."""
        namespace = self._namespace_of(key)
        now = rfc3339(self._clock.now())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{key.name[:40]}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": self.target.api_version,
                "kind": self.target.kind,
                "namespace": namespace,
                "name": key.name,
            },
            "reason": reason,
            "message": message[:_MAX_MESSAGE],
            "type": "Warning",
            "source": {"component": self.config.field_manager},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._downstream.request(
                "POST", EVENTS.collection(self._down_base, namespace), body=event
            )
            self._metrics.writes.labels(self.name, "downstream", "event").inc()
        except (ApiError, UpstreamUnavailable) as e:
            log.warning("%s: cannot record event for %s downstream: %s", self.name, key, e)


def _count_rounds(
    counts: dict[sync_plan.MetadataKey, int], overwritten: frozenset[sync_plan.MetadataKey]
) -> set[sync_plan.MetadataKey]:
    """One more round of putting ``overwritten`` back into ``counts``; the keys that reached
    :data:`FLIP_LIMIT` with it."""
    stop = set()
    for item in overwritten:
        counts[item] = counts.get(item, 0) + 1
        if counts[item] >= FLIP_LIMIT:
            stop.add(item)
    return stop


class _UpstreamEvents:
    def __init__(self, controller: ResourceController) -> None:
        self._c = controller

    def on_upsert(self, obj: JSON) -> None:
        if (key := upstream_key(obj)) is not None:
            self._c.tombstones.pop(key, None)
            self._c._index(self._c._up_members, key, add=True)
            self._c.queue.add(key)

    def on_delete(self, obj: JSON) -> None:
        if (key := upstream_key(obj)) is not None:
            self._c.tombstones[key] = obj
            self._c._index(self._c._up_members, key, add=False)
            self._c.queue.add(key)


class _DownstreamEvents:
    def __init__(self, controller: ResourceController) -> None:
        self._c = controller

    def on_upsert(self, obj: JSON) -> None:
        if (key := source_key(obj)) is not None:
            self._c._index(self._c._down_members, key, add=True)
            self._c.queue.add(key)

    def on_delete(self, obj: JSON) -> None:
        if (key := source_key(obj)) is not None:
            self._c._index(self._c._down_members, key, add=False)
            self._c.queue.add(key)
