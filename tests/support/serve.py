"""Serve an aiohttp app on a free loopback port for tests, benchmarks and the demo."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from typing import Final

from aiohttp import web

from vwserver.auth.guard import NO_AUTH_ACKNOWLEDGEMENT, NoAuth
from vwserver.listener import ConnectionLimits, listening

NO_AUTH: Final = NoAuth(acknowledge=NO_AUTH_ACKNOWLEDGEMENT)
"""``build_app(guard=NO_AUTH)``: tests of the proxy without authentication, said so by name."""


@contextlib.asynccontextmanager
async def serve_app(
    app: web.Application,
    *,
    host: str = "127.0.0.1",
    ssl_context: ssl.SSLContext | None = None,
    limits: ConnectionLimits | None = None,
) -> AsyncIterator[str]:
    """Run ``app`` like ``vwserver serve`` does (the same listener, handler cancellation on;
    ``limits``: the config file's defaults); yields its base URL."""
    async with listening(
        app, host, 0, limits=limits or ConnectionLimits(), ssl_context=ssl_context
    ) as site:
        bound_host, port = site.address
        scheme = "https" if ssl_context is not None else "http"
        yield f"{scheme}://{bound_host}:{port}"
