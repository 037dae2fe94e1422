"""Authentication, authorization and TLS of the proxy, end to end over real sockets (issue #5).

The fake upstream also plays kcp's TokenReview and SubjectAccessReview endpoints
(:class:`~fakekcp.auth.FakeAuth` installed on its app), so one fake origin is "kcp"
and every request that reached it is on record. TLS material comes from trustme.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web

from fakekcp.auth import FakeAuth
from fakekcp.upstream import FakeUpstream, start_fake_upstream
from tests.support.serve import serve_app
from vwserver.auth.access import AccessReviewer
from vwserver.auth.guard import AuthMode, Guard
from vwserver.auth.tls import ServingTLS
from vwserver.auth.tokens import TokenReviewer
from vwserver.config import parse_config
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Routes
from vwserver.server import build_app, serve

from .conftest import PROXY_TOKEN, SLICE_CLUSTER, routes_for, widget

WIDGETS = "/apis/example.io/v1alpha1/namespaces/ns1/widgets"
ALICE = {"Authorization": "Bearer alice-token"}
TIMEOUT = 10.0


def fake_kcp() -> tuple[FakeUpstream, FakeAuth]:
    fake = FakeUpstream(bookmark_interval=0.2)
    fake.create(cluster="c1", obj=widget("p1", env="prod", region="eu"))
    fake.create(cluster="c1", obj=widget("d1", env="dev", region="eu"))
    auth = FakeAuth(reviewer_token=PROXY_TOKEN)
    auth.add_user("alice-token", "alice")
    auth.add_user("bob-token", "bob")
    auth.grant(cluster=SLICE_CLUSTER, slice_name="prod", user="alice")
    auth.grant(cluster=SLICE_CLUSTER, slice_name="broken", user="bob")
    auth.install(fake.app)
    return fake, auth


@dataclass
class Env:
    fake: FakeUpstream
    auth: FakeAuth
    base: str
    session: aiohttp.ClientSession

    def url(self, slice_name: str = "prod", path: str = WIDGETS, cluster: str = "c1") -> str:
        return (
            f"{self.base}/services/filtered-apiexport/{SLICE_CLUSTER}/{slice_name}"
            f"/clusters/{cluster}{path}"
        )

    def vw_requests(self) -> list[Any]:
        """Requests that reached the APIExport virtual workspace (not the review endpoints)."""
        return [r for r in self.fake.faults.requests if r.path.startswith(self.fake.base_path)]


@contextlib.asynccontextmanager
async def proxy_env(mode: AuthMode = AuthMode.DELEGATED) -> AsyncIterator[Env]:
    fake, auth = fake_kcp()
    async with start_fake_upstream(fake) as (_, vw_url):
        origin = vw_url.removesuffix(fake.base_path)
        identity = ClientAuth(server=origin, token=PROXY_TOKEN)
        async with KubeClient(auth=identity, timeout=5) as reviews:
            guard = Guard(
                tokens=TokenReviewer(client=reviews),
                access=AccessReviewer(client=reviews),
                mode=mode,
            )
            app = build_app(
                routes=Routes(routes_for(vw_url)),
                upstream=UpstreamClient(auth=identity),
                guard=guard,
            )
            async with serve_app(app) as base, aiohttp.ClientSession() as session:
                yield Env(fake, auth, base, session)


async def status_of(response: aiohttp.ClientResponse) -> dict[str, Any]:
    assert response.content_type == "application/json"
    body: dict[str, Any] = json.loads(await response.read())
    assert body["kind"] == "Status"
    return body


async def test_health_is_open_and_slices_need_credentials() -> None:
    async with proxy_env() as env:
        for path in ("/healthz", "/livez", "/readyz"):
            async with env.session.get(env.base + path) as r:
                assert r.status == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic eDp5"}):
            async with env.session.get(env.url(), headers=headers) as r:
                assert r.status == 401
                # like kube-apiserver and kcp: the bare Status, no WWW-Authenticate challenge
                assert "WWW-Authenticate" not in r.headers
                body = await status_of(r)
                assert (body["reason"], body["message"], body["code"]) == (
                    "Unauthorized",
                    "Unauthorized",
                    401,
                )
        assert env.vw_requests() == []


async def test_a_granted_slice_and_nothing_else() -> None:
    async with proxy_env() as env:
        async with env.session.get(env.url("prod"), headers=ALICE) as r:
            assert r.status == 200
            assert [i["metadata"]["name"] for i in (await r.json())["items"]] == ["p1"]
        assert len(env.vw_requests()) == 1
        # another slice, a slice that does not exist, a slice that is not ready: all 403 for
        # alice — she learns nothing about slices she may not use (not even 404 or 503)
        for slice_name in ("eu-not-dev", "nosuch", "broken"):
            async with env.session.delete(env.url(slice_name, WIDGETS + "/d1"), headers=ALICE) as r:
                assert r.status == 403
                body = await status_of(r)
                assert f'"{slice_name}" is forbidden' in body["message"]
                assert 'User "alice" cannot delete' in body["message"]
        assert len(env.vw_requests()) == 1
        # bob may use "broken": he gets past the guard and sees its 503
        headers = {"Authorization": "Bearer bob-token"}
        async with env.session.get(env.url("broken"), headers=headers) as r:
            assert r.status == 503


async def test_client_identity_headers_are_refused_and_never_reach_kcp() -> None:
    """``Impersonate-*`` / ``X-Remote-*`` ask for another identity: refused (403) in both modes,
    before any review; the variants are in tests/security/test_impersonation.py."""
    spoof = {**ALICE, "Impersonate-User": "system:admin", "X-Remote-User": "system:admin"}
    for mode in AuthMode:
        async with proxy_env(mode) as env:
            async with env.session.get(env.url(), headers=spoof) as r:
                assert r.status == 403
                assert (await status_of(r))["message"].startswith(
                    "impersonation is not supported through a slice"
                )
            assert env.vw_requests() == [] and env.auth.token_reviews == []


async def test_passthrough_view_sends_no_client_certificate(tmp_path: Path) -> None:
    """kcp would authenticate vwserver by its certificate before looking at a bearer token."""
    server_ca, client_ca = trustme.CA(), trustme.CA()
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    client_ca.configure_trust(server_ctx)
    server_ctx.verify_mode = ssl.CERT_OPTIONAL

    async def who(request: web.Request) -> web.Response:
        assert request.transport is not None
        cert = request.transport.get_extra_info("peercert") or {}
        cn = [v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"]
        return web.json_response({"cn": cn, "auth": request.headers.get("Authorization")})

    app = web.Application()
    app.router.add_get("/who", who)
    vw_cert = client_ca.issue_cert("vwserver.example", common_name="vwserver")
    async with serve_app(app, ssl_context=server_ctx) as url:
        client = UpstreamClient(
            auth=ClientAuth(
                server=url,
                ca_pem=server_ca.cert_pem.bytes().decode(),
                token="vw-token",
                client_cert_pem=vw_cert.cert_chain_pems[0].bytes().decode(),
                client_key_pem=vw_cert.private_key_pem.bytes().decode(),
            )
        )
        await client.start()
        try:
            seen = []
            for upstream in (client, client.for_caller("caller-token"), client):
                async with upstream.request("GET", f"{url}/who") as r:
                    seen.append(await r.json())
        finally:
            await client.close()
    assert seen == [
        {"cn": ["vwserver"], "auth": "Bearer vw-token"},
        {"cn": [], "auth": "Bearer caller-token"},
        {"cn": ["vwserver"], "auth": "Bearer vw-token"},
    ]


# --- TLS ---------------------------------------------------------------------------------------


def write_pair(cert: trustme.LeafCert, directory: Path) -> None:
    cert.private_key_pem.write_to_path(str(directory / "tls.key"))
    cert.cert_chain_pems[0].write_to_path(str(directory / "tls.crt"))


def trusting(ca: trustme.CA, client_cert: trustme.LeafCert | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    if client_cert is not None:
        client_cert.configure_cert(ctx)
    return ctx


async def get(url: str, ctx: ssl.SSLContext, **headers: str) -> tuple[int, Any]:
    """One request on a new connection."""
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, force_close=True)) as s,
        s.get(url, headers=headers) as r,
    ):
        return r.status, json.loads(await r.read())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_serve_rotates_the_certificate_under_an_open_watch(tmp_path: Path) -> None:
    """``serve()`` as the CLI runs it: auth on, TLS reloaded while a watch stays open."""
    old_ca, new_ca = trustme.CA(), trustme.CA()
    write_pair(old_ca.issue_cert("127.0.0.1"), tmp_path)
    fake, _ = fake_kcp()
    port = free_port()
    async with start_fake_upstream(fake) as (_, vw_url):
        config = parse_config(
            {
                "listen": {"host": "127.0.0.1", "port": port},
                "tls": {"certFile": "tls.crt", "keyFile": "tls.key"},
                "upstream": {"server": vw_url.removesuffix(fake.base_path), "token": PROXY_TOKEN},
                "slices": [
                    {
                        "cluster": SLICE_CLUSTER,
                        "name": "prod",
                        "export": {"cluster": fake.export_cluster, "name": fake.export_name},
                        "selector": {"matchLabels": {"env": "prod"}},
                    }
                ],
            },
            base_dir=tmp_path,
        )
        stop = asyncio.Event()
        server = asyncio.create_task(
            serve(config, base_dir=tmp_path, stop=stop, tls_reload_interval=0.05)
        )
        base = f"https://127.0.0.1:{port}/services/filtered-apiexport/{SLICE_CLUSTER}/prod"
        url = f"{base}/clusters/*/apis/example.io/v1alpha1/widgets"
        try:
            async with asyncio.timeout(TIMEOUT):
                while True:
                    with contextlib.suppress(aiohttp.ClientConnectorError):
                        if (await get(url, trusting(old_ca), **ALICE))[0] == 200:
                            break
                    await asyncio.sleep(0.05)
            assert (await get(url, trusting(old_ca)))[0] == 401
            async with (
                aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(ssl=trusting(old_ca))
                ) as session,
                session.get(url, params={"watch": "true"}, headers=ALICE) as watch,
            ):
                assert watch.status == 200
                write_pair(new_ca.issue_cert("127.0.0.1"), tmp_path)
                async with asyncio.timeout(TIMEOUT):  # new connections get the new certificate
                    while True:
                        with contextlib.suppress(aiohttp.ClientConnectorCertificateError):
                            assert (await get(url, trusting(new_ca), **ALICE))[0] == 200
                            break
                        await asyncio.sleep(0.05)
                with pytest.raises(aiohttp.ClientConnectorCertificateError):
                    await get(url, trusting(old_ca), **ALICE)
                # ... and the watch opened before the rotation keeps delivering
                fake.create(cluster="c1", obj=widget("after-rotation", env="prod"))
                async with asyncio.timeout(TIMEOUT):
                    while True:
                        line = await watch.content.readline()
                        assert line, "watch ended"
                        event = json.loads(line)
                        if event["object"]["metadata"]["name"] == "after-rotation":
                            break
                assert event["type"] == "ADDED"
        finally:
            stop.set()
            await asyncio.wait_for(server, TIMEOUT)


async def test_a_half_written_rotation_keeps_the_old_certificate(tmp_path: Path) -> None:
    old_ca, new_ca = trustme.CA(), trustme.CA()
    write_pair(old_ca.issue_cert("127.0.0.1"), tmp_path)
    tls = ServingTLS(cert_file=tmp_path / "tls.crt", key_file=tmp_path / "tls.key")

    async def ok(_: web.Request) -> web.Response:
        return web.json_response("ok")

    app = web.Application()
    app.router.add_get("/", ok)
    async with serve_app(app, ssl_context=tls.context) as base:
        assert not tls.reload()  # unchanged files: nothing to do
        new = new_ca.issue_cert("127.0.0.1")
        new.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))  # the key is still old
        with pytest.raises(ssl.SSLError):
            tls.reload()
        assert await get(base + "/", trusting(old_ca)) == (200, "ok")
        new.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
        assert tls.reload()
        assert await get(base + "/", trusting(new_ca)) == (200, "ok")


async def test_client_certificates(tmp_path: Path) -> None:
    serving_ca, clients_ca, rogue_ca = trustme.CA(), trustme.CA(), trustme.CA()
    write_pair(serving_ca.issue_cert("127.0.0.1"), tmp_path)
    clients_ca.cert_pem.write_to_path(str(tmp_path / "clients-ca.crt"))
    tls = ServingTLS(
        cert_file=tmp_path / "tls.crt",
        key_file=tmp_path / "tls.key",
        client_ca_file=tmp_path / "clients-ca.crt",
    )
    assert tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
    fake, auth = fake_kcp()
    async with start_fake_upstream(fake) as (_, vw_url):
        identity = ClientAuth(server=vw_url.removesuffix(fake.base_path), token=PROXY_TOKEN)
        async with KubeClient(auth=identity) as reviews:
            guard = Guard(
                tokens=TokenReviewer(client=reviews), access=AccessReviewer(client=reviews)
            )
            app = build_app(
                routes=Routes(routes_for(vw_url)),
                upstream=UpstreamClient(auth=identity),
                guard=guard,
            )
            async with serve_app(app, ssl_context=tls.context) as base:
                prefix = f"{base}/services/filtered-apiexport/{SLICE_CLUSTER}"
                prod = f"{prefix}/prod/clusters/c1{WIDGETS}"
                alice = clients_ca.issue_cert(
                    "alice.example", common_name="alice", organization_name="team-a"
                )
                status, body = await get(prod, trusting(serving_ca, alice))
                assert status == 200
                assert [i["metadata"]["name"] for i in body["items"]] == ["p1"]
                assert auth.token_reviews == []  # the certificate was enough
                assert auth.access_reviews[-1]["spec"]["user"] == "alice"
                assert auth.access_reviews[-1]["spec"]["groups"] == [
                    "team-a",
                    "system:authenticated",
                ]
                # a trusted certificate of a user without the grant: 403
                bob = clients_ca.issue_cert("bob.example", common_name="bob")
                status, body = await get(prod, trusting(serving_ca, bob))
                assert (status, body["reason"]) == (403, "Forbidden")
                # a certificate from another CA: the handshake fails, nothing is asked or sent
                reviews_before = len(auth.access_reviews)
                rogue = rogue_ca.issue_cert("alice.example", common_name="alice")
                tls12 = trusting(serving_ca, rogue)
                tls12.maximum_version = ssl.TLSVersion.TLSv1_2
                with pytest.raises(aiohttp.ClientConnectorError):  # reset in the handshake
                    await get(prod, tls12)
                # (with TLS 1.3 the client finishes its side first and sees the server hang up)
                with pytest.raises(aiohttp.ClientError):
                    await get(prod, trusting(serving_ca, rogue))
                assert len(auth.access_reviews) == reviews_before
                # no certificate at all is fine: then the bearer token counts
                assert (await get(prod, trusting(serving_ca), **ALICE))[0] == 200
                assert (await get(prod, trusting(serving_ca)))[0] == 401
