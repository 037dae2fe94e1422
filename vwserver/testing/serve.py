"""Serve an aiohttp app on a free loopback port for tests, benchmarks and the demo."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def serve_app(
    app: web.Application, *, host: str = "127.0.0.1", ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[str]:
    """Run ``app`` like ``vwserver serve`` does (handler cancellation on); yields its base URL."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, 0, ssl_context=ssl_context)
        await site.start()
        bound_host, port = runner.addresses[0][:2]
        scheme = "https" if ssl_context is not None else "http"
        yield f"{scheme}://{bound_host}:{port}"
    finally:
        await runner.cleanup()
