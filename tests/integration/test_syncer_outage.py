"""A downstream cluster that is away — at start, or for longer than the lease's renew deadline
while the syncer leads — never ends ``vwserver sync``: it waits, says why in ``/readyz``, logs
the outage once instead of a traceback per retry, and syncs once the cluster is back.

Related objects (``resources[].related[]``, issue #25 §2) hold to the same rules: their copies
catch up after the downstream cluster and then the kcp endpoint were away (a Secret changed,
one deleted, one added meanwhile; the operator's Secret changed meanwhile); two syncers on the
same objects and downstream namespaces do not fight over a shared copy (only a copy carrying a
syncer's label, written by its field manager, is its own); an idle syncer with copies both ways
writes nothing over several resyncs (every write request on both servers counted).

Real servers throughout: the fake kcp VW upstream, a fake downstream cluster behind a TCP relay
the test switches off and on (:mod:`tests.integration.syncer_support`). Every wait is bounded and
waits for an event (a readiness text, a counted retry, an object), never for some seconds; the
timing rules of the lease itself are tested with fake time in ``test_lease.py``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
import yaml

from fakekcp.upstream import FakeUpstream
from tests.integration.related_support import (
    RelatedWorld,
    changed,
    eventually,
    quiet_round,
    related_world,
    resyncs,
    running,
    secret,
    settled,
    value,
    writes,
)
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
from vwserver.syncer.naming import LABEL_SYNCER, downstream_namespace, field_manager, finalizer
from vwserver.syncer.runner import Syncer

TIMEOUT = 30.0
T = TypeVar("T")


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


@pytest.fixture
async def related(tmp_path: Path) -> AsyncIterator[RelatedWorld]:
    async with related_world(tmp_path) as world:
        yield world


async def test_related_copies_catch_up_after_the_downstream_and_kcp_were_away(
    related: RelatedWorld,
) -> None:
    """Downstream away: a Secret changed, one deleted and one added meanwhile are in step once
    it is back. The kcp endpoint away: the operator's Secret changed meanwhile is copied up,
    and a Secret changed in kcp meanwhile is copied down, once it is back."""
    w = related
    syncer = Syncer(w.config(), base_dir=w.dir, identity="replica-1")
    async with running(syncer):
        await settled(w)
        assert w.copy_down("private") is None
        owner = w.in_kcp("w1-conn")
        assert owner is not None and owner["metadata"]["labels"][LABEL_SYNCER] == "eu"

        w.down_relay.down()
        refused = w.down_relay.refused
        await eventually("the syncer retried", lambda: _at_least(w.down_relay.refused, refused + 2))
        changed(w.upstream, "c1", "ns1", "s1", "v2")
        w.upstream.delete(cluster="c1", namespace="ns1", name="s2", resource="secrets")
        w.upstream.create(cluster="c1", obj=secret("s3", "ns1", "v1", app="shop"))
        w.down_relay.up()
        await eventually("s1 changed downstream", lambda: _value(value(w.copy_down("s1")) == "v2"))
        await eventually("s3 copied down", lambda: _value(w.copy_down("s3")))
        await eventually("s2's copy gone", lambda: _value(w.copy_down("s2") is None))

        w.up_relay.down()
        refused = w.up_relay.refused
        await eventually("the syncer retried", lambda: _at_least(w.up_relay.refused, refused + 2))
        changed(w.downstream, DOWN_CLUSTER, w.down_ns(), "w1-conn", "conn-2")
        changed(w.upstream, "c1", "ns1", "s1", "v3")
        w.up_relay.up()
        await eventually("w1-conn changed in kcp", lambda: _value(value(w.in_kcp("w1-conn")) == "conn-2"))  # fmt: skip
        await eventually("s1 changed downstream", lambda: _value(value(w.copy_down("s1")) == "v3"))
        assert w.copy_down("s2") is None and w.copy_down("private") is None


async def test_two_syncers_on_the_same_objects_do_not_fight_over_a_shared_copy(
    related: RelatedWorld,
) -> None:
    """Syncers eu and us see the same endpoint and write into the same downstream namespaces.
    eu owns w1 and the copies of s1 and s2; w2 is us's (its finalizer, written by us's field
    manager). us needs the same copies for w2, finds eu's there and reports ``NotOwned`` on w2
    instead of taking them over; eu leaves w2 alone. Over several resyncs of both, eu's copies
    stay as they are and us writes no Secret anywhere."""
    w = related
    eu = Syncer(w.config("eu"), base_dir=w.dir, identity="eu-1")
    async with running(eu):
        await settled(w)
        copies = {n: w.copy_down(n) for n in ("s1", "s2")}
        # w2, claimed by us when it is created (POST with us's field manager)
        body = widget("w2") | {"metadata": {"name": "w2", "namespace": "ns1",
                                            "finalizers": [finalizer("us")]}}  # fmt: skip
        url = f"{w.vw_url}/clusters/c1/apis/example.io/v1alpha1/namespaces/ns1/widgets"
        async with (
            aiohttp.ClientSession(headers={"Authorization": "Bearer t"}) as session,
            session.post(url, json=body, params={"fieldManager": field_manager("us")}) as r,
        ):
            assert r.status == 201, await r.text()
        us = Syncer(w.config("us"), base_dir=w.dir, identity="us-1")
        async with running(us):

            async def refused_by_us() -> dict[str, Any] | None:
                obj = w.upstream.get(cluster="c1", namespace="ns1", name="w2")
                for c in ((obj or {}).get("status") or {}).get("conditions") or ():
                    if c["type"] == "Synced" and c["reason"] == "NotOwned":
                        return dict(c)
                return None

            condition = await eventually("w2: NotOwned", refused_by_us)
            assert "is not a copy of syncer us" in condition["message"]
            assert "127.0.0.1" not in condition["message"]
            # several resyncs of both (each syncs every key once a second)
            await resyncs(eu, us, rounds=3)
            # eu sees w2 and leaves it to us (readiness names the contention)
            assert any("owned by other syncer(s) (us)" in n for n in eu.readiness_notes())
        for name, before in copies.items():
            after = w.copy_down(name)
            assert after is not None and before is not None
            assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
            assert after["metadata"]["labels"][LABEL_SYNCER] == "eu"
        us_manager = field_manager("us")
        assert [x for x in writes(w.downstream, manager=us_manager) if "/secrets" in x] == []
        assert [x for x in writes(w.upstream, manager=us_manager) if "/secrets" in x] == []
        # the primaries' copies: each syncer's own
        for name, syncer in (("w1", "eu"), ("w2", "us")):
            copy = w.downstream.get(cluster=DOWN_CLUSTER, namespace=w.down_ns(), name=name,
                                    resource="widgets")  # fmt: skip
            assert copy is None or copy["metadata"]["labels"][LABEL_SYNCER] == syncer
        owner = w.in_kcp("w1-conn")
        assert owner is not None and owner["metadata"]["labels"][LABEL_SYNCER] == "eu"


async def test_an_idle_syncer_with_related_objects_writes_nothing(related: RelatedWorld) -> None:
    """Steady state with copies both ways: over resync periods (every key reconciled again,
    counted), no write reaches either server."""
    w = related
    syncer = Syncer(w.config(), base_dir=w.dir, identity="replica-1")
    async with running(syncer):
        await settled(w)
        assert any("/secrets/" in x for x in writes(w.downstream))  # the copies are counted
        # settled: a full round that writes nothing, then count
        await eventually("a quiet round", lambda: quiet_round(w, syncer))
        down, up = len(writes(w.downstream)), len(writes(w.upstream))
        await resyncs(syncer, rounds=3)
        assert writes(w.downstream)[down:] == []
        assert writes(w.upstream)[up:] == []
