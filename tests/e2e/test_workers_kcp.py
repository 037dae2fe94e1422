"""``vwserver serve`` with two workers in kcp mode, as a process over TLS, against real kcp.

A slice created with kubectl becomes ready (its status written), and GET, LIST and WATCH work
through it on connections the kernel spreads over both workers. Both workers keep their route
tables (each reconciles), only worker 0 writes slice status: the parent's health listener shows
every worker's counters with a ``worker`` label.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp

from devenv.bootstrap import Bootstrap
from devenv.kcp import KcpInstance
from devenv.slices import bind_api, install_api, slice_manifest, wait_slice_ready
from tests.e2e.controller_env import API_WS, unique
from tests.integration.test_workers import CONNECTIONS, every_worker_ready
from tests.support.metrics import per_worker
from tests.support.vwserver_process import Reaper, reaper, vwserver_process

__all__ = ["reaper"]

WAIT = 30.0


async def test_two_workers_in_kcp_mode(
    kcp: KcpInstance, world: Bootstrap, tmp_path: Path, reaper: Reaper
) -> None:
    api_ws = await install_api(kcp, workspace=API_WS)
    await bind_api(kcp, world.provider, api=api_ws)
    config = {
        "upstream": {"kubeconfig": str(kcp.kubeconfig), "context": kcp.admin_context},
        "externalURL": "https://vwserver.example.com",
        "controller": {"export": {"path": api_ws.path}, "resyncSeconds": 5},
        "workers": 2,
        "shutdownGracePeriodSeconds": 3,
    }
    async with vwserver_process(
        config, workdir=tmp_path, reaper=reaper, ready_within=120
    ) as served:
        await every_worker_ready(served)
        name = unique("workers")
        manifest = slice_manifest(
            name,
            export_path=world.provider.path,
            export_name=world.export_name,
            selector={"matchLabels": {"env": "prod"}},
        )
        await kcp.kubectl("apply", "-f", "-", server=world.provider.url, input=manifest)
        status = await wait_slice_ready(kcp, world.provider, name, within=WAIT)
        assert status["endpoints"][0]["url"].startswith("https://vwserver.example.com/")
        collection = (
            f"{served.base}/services/filtered-apiexport/{world.provider.cluster}/{name}"
            f"/clusters/*/{world.api_path}/{world.resource}"
        )
        headers = {"Authorization": f"Bearer {kcp.admin_token}"}

        def session(*, fresh: bool = False) -> aiohttp.ClientSession:
            return aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=served.ssl_context(), force_close=fresh),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=WAIT),
            )

        async with session() as s:
            async with s.get(collection) as r:
                assert r.status == 200, await r.text()
                items = (await r.json())["items"]
            assert items and {i["metadata"]["labels"]["env"] for i in items} == {"prod"}
            meta = items[0]["metadata"]
            one = (
                f"{served.base}/services/filtered-apiexport/{world.provider.cluster}/{name}"
                f"/clusters/{meta['annotations']['kcp.io/cluster']}/{world.api_path}"
                f"/namespaces/{meta['namespace']}/{world.resource}/{meta['name']}"
            )
            async with s.get(collection, params={"watch": "1"}) as watch:
                event = json.loads(await asyncio.wait_for(watch.content.readline(), WAIT))
                assert event["type"] == "ADDED"
        for _ in range(CONNECTIONS):  # a GET of one object on each of many connections
            async with session(fresh=True) as s, s.get(one) as r:
                assert r.status == 200, await r.text()
        async with aiohttp.ClientSession() as s:
            gets = await per_worker(s, served.health_base, "vwserver_requests_total", verb="get")
            reconciles = await per_worker(
                s, served.health_base, "vwserver_controller_reconciles_total", result="ready"
            )
            writes = await per_worker(
                s, served.health_base, "vwserver_controller_status_writes_total"
            )
        assert set(gets) == {"0", "1"}, gets
        assert reconciles.get("0", 0) >= 1 and reconciles.get("1", 0) >= 1, reconciles
        assert writes.get("0", 0) >= 1 and writes.get("1") == 0, writes
        await kcp.kubectl(
            "delete", "filteredapiexportendpointslice", name, server=world.provider.url
        )
