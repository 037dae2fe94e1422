"""Assemble the aiohttp application: health endpoints plus the filtering proxy.

Nothing here is global: :func:`build_app` wires the pieces it is given, so tests build as many
independent servers as they like (against fake or real upstreams) and ``serve`` builds one.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from vwserver.config import Config, resolve, slice_selector
from vwserver.errors import ConfigError
from vwserver.k8s.kubeconfig import ClientAuth, load_kubeconfig
from vwserver.proxy.handler import ProxyHandler
from vwserver.proxy.paths import PREFIX
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Route, Routes, RouteTable

log = logging.getLogger(__name__)

# The apiserver accepts request bodies up to 3 MiB; leave room for the envelope.
MAX_REQUEST_BODY = 4 * 2**20

_UPSTREAM_KEY = web.AppKey("upstream", UpstreamClient)
ROUTES_KEY = web.AppKey("routes", Routes)


def build_app(*, routes: Routes, upstream: UpstreamClient, page_size: int = 500) -> web.Application:
    app = web.Application(client_max_size=MAX_REQUEST_BODY)
    app[ROUTES_KEY] = routes
    app[_UPSTREAM_KEY] = upstream
    handler = ProxyHandler(routes=routes, upstream=upstream, page_size=page_size)
    for path in ("/healthz", "/livez", "/readyz"):
        app.router.add_get(path, _ok)
    app.router.add_route("*", PREFIX + "{tail:.*}", handler.handle)
    app.cleanup_ctx.append(_upstream_lifecycle)
    return app


async def _ok(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _upstream_lifecycle(app: web.Application) -> AsyncIterator[None]:
    upstream = app[_UPSTREAM_KEY]
    await upstream.start()
    yield
    await upstream.close()


def upstream_auth(config: Config, *, base_dir: Path) -> ClientAuth:
    up = config.upstream
    if up.kubeconfig is not None:
        return load_kubeconfig(resolve(up.kubeconfig, base=base_dir), context=up.context)
    assert up.server is not None
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
    origin = _origin(auth.server)
    routes = []
    for i, s in enumerate(config.slices):
        if s.upstream_url is not None:
            url = s.upstream_url.rstrip("/")
        else:
            assert s.export is not None
            url = f"{origin}/services/apiexport/{s.export.cluster}/{s.export.name}"
        routes.append(
            Route(
                cluster=s.cluster,
                name=s.name,
                selector=slice_selector(s, field=f"$.slices[{i}]"),
                upstream_url=url,
            )
        )
    return RouteTable(routes)


def _origin(server: str) -> str:
    """scheme://host:port of a kubeconfig server URL (which may end in /clusters/<ws>)."""
    scheme, _, rest = server.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def server_ssl_context(config: Config, *, base_dir: Path) -> ssl.SSLContext | None:
    if config.tls is None:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(
            resolve(config.tls.cert_file, base=base_dir),
            resolve(config.tls.key_file, base=base_dir),
        )
    except (OSError, ssl.SSLError) as e:
        raise ConfigError("$.tls", f"cannot load certificate/key: {e}") from e
    return ctx


async def serve(config: Config, *, base_dir: Path, stop: asyncio.Event) -> None:
    """Run the server until ``stop`` is set."""
    auth = upstream_auth(config, base_dir=base_dir)
    routes = Routes(static_routes(config, auth=auth))
    app = build_app(
        routes=routes, upstream=UpstreamClient(auth=auth), page_size=config.list_page_size
    )
    # handler_cancellation: a client that goes away cancels its handler, which closes the
    # upstream request at once (issue #2 §3) instead of holding an idle watch open.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(
        runner,
        config.listen.host,
        config.listen.port,
        ssl_context=server_ssl_context(config, base_dir=base_dir),
    )
    await site.start()
    scheme = "https" if config.tls else "http"
    log.info(
        "serving %d slice(s) on %s://%s:%d%s",
        len(routes.table),
        scheme,
        config.listen.host,
        config.listen.port,
        PREFIX,
    )
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
