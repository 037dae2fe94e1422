"""Assemble the aiohttp application: health endpoints, ``/metrics`` and the filtering proxy.

The health and metrics endpoints are :mod:`vwserver.health`'s, as ``vwserver sync`` serves them;
the upstream credentials come from the configuration (:func:`upstream_auth`: a kubeconfig — exec
plugins included —, the pod's ServiceAccount, or explicit files; :mod:`vwserver.k8s.kubeconfig`).
Every slice request passes the :class:`~vwserver.auth.guard.Gate` given to :func:`build_app`;
there is no default (``NoAuth`` exists for tests and must be asked for by name).

Nothing here is global: :func:`build_app` wires the pieces it is given, so tests build as many
independent servers as they like (against fake or real upstreams) and ``serve`` builds one.
``serve`` listens through :mod:`vwserver.listener` (plain HTTP and TLS alike): bounded request
heads, header/body/idle timeouts, a per-client connection limit (``connections`` in the config),
malformed requests answered with a Status and logged without their bytes.

The slice listener (``listen``) serves the proxy, the health endpoints and the metrics. The
optional health listener (``health``, plain HTTP, :func:`health_listener_app`) serves the health
endpoints and the metrics again, for probes and scrapers that should not reach the slices, and
``/debug/cache`` — only when it is bound to a loopback address: that page shows every shared
resource of the watch cache with the whole export's object counts, and is for an operator on
the machine (or ``kubectl port-forward``), never for a network. It is served nowhere else, and
it never shows kcp's address (:func:`debug_cache_rows`).

Graceful shutdown, when ``stop`` is set (SIGTERM): ``/readyz`` answers 503 at once, so
that Kubernetes takes the pod out of its Service. New connections are still served for
``shutdownDelaySeconds`` (default 0; the Deployment uses a few seconds, because endpoint updates
take a moment to reach every node's kube-proxy). Then the listener closes, every open watch ends
with the chunked stream's last chunk (client-go re-watches from its last resourceVersion, through
the Service, on another replica), idle keep-alive connections close, and requests in flight get
``shutdownGracePeriodSeconds`` to finish before they are cancelled. ``serve`` returns within delay
+ grace period (plus the controller's own cleanup), so the Deployment's
``terminationGracePeriodSeconds`` must be larger.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import os
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from vwserver.auth.access import AccessReviewer
from vwserver.auth.guard import AuthMode, Gate, Guard
from vwserver.auth.tls import DEFAULT_RELOAD_INTERVAL, ServingTLS
from vwserver.auth.tokens import TokenReviewer
from vwserver.cache.registry import CacheRegistry
from vwserver.clock import SystemClock
from vwserver.config import DEFAULT_LEASE_NAME, Config, resolve, slice_selector
from vwserver.config.base import client_auth
from vwserver.controller.handoff import Handoff, HandoffRelay, StuckHolds, relayed
from vwserver.controller.scope import ShardScope
from vwserver.controller.slice_status import WatchHealth
from vwserver.controller.slices import TENANT_CONNECTIONS, ControllerSettings, SliceController
from vwserver.errors import ConfigError
from vwserver.health import add_health_routes, health_app
from vwserver.k8s import kcp
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import SERVICE_ACCOUNT_DIR, ClientAuth
from vwserver.k8s.lease import LeaderElector
from vwserver.listener import ConnectionLimits, GuardedSite, listening
from vwserver.metrics import ServerMetrics, upstream_name
from vwserver.proxy.handler import ProxyHandler, record_headers_sent
from vwserver.proxy.paths import PREFIX
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Route, Routes, RouteTable

log = logging.getLogger(__name__)

# The apiserver accepts request bodies up to 3 MiB; leave room for the envelope.
MAX_REQUEST_BODY = 4 * 2**20
# TokenReviews and SubjectAccessReviews hold up a request: fail it (503) rather than hang.
REVIEW_TIMEOUT = 10.0
DEBUG_CACHE_PATH = "/debug/cache"
"""Per shared resource of the watch cache: objects, window, resourceVersion, lag, clients; on
the health listener bound to loopback only."""


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """The two steps of a graceful shutdown, as events the app's handlers look at."""

    draining: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when shutdown begins: ``/readyz`` answers 503."""
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the listener closes: open watches end cleanly."""


@dataclass(frozen=True, slots=True)
class WorkerRole:
    """This process is worker ``index`` of ``count`` of one server (:mod:`vwserver.workers`).

    Every worker listens on ``port`` with ``SO_REUSEPORT`` (the parent resolved a configured
    port 0 and holds it) and serves, instead of the health listener, its health endpoints,
    metrics and ``/debug/cache`` on a Unix socket in ``sockets`` (a directory only this user can
    enter), where the parent aggregates them. Worker 0 is the server's one writer: it alone
    writes slice status (and stands for the Lease) and runs the handoff loop; the others keep
    their route tables with a controller that writes nothing and relay their cache's resources
    and moves to worker 0 (:class:`~vwserver.controller.handoff.HandoffRelay`)."""

    index: int
    count: int
    port: int
    sockets: Path

    @property
    def writer(self) -> bool:
        return self.index == 0

    def socket_path(self, index: int) -> Path:
        return self.sockets / f"worker-{index}.sock"

    def encode(self) -> str:
        return f"{self.index}/{self.count}/{self.port}/{self.sockets}"

    @classmethod
    def decode(cls, text: str) -> WorkerRole:
        index, count, port, sockets = text.split("/", 3)
        return cls(index=int(index), count=int(count), port=int(port), sockets=Path(sockets))


HANDOFF_PATH = "/internal/handoff"
"""Worker 0's endpoint for the other workers' :class:`HandoffRelay` (on its Unix socket only)."""
WORKER_HEADER = "X-Vwserver-Worker"
"""Set by a worker on every response of its internal socket: which worker answered."""


_UPSTREAM_KEY = web.AppKey("upstream", UpstreamClient)
ROUTES_KEY = web.AppKey("routes", Routes)
METRICS_KEY = web.AppKey("metrics", ServerMetrics)
LIFECYCLE_KEY = web.AppKey("lifecycle", Lifecycle)


@dataclass(frozen=True, slots=True)
class _HealthEndpoints:
    """What a proxy app's health endpoints answer from, for its health listener's app too."""

    problems: Callable[[], Sequence[str]]
    notes: Callable[[], Sequence[str]]
    metrics: Callable[[], bytes]
    metrics_path: str | None
    cache: CacheRegistry | None


_HEALTH_KEY = web.AppKey("health", _HealthEndpoints)


def build_app(
    *,
    routes: Routes,
    upstream: UpstreamClient,
    guard: Gate,
    page_size: int = 500,
    mutating_admission: bool = False,
    ready: Callable[[], bool] | None = None,
    failing: Callable[[], Sequence[str]] | None = None,
    metrics: ServerMetrics | None = None,
    metrics_path: str | None = "/metrics",
    cache: CacheRegistry | None = None,
    handoff: Handoff | HandoffRelay | None = None,
    handoff_interval: float = 2.0,
) -> web.Application:
    """The server's aiohttp app. ``ready`` gates ``/readyz`` (e.g. on the controller's first
    list of slices); liveness never depends on kcp, and neither does readiness after that:
    ``failing`` (and the cache's reflectors) only add lines to ``/readyz``'s ``200 ok``
    (:func:`upstream_notes`). ``guard`` authenticates and authorizes every
    slice request (required: ``NoAuth`` for tests that want none); health endpoints and
    ``metrics_path`` (None: not served) are always open; ``/debug/cache`` is not served here
    (:func:`health_listener_app`). ``metrics`` is where the proxy counts
    (default: a new registry); the app keeps it and its :class:`Lifecycle` under
    :data:`METRICS_KEY`, :data:`LIFECYCLE_KEY`. ``cache``: the shared watch cache that serves
    LIST and WATCH (None: every read goes to kcp); with it runs the handoff loop ``handoff``
    (default: one that scans the cache every ``handoff_interval`` seconds,
    :mod:`vwserver.controller.handoff`; a worker that is not the server's handoff writer passes
    its :class:`HandoffRelay`).
    """
    metrics = metrics if metrics is not None else ServerMetrics()
    upstream.count_requests(metrics.count_upstream_request)
    lifecycle = Lifecycle()
    app = web.Application(client_max_size=MAX_REQUEST_BODY)
    app[ROUTES_KEY] = routes
    app[_UPSTREAM_KEY] = upstream
    app[METRICS_KEY] = metrics
    app[LIFECYCLE_KEY] = lifecycle
    if cache is not None and handoff is None:
        handoff = Handoff(
            registry=cache,
            routes=routes,
            clock=cache.clock,
            interval=handoff_interval,
            metrics=metrics,
        )
    handler = ProxyHandler(
        routes=routes,
        upstream=upstream,
        page_size=page_size,
        mutating_admission=mutating_admission,
        metrics=metrics,
        closing=lifecycle.closing,
        guard=guard,
        cache=cache,
        unrecorded_move=handoff.wake if handoff is not None else None,
    )

    def problems() -> list[str]:
        if lifecycle.draining.is_set():
            return ["shutting down"]
        if ready is not None and not ready():
            return ["slices not synced yet"]
        return []

    def notes() -> list[str]:
        return upstream_notes(failing() if failing is not None else (), cache=cache)

    add_health_routes(
        app, problems=problems, notes=notes, metrics=metrics.render, metrics_path=metrics_path
    )
    app[_HEALTH_KEY] = _HealthEndpoints(problems, notes, metrics.render, metrics_path, cache)
    app.router.add_route("*", PREFIX + "{tail:.*}", handler.handle)
    app.on_response_prepare.append(record_headers_sent)
    app.cleanup_ctx.append(_upstream_lifecycle)
    if handoff is not None:
        app.cleanup_ctx.append(_running(handoff.run, name="handoff"))
    return app


def health_listener_app(app: web.Application, *, debug_cache: bool) -> web.Application:
    """The health listener's app for the proxy app ``app`` (made by :func:`build_app`): the same
    health endpoints and metrics, and ``/debug/cache`` if ``debug_cache`` (the listener is bound
    to a loopback address, :func:`is_loopback`) and ``app`` has a cache."""
    health = app[_HEALTH_KEY]
    local = health_app(
        problems=health.problems,
        metrics=health.metrics,
        metrics_path=health.metrics_path,
        notes=health.notes,
    )
    if debug_cache and health.cache is not None:
        local.router.add_get(DEBUG_CACHE_PATH, _debug_cache(health.cache))
    return local


def is_loopback(host: str) -> bool:
    """Whether a listener bound to ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False


def upstream_notes(failing: Sequence[str], *, cache: CacheRegistry | None) -> list[str]:
    """``/readyz`` lines for what of kcp vwserver cannot reach right now.

    Readiness does not depend on kcp: every replica reads the same kcp, so an outage would take
    all of them out of their Service at once, and clients would get refused connections instead
    of the 503 Status each slice answers with while it cannot reach kcp (a slice whose export
    and consent cannot be re-checked stops serving after its resync, see
    :mod:`vwserver.controller.slices`). The slices' status conditions cannot say it either:
    they are written to the kcp that cannot be reached. So ``/readyz`` stays ``200`` and says
    what fails, one line each, without URLs or error text (it is unauthenticated; the log has
    the details).
    """
    lines = [f"upstream: {what}" for what in failing]
    health = watch_health(cache, None) if cache is not None else WatchHealth()
    if health.failing and cache is not None:
        # Which shards: by the digest the metrics' ``shard`` label has (never kcp's address),
        # so that with a sharded kcp the operator sees which shard is away.
        shards = sorted(
            {upstream_name(r.upstream).shard for r in cache.resources() if r.last_error}
        )
        lines.append(
            f"upstream: the watch cache's upstream watches fail ({health.failing} of "
            f"{health.total}; shard {', '.join(shards)})"
        )
    return lines


def watch_health(cache: CacheRegistry, upstreams: Sequence[str] | None) -> WatchHealth:
    """How many of the cache's upstream watches of the export URLs ``upstreams`` (None: of
    every export) fail."""
    resources = cache.resources()
    if upstreams is not None:
        wanted = {u.rstrip("/") for u in upstreams}
        resources = [r for r in resources if r.upstream in wanted]
    failing = sum(1 for r in resources if r.last_error is not None)
    return WatchHealth(failing=failing, total=len(resources))


def _running(
    run: Callable[[], Coroutine[Any, Any, None]], *, name: str
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context that runs ``run`` while the app runs."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(run(), name=name)
        yield
        await _cancel(task)

    return context


def _debug_cache(cache: CacheRegistry) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def debug_cache(request: web.Request) -> web.Response:
        return web.json_response({"resources": debug_cache_rows(cache.stats())})

    return debug_cache


def debug_cache_rows(stats: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``/debug/cache``'s rows: the cache's stats with kcp's address taken out. A resource is
    named as the metrics name it (:func:`vwserver.metrics.upstream_name`): by its ``path`` in
    the virtual workspace and its ``shard`` (a digest of the shard's origin, which tells two
    shards apart without naming either); the origin is cut out of ``last_error`` too."""
    rows = []
    for row in stats:
        name = upstream_name(str(row["url"]))
        shown = {k: v for k, v in row.items() if k != "url"}
        error = shown.get("last_error")
        if isinstance(error, str):
            shown["last_error"] = name.scrub(error)
        rows.append({"path": name.path, "shard": name.shard, **shown})
    return rows


async def _upstream_lifecycle(app: web.Application) -> AsyncIterator[None]:
    upstream = app[_UPSTREAM_KEY]
    await upstream.start()
    yield
    await upstream.close()


async def upstream_auth(
    config: Config, *, base_dir: Path, service_account_dir: Path = SERVICE_ACCOUNT_DIR
) -> ClientAuth:
    """vwserver's own credentials towards kcp (``service_account_dir``: for tests)."""
    up = config.upstream
    if up.server is None:
        return await client_auth(
            up, field="$.upstream", base=base_dir, service_account_dir=service_account_dir
        )
    return ClientAuth(
        server=up.server.rstrip("/"),
        ca_pem=resolve(up.ca_file, base=base_dir).read_text() if up.ca_file else None,
        insecure_skip_tls_verify=up.insecure_skip_tls_verify,
        token=up.token,
        token_file=resolve(up.token_file, base=base_dir) if up.token_file else None,
        client_cert_pem=resolve(up.client_cert_file, base=base_dir).read_text()
        if up.client_cert_file
        else None,
        client_key_pem=resolve(up.client_key_file, base=base_dir).read_text()
        if up.client_key_file
        else None,
    )


def static_routes(config: Config, *, auth: ClientAuth) -> RouteTable:
    """The route table of the slices listed in the config file (static mode)."""
    routes = []
    for i, s in enumerate(config.slices):
        if s.upstream_url is not None:
            url = s.upstream_url.rstrip("/")
        else:
            assert s.export is not None
            url = kcp.export_virtual_workspace(
                auth.server, cluster=s.export.cluster, name=s.export.name
            )
        routes.append(
            Route(
                cluster=s.cluster,
                name=s.name,
                selector=slice_selector(s, field=f"$.slices[{i}]"),
                upstream_url=url,
                cache=s.cache,
                hold_timeout=s.hold_timeout_seconds,
            )
        )
    return RouteTable(routes)


def connection_limits(config: Config) -> ConnectionLimits:
    c = config.connections
    return ConnectionLimits(
        header_timeout=c.header_timeout_seconds,
        body_timeout=c.body_timeout_seconds,
        idle_timeout=c.idle_timeout_seconds,
        max_connections_per_client=c.max_connections_per_client,
    )


def serving_tls(config: Config, *, base_dir: Path) -> ServingTLS | None:
    """The listener's TLS context (reloadable), or None for ``insecureServing``."""
    if config.tls is None:
        return None
    ca = config.tls.client_ca_file
    client_ca = resolve(ca, base=base_dir) if ca else None
    if client_ca is not None:
        try:  # on a scratch context, so that a bad CA file is reported as such
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cafile=str(client_ca))
        except (OSError, ssl.SSLError) as e:
            raise ConfigError("$.tls.clientCAFile", f"cannot load CA: {e}") from e
    try:
        return ServingTLS(
            cert_file=resolve(config.tls.cert_file, base=base_dir),
            key_file=resolve(config.tls.key_file, base=base_dir),
            client_ca_file=client_ca,
        )
    except (OSError, ssl.SSLError) as e:
        raise ConfigError("$.tls", f"cannot load certificate/key: {e}") from e


def build_guard(config: Config, *, client: KubeClient, routes: Routes | None = None) -> Guard:
    """The Guard of ``config.auth``; ``client`` (vwserver's identity) posts the reviews;
    ``routes`` tells it which slice workspaces exist (see :class:`Guard`)."""
    cache = config.auth.cache
    tokens = TokenReviewer(
        client=client,
        ttl=cache.token_ttl_seconds,
        negative_ttl=cache.token_negative_ttl_seconds,
        max_entries=cache.max_entries,
    )
    access = AccessReviewer(
        client=client,
        allow_ttl=cache.allow_ttl_seconds,
        deny_ttl=cache.deny_ttl_seconds,
        max_entries=cache.max_entries,
    )
    return Guard(
        tokens=tokens,
        access=access,
        mode=AuthMode(config.auth.mode),
        serves_cluster=(lambda c: routes.table.serves_cluster(c)) if routes is not None else None,
    )


async def serve(
    config: Config,
    *,
    base_dir: Path,
    stop: asyncio.Event,
    tls_reload_interval: float = DEFAULT_RELOAD_INTERVAL,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    role: WorkerRole | None = None,
) -> None:
    """Run the server (and, in kcp mode, the embedded controller) until ``stop`` is set, then
    shut down gracefully (see the module docstring). ``service_account_dir``: for tests of
    ``upstream.inCluster``. ``role``: this process is one of several workers of one server
    (:class:`WorkerRole`; None: the only process). A worker opens its slice listener only once
    its controller has listed the slices: a connection the kernel hands it must never find a
    slice missing that its siblings serve."""
    auth = await upstream_auth(config, base_dir=base_dir, service_account_dir=service_account_dir)
    static = static_routes(config, auth=auth)
    routes = Routes(static)
    metrics = ServerMetrics()
    writer = role is None or role.writer
    async with contextlib.AsyncExitStack() as stack:
        cache = None
        handoff: Handoff | HandoffRelay | None = None
        if config.cache.enabled:
            cache_client = await stack.enter_async_context(KubeClient(auth=auth))
            cache = CacheRegistry(
                client=cache_client,
                clock=SystemClock(),
                idle_seconds=config.cache.idle_seconds,
                window=config.cache.window,
                metrics=metrics,
            )
            stack.push_async_callback(cache.aclose)
            if writer:
                handoff = Handoff(registry=cache, routes=routes, clock=cache.clock, metrics=metrics)
            else:
                assert role is not None
                relay = await stack.enter_async_context(RelayClient(role.socket_path(0)))
                handoff = HandoffRelay(registry=cache, send=relay.send, clock=cache.clock)
        controller = None
        if config.controller is not None:
            client = await stack.enter_async_context(KubeClient(auth=auth))
            # Requests for slices naming another workspace's export go through a pool of
            # their own: no tenant can fill the pool of the providers' watches and re-checks.
            tenants = await stack.enter_async_context(
                KubeClient(auth=auth, max_connections=TENANT_CONNECTIONS)
            )
            controller = build_controller(
                config,
                client=client,
                tenant_client=tenants,
                routes=routes,
                static=static,
                metrics=metrics,
                stuck_holds=handoff.stuck if isinstance(handoff, Handoff) else None,
                upstream_watches=functools.partial(watch_health, cache)
                if cache is not None
                else None,
                writes_status=writer,
            )
            task = asyncio.create_task(controller.run(), name="slice-controller")
            stack.push_async_callback(_cancel, task)
            stack.push_async_callback(controller.aclose)
            # First on the way out (the stack unwinds backwards), while the controller still
            # knows whether it may write (holds the Lease): a shard-scoped replica set's
            # endpoints and conditions leave the slices' status (a no-op without a scope).
            stack.push_async_callback(controller.retire)
        reviews = await stack.enter_async_context(KubeClient(auth=auth, timeout=REVIEW_TIMEOUT))
        app = build_app(
            routes=routes,
            upstream=UpstreamClient(auth=auth),
            page_size=config.list_page_size,
            mutating_admission=config.mutating_admission,
            ready=controller.synced.is_set if controller is not None else None,
            failing=controller.failing if controller is not None else None,
            guard=build_guard(config, client=reviews, routes=routes),
            metrics=metrics,
            metrics_path=config.metrics.path if config.metrics.enabled else None,
            cache=cache,
            handoff=handoff,
        )
        await _run_site(
            app,
            config,
            base_dir=base_dir,
            stop=stop,
            routes=routes,
            tls_reload_interval=tls_reload_interval,
            role=role,
            handoff=handoff if isinstance(handoff, Handoff) else None,
            synced=controller.synced.wait if controller is not None else None,
        )


async def _first(*waits: Coroutine[Any, Any, Any]) -> None:
    """Wait until the first of ``waits`` is done; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class RelayClient:
    """A worker's client of worker 0's :data:`HANDOFF_PATH`, over worker 0's Unix socket."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._session: aiohttp.ClientSession | None = None
        self._failing_since: float | None = None

    async def __aenter__(self) -> RelayClient:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=str(self._path)),
            timeout=aiohttp.ClientTimeout(total=5),
        )
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(self, message: dict[str, Any]) -> bool:
        assert self._session is not None
        try:
            async with self._session.post(f"http://worker-0{HANDOFF_PATH}", json=message) as r:
                ok = r.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            ok = False
        if ok:
            self._failing_since = None
        elif self._failing_since is None:
            self._failing_since = time.monotonic()
            log.info("worker 0 does not take the handoff relay's messages yet; retrying")
        return ok


def build_controller(
    config: Config,
    *,
    client: KubeClient,
    routes: Routes,
    static: RouteTable,
    metrics: ServerMetrics | None = None,
    stuck_holds: Callable[[str], StuckHolds | None] | None = None,
    upstream_watches: Callable[[Sequence[str]], WatchHealth] | None = None,
    tenant_client: KubeClient | None = None,
    writes_status: bool = True,
) -> SliceController:
    """The embedded slice controller; ``writes_status=False``: one that keeps the route table
    only (a worker that is not the server's writer), and stands for no Lease."""
    c = config.controller
    assert c is not None
    assert config.external_url is not None
    scope = None
    if c.shards is not None:
        scope = ShardScope(
            name=c.shards.name,
            virtual_workspace_urls=tuple(u.rstrip("/") for u in c.shards.virtual_workspace_urls),
        )
    leader = None
    if c.lease is not None and writes_status:
        workspace = c.lease.workspace or c.export.path
        leader = LeaderElector(
            client=client,
            base=kcp.workspace(workspace, server=client.origin),
            namespace="default",
            name=lease_name(c.lease.name, scope),
            identity=c.lease.identity or f"{socket.gethostname()}-{os.getpid()}",
            clock=SystemClock(),
        )
    settings = ControllerSettings(
        export_path=c.export.path,
        export_name=c.export.name,
        external_url=config.external_url,
        resync=c.resync_seconds,
        max_slices_per_workspace=c.max_slices_per_workspace,
        max_exports_per_workspace=c.max_exports_per_workspace,
        consent_reviews_per_second=c.consent_reviews_per_second,
        scope=scope,
    )
    return SliceController(
        client=client,
        routes=routes,
        settings=settings,
        static=static,
        leader=leader,
        metrics=metrics,
        stuck_holds=stuck_holds,
        upstream_watches=upstream_watches,
        tenant_client=tenant_client,
        writes_status=writes_status,
    )


def lease_name(name: str, scope: ShardScope | None) -> str:
    """The Lease of a replica set: the default name gets the set's name (two shard-scoped
    replica sets must not share one Lease: only one of them would write)."""
    if scope is not None and name == DEFAULT_LEASE_NAME:
        return f"{name}-{scope.name}"
    return name


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _run_site(
    app: web.Application,
    config: Config,
    *,
    base_dir: Path,
    stop: asyncio.Event,
    routes: Routes,
    tls_reload_interval: float,
    role: WorkerRole | None = None,
    handoff: Handoff | None = None,
    synced: Callable[[], Coroutine[Any, Any, Any]] | None = None,
) -> None:
    """Serve ``app`` until ``stop``, then drain. A worker (``role``) opens its Unix socket
    first (the parent sees it starting: ``/readyz`` says why it is not ready), and the slice
    listener only once ``synced()`` (the controller's first list of slices) returned."""
    tls = serving_tls(config, base_dir=base_dir)
    async with contextlib.AsyncExitStack() as stack:
        if role is not None:
            await stack.enter_async_context(_worker_socket(app, role, handoff=handoff))
            if synced is not None:
                await _first(synced(), stop.wait())
        # Leaving the block closes idle keep-alive connections (busy ones after their
        # response), waits up to the grace period for requests in flight, cancels what is left,
        # then closes the upstream (the app's cleanup).
        site = await stack.enter_async_context(
            listening(
                app,
                config.listen.host,
                role.port if role is not None else config.listen.port,
                limits=connection_limits(config),
                ssl_context=tls.context if tls is not None else None,
                metrics=app[METRICS_KEY],
                shutdown_timeout=config.shutdown_grace_period_seconds,
                reuse_port=role is not None,
            )
        )
        if role is None:
            await stack.enter_async_context(_health_listener(app, config))
        reload_task = (
            asyncio.create_task(tls.watch(interval=tls_reload_interval), name="tls-reload")
            if tls is not None
            else None
        )
        if tls is None:
            log.warning(
                "insecureServing: plain HTTP, bearer tokens travel unencrypted; development only"
            )
        log.info(
            "serving %d static slice(s)%s on %s%s%s",
            len(routes.table),
            " and the slices found in kcp" if config.controller is not None else "",
            site.name,
            PREFIX,
            f" (worker {role.index} of {role.count})" if role is not None else "",
        )
        try:
            await stop.wait()
            await _drain(app[LIFECYCLE_KEY], site, delay=config.shutdown_delay_seconds)
        finally:
            if reload_task is not None:
                await _cancel(reload_task)
    log.info("stopped")


@contextlib.asynccontextmanager
async def _health_listener(
    app: web.Application, config: Config
) -> AsyncIterator[GuardedSite | None]:
    """The health listener of ``config.health`` while the block runs (None: not configured)."""
    if config.health is None:
        yield None
        return
    host = config.health.host
    debug = is_loopback(host)
    async with listening(
        health_listener_app(app, debug_cache=debug),
        host,
        config.health.port,
        limits=connection_limits(config),
    ) as site:
        log.info(
            "health and metrics%s on %s",
            f" and {DEBUG_CACHE_PATH}" if debug else f" ({DEBUG_CACHE_PATH}: loopback only)",
            site.name,
        )
        yield site


@contextlib.asynccontextmanager
async def _worker_socket(
    app: web.Application, role: WorkerRole, *, handoff: Handoff | None
) -> AsyncIterator[None]:
    """A worker's health endpoints, metrics and ``/debug/cache`` on its Unix socket (for the
    parent, :mod:`vwserver.workers`), and on worker 0 the handoff relay's endpoint."""
    local = health_listener_app(app, debug_cache=True)
    index = str(role.index)

    @web.middleware
    async def name_worker(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        response = await handler(request)
        response.headers[WORKER_HEADER] = index
        return response

    local.middlewares.append(name_worker)
    if handoff is not None:
        local.router.add_post(HANDOFF_PATH, handoff_endpoint(handoff))
    runner = web.AppRunner(local, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    path = role.socket_path(role.index)
    path.unlink(missing_ok=True)  # a crashed predecessor's
    try:
        await web.UnixSite(runner, str(path)).start()
        yield
    finally:
        await runner.cleanup()


def handoff_endpoint(handoff: Handoff) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def relay(request: web.Request) -> web.Response:
        try:
            resources, wake = relayed(await request.json())
        except ValueError as e:  # (json's errors are ValueErrors too)
            return web.Response(status=400, text=str(e))
        await handoff.keep(resources)
        if wake:
            handoff.wake()
        return web.Response(text="ok")

    return relay


async def _drain(lifecycle: Lifecycle, site: web.BaseSite, *, delay: float) -> None:
    """The first steps of a graceful shutdown: not ready, (after ``delay``) no new connections,
    open watches ended."""
    lifecycle.draining.set()
    log.info("shutting down: /readyz answers 503; the listener closes in %.1fs", delay)
    if delay > 0:
        await asyncio.sleep(delay)
    await site.stop()
    lifecycle.closing.set()
    log.info("listener closed; ending open watches and waiting for requests in flight")
