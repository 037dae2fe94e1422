"""``vwserver serve`` as a process: config file, TLS both ways (trustme CAs), real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import trustme
import yaml

from fakekcp.auth import FakeAuth
from fakekcp.upstream import FakeUpstream, start_fake_upstream
from tests.support.serve import NO_AUTH, serve_app
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Routes
from vwserver.server import build_app

from .conftest import widget


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def vwserver(config: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vwserver.cli", "serve", "--config", str(config),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 10)


async def wait_ready(url: str, ctx: ssl.SSLContext) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
        for _ in range(100):
            with contextlib.suppress(aiohttp.ClientConnectorError):
                async with s.get(url + "/readyz") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise TimeoutError("vwserver did not become ready")


async def test_tls_to_clients_and_to_the_upstream(tmp_path: Path) -> None:
    upstream_ca, serving_ca = trustme.CA(), trustme.CA()
    upstream_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    upstream_ca.issue_cert("127.0.0.1").configure_cert(upstream_ctx)
    upstream_ca.cert_pem.write_to_path(str(tmp_path / "upstream-ca.crt"))
    cert = serving_ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    fake = FakeUpstream()
    fake.create(cluster="c1", obj=widget("a", env="prod"))
    fake.create(cluster="c1", obj=widget("b", env="dev"))
    # The fake upstream also plays kcp's TokenReview/SubjectAccessReview (auth is always on).
    auth = FakeAuth(reviewer_token="t")
    auth.add_user("caller-token", "alice")
    auth.grant(cluster="slicews", slice_name="prod", user="alice", verbs=["list"])
    auth.install(fake.app)
    port = free_port()
    async with start_fake_upstream(fake, ssl_context=upstream_ctx) as (_, vw_url):
        origin = vw_url.removesuffix(fake.base_path)
        config = tmp_path / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "listen": {"host": "127.0.0.1", "port": port},
                    "tls": {"certFile": "tls.crt", "keyFile": "tls.key"},
                    "upstream": {"server": origin, "caFile": "upstream-ca.crt", "token": "t"},
                    "slices": [
                        {
                            "cluster": "slicews",
                            "name": "prod",
                            "export": {"cluster": fake.export_cluster, "name": fake.export_name},
                            "selector": {"matchLabels": {"env": "prod"}},
                        }
                    ],
                }
            )
        )
        client_ctx = ssl.create_default_context()
        serving_ca.configure_trust(client_ctx)
        base = f"https://127.0.0.1:{port}"
        async with vwserver(config):
            await wait_ready(base, client_ctx)
            url = f"{base}/services/filtered-apiexport/slicews/prod/clusters/*/apis/example.io/v1alpha1/widgets"
            async with (
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ctx)) as s,
                s.get(url, headers={"Authorization": "Bearer caller-token"}) as r,
            ):
                assert r.status == 200
                names = [i["metadata"]["name"] for i in json.loads(await r.read())["items"]]
            assert names == ["a"]


async def test_bad_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("insecureServing: true\nupstream: {server: 'ftp://x'}\n")
    async with vwserver(config) as proc:
        assert proc.stderr is not None
        err = (await asyncio.wait_for(proc.stderr.read(), 20)).decode()
        assert await proc.wait() == 2
    assert err.strip() == (
        "vwserver: invalid configuration: $.upstream.server: 'ftp://x' is not an http(s) URL"
    )


async def test_readyz_follows_the_ready_callback() -> None:
    state = {"ready": False}
    app = build_app(
        routes=Routes(),
        upstream=UpstreamClient(auth=ClientAuth(server="http://127.0.0.1:1")),
        ready=lambda: state["ready"],
        guard=NO_AUTH,
    )
    async with serve_app(app) as base, aiohttp.ClientSession() as s:
        async with s.get(base + "/readyz") as r:
            assert r.status == 503
        async with s.get(base + "/livez") as r:
            assert r.status == 200  # liveness never depends on kcp
        state["ready"] = True
        async with s.get(base + "/readyz") as r:
            assert r.status == 200
