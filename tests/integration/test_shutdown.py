"""Graceful shutdown of ``serve()`` and of the ``vwserver serve`` process (issue #7).

What a rolling update needs from a replica that is told to stop: it reports not-ready at once,
stops taking connections (after ``shutdownDelaySeconds``), ends every open watch with a proper end
of the chunked stream — aiohttp's client raises ``ClientPayloadError`` for a stream cut short, so
reading to the end without an error *is* the check for a clean EOF — lets short requests finish,
and exits on its own within its grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from fakekcp.auth import FakeAuth
from fakekcp.upstream import FakeUpstream, start_fake_upstream
from vwserver.config import parse_config
from vwserver.server import serve

from .conftest import PROXY_TOKEN, SLICE_CLUSTER, widget

ALICE = {"Authorization": "Bearer alice-token"}
TIMEOUT = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def fake_kcp() -> AsyncIterator[tuple[FakeUpstream, str]]:
    """A fake kcp (APIExport VW + reviews) where alice may use slice ``prod``; yields its origin."""
    fake = FakeUpstream(bookmark_interval=0.2)
    fake.create(cluster="c1", obj=widget("p1", env="prod"))
    fake.create(cluster="c1", obj=widget("d1", env="dev"))
    auth = FakeAuth(reviewer_token=PROXY_TOKEN)
    auth.add_user("alice-token", "alice")
    auth.grant(cluster=SLICE_CLUSTER, slice_name="prod", user="alice")
    auth.install(fake.app)
    async with start_fake_upstream(fake) as (_, vw_url):
        yield fake, vw_url.removesuffix(fake.base_path)


def config_doc(fake: FakeUpstream, origin: str, port: int, **extra: Any) -> dict[str, Any]:
    return {
        "insecureServing": True,
        "listen": {"host": "127.0.0.1", "port": port},
        "upstream": {"server": origin, "token": PROXY_TOKEN},
        "slices": [
            {
                "cluster": SLICE_CLUSTER,
                "name": "prod",
                "export": {"cluster": fake.export_cluster, "name": fake.export_name},
                "selector": {"matchLabels": {"env": "prod"}},
            }
        ],
        **extra,
    }


def widgets_url(port: int) -> str:
    return (
        f"http://127.0.0.1:{port}/services/filtered-apiexport/{SLICE_CLUSTER}/prod/clusters/c1"
        "/apis/example.io/v1alpha1/namespaces/ns1/widgets"
    )


async def wait_ready(port: int) -> None:
    async with aiohttp.ClientSession() as session, asyncio.timeout(TIMEOUT):
        while True:
            with contextlib.suppress(aiohttp.ClientConnectorError):
                async with session.get(f"http://127.0.0.1:{port}/readyz") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.05)


async def list_names(session: aiohttp.ClientSession, port: int) -> tuple[int, list[str]]:
    async with session.get(widgets_url(port), headers=ALICE) as r:
        body = await r.read()
        return r.status, [i["metadata"]["name"] for i in json.loads(body)["items"]]


async def reached_upstream(fake: FakeUpstream, *, lists: int) -> None:
    """Wait until the fake has seen ``lists`` LISTs of widgets (recorded before its delay)."""

    def count() -> int:
        return sum(
            1
            for r in fake.faults.requests
            if r.path.endswith("/widgets") and "watch" not in r.query
        )

    async with asyncio.timeout(TIMEOUT):
        while True:  # polled: the fake records requests, it does not signal them
            if count() >= lists:
                return
            await asyncio.sleep(0.01)


async def test_shutdown_ends_watches_cleanly_and_lets_a_list_finish(tmp_path: Path) -> None:
    delay, grace = 0.5, 5.0
    loop = asyncio.get_running_loop()
    async with fake_kcp() as (fake, origin):
        port = free_port()
        config = parse_config(
            config_doc(
                fake,
                origin,
                port,
                shutdownDelaySeconds=delay,
                shutdownGracePeriodSeconds=grace,
            ),
            base_dir=tmp_path,
        )
        stop = asyncio.Event()
        server = asyncio.create_task(serve(config, base_dir=tmp_path, stop=stop))
        try:
            await wait_ready(port)
            async with aiohttp.ClientSession() as session:
                assert await list_names(session, port) == (200, ["p1"])  # reviews now cached
                watch_url = widgets_url(port) + "?watch=true"
                async with session.get(watch_url, headers=ALICE) as watch:
                    first = json.loads(await asyncio.wait_for(watch.content.readline(), TIMEOUT))
                    assert first["object"]["metadata"]["name"] == "p1"
                    fake.faults.delay = 1.0  # the next LIST stays in flight for a second
                    listing = asyncio.create_task(list_names(session, port))
                    await reached_upstream(fake, lists=2)
                    stop.set()
                    stopped = loop.time()
                    # not ready at once; new connections are still taken during the delay
                    async with aiohttp.ClientSession() as fresh:
                        async with fresh.get(f"http://127.0.0.1:{port}/readyz") as r:
                            assert r.status == 503
                            assert "shutting down" in await r.text()
                        async with fresh.get(f"http://127.0.0.1:{port}/livez") as r:
                            assert r.status == 200
                    # the watch ends with a proper end of stream (no ClientPayloadError) ...
                    await asyncio.wait_for(watch.content.read(), TIMEOUT)
                    assert watch.content.at_eof()
                    # ... once the delay is over
                    assert loop.time() - stopped >= delay
                # the LIST in flight completes, whole
                assert await asyncio.wait_for(listing, TIMEOUT) == (200, ["p1"])
            # the listener is closed: new connections are refused
            async with aiohttp.ClientSession() as fresh:
                with pytest.raises(aiohttp.ClientConnectorError):
                    await fresh.get(f"http://127.0.0.1:{port}/livez")
            await asyncio.wait_for(server, delay + grace)
            assert loop.time() - stopped < delay + grace
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(server, return_exceptions=True), TIMEOUT)


async def test_requests_outlasting_the_grace_period_are_cut_off(tmp_path: Path) -> None:
    grace = 0.5
    loop = asyncio.get_running_loop()
    async with fake_kcp() as (fake, origin):
        port = free_port()
        # The LIST must be the one upstream read in flight: without the shared cache, whose
        # reflector would read the upstream too.
        doc = config_doc(
            fake, origin, port, shutdownGracePeriodSeconds=grace, cache={"enabled": False}
        )
        config = parse_config(doc, base_dir=tmp_path)
        stop = asyncio.Event()
        server = asyncio.create_task(serve(config, base_dir=tmp_path, stop=stop))
        try:
            await wait_ready(port)
            async with aiohttp.ClientSession() as session:
                assert await list_names(session, port) == (200, ["p1"])
                fake.faults.delay = 30.0  # an upstream that does not answer in time
                listing = asyncio.create_task(list_names(session, port))
                await reached_upstream(fake, lists=2)
                stop.set()
                stopped = loop.time()
                await asyncio.wait_for(server, TIMEOUT)
                elapsed = loop.time() - stopped
                # waited for it, then cancelled it (aiohttp's own default would wait 60 s)
                assert grace <= elapsed < grace + 2.0
                with pytest.raises(aiohttp.ClientError):  # the client sees the connection end
                    await asyncio.wait_for(listing, TIMEOUT)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(server, return_exceptions=True), TIMEOUT)


async def test_vwserver_serve_exits_0_on_sigterm_with_an_open_watch(tmp_path: Path) -> None:
    grace = 5.0
    loop = asyncio.get_running_loop()
    async with fake_kcp() as (fake, origin):
        port = free_port()
        config = tmp_path / "config.yaml"
        doc = config_doc(fake, origin, port, shutdownGracePeriodSeconds=grace, logFormat="json")
        config.write_text(yaml.safe_dump(doc))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vwserver.cli", "serve", "--config", str(config),
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert proc.stderr is not None
        stderr = asyncio.create_task(proc.stderr.read())  # drained all along: never blocks it
        try:
            await wait_ready(port)
            async with (
                aiohttp.ClientSession() as session,
                session.get(widgets_url(port) + "?watch=true", headers=ALICE) as watch,
            ):
                assert watch.status == 200
                await asyncio.wait_for(watch.content.readline(), TIMEOUT)
                proc.send_signal(signal.SIGTERM)
                sent = loop.time()
                await asyncio.wait_for(watch.content.read(), TIMEOUT)  # a clean end of stream
            assert await asyncio.wait_for(proc.wait(), grace) == 0
            assert loop.time() - sent < grace
        finally:
            if proc.returncode is None:
                proc.kill()
                await asyncio.wait_for(proc.wait(), TIMEOUT)
        lines = [json.loads(line) for line in (await stderr).decode().splitlines()]
    (access,) = [line for line in lines if line["logger"] == "vwserver.access"]
    assert (access["verb"], access["code"], access["user"]) == ("watch", 200, "alice")
    messages = [line["msg"] for line in lines]
    assert any(m.startswith("shutting down") for m in messages)
    assert messages[-1] == "stopped"
