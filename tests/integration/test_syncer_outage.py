"""A downstream cluster that is away — at start, or for longer than the lease's renew deadline
while the syncer leads — never ends ``vwserver sync``: it waits, says why in ``/readyz``, logs
the outage once instead of a traceback per retry, and syncs once the cluster is back.

Real servers throughout: the fake kcp VW upstream, a fake downstream cluster behind a TCP relay
the test switches off and on (:mod:`tests.integration.syncer_support`). Every wait is bounded and
waits for an event (a readiness text, a counted retry, an object), never for some seconds; the
timing rules of the lease itself are tested with fake time in ``test_lease.py``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
import yaml

from fakekcp.upstream import FakeUpstream
from tests.integration.syncer_support import (
    DOWN_CLUSTER,
    Namespaces,
    downstream_fake,
    free_port,
    upstream_fake,
    widget,
    write_kubeconfig,
)
from tests.support.relay import Relay
from vwserver.syncer.config import load_syncer_config
from vwserver.syncer.naming import downstream_namespace
from vwserver.syncer.runner import Syncer

TIMEOUT = 30.0
T = TypeVar("T")


async def eventually(what: str, probe: Callable[[], Awaitable[T | None]]) -> T:
    """``probe()`` until it returns something truthy, for at most TIMEOUT seconds."""
    async with asyncio.timeout(TIMEOUT):
        while True:
            value = await probe()
            if value:
                return value
            await asyncio.sleep(0.1)
    raise AssertionError(f"unreachable: {what}")  # pragma: no cover


@dataclass
class World:
    upstream: FakeUpstream
    vw_url: str
    downstream: FakeUpstream
    namespaces: Namespaces
    relay: Relay
    dir: Path

    def copy(self, name: str, ns: str = "ns1") -> dict[str, Any] | None:
        namespace = downstream_namespace("c1", ns, prefix="kcp-")
        return self.downstream.get(
            cluster=DOWN_CLUSTER, namespace=namespace, name=name, resource="widgets"
        )


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with (
        upstream_fake() as (up, vw_url),
        downstream_fake() as (down, namespaces, port, prefix),
        Relay(port) as relay,
    ):
        up.create(cluster="c1", obj=widget("w1"))
        origin = vw_url.split("/services/", 1)[0]
        write_kubeconfig(tmp_path / "kcp.kubeconfig", origin)
        write_kubeconfig(tmp_path / "down.kubeconfig", f"http://127.0.0.1:{relay.port}{prefix}")
        yield World(up, vw_url, down, namespaces, relay, tmp_path)


def config_file(world: World, *, health_port: int) -> Path:
    path = world.dir / "syncer.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "eu",
                "upstream": {"kubeconfig": "kcp.kubeconfig", "urls": [world.vw_url]},
                "downstream": {"kubeconfig": "down.kubeconfig"},
                "resources": [
                    {"group": "example.io", "version": "v1alpha1", "resource": "widgets",
                     "kind": "Widget"}
                ],
                "resyncSeconds": 5,
                "leaderElection": {
                    "leaseDurationSeconds": 2,
                    "renewDeadlineSeconds": 1,
                    "retryPeriodSeconds": 0.2,
                },
                "health": {"port": health_port},
                "logFormat": "json",
            }
        )
    )  # fmt: skip
    return path


class Probe:
    def __init__(self, base: str, session: aiohttp.ClientSession) -> None:
        self.base, self.session = base, session

    async def get(self, path: str) -> tuple[int, str]:
        try:
            async with self.session.get(f"{self.base}{path}") as r:
                return r.status, await r.text()
        except aiohttp.ClientConnectionError:
            return 0, ""

    async def not_ready_because(self, words: str) -> str | None:
        status, text = await self.get("/readyz")
        return text if status == 503 and words in text else None

    async def ready(self) -> bool:
        return (await self.get("/readyz"))[0] == 200

    async def leader(self, value: int) -> bool:
        _, text = await self.get("/metrics")
        return f"vwserver_syncer_leader {float(value)}" in text


async def test_downstream_away_at_start_and_while_leading(world: World) -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vwserver.cli", "sync",
        "--config", str(config_file(world, health_port=port)),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    stderr = asyncio.create_task(proc.stderr.read())
    try:
        async with aiohttp.ClientSession() as session:
            probe = Probe(f"http://127.0.0.1:{port}", session)
            # (a) unreachable at start: up, not ready, saying why, retrying
            reason = await eventually(
                "not ready: downstream unreachable",
                lambda: probe.not_ready_because("downstream unreachable"),
            )
            assert str(world.relay.port) in reason
            await eventually("two retries", lambda: _at_least(world.relay.refused, 2))
            assert proc.returncode is None
            world.relay.up()
            await eventually("w1 synced", lambda: _value(world.copy("w1")))
            await eventually("ready", probe.ready)
            assert await probe.leader(1)

            # (b) gone while leading, longer than the renew deadline (1 s)
            world.relay.down()
            await eventually(
                "not ready: downstream unreachable (lease)",
                lambda: probe.not_ready_because("downstream unreachable"),
            )
            await eventually("lease lost: controllers stopped", lambda: probe.leader(0))
            refused = world.relay.refused
            await eventually("campaigning on", lambda: _at_least(world.relay.refused, refused + 3))
            assert proc.returncode is None
            world.upstream.create(cluster="c1", obj=widget("w2"))
            world.relay.up()
            await eventually("leading again", lambda: probe.leader(1))
            await eventually("w2 synced", lambda: _value(world.copy("w2")))
            await eventually("ready again", probe.ready)
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), TIMEOUT) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await asyncio.wait_for(proc.wait(), TIMEOUT)
    lines = [json.loads(line) for line in (await stderr).decode().splitlines()]
    print("refused", world.relay.refused)
    assert not [line for line in lines if "exc" in line], "a traceback was logged"
    lease_warnings = [
        line
        for line in lines
        if line["logger"] == "vwserver.k8s.lease" and line["level"] == "warning"
    ]
    # one when the outage began, one for stepping down — not one per retry
    assert len(lease_warnings) <= 3, lease_warnings
    assert world.relay.refused > len(lease_warnings)


async def _at_least(value: int, minimum: int) -> bool:
    return value >= minimum


async def _value(value: T | None) -> T | None:
    return value


async def test_a_standby_is_ready_and_says_whose_lease_it_waits_for(world: World) -> None:
    """Two replicas: the second is ready (nothing to sync) and ``/readyz`` names the holder."""
    world.relay.up()
    config = load_syncer_config(config_file(world, health_port=0))
    one = Syncer(config, base_dir=world.dir, identity="replica-1")
    two = Syncer(config, base_dir=world.dir, identity="replica-2")
    stop = asyncio.Event()
    tasks = [asyncio.create_task(one.run(stop))]
    try:
        await eventually("replica-1 synced", lambda: _value(one.synced))
        tasks.append(asyncio.create_task(two.run(stop)))
        await eventually("replica-2 saw the holder", lambda: _value(two.readiness_notes()))
        assert two.readiness() == []
        assert two.health_url is not None
        async with aiohttp.ClientSession() as session:
            status, text = await Probe(two.health_url, session).get("/readyz")
        assert (status, text) == (
            200,
            "ok\nstandby: waiting for the lease vwserver-syncer/vwserver-syncer-eu held by "
            "replica-1",
        )
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT)
