"""Slice mode with two connections: the FilteredAPIExportEndpointSlice is read from kcp with
``upstream``'s CA and credentials, every call to the endpoint URL it lists goes out with the
``endpoints`` section's — a different CA, and its own identity or upstream's.

Two TLS servers with CAs of their own (trustme): the *lookup* server plays kcp and serves the
slice; the *endpoint* server is the fake VW the slice points to (what vwserver's endpoint is to a
syncer). Each records who called it. No file holds both CAs: before the ``endpoints`` section,
that concatenation was the only way this worked.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trustme
from aiohttp import web

from fakekcp.upstream import FakeUpstream
from tests.integration.syncer_support import (
    DOWN_CLUSTER,
    downstream_fake,
    upstream_fake,
    widget,
    write_kubeconfig,
)
from tests.support.serve import serve_app
from vwserver.syncer.config import parse_syncer_config
from vwserver.syncer.naming import downstream_namespace
from vwserver.syncer.runner import Syncer

TIMEOUT = 30.0
SLICE_PATH = (
    "/clusters/root:provider/apis/sync.edge-connect.eu/v1alpha1/filteredapiexportendpointslices/eu"
)
T = TypeVar("T")


async def eventually(probe: Callable[[], Awaitable[T | None]]) -> T:
    async with asyncio.timeout(TIMEOUT):
        while True:
            if value := await probe():
                return value
            await asyncio.sleep(0.05)


@dataclass
class Lookup:
    """kcp's part: the slice, for the kcp token only."""

    endpoint: str = ""
    tokens: list[str | None] = field(default_factory=list)

    def app(self) -> web.Application:
        async def get_slice(request: web.Request) -> web.Response:
            token = request.headers.get("Authorization")
            self.tokens.append(token)
            if token != "Bearer kcp-token":
                return web.json_response({"kind": "Status", "code": 401}, status=401)
            return web.json_response(
                {
                    "apiVersion": "sync.edge-connect.eu/v1alpha1",
                    "kind": "FilteredAPIExportEndpointSlice",
                    "metadata": {"name": "eu"},
                    "status": {"endpoints": [{"url": self.endpoint}]},
                }
            )

        app = web.Application()
        app.router.add_get(SLICE_PATH, get_slice)
        return app


def server_context(ca: trustme.CA, *, client_ca: trustme.CA | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    if client_ca is not None:
        client_ca.configure_trust(ctx)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@dataclass
class Env:
    dir: Path
    lookup: Lookup
    endpoint: FakeUpstream
    downstream: FakeUpstream
    client_ca: trustme.CA

    def endpoint_tokens(self) -> set[str | None]:
        return {r.headers.get("Authorization") for r in self.endpoint.faults.requests}

    def copy(self, name: str) -> dict[str, Any] | None:
        namespace = downstream_namespace("c1", "ns1", prefix="kcp-")
        return self.downstream.get(
            cluster=DOWN_CLUSTER, namespace=namespace, name=name, resource="widgets"
        )


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, *, require_client_cert: bool) -> AsyncIterator[Env]:
    """The lookup server (kcp's CA), the endpoint server (vwserver's CA; with
    ``require_client_cert`` it refuses a TLS handshake without a certificate of the client CA)
    and the downstream."""
    kcp_ca, vw_ca, client_ca = trustme.CA(), trustme.CA(), trustme.CA()
    kcp_ca.cert_pem.write_to_path(str(tmp_path / "kcp-ca.crt"))
    vw_ca.cert_pem.write_to_path(str(tmp_path / "vw-ca.crt"))
    (tmp_path / "vw-token").write_text("vw-token\n")
    client = client_ca.issue_cert("syncer-eu")
    client.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    client.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    lookup = Lookup()
    async with (
        serve_app(lookup.app(), ssl_context=server_context(kcp_ca)) as kcp_url,
        upstream_fake(
            ssl_context=server_context(vw_ca, client_ca=client_ca if require_client_cert else None)
        ) as (vw, vw_url),
        downstream_fake() as (down, _, port, prefix),
    ):
        lookup.endpoint = vw_url
        vw.create(cluster="c1", obj=widget("w1"))
        write_kubeconfig(
            tmp_path / "kcp.kubeconfig", kcp_url, token="kcp-token", ca=tmp_path / "kcp-ca.crt"
        )
        write_kubeconfig(tmp_path / "down.kubeconfig", f"http://127.0.0.1:{port}{prefix}")
        yield Env(tmp_path, lookup, vw, down, client_ca)


def config(env: Env, endpoints: dict[str, Any] | None) -> Any:
    raw: dict[str, Any] = {
        "name": "eu",
        "upstream": {
            "kubeconfig": "kcp.kubeconfig",
            "endpointSlice": {
                "kind": "FilteredAPIExportEndpointSlice",
                "workspace": "root:provider",
                "name": "eu",
            },
        },
        "downstream": {"kubeconfig": "down.kubeconfig"},
        "resources": [
            {"group": "example.io", "version": "v1alpha1", "resource": "widgets", "kind": "Widget"}
        ],
        "leaderElection": {"enabled": False},
        "health": {"enabled": False},
    }
    if endpoints is not None:
        raw["endpoints"] = endpoints
    return parse_syncer_config(raw, base_dir=env.dir)


async def run_until(syncer: Syncer, probe: Callable[[], Awaitable[T | None]]) -> T:
    stop = asyncio.Event()
    task = asyncio.create_task(syncer.run(stop))
    try:

        async def check() -> T | None:
            if task.done():
                task.result()
                raise AssertionError("the syncer stopped by itself")
            return await probe()

        return await eventually(check)
    finally:
        stop.set()
        await asyncio.wait_for(task, TIMEOUT)


@pytest.mark.parametrize(
    ("endpoints", "identity"),
    [
        ({"caFile": "vw-ca.crt", "clientCertFile": "tls.crt", "clientKeyFile": "tls.key"}, None),
        ({"caFile": "vw-ca.crt", "tokenFile": "vw-token"}, "Bearer vw-token"),
        ({"caFile": "vw-ca.crt"}, "Bearer kcp-token"),  # upstream's identity, vwserver's CA
    ],
    ids=["client-certificate", "token-file", "upstream-identity"],
)
async def test_lookup_and_endpoints_each_use_their_own_ca_and_identity(
    tmp_path: Path, endpoints: dict[str, Any], identity: str | None
) -> None:
    """The slice is read with the kcp token and kcp's CA only; the endpoint is called with the
    endpoints section's CA only, and with its identity: a client certificate (the endpoint
    server refuses handshakes without one), a token file, or upstream's token."""
    client_cert = "clientCertFile" in endpoints
    async with serving(tmp_path, require_client_cert=client_cert) as env:
        syncer = Syncer(config(env, endpoints), base_dir=env.dir)

        async def synced() -> bool:
            return syncer.synced and env.copy("w1") is not None

        await run_until(syncer, synced)
        assert set(env.lookup.tokens) == {"Bearer kcp-token"}
        assert env.endpoint_tokens() == {identity}


async def test_without_an_endpoints_section_the_endpoint_gets_upstreams_connection(
    tmp_path: Path,
) -> None:
    """The old behaviour, kept as the default: the endpoint URLs are called with upstream's
    connection — here kcp's CA, which did not sign the endpoint's certificate, so the syncer
    reports why it cannot use the endpoint (and keeps trying) instead of syncing."""
    async with serving(tmp_path, require_client_cert=False) as env:
        syncer = Syncer(config(env, None), base_dir=env.dir)

        async def refused() -> list[str] | None:
            problems = syncer.readiness()
            return problems if any("CERTIFICATE_VERIFY_FAILED" in p for p in problems) else None

        problems = await run_until(syncer, refused)
        assert any(
            p.startswith(f"upstream {env.lookup.endpoint}: checking discovery") for p in problems
        )
        assert env.copy("w1") is None
        assert set(env.lookup.tokens) == {"Bearer kcp-token"}
