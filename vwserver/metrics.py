"""The server's Prometheus metrics (``vwserver serve``), on a registry of its own.

Why a registry per :class:`ServerMetrics` and not prometheus_client's global one: tests start
many servers in one process, and each must count only its own requests (the syncer does the same,
:mod:`vwserver.syncer.metrics`). :func:`vwserver.server.build_app` serves the registry at
``metrics.path``; whoever builds the proxy and the controller passes one object to both.

Label cardinality is bounded by construction: ``slice`` is ``<cluster>/<name>`` of a slice in the
route table and :data:`UNKNOWN` for anything else (a client can put any name in a URL, and each
would otherwise become a time series); ``verb`` is one of the apiserver's verbs; ``code`` one of
the HTTP status codes the proxy answers; the other labels are fixed sets named below. The shared
watch cache's metrics name the upstream collection a cache follows by ``resource``, its path in
the virtual workspace (``/services/apiexport/<export cluster>/<export>/clusters/*/<api path>``),
and ``shard``, a digest of the shard's origin (:func:`upstream_name`, which ``/debug/cache``
uses too): ``/metrics`` is served unauthenticated on the slice listener, and kcp's address is
none of its callers' business. One per served resource and upstream shard, bounded by the
configuration.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST

UNKNOWN = "unknown"
"""The ``slice`` (and ``verb``) label of a request that names no known slice (or verb)."""

# Watch event outcomes (``vwserver_watch_events_total{outcome}``), see vwserver.proxy.filtering.
FORWARDED = "forwarded"  # sent as the upstream's bytes
DROPPED = "dropped"  # filtered out: nothing sent (an ADDED outside the slice)
SYNTHESIZED = "synthesized"  # replaced by a synthetic DELETED (an object that left the slice)

# Upstream error kinds (``vwserver_upstream_errors_total{kind}``).
UNREACHABLE = "unreachable"  # no answer: connect failed, timed out, or the connection broke
BAD_GATEWAY = "bad_gateway"  # an answer the proxy cannot use (undecodable, too large, ...)
UPSTREAM_5XX = "5xx"  # the upstream answered with a 5xx status, relayed to the client


@dataclass(frozen=True)
class UpstreamName:
    """How vwserver names an upstream collection where kcp's address must not show (the
    metrics' labels, ``/debug/cache``): its ``path`` in the virtual workspace and its ``shard``,
    the first 12 hex digits of the SHA-256 of the shard's origin (``scheme://host:port``), which
    tells two shards apart without naming either."""

    path: str
    shard: str
    _origin: str
    _netloc: str

    def labels(self) -> dict[str, str]:
        """The metrics' labels for the collection."""
        return {"resource": self.path, "shard": self.shard}

    def scrub(self, text: str) -> str:
        """``text`` (e.g. an error message about this collection) with the shard's origin and
        host:port replaced by ``<kcp>``."""
        return text.replace(self._origin, "<kcp>").replace(self._netloc, "<kcp>")


@functools.lru_cache(maxsize=1024)
def upstream_name(url: str) -> UpstreamName:
    """The :class:`UpstreamName` of the upstream collection ``url`` (its path may carry a
    suffix such as `` (as Table)``: kept)."""
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc}"
    digest = hashlib.sha256(origin.encode()).hexdigest()[:12]
    return UpstreamName(path=parts.path, shard=digest, _origin=origin, _netloc=parts.netloc)


# Request latency buckets: the default ones up to 10 s, plus 30 s and 60 s for large LISTs that the
# proxy pages itself.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServerMetrics:
    """Every metric of ``vwserver serve``: the proxy's and the embedded controller's."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "vwserver_requests",
            "Slice requests by slice (<cluster>/<name>, or unknown), verb and HTTP code; a watch "
            "is counted when it ends. 499: the client went away before the response started.",
            ["slice", "verb", "code"],
            registry=r,
        )
        self.request_duration = Histogram(
            "vwserver_request_duration_seconds",
            "Slice request latency by verb: until the handler is done, except for watch: until "
            "the response headers are sent (the watch is established), not its whole lifetime.",
            ["verb"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.open_watches = Gauge(
            "vwserver_open_watches",
            "Watches currently streaming to clients, by slice.",
            ["slice"],
            registry=r,
        )
        self.watch_events = Counter(
            "vwserver_watch_events",
            "Upstream watch events by slice and outcome: forwarded (the original bytes), dropped "
            "(filtered out, nothing sent), synthesized (replaced by a minimal DELETED).",
            ["slice", "outcome"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "vwserver_upstream_errors",
            "Failed upstream exchanges by kind: unreachable (no answer, or the connection broke "
            "mid-stream), bad_gateway (an answer the proxy cannot use), 5xx (an upstream 5xx).",
            ["kind"],
            registry=r,
        )
        self.upstream_requests = Counter(
            "vwserver_upstream_requests",
            "Requests the proxy sent to kcp for its clients, by HTTP method (a LIST page, a GET, "
            "a write, a watch when it is opened); the shared cache's own list+watch and the "
            "controller's requests are not counted. Per client request this is bounded (a "
            "client's LIST page costs at most vwserver.proxy.lists.MAX_UPSTREAM_PAGES).",
            ["method"],
            registry=r,
        )
        self.moved_by_admission = Counter(
            "vwserver_writes_moved_by_admission",
            "Writes through a slice that kcp's mutating admission (a webhook or policy of the "
            "provider's workspace) moved out of the slice after vwserver checked them, by slice "
            "and verb: the write was made. Any count means the provider runs such admission: "
            "set mutatingAdmission (patches then keep their dry run).",
            ["slice", "verb"],
            registry=r,
        )
        self.upstream_out_of_scope = Counter(
            "vwserver_upstream_out_of_scope",
            "Objects and watch events the upstream sent outside the request's own scope (another "
            "logical cluster than the URL's, another namespace, another name than the one "
            "asked for), by slice and verb: never forwarded. kcp never sends them; any count is "
            "an upstream (or shard routing) bug.",
            ["slice", "verb"],
            registry=r,
        )
        self.connections_closed = Counter(
            "vwserver_connections_closed",
            "Client connections the server closed or refused, by reason: client_limit (over "
            "connections.maxConnectionsPerClient), header_timeout, body_timeout, malformed (a "
            "request that is not HTTP, or whose head is too large).",
            ["reason"],
            registry=r,
        )
        self.reconciles = Counter(
            "vwserver_controller_reconciles",
            "Slice reconciles by result (ready, not_ready, deleted, error, throttled: the slice "
            "workspace spent its consent-review budget, nothing asked).",
            ["result"],
            registry=r,
        )
        self.status_writes = Counter(
            "vwserver_controller_status_writes",
            "Slice status patches this process sent to kcp. Only the status writer writes: the "
            "Lease holder (controller.lease), and with several workers worker 0 alone.",
            registry=r,
        )
        self.handoff_writes = Counter(
            "vwserver_handoff_writes",
            "Writes of the handoff loop (a move recorded, a hold ended), by result: made, "
            "failed (refused or not answered; decided again when the object changes). With "
            "several workers only worker 0 runs the loop.",
            ["result"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "vwserver_controller_queue_depth",
            "Slices waiting in the controller's work queue (not those waiting for a retry).",
            registry=r,
        )
        self.controller_watches = Gauge(
            "vwserver_controller_upstream_watches",
            "The slice controller's own list+watch loops against kcp: slices (one per shard) "
            "and the APIExport and APIExportEndpointSlice of every export a slice may serve "
            "(its owner consented); never one for an export before that.",
            registry=r,
        )
        self.controller_connections = Gauge(
            "vwserver_controller_upstream_connections",
            "Open connections to kcp of the slice controller's connection pools: provider (its "
            "watches, and the re-checks of slices in their export's own workspace) and tenants "
            "(everything else, bounded, so that no tenant can fill the provider's pool).",
            ["pool"],
            registry=r,
        )

        self.cache_restarts = Counter(
            "vwserver_cache_reflector_restarts",
            "Restarts of a shared watch cache's upstream list+watch, by resource (its path in "
            "the virtual workspace), shard (a digest of the shard's origin) and cause (gone: "
            "the resourceVersion expired, relisted; error: retried with backoff).",
            ["resource", "shard", "cause"],
            registry=r,
        )
        self.cache_terminations = Counter(
            "vwserver_cache_watch_terminations",
            "Watches the shared cache ended, by resource (its path in the virtual workspace), "
            "shard (a digest of the shard's origin) and reason: overflowed (the client fell "
            "behind its queue), relisted (the cache relisted after a 410 upstream).",
            ["resource", "shard", "reason"],
            registry=r,
        )
        self.cache_reads = Counter(
            "vwserver_cache_reads",
            "LIST and WATCH requests the shared cache could take, by verb and outcome: served "
            "(from the cache), fallback (sent to kcp: the cache was not synced, or could not "
            "catch up with a consistent read in time).",
            ["verb", "outcome"],
            registry=r,
        )
        self.cache_freshness_wait = Histogram(
            "vwserver_cache_freshness_wait_seconds",
            "How long a consistent read waited for the cache to reach kcp's current "
            "resourceVersion: the cache's lag behind kcp as reads see it.",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0),
            registry=r,
        )
        self.holds_ended = Counter(
            "vwserver_handoff_holds_ended",
            "Holds of a slice on an object that vwserver ended by removing the slice's "
            "finalizers, by reason: released (the operator's release annotation), timeout (the "
            "slice's holdTimeoutSeconds passed while the object was leaving it).",
            ["reason"],
            registry=r,
        )
        self._cache_stats: Callable[[], Iterable[Mapping[str, Any]]] | None = None
        r.register(_CacheCollector(self))
        # The labelled children of the per-request metrics, kept (their label sets are bounded
        # as the module says): ``labels()`` takes a lock and checks and copies the labels.
        self._request_counts: dict[tuple[str, str, int], Counter] = {}
        self._request_durations: dict[str, Histogram] = {}
        self._upstream_counts: dict[str, Counter] = {}

    def observe_request(self, *, slice_label: str, verb: str, code: int, seconds: float) -> None:
        """Count one finished slice request and observe its latency (``vwserver_requests``,
        ``vwserver_request_duration_seconds``)."""
        key = (slice_label, verb, code)
        count = self._request_counts.get(key)
        if count is None:
            count = self._request_counts[key] = self.requests.labels(slice_label, verb, str(code))
        count.inc()
        duration = self._request_durations.get(verb)
        if duration is None:
            duration = self._request_durations[verb] = self.request_duration.labels(verb)
        duration.observe(seconds)

    def count_upstream_request(self, method: str) -> None:
        """Count one request the proxy sends to kcp (``vwserver_upstream_requests``); ``method``
        is the HTTP method the proxy itself chose (a bounded set)."""
        count = self._upstream_counts.get(method)
        if count is None:
            count = self._upstream_counts[method] = self.upstream_requests.labels(method)
        count.inc()

    def cache_restarted(self, *, url: str, cause: str) -> None:
        """Count a restart of the shared cache of the upstream collection ``url``."""
        self.cache_restarts.labels(**upstream_name(url).labels(), cause=cause).inc()

    def cache_watch_ended(self, *, url: str, reason: str) -> None:
        """Count a watch that the shared cache of the upstream collection ``url`` ended."""
        self.cache_terminations.labels(**upstream_name(url).labels(), reason=reason).inc()

    def watch_cache(self, stats: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
        """Report the shared watch cache's gauges from ``stats`` (one mapping per resource,
        :meth:`vwserver.cache.registry.CacheRegistry.stats`), read at every scrape."""
        self._cache_stats = stats

    def render(self) -> bytes:
        """The registry in the Prometheus text format (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


_CACHE_GAUGES = (
    ("objects", "vwserver_cache_objects", "Objects held by a shared watch cache."),
    ("raw_bytes", "vwserver_cache_object_bytes", "JSON bytes of the objects a cache holds."),
    ("window", "vwserver_cache_window_changes", "Recent changes held to serve watches."),
    ("subscribers", "vwserver_cache_subscribers", "Watches served from a shared cache."),
    (
        "max_queue_depth",
        "vwserver_cache_max_queue_depth",
        "The longest queue of changes waiting for one client of a cache.",
    ),
    ("rv", "vwserver_cache_resource_version", "The latest resourceVersion a cache has seen."),
    ("synced", "vwserver_cache_synced", "1 once a cache has completed its first list."),
)


class _CacheCollector:
    """The cache gauges, computed from the registry's stats when scraped (nothing to keep in
    step on the hot path)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        source = self._metrics._cache_stats
        rows = list(source()) if source is not None else []
        for field, name, documentation in _CACHE_GAUGES:
            family = GaugeMetricFamily(name, documentation, labels=["resource", "shard"])
            for row in rows:
                shown = upstream_name(str(row["url"]))
                family.add_metric([shown.path, shown.shard], float(row[field]))
            yield family
