"""``vwserver serve --workers 2`` (vwserver.workers) as processes over TLS against the fake kcp.

Which worker takes a connection is the kernel's choice (SO_REUSEPORT hashes each connection's
ports), so the tests count, never time: every request a worker answers is in its
``vwserver_requests_total``, which the parent's health listener shows per ``worker`` label.
Stopping is checked from outside: the parent's exit code, and ``/proc`` for every worker it
started (no process of the server may be left).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import trustme
from aiohttp import web

from fakekcp.upstream import FakeUpstream, start_fake_upstream
from tests.integration.conftest import PROXY_TOKEN, widget
from tests.integration.test_shutdown import ALICE, config_doc, fake_kcp
from tests.support.metrics import per_worker
from tests.support.procfs import alive, children
from tests.support.vwserver_process import Reaper, ServedProcess, reaper, vwserver_process
from vwserver.auth.tls import DEFAULT_RELOAD_INTERVAL as TLS_POLL
from vwserver.cache.registry import CacheRegistry
from vwserver.clock import SystemClock
from vwserver.controller.handoff import Handoff, HandoffRelay
from vwserver.holds import HOLDS_ANNOTATION, Hold, render_holds
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.metrics import ServerMetrics
from vwserver.routes import Route, Routes, RouteTable
from vwserver.selector import Selector
from vwserver.server import HANDOFF_PATH, RelayClient, handoff_endpoint

__all__ = ["reaper"]

WAIT = 20.0
API = "/apis/example.io/v1alpha1/widgets"
FIN = "a.example.io/cleanup"
CONNECTIONS = 24
"""Fresh connections spread over 2 workers: all on one worker has odds 2**-23."""


def slice_url(served: ServedProcess, *, cluster: str = "c1", name: str | None = None) -> str:
    base = f"{served.base}/services/filtered-apiexport/slicews/prod/clusters/{cluster}"
    coll = f"{base}/apis/example.io/v1alpha1/namespaces/ns1/widgets"
    return f"{coll}/{name}" if name else coll


@contextlib.asynccontextmanager
async def two_workers(
    tmp_path: Path, reaper: Reaper, **extra: Any
) -> AsyncIterator[tuple[FakeUpstream, ServedProcess]]:
    async with fake_kcp() as (fake, origin):
        doc = config_doc(fake, origin, 0, workers=2, shutdownGracePeriodSeconds=3, **extra)
        for key in ("insecureServing", "listen"):  # vwserver_process serves TLS on its port
            doc.pop(key)
        async with vwserver_process(doc, workdir=tmp_path, reaper=reaper) as served:
            await every_worker_ready(served)
            yield fake, served


async def every_worker_ready(served: ServedProcess) -> None:
    """Until the parent's ``/readyz`` answers 200: every worker listens (the slice port's
    ``/readyz`` answers as soon as one does)."""
    async with aiohttp.ClientSession() as s, asyncio.timeout(WAIT):
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with s.get(f"{served.health_base}/readyz") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.05)


def session(served: ServedProcess, *, fresh: bool = False) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=served.ssl_context(), force_close=fresh),
        timeout=aiohttp.ClientTimeout(total=WAIT),
        headers=ALICE,
    )


async def counted(served: ServedProcess, name: str, **labels: str) -> dict[str, float]:
    """A metric's value per worker, from the parent's health listener."""
    async with aiohttp.ClientSession() as s:
        return await per_worker(s, served.health_base, name, **labels)


async def until(check: Callable[[], bool]) -> None:
    """Poll ``check`` (what it looks at signals nothing) until it holds, within :data:`WAIT`."""
    async with asyncio.timeout(WAIT):
        while not check():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


async def workers_of(served: ServedProcess) -> list[int]:
    await until(lambda: len(children(served.pid)) == 2)
    return children(served.pid)


async def gone(pids: list[int]) -> None:
    await until(lambda: not any(alive(pid) for pid in pids))


async def test_two_workers_serve_every_read_and_both_take_connections(
    tmp_path: Path, reaper: Reaper
) -> None:
    async with two_workers(tmp_path, reaper) as (_, served):
        assert len(await workers_of(served)) == 2
        for _ in range(CONNECTIONS):  # each GET on a connection of its own
            async with session(served, fresh=True) as s, s.get(slice_url(served, name="p1")) as r:
                assert r.status == 200
        async with session(served) as s:
            async with s.get(slice_url(served)) as r:
                assert r.status == 200
                assert [i["metadata"]["name"] for i in (await r.json())["items"]] == ["p1"]
            async with s.get(slice_url(served, name="d1")) as r:
                assert r.status == 404  # outside the slice, in every worker
            async with s.get(slice_url(served), params={"watch": "1"}) as watch:
                line = await asyncio.wait_for(watch.content.readline(), WAIT)
                assert json.loads(line)["object"]["metadata"]["name"] == "p1"
        gets = await counted(served, "vwserver_requests_total", verb="get")
        assert set(gets) == {"0", "1"}, gets  # the kernel gave both workers connections
        assert sum(gets.values()) == CONNECTIONS + 1
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{served.health_base}/readyz") as r:
                assert r.status == 200
            async with s.get(f"{served.health_base}/debug/cache") as r:
                rows = (await r.json())["resources"]
                assert {row["worker"] for row in rows} <= {0, 1} and rows


async def test_every_worker_follows_a_certificate_rotation(tmp_path: Path, reaper: Reaper) -> None:
    """Every worker polls the same files (vwserver.auth.tls): after a rotation, fresh
    connections — spread over both workers — get the new certificate, and a watch opened
    before it goes on."""
    async with two_workers(tmp_path, reaper) as (fake, served), session(served) as s:
        watch = await s.get(slice_url(served), params={"watch": "1"})
        await asyncio.wait_for(watch.content.readline(), WAIT)
        rotated = trustme.CA()
        cert = rotated.issue_cert("127.0.0.1")
        cert.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
        cert.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
        trusting = ssl.create_default_context()
        rotated.configure_trust(trusting)
        before = await counted(served, "vwserver_requests_total", verb="get")
        streak = 0
        async with asyncio.timeout(3 * TLS_POLL + WAIT):
            while streak < CONNECTIONS:  # in a row, each on a connection of its own
                try:
                    async with (
                        aiohttp.ClientSession(
                            connector=aiohttp.TCPConnector(ssl=trusting, force_close=True),
                            headers=ALICE,
                        ) as fresh,
                        fresh.get(slice_url(served, name="p1")) as r,
                    ):
                        assert r.status == 200
                        streak += 1
                except aiohttp.ClientConnectorCertificateError:
                    streak = 0
                    await asyncio.sleep(0.2)
        after = await counted(served, "vwserver_requests_total", verb="get")
        assert all(after.get(w, 0) > before.get(w, 0) for w in ("0", "1")), (before, after)
        fake.create(cluster="c1", obj=widget("p2", env="prod"))
        event = json.loads(await asyncio.wait_for(watch.content.readline(), WAIT))
        assert event["object"]["metadata"]["name"] == "p2"  # the old connection goes on
        watch.release()


async def test_sigterm_to_the_parent_drains_every_worker(tmp_path: Path, reaper: Reaper) -> None:
    async with two_workers(tmp_path, reaper) as (_, served):
        pids = await workers_of(served)
        async with session(served) as s:
            watches = []
            for _ in range(4):  # on connections of their own: some on each worker, likely
                w = await s.get(slice_url(served), params={"watch": "1"})
                await asyncio.wait_for(w.content.readline(), WAIT)
                watches.append(w)
            served.process.send_signal(signal.SIGTERM)
            for w in watches:  # every watch ends with the chunked stream's end, no error
                async with asyncio.timeout(WAIT):
                    assert await w.content.read() == b""
                w.release()
        assert await asyncio.wait_for(served.process.wait(), WAIT) == 0
        await gone(pids)


async def test_a_crashed_worker_stops_the_server_with_an_error(
    tmp_path: Path, reaper: Reaper
) -> None:
    async with two_workers(tmp_path, reaper) as (_, served):
        pids = await workers_of(served)
        os.kill(pids[1], signal.SIGKILL)
        code = await asyncio.wait_for(served.process.wait(), WAIT)
        assert code != 0
        await gone(pids)
        log = served.log_tail(400)
        assert "exited with code -9; stopping the server" in log
        for index in (0, 1):  # every line of a worker names it
            assert f"[worker {index}] vwserver.server: serving 1 static slice(s)" in log


async def test_workers_of_a_killed_parent_stop(tmp_path: Path, reaper: Reaper) -> None:
    async with two_workers(tmp_path, reaper) as (_, served):
        pids = await workers_of(served)
        served.process.kill()
        await served.process.wait()
        await gone(pids)  # the pipe from the parent closed: each drained and exited


async def test_only_worker_0_records_a_move(tmp_path: Path, reaper: Reaper) -> None:
    """A move is recorded by one write, from worker 0, wherever the slice's clients read: the
    other worker relays what its cache runs and the read that found the move."""
    slices = [
        {
            "cluster": "slicews",
            "name": name,
            "export": {"cluster": "exportid", "name": "widgets.example.io"},
            "selector": {"matchLabels": {"env": env}},
        }
        for name, env in (("prod", "prod"), ("dev", "dev"))
    ]
    async with two_workers(tmp_path, reaper, slices=slices) as (fake, served):
        created = {
            "apiVersion": "example.io/v1alpha1",
            "kind": "Widget",
            "metadata": {"name": "w1", "namespace": "ns1", "finalizers": [FIN]},
        }
        async with session(served) as s, s.post(slice_url(served), json=created) as r:
            assert r.status == 201, await r.text()
        stored = fake.get(cluster="c1", namespace="ns1", name="w1")
        assert stored is not None and HOLDS_ANNOTATION in stored["metadata"]["annotations"]
        # Reads on many connections: both workers' caches run widgets.
        for _ in range(CONNECTIONS):
            async with session(served, fresh=True) as s, s.get(slice_url(served)) as r:
                assert r.status == 200
        stored["metadata"]["labels"] = {"env": "dev"}  # the consumer moves it, in kcp
        fake.update(cluster="c1", obj=stored)
        async with asyncio.timeout(WAIT):
            while True:
                obj = fake.get(cluster="c1", namespace="ns1", name="w1")
                assert obj is not None
                if "leavingSince" in obj["metadata"]["annotations"][HOLDS_ANNOTATION]:
                    break
                await asyncio.sleep(0.05)
        writes = await counted(served, "vwserver_handoff_writes_total")
        assert writes == {"0": 1.0}, writes


async def test_the_relay_makes_worker_0_run_and_record_what_another_worker_reads(
    tmp_path: Path,
) -> None:
    """In process: "worker 1" reads widgets, "worker 0" reads nothing. Worker 1's relay makes
    worker 0 run widgets too (Handoff.keep), and forwards the wake of a move, which worker 0
    records — both loops' intervals are an hour, so only the relay can make that happen."""
    hour = 3600.0
    fake = FakeUpstream()
    held = widget("w1", env="prod")
    held["metadata"]["finalizers"] = [FIN]
    holds = render_holds({"slicews/prod": Hold((FIN,))})
    held["metadata"]["annotations"] = {HOLDS_ANNOTATION: holds}
    fake.create(cluster="c1", obj=held)

    def stored() -> dict[str, Any]:
        obj = fake.get(cluster="c1", namespace="ns1", name="w1")
        assert obj is not None
        return obj

    async with start_fake_upstream(fake) as (_, vw_url), contextlib.AsyncExitStack() as stack:
        auth = ClientAuth(server=vw_url.removesuffix(fake.base_path), token=PROXY_TOKEN)
        clock = SystemClock()
        caches = []
        for _ in range(2):
            client = await stack.enter_async_context(KubeClient(auth=auth))
            cache = CacheRegistry(client=client, clock=clock)
            stack.push_async_callback(cache.aclose)
            caches.append(cache)
        table = RouteTable(
            Route(
                cluster="slicews", name=n, selector=Selector.parse(f"env={n}"), upstream_url=vw_url
            )
            for n in ("prod", "dev")
        )
        metrics = ServerMetrics()
        handoff = Handoff(
            registry=caches[0], routes=Routes(table), clock=clock, interval=hour, metrics=metrics
        )
        app = web.Application()  # worker 0's socket, as serve() gives it the relay's endpoint
        app.router.add_post(HANDOFF_PATH, handoff_endpoint(handoff))
        runner = web.AppRunner(app)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        path = tmp_path / "worker-0.sock"
        await web.UnixSite(runner, str(path)).start()
        read = await caches[1].acquire(upstream=vw_url, api_path=API)  # a reader on worker 1
        assert await read.wait_synced(WAIT)
        sender = await stack.enter_async_context(RelayClient(path))
        relay = HandoffRelay(registry=caches[1], send=sender.send, clock=clock, interval=hour)
        for loop in (handoff.run, relay.run):
            task = asyncio.create_task(loop())
            stack.callback(task.cancel)
        await until(lambda: any(r.synced for r in caches[0].resources()))
        assert [(r.upstream, r.api_path) for r in caches[0].resources()] == [(vw_url, API)]
        moved = stored()
        moved["metadata"]["labels"] = {"env": "dev"}
        fake.update(cluster="c1", obj=moved)
        kept = caches[0].resources()[0]
        await until(lambda: any(e.meta.labels == {"env": "dev"} for e in kept.store.snapshot()))
        relay.wake()  # as a read on worker 1 that found the move not recorded
        await until(lambda: "leavingSince" in stored()["metadata"]["annotations"][HOLDS_ANNOTATION])
        assert metrics.handoff_writes.labels("made")._value.get() == 1
        caches[1].release(read)
