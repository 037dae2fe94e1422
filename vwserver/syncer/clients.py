"""The three connections of a syncer, opened together: ``vwserver sync`` and ``--decommission``
use the same ones.

* ``upstream`` — kcp, with ``upstream``'s credentials: the endpoint slice lookup;
* ``endpoints`` — the endpoint URLs (``upstream.urls`` or the slice's): the ``endpoints``
  section's connection, or the very same client as ``upstream`` without one
  (:mod:`vwserver.syncer.endpoints`);
* ``downstream`` — the downstream cluster (objects, namespaces, the Lease).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from vwserver.config.base import client_auth
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import SERVICE_ACCOUNT_DIR
from vwserver.syncer.config import SyncerConfig
from vwserver.syncer.endpoints import endpoints_auth


@dataclass(frozen=True, slots=True)
class Clients:
    upstream: KubeClient
    endpoints: KubeClient
    downstream: KubeClient
    upstream_server: str
    """The upstream kubeconfig's server URL (the slice's workspace is addressed on it)."""
    downstream_base: str
    """The downstream server URL every downstream path is built on."""


@contextlib.asynccontextmanager
async def open_clients(
    config: SyncerConfig, *, base_dir: Path, service_account_dir: Path = SERVICE_ACCOUNT_DIR
) -> AsyncIterator[Clients]:
    """Load the credentials (an exec plugin runs once here) and open the clients; raises
    :class:`~vwserver.errors.ConfigError` naming the field when credentials are unusable."""
    sa = service_account_dir
    up_auth = await client_auth(
        config.upstream, field="$.upstream", base=base_dir, service_account_dir=sa
    )
    down_auth = await client_auth(
        config.downstream, field="$.downstream", base=base_dir, service_account_dir=sa
    )
    ep_auth = None
    if config.endpoints is not None:
        ep_auth = await endpoints_auth(
            config.endpoints, upstream=up_auth, base=base_dir, service_account_dir=sa
        )
    async with contextlib.AsyncExitStack() as stack:
        upstream = await stack.enter_async_context(KubeClient(auth=up_auth))
        downstream = await stack.enter_async_context(KubeClient(auth=down_auth))
        endpoints = upstream
        if ep_auth is not None:
            endpoints = await stack.enter_async_context(KubeClient(auth=ep_auth))
        yield Clients(
            upstream=upstream,
            endpoints=endpoints,
            downstream=downstream,
            upstream_server=up_auth.server,
            downstream_base=down_auth.server,
        )
