"""What the listeners show to whoever connects (issue #22, finding 13).

* ``/debug/cache`` (every shared resource of the watch cache: the whole export's object counts)
  is served on the health listener bound to loopback only — 404 on the slice listener, 404 on
  a health listener that is not loopback-only — and never names kcp's address;
* ``/metrics`` and ``/readyz`` (unauthenticated on the slice listener) never name kcp's address
  either: the cache's metrics name a resource as ``/debug/cache`` does, by its path in the
  virtual workspace and a digest of its shard (#22 follow-up of finding 13);
* no response on any listener carries a ``Server`` header (aiohttp's ``Python/3.x aiohttp/3.x``
  named the stack): the proxy's answers, 404s of unknown paths, the answers to malformed
  requests written before any handler, the health endpoints.

``vwserver serve`` runs in this process (:func:`vwserver.server.serve`, as the CLI runs it) in
front of the fake kcp, with its health listener; requests go over raw sockets, so that
nothing between the test and the server adds or hides a header.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devenv.kcp import free_ports
from fakekcp.upstream import FakeUpstream, start_fake_upstream
from tests.integration.conftest import PROXY_TOKEN, SLICE_CLUSTER, routes_for, widget
from tests.integration.test_auth import fake_kcp
from tests.integration.test_shutdown import config_doc
from tests.integration.test_syncer_health import State
from tests.support.raw_http import Answer, answer_to
from tests.support.serve import NO_AUTH, serve_app
from vwserver.cache.registry import CacheRegistry
from vwserver.clock import SystemClock
from vwserver.config import parse_config
from vwserver.errors import ConfigError
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.metrics import upstream_name
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Routes
from vwserver.server import build_app, debug_cache_rows, health_listener_app, is_loopback, serve
from vwserver.syncer.health import health_app

TIMEOUT = 10.0
WIDGETS = (
    f"/services/filtered-apiexport/{SLICE_CLUSTER}/prod/clusters/c1"
    "/apis/example.io/v1alpha1/namespaces/ns1/widgets"
)


async def raw(port: int, head: bytes) -> Answer:
    return await answer_to("127.0.0.1", port, head, timeout=TIMEOUT)


def get(path: str, *fields: str) -> bytes:
    return "\r\n".join([f"GET {path} HTTP/1.1", "Host: vwserver", *fields, "", ""]).encode()


MALFORMED = b"GET / HTTP/1.1\r\nHost: x\r\nBad Header: \x01\r\n\r\n"


@dataclass
class Served:
    port: int
    health_port: int
    kcp_origin: str
    fake: FakeUpstream


@contextlib.asynccontextmanager
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    """``vwserver serve`` (plain HTTP, cache on, a health listener on 127.0.0.1)."""
    fake, _ = fake_kcp()
    port, health_port = free_ports(2)
    async with start_fake_upstream(fake) as (_, vw_url):
        origin = vw_url.removesuffix(fake.base_path)
        health = {"host": "127.0.0.1", "port": health_port}
        config = parse_config(config_doc(fake, origin, port, health=health), base_dir=tmp_path)
        stop = asyncio.Event()
        server = asyncio.create_task(serve(config, base_dir=tmp_path, stop=stop))
        try:
            async with asyncio.timeout(TIMEOUT):
                while True:
                    with contextlib.suppress(OSError):
                        if (await raw(health_port, get("/readyz"))).status == 200:
                            break
                    await asyncio.sleep(0.05)
            yield Served(port, health_port, origin, fake)
        finally:
            stop.set()
            await asyncio.wait_for(server, TIMEOUT)


async def test_debug_cache_is_on_the_loopback_health_listener_only_and_names_no_kcp_address(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as s:
        alice = "Authorization: Bearer alice-token"
        listed = await raw(s.port, get(WIDGETS + "?resourceVersion=0", alice))
        assert listed.status == 200, listed  # read from the cache: it has a shared resource
        public = await raw(s.port, get("/debug/cache"))
        assert public.status == 404
        local = await raw(s.health_port, get("/debug/cache"))
        assert local.status == 200
        (row,) = json.loads(local.body)["resources"]
        assert row["objects"] == 2 and row["synced"] is True  # the whole export's count
        assert row["path"].endswith("/clusters/*/apis/example.io/v1alpha1/widgets")
        host_port = s.kcp_origin.removeprefix("http://")
        assert host_port not in local.body.decode(), local.body
        # the health listener serves the health endpoints and the metrics as well
        for path in ("/healthz", "/livez", "/readyz", "/metrics"):
            assert (await raw(s.health_port, get(path))).status == 200, path
            assert (await raw(s.port, get(path))).status == 200, path


TABLE = "Accept: application/json;as=Table;v=v1;g=meta.k8s.io"


async def test_metrics_and_readyz_name_no_kcp_address_even_while_kcp_fails(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as s:
        alice = "Authorization: Bearer alice-token"
        # objects and Tables from the cache: two shared resources, each with its gauges
        for fields in ((alice,), (alice, TABLE)):
            listed = await raw(s.port, get(WIDGETS + "?resourceVersion=0", *fields))
            assert listed.status == 200, listed
        host_port = s.kcp_origin.removeprefix("http://")
        path = f"{s.fake.base_path}/clusters/*/apis/example.io/v1alpha1/widgets"
        shard = upstream_name(s.kcp_origin + path).shard

        async def scraped() -> dict[str, str]:
            texts = {}
            for port in (s.port, s.health_port):
                for what in ("/metrics", "/readyz"):
                    answer = await raw(port, get(what))
                    assert answer.status == 200, (port, what, answer)
                    texts[f"{port}{what}"] = answer.body.decode()
            return texts

        for text in (await scraped()).values():
            assert host_port not in text, text
        metrics = (await scraped())[f"{s.port}/metrics"]
        assert f'vwserver_cache_objects{{resource="{path}",shard="{shard}"}} 2.0' in metrics
        assert f'vwserver_cache_objects{{resource="{path} (as Table)",shard="{shard}"}}' in metrics
        # kcp fails: the reflectors restart (a counter per resource) and /readyz says so
        s.fake.faults.status_code = 503
        s.fake.faults.die_mid_watch_after = 0
        s.fake.create(cluster="c1", obj=widget("breaks-the-watch", env="prod"))
        restarted = (
            f'vwserver_cache_reflector_restarts_total{{cause="error",resource="{path}",'
            f'shard="{shard}"}}'
        )
        async with asyncio.timeout(TIMEOUT):
            while True:
                texts = await scraped()
                if restarted in texts[f"{s.port}/metrics"] and "fail" in texts[f"{s.port}/readyz"]:
                    break
                await asyncio.sleep(0.05)
        s.fake.faults.reset()
        for where, text in texts.items():
            assert host_port not in text, (where, text)
            assert s.kcp_origin not in text, (where, text)


async def test_no_response_of_any_listener_names_the_server_software(tmp_path: Path) -> None:
    async with served(tmp_path) as s:
        answers = {
            "proxy 200": await raw(s.port, get(WIDGETS, "Authorization: Bearer alice-token")),
            "proxy 401": await raw(s.port, get(WIDGETS)),
            "proxy 400": await raw(s.port, get(WIDGETS, "Accept: \xff")),
            "unknown path": await raw(s.port, get("/nothing/here")),
            "healthz": await raw(s.port, get("/healthz")),
            "metrics": await raw(s.port, get("/metrics")),
            "malformed": await raw(s.port, MALFORMED),
            "health listener healthz": await raw(s.health_port, get("/healthz")),
            "health listener debug": await raw(s.health_port, get("/debug/cache")),
            "health listener unknown": await raw(s.health_port, get("/nothing")),
            "health listener malformed": await raw(s.health_port, MALFORMED),
        }
    # (the proxy 400: "\xff" was sent as its UTF-8 bytes, which are not visible ASCII)
    assert {k: a.status for k, a in answers.items()} == {
        "proxy 200": 200,
        "proxy 401": 401,
        "proxy 400": 400,
        "unknown path": 404,
        "healthz": 200,
        "metrics": 200,
        "malformed": 400,
        "health listener healthz": 200,
        "health listener debug": 200,
        "health listener unknown": 404,
        "health listener malformed": 400,
    }
    named = {k: a.headers["server"] for k, a in answers.items() if "server" in a.headers}
    assert not named, named


async def test_the_syncers_health_listener_names_no_server_software_either() -> None:
    async with serve_app(health_app(State())) as base:  # the listener the syncer runs
        port = int(base.rpartition(":")[2])
        for head in (get("/healthz"), get("/readyz"), get("/debug/stuck"), get("/x"), MALFORMED):
            answer = await raw(port, head)
            assert "server" not in answer.headers, (head, answer.headers)


async def test_a_health_listener_that_is_not_loopback_only_serves_no_debug_cache() -> None:
    # (not bound to a public address in a test: what serve() builds for one)
    async with start_fake_upstream(fake_kcp()[0]) as (fake, vw_url):
        auth = ClientAuth(server=vw_url.removesuffix(fake.base_path), token=PROXY_TOKEN)
        async with KubeClient(auth=auth) as client:
            cache = CacheRegistry(client=client, clock=SystemClock(), idle_seconds=60)
            try:
                app = build_app(
                    routes=Routes(routes_for(vw_url)),
                    upstream=UpstreamClient(auth=auth),
                    guard=NO_AUTH,
                    cache=cache,
                )
                for debug, status in ((False, 404), (True, 200)):
                    async with serve_app(health_listener_app(app, debug_cache=debug)) as base:
                        port = int(base.rpartition(":")[2])
                        assert (await raw(port, get("/debug/cache"))).status == status
                        assert (await raw(port, get("/readyz"))).status == 200
            finally:
                await cache.aclose()


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("vwserver.example.com", False),  # a name may resolve to anything
    ],
)
def test_which_addresses_are_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_debug_cache_rows_cut_the_kcp_address_out() -> None:
    origin = "https://kcp.internal:6443"
    path = "/services/apiexport/abc/widgets.example.io/clusters/*/apis/example.io/v1/widgets"
    stats = [
        {"url": origin + path, "objects": 3, "last_error": f"cannot reach {origin}: refused"},
        {"url": origin + path + " (as Table)", "objects": 3, "last_error": None},
        {"url": "https://other-shard:6443" + path, "objects": 1, "last_error": None},
    ]
    rows = debug_cache_rows(stats)
    assert "kcp.internal" not in json.dumps(rows)
    assert rows[0]["last_error"] == "cannot reach <kcp>: refused"
    assert [r["path"] for r in rows] == [path, path + " (as Table)", path]
    assert rows[0]["shard"] == rows[1]["shard"] != rows[2]["shard"]  # shards told apart


def test_the_health_listener_needs_a_port_of_its_own(tmp_path: Path) -> None:
    base = {"insecureServing": True, "upstream": {"server": "https://kcp", "token": "t"}}
    assert parse_config(base, base_dir=tmp_path).health is None  # off unless configured
    with pytest.raises(ConfigError, match=r"\$\.health\.port"):
        parse_config(
            {**base, "listen": {"port": 8443}, "health": {"port": 8443}}, base_dir=tmp_path
        )
