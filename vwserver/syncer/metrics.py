"""The syncer's Prometheus metrics, on a registry of its own (no process-global state).

Each :class:`SyncerMetrics` owns a ``CollectorRegistry``, so two syncers in one process (the e2e
tests run several) never share or clash on counters; ``/metrics`` renders that registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST


class SyncerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.reconciles = Counter(
            "vwserver_syncer_reconciles",
            "Reconciles of one upstream object, by result (ok, error, conflict).",
            ["resource", "result"],
            registry=r,
        )
        self.sync_errors = Counter(
            "vwserver_syncer_sync_errors",
            "Failed reconciles by error reason (NotOwned, ApiError, Unreachable, ...).",
            ["resource", "reason"],
            registry=r,
        )
        self.writes = Counter(
            "vwserver_syncer_writes",
            "Writes by side (upstream, downstream) and kind (apply, delete, status, finalizer, "
            "namespace, event).",
            ["resource", "side", "kind"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "vwserver_syncer_queue_depth",
            "Keys waiting in the work queue.",
            ["resource"],
            registry=r,
        )
        self.objects = Gauge(
            "vwserver_syncer_cached_objects",
            "Objects in the informer caches, by side.",
            ["resource", "side"],
            registry=r,
        )
        self.stuck_finalizers = Gauge(
            "vwserver_syncer_stuck_finalizers",
            "Objects that left this syncer's view while carrying its finalizer (the finalizer "
            "cannot be removed through the endpoint).",
            ["resource"],
            registry=r,
        )
        self.contested_objects = Gauge(
            "vwserver_syncer_contested_objects",
            "Objects this syncer sees but leaves alone because another syncer's finalizer comes "
            "first on them (two syncers see the same objects).",
            ["resource"],
            registry=r,
        )
        self.pruned_fields = Gauge(
            "vwserver_syncer_pruned_fields",
            "Fields the syncer writes that the schema on that side (upstream: kcp status, "
            "downstream: the copies) does not store, learned from the answers to its writes; "
            "they are no longer written or compared.",
            ["resource", "side"],
            registry=r,
        )
        self.watch_restarts = Counter(
            "vwserver_syncer_watch_restarts",
            "Informer restarts by cause (gone: 410 relist, error: backoff).",
            ["resource", "side", "cause"],
            registry=r,
        )
        self.informers_synced = Gauge(
            "vwserver_syncer_informers_synced",
            "1 when every informer of the resource has completed its first list.",
            ["resource"],
            registry=r,
        )
        self.leader = Gauge(
            "vwserver_syncer_leader", "1 while this replica holds the leader lease.", registry=r
        )
        self.endpoints = Gauge(
            "vwserver_syncer_upstream_endpoints", "Upstream endpoint URLs in use.", registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
