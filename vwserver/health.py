"""Health and metrics endpoints, the same for ``vwserver serve`` and ``vwserver sync``.

* ``/healthz``, ``/livez``: the process serves (liveness; never depends on kcp).
* ``/readyz``: ``200 ok`` when ``problems()`` is empty, else ``503`` with one ``not ready: …``
  line per problem (``serve``: shutting down, slices not listed yet; ``sync``: an informer that
  has not listed, e.g. ``upstream …: not synced (403 Forbidden: …)``, or ``downstream
  unreachable: …``). ``notes()``, if given, adds lines to the ``200`` body: what a ready process
  is doing when that is not the obvious (``sync``: ``standby: waiting for the lease … held by
  …``; ``serve``: ``upstream: …`` for each part of kcp it cannot reach right now, see
  :func:`vwserver.server.upstream_notes` for why that is no reason to be unready).
* the metrics path (default ``/metrics``): Prometheus text format of the caller's registry.

``serve`` adds these routes to its proxy app (:func:`add_health_routes`) and serves them alone
on its optional health listener (:func:`health_app`, plus ``/debug/cache`` when that listener is
bound to loopback, :mod:`vwserver.server`); ``sync`` serves them alone (plus its
``/debug/stuck``). All are unauthenticated: they show no objects and no credentials.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from vwserver.metrics import CONTENT_TYPE

HEALTH_PATHS = ("/healthz", "/livez", "/readyz")
METRICS_PATH = "/metrics"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def add_health_routes(
    app: web.Application,
    *,
    problems: Callable[[], Sequence[str]],
    metrics: Callable[[], bytes] | None,
    metrics_path: str | None = METRICS_PATH,
    notes: Callable[[], Sequence[str]] | None = None,
) -> None:
    """Add the health endpoints, and ``metrics`` (a registry's rendering) at ``metrics_path``
    unless either is None, to ``app``."""
    for path in ("/healthz", "/livez"):
        app.router.add_get(path, _ok)
    app.router.add_get("/readyz", _readyz(problems, notes))
    if metrics is not None and metrics_path is not None:
        app.router.add_get(metrics_path, _metrics(metrics))


def health_app(
    *,
    problems: Callable[[], Sequence[str]],
    metrics: Callable[[], bytes] | None,
    metrics_path: str | None = METRICS_PATH,
    notes: Callable[[], Sequence[str]] | None = None,
) -> web.Application:
    """An app serving only the health and metrics endpoints."""
    app = web.Application()
    add_health_routes(
        app, problems=problems, metrics=metrics, metrics_path=metrics_path, notes=notes
    )
    return app


async def _ok(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def _readyz(
    problems: Callable[[], Sequence[str]], notes: Callable[[], Sequence[str]] | None
) -> Handler:
    async def readyz(_: web.Request) -> web.Response:
        found = problems()
        if found:
            return web.Response(status=503, text="".join(f"not ready: {p}\n" for p in found))
        extra = notes() if notes is not None else ()
        return web.Response(text="".join(["ok", *(f"\n{n}" for n in extra)]))

    return readyz


def _metrics(render: Callable[[], bytes]) -> Handler:
    async def metrics(_: web.Request) -> web.Response:
        # Content-Type as a header: web.Response's content_type refuses parameters (version=).
        return web.Response(body=render(), headers={"Content-Type": CONTENT_TYPE})

    return metrics
