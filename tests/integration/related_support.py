"""The world of the syncer's integration tests of related objects (issue #25, §2): the real
local servers of :mod:`tests.integration.syncer_support` serving core Secrets on both sides and
writing ``managedFields`` (the syncer's ownership rules read them: a copy is its own only if
its field manager wrote the owner label, a finalizer its claim only if its field manager added
it), with a relay in front of each side so that the downstream cluster and the kcp endpoint can
go away in turn; syncers run in-process (:class:`~vwserver.syncer.runner.Syncer`).

Namespace ``ns1`` of workspace ``c1`` holds ``w1`` and the Secrets ``s1``, ``s2`` (``app=shop``:
:data:`CREDS` copies them down) and ``private`` (never copied); the test plays the operator,
which writes ``w1-conn`` downstream (:data:`CONN` copies it up).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from prometheus_client.parser import text_string_to_metric_families

from fakekcp.upstream import FakeUpstream
from tests.integration.syncer_support import (
    DOWN_CLUSTER,
    SECRETS,
    WIDGETS,
    downstream_fake,
    upstream_fake,
    widget,
    write_kubeconfig,
)
from tests.support.relay import Relay
from vwserver.syncer.config import SyncerConfig, load_syncer_config
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


async def _value(value: T | None) -> T | None:
    return value


CREDS = {  # origin kcp, by selector: every Secret app=shop of a widget's namespace goes down
    "name": "creds", "origin": "kcp", "version": "v1", "resource": "secrets", "kind": "Secret",
    "selector": {"matchLabels": {"app": "shop"}},
}  # fmt: skip
CONN = {  # origin downstream: the operator's <widget>-conn comes up
    "name": "conn", "origin": "downstream", "version": "v1", "resource": "secrets",
    "kind": "Secret", "nameTemplate": "{{ .metadata.name }}-conn",
}  # fmt: skip
WRITES = ("POST", "PUT", "PATCH", "DELETE")


@dataclass
class RelatedWorld:
    upstream: FakeUpstream
    vw_url: str
    downstream: FakeUpstream
    down_relay: Relay
    up_relay: Relay
    dir: Path

    def down_ns(self, prefix: str = "kcp-") -> str:
        return downstream_namespace("c1", "ns1", prefix=prefix)

    def copy_down(self, name: str, prefix: str = "kcp-") -> dict[str, Any] | None:
        return self.downstream.get(
            cluster=DOWN_CLUSTER, namespace=self.down_ns(prefix), name=name, resource="secrets"
        )

    def in_kcp(self, name: str) -> dict[str, Any] | None:
        return self.upstream.get(cluster="c1", namespace="ns1", name=name, resource="secrets")

    def config(self, name: str = "eu", *, prefix: str = "kcp-", **resource: Any) -> SyncerConfig:
        """Syncer ``name``'s config: widgets with :data:`CREDS` and :data:`CONN`, a resync a
        second, a short lease; ``resource``: more fields of the widgets' entry."""
        path = self.dir / f"{name}.yaml"
        up = self.vw_url.replace(
            self.vw_url.split("://", 1)[1].split("/", 1)[0], f"127.0.0.1:{self.up_relay.port}"
        )
        path.write_text(
            yaml.safe_dump(
                {
                    "name": name,
                    "upstream": {"kubeconfig": "kcp.kubeconfig", "urls": [up]},
                    "downstream": {"kubeconfig": "down.kubeconfig"},
                    "namespacePrefix": prefix,
                    "resources": [
                        {"group": "example.io", "version": "v1alpha1", "resource": "widgets",
                         "kind": "Widget", "related": [CREDS, CONN], **resource}
                    ],
                    "resyncSeconds": 1,
                    "leaderElection": {
                        "leaseDurationSeconds": 2,
                        "renewDeadlineSeconds": 1,
                        "retryPeriodSeconds": 0.2,
                    },
                    "health": {"port": 0},
                }
            )
        )  # fmt: skip
        return load_syncer_config(path)


def secret(name: str, namespace: str, value: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "data": {"value": base64.b64encode(value.encode()).decode()},
    }


def value(obj: dict[str, Any] | None) -> str | None:
    if obj is None or "value" not in (obj.get("data") or {}):
        return None
    return base64.b64decode(obj["data"]["value"]).decode()


def writes(fake: FakeUpstream, *, manager: str | None = None) -> list[str]:
    """The write requests ``fake`` received (not the Lease's: leader election renews it), of
    field manager ``manager`` only if given."""
    return [
        f"{r.method} {r.path}"
        for r in fake.faults.requests
        if r.method in WRITES
        and "/leases" not in r.path
        and (manager is None or r.query.get("fieldManager") == manager)
    ]


@contextlib.asynccontextmanager
async def related_world(tmp_path: Path) -> AsyncIterator[RelatedWorld]:
    async with (
        upstream_fake(resources=[WIDGETS, SECRETS], managed_fields=True) as (up, vw_url),
        downstream_fake(resources=(SECRETS,), managed_fields=True) as (down, _, port, prefix),
        Relay(port) as down_relay,
    ):
        up_port = int(vw_url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        async with Relay(up_port) as up_relay:
            down_relay.up()
            up_relay.up()
            write_kubeconfig(tmp_path / "kcp.kubeconfig", f"http://127.0.0.1:{up_relay.port}")
            write_kubeconfig(
                tmp_path / "down.kubeconfig", f"http://127.0.0.1:{down_relay.port}{prefix}"
            )
            up.create(cluster="c1", obj=secret("s1", "ns1", "v1", app="shop"))
            up.create(cluster="c1", obj=secret("s2", "ns1", "v1", app="shop"))
            up.create(cluster="c1", obj=secret("private", "ns1", "never copied"))
            up.create(cluster="c1", obj=widget("w1"))
            yield RelatedWorld(up, vw_url, down, down_relay, up_relay, tmp_path)


@contextlib.asynccontextmanager
async def running(*syncers: Syncer) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(s.run(stop)) for s in syncers]
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT)


async def settled(w: RelatedWorld) -> None:
    """s1 and s2 copied down, then w1, the operator's w1-conn written and copied up."""
    await eventually("s1, s2 copied down", lambda: _value(w.copy_down("s1") and w.copy_down("s2")))
    namespace = w.down_ns()
    primary = await eventually(
        "w1 copied",
        lambda: _value(
            w.downstream.get(
                cluster=DOWN_CLUSTER, namespace=namespace, name="w1", resource="widgets"
            )
        ),
    )
    # the copies down were made first (one store: its resourceVersions order every write)
    created = [
        int(obj["metadata"]["resourceVersion"])
        for obj in (w.copy_down("s1"), w.copy_down("s2"))
        if obj
    ]
    assert max(created) < int(primary["metadata"]["resourceVersion"])
    if w.downstream.get(cluster=DOWN_CLUSTER, namespace=namespace, name="w1-conn",
                        resource="secrets") is None:  # fmt: skip
        w.downstream.create(cluster=DOWN_CLUSTER, obj=secret("w1-conn", namespace, "conn-1"))
    await eventually("w1-conn copied up", lambda: _value(value(w.in_kcp("w1-conn")) == "conn-1"))


def changed(fake: FakeUpstream, cluster: str, namespace: str, name: str, to: str) -> None:
    obj = fake.get(cluster=cluster, namespace=namespace, name=name, resource="secrets")
    assert obj is not None
    obj["data"] = secret(name, namespace, to)["data"]
    fake.update(cluster=cluster, obj=obj)


def reconciled(syncer: Syncer) -> float:
    """The keys ``syncer`` reconciled so far (its ``vwserver_syncer_reconciles_total``)."""
    total = 0.0
    for family in text_string_to_metric_families(syncer.metrics_text().decode()):
        for sample in family.samples:
            if sample.name == "vwserver_syncer_reconciles_total":
                total += sample.value
    return total


async def resyncs(*syncers: Syncer, rounds: int) -> None:
    """Until each syncer reconciled ``2 * rounds`` more keys (it has a widget or two, and every
    key again each resync, once a second): ``rounds`` resyncs, whatever they take."""
    marks = [reconciled(s) + rounds * 2 for s in syncers]

    async def past() -> bool:
        return all(reconciled(s) >= m for s, m in zip(syncers, marks, strict=True))

    await eventually(f"{rounds} resyncs", past)


async def quiet_round(w: RelatedWorld, syncer: Syncer) -> bool:
    """Whether a resync round of ``syncer`` wrote nothing on either server."""
    down, up = len(writes(w.downstream)), len(writes(w.upstream))
    await resyncs(syncer, rounds=1)
    return len(writes(w.downstream)) == down and len(writes(w.upstream)) == up
