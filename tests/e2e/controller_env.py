"""An in-process vwserver in kcp mode (proxy + slice controller) on the session's kcp, and the
helpers its tests share (``tests/e2e/test_controller_kcp.py``, ``tests/security/test_consent_kcp.py``).

vwserver's own API (``manifests/kcp/apiexport.yaml``) is installed once in workspace
``root:vwserver-api`` and bound where the tests create slices; the server's external URL is its
own loopback address; vwserver's identity is kcp-admin.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from devenv.bootstrap import (
    Bootstrap,
    Workspace,
    apply_retrying,
    poll,
    wait_workspace_ready,
)
from devenv.kcp import KcpInstance
from devenv.slices import bind_api, install_api, slice_manifest
from tests.support.serve import NO_AUTH, serve_app
from vwserver.auth.guard import Guard
from vwserver.cache.registry import CacheRegistry
from vwserver.clock import SystemClock
from vwserver.controller.scope import ShardScope
from vwserver.controller.slices import TENANT_CONNECTIONS, ControllerSettings, SliceController
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import load_kubeconfig
from vwserver.metrics import ServerMetrics
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Routes
from vwserver.server import build_app
from vwserver.server import watch_health as server_watch_health

API_WS = "vwserver-api"
T = TypeVar("T")


@dataclass
class Served:
    base: str
    kcp: KcpInstance
    world: Bootstrap
    controller: SliceController
    api_ws: Workspace
    metrics: ServerMetrics

    async def kubectl(self, ws: Workspace, *args: str, input: str | None = None) -> Any:
        result = await self.kcp.kubectl(*args, server=ws.url, input=input)
        out = result.stdout.strip()
        return json.loads(out) if out.startswith("{") else out

    async def create_slice(
        self,
        ws: Workspace,
        name: str,
        *,
        selector: dict[str, Any],
        export_name: str | None = None,
    ) -> None:
        """A slice in ``ws`` over an export of the provider workspace (by path)."""
        manifest = slice_manifest(
            name,
            export_path=self.world.provider.path,
            export_name=export_name or self.world.export_name,
            selector=selector,
        )
        await self.kubectl(ws, "apply", "-f", "-", input=manifest)

    async def slice_status(self, ws: Workspace, name: str) -> dict[str, Any]:
        doc = await self.kubectl(ws, "get", "filteredapiexportendpointslice", name, "-o", "json")
        return dict(doc.get("status") or {})


async def until(
    what: str, probe: Callable[[], Awaitable[T | None]], *, within: float, interval: float = 0.3
) -> T:
    """``probe()`` until it returns something other than None/False (devenv's ``poll``: kubectl
    errors count as "not yet")."""

    async def ready() -> T | None:
        value = await probe()
        return None if value is False else value

    return await poll(what, ready, within=within, interval=interval)


async def eventually(probe: Callable[[], Awaitable[T | None]], *, within: float, what: str) -> T:
    """Poll ``probe`` until it returns something truthy (``None``/falsy: not yet)."""

    async def truthy() -> T | None:
        value = await probe()
        return value if value else None

    return await poll(what, truthy, within=within, interval=0.25)


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def create_workspace(kcp: KcpInstance, name: str) -> Workspace:
    doc = {"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": name}}
    await apply_retrying(kcp, kcp.cluster_url("root"), json.dumps(doc), within=60)
    return await wait_workspace_ready(kcp, name, within=60)


@contextlib.asynccontextmanager
async def serving(
    kcp: KcpInstance,
    world: Bootstrap,
    *,
    bind_in: Sequence[Workspace],
    resync: float,
    guard: Callable[[KubeClient], Guard] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    cache: bool = False,
    max_slices_per_workspace: int = 50,
    max_exports_per_workspace: int = 20,
    api_location: dict[str, Any] | None = None,
    watch_health: bool = False,
    scope: ShardScope | None = None,
    external_url: str | None = None,
) -> AsyncIterator[Served]:
    """vwserver's API bound in ``bind_in``, and a running vwserver (controller re-checking ready
    slices every ``resync`` s; ``guard(client)``: authenticate and authorize callers with it;
    ``ssl_context``: serve HTTPS with it, so the slices' endpoint URLs are https; ``cache``:
    serve LIST and WATCH from the shared watch cache, with holds, as a deployed vwserver does).
    The controller has its tenants' connection pool, as ``vwserver serve`` builds it, and the
    caps given. ``api_location``: the ``spec.location.selector`` of vwserver's API workspace (a
    sharded kcp); ``watch_health`` (with ``cache``): slices get the ``UpstreamReachable``
    condition from the cache's watches, as ``vwserver serve`` has it. ``scope``: a shard-scoped
    replica (``controller.shards``), whose part of the status leaves on the way out, as on a
    graceful shutdown of ``vwserver serve``; ``external_url``: the URL the controller publishes
    (default: this server's own; another replica's, for a second replica behind one Service)."""
    api_ws = await install_api(kcp, workspace=API_WS, selector=api_location)
    for ws in bind_in:
        await bind_api(kcp, ws, api=api_ws)
    auth = await load_kubeconfig(kcp.kubeconfig, context=kcp.admin_context)
    routes = Routes()
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(KubeClient(auth=auth))
        tenants = await stack.enter_async_context(
            KubeClient(auth=auth, max_connections=TENANT_CONNECTIONS)
        )
        metrics = ServerMetrics()
        registry = None
        if cache:
            registry = CacheRegistry(client=client, clock=SystemClock(), metrics=metrics)
            stack.push_async_callback(registry.aclose)
        holder: dict[str, SliceController] = {}
        app = build_app(
            routes=routes,
            upstream=UpstreamClient(auth=auth),
            ready=lambda: "c" in holder and holder["c"].synced.is_set(),
            guard=guard(client) if guard is not None else NO_AUTH,
            cache=registry,
            metrics=metrics,
        )
        base = await stack.enter_async_context(serve_app(app, ssl_context=ssl_context))
        controller = SliceController(
            client=client,
            routes=routes,
            settings=ControllerSettings(
                export_path=api_ws.path,
                external_url=external_url or base,
                resync=resync,
                retry=Backoff(initial=0.2, maximum=1.0),
                max_slices_per_workspace=max_slices_per_workspace,
                max_exports_per_workspace=max_exports_per_workspace,
                scope=scope,
            ),
            tenant_client=tenants,
            metrics=metrics,
            upstream_watches=(
                functools.partial(server_watch_health, registry)
                if watch_health and registry is not None
                else None
            ),
        )
        holder["c"] = controller
        task = asyncio.create_task(controller.run())
        try:
            await asyncio.wait_for(controller.synced.wait(), 30)
            yield Served(base, kcp, world, controller, api_ws, metrics)
        finally:
            await controller.retire()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await controller.aclose()
