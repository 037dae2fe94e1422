"""The syncer is quiet when nothing changes, and stands back from objects another syncer owns —
against real kcp, with the demo's Widgets (``world``).

The demo's Widget schema has ``status.phase`` only: kcp prunes the ``Synced`` condition and any
other status field the syncer mirrors. The downstream "cluster" (a kcp workspace of this module)
serves Widgets from a plain CRD that defaults ``spec.replicas``, and a small test operator writes
``status.phase`` and ``status.observedSize`` there (the latter unknown to the kcp schema). A
syncer that compares what it wants with what it *sent* instead of what the servers *store*
writes on every reconcile here.

Writes are counted with the syncer's own metric (``vwserver_syncer_writes``, by side and kind) and
"a few resyncs" are counted in reconciles (``vwserver_syncer_reconciles``: every resync reconciles
every object once), never in wall-clock time. Every wait is bounded.

The Widgets are the session's shared demo objects: each test removes the finalizers its syncers
added and puts the Widgets' status back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
import pytest_asyncio

from devenv.bootstrap import Bootstrap, Workspace, apply_retrying, poll, wait_workspace_ready
from devenv.kcp import KcpInstance
from tests.e2e.controller_env import until
from tests.support.rest import MERGE_PATCH, RestCalls
from vwserver.syncer.config import parse_syncer_config
from vwserver.syncer.naming import (
    FINALIZER_PREFIX,
    LABEL_SYNCER,
    ObjectKey,
    downstream_namespace,
    field_manager,
    finalizer,
)
from vwserver.syncer.runner import Syncer
from vwserver.syncer.sync_loop import ResourceController

API = "apis/example.io/v1alpha1"
WAIT = 60.0  # one expected convergence
SETUP = 120.0

T = TypeVar("T")

DOWNSTREAM_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.io"},
    "spec": {
        "group": "example.io",
        "names": {
            "kind": "Widget",
            "listKind": "WidgetList",
            "plural": "widgets",
            "singular": "widget",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "apiVersion": {"type": "string"},
                            "kind": {"type": "string"},
                            "metadata": {"type": "object"},
                            # replicas: defaulted downstream, never set by the syncer. (A field
                            # the schema lacks would not be pruned: server-side apply refuses
                            # it, "field not declared in schema" — a sync error, not a loop.)
                            "spec": {
                                "type": "object",
                                "properties": {
                                    "size": {"type": "integer"},
                                    "color": {"type": "string"},
                                    "replicas": {"type": "integer", "default": 1},
                                },
                            },
                            "status": {
                                "type": "object",
                                "properties": {
                                    "phase": {"type": "string"},
                                    "observedSize": {"type": "integer"},
                                },
                            },
                        },
                    }
                },
            }
        ],
    },
}


@dataclass
class WidgetWorld(RestCalls):
    kcp: KcpInstance
    world: Bootstrap
    downstream: Workspace
    dir: Path
    session: aiohttp.ClientSession

    def up_url(self, key: ObjectKey, sub: str = "") -> str:
        ws = next(c for c in self.world.consumers if c.cluster == key.cluster)
        url = f"{ws.url}/{API}/namespaces/{key.namespace}/widgets/{key.name}"
        return f"{url}/{sub}" if sub else url

    def down_url(self, namespace: str = "", name: str = "", sub: str = "") -> str:
        ns = f"/namespaces/{namespace}" if namespace else ""
        url = f"{self.downstream.url}/{API}{ns}/widgets"
        return "/".join(p for p in (url, name, sub) if p)

    @property
    def keys(self) -> set[ObjectKey]:
        return {ObjectKey(w.cluster, w.namespace, w.name) for w in self.world.widgets}

    async def upstream_versions(self) -> dict[ObjectKey, str]:
        """The resourceVersion of every demo Widget, read from kcp."""
        versions = {}
        for key in self.keys:
            obj = await self.get(self.up_url(key))
            assert obj is not None, key
            versions[key] = obj["metadata"]["resourceVersion"]
        return versions

    def syncer_config(self, name: str, *, prefix: str) -> Any:
        raw = {
            "name": name,
            "upstream": {"kubeconfig": "kcp.kubeconfig", "urls": [self.world.vw_url]},
            "downstream": {"kubeconfig": "downstream.kubeconfig"},
            "resources": [
                {
                    "group": "example.io",
                    "version": "v1alpha1",
                    "resource": "widgets",
                    "kind": "Widget",
                }
            ],
            "namespacePrefix": prefix,
            "resyncSeconds": 1,
            "leaderElection": {
                "namespace": "vwserver-syncer",
                "leaseDurationSeconds": 4,
                "renewDeadlineSeconds": 3,
                "retryPeriodSeconds": 0.5,
            },
            "health": {"port": 0},
        }
        return parse_syncer_config(raw, base_dir=self.dir)

    async def restore(self, original: dict[ObjectKey, dict[str, Any]]) -> None:
        """Take every syncer finalizer off the demo Widgets and put their status back."""
        for key, before in original.items():
            for _ in range(10):  # conflicts: something else wrote meanwhile
                obj = await self.get(self.up_url(key))
                if obj is None:
                    break
                meta = obj["metadata"]
                kept = [
                    f for f in meta.get("finalizers") or [] if not f.startswith(FINALIZER_PREFIX)
                ]
                patch = {
                    "metadata": {"finalizers": kept, "resourceVersion": meta["resourceVersion"]}
                }
                status, body = await self.call("PATCH", self.up_url(key), patch, ctype=MERGE_PATCH)
                if status == 200:
                    break
                assert status == 409, f"PATCH {key}: {status} {body}"
            status, body = await self.call(
                "PATCH",
                self.up_url(key, "status"),
                {"status": before.get("status")},
                ctype=MERGE_PATCH,
            )
            assert status in (200, 404), f"PATCH {key}/status: {status} {body}"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def widgets(
    kcp: KcpInstance, world: Bootstrap, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[WidgetWorld]:
    """A downstream workspace with the Widget CRD and a test operator in it."""
    name = f"writes-{uuid.uuid4().hex[:5]}-down"
    doc = {"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": name}}
    await apply_retrying(kcp, kcp.cluster_url("root"), json.dumps(doc), within=SETUP)
    downstream = await wait_workspace_ready(kcp, name, within=SETUP)
    await apply_retrying(kcp, downstream.url, json.dumps(DOWNSTREAM_CRD), within=SETUP)
    directory = tmp_path_factory.mktemp("syncer-writes")
    kcp.write_admin_kubeconfig(directory / "kcp.kubeconfig", server=kcp.url)
    kcp.write_admin_kubeconfig(directory / "downstream.kubeconfig", server=downstream.url)
    async with kcp.http_session(timeout=30) as session:
        env = WidgetWorld(
            kcp=kcp, world=world, downstream=downstream, dir=directory, session=session
        )

        async def serving() -> bool | None:
            status, _ = await env.call("GET", env.down_url())
            # discovery lags behind the resource for a moment (the syncer checks discovery)
            _, found = await env.call("GET", f"{downstream.url}/{API}")
            names = [r.get("name") for r in (found or {}).get("resources", [])]
            return True if status == 200 and "widgets" in names else None

        await poll("downstream Widget CRD served and discovered", serving, within=SETUP)
        operator = asyncio.create_task(_operator(env), name="widget operator")
        try:
            yield env
        finally:
            operator.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await operator


async def _operator(env: WidgetWorld) -> None:
    """The downstream operator: ``status.phase=Ready`` and ``status.observedSize`` on every copy,
    written only when they differ (a polling loop: it shares no code with the syncer)."""
    while True:
        with contextlib.suppress(aiohttp.ClientError, AssertionError, TimeoutError):
            listing = await env.get(env.down_url())
            for obj in (listing or {}).get("items") or []:
                meta = obj["metadata"]
                want = {"phase": "Ready", "observedSize": (obj.get("spec") or {}).get("size")}
                if any((obj.get("status") or {}).get(k) != v for k, v in want.items()):
                    await env.call(
                        "PATCH",
                        env.down_url(meta["namespace"], meta["name"], "status"),
                        {"status": want},
                        ctype=MERGE_PATCH,
                    )
        await asyncio.sleep(0.3)


# --------------------------------------------------------------------------------------------
# Running syncers and reading their metrics


@contextlib.asynccontextmanager
async def running(env: WidgetWorld, config: Any) -> AsyncIterator[Syncer]:
    """A syncer in-process until the block ends (stopped gracefully within 20 s, checked)."""
    syncer = Syncer(config, base_dir=env.dir)
    stop = asyncio.Event()
    task = asyncio.create_task(syncer.run(stop), name=f"syncer {config.name}")
    try:

        async def synced() -> bool:
            if task.done():
                task.result()
                raise AssertionError(f"syncer {config.name} stopped by itself")
            return syncer.synced

        await eventually(f"syncer {config.name} synced", synced)
        yield syncer
    finally:
        stop.set()
        async with asyncio.timeout(20):
            await task


def controller(syncer: Syncer) -> ResourceController:
    (only,) = syncer.controllers
    return only


def writes(syncer: Syncer) -> dict[str, float]:
    """``side/kind`` → writes so far (``vwserver_syncer_writes_total``)."""
    return {
        f"{s.labels['side']}/{s.labels['kind']}": s.value
        for metric in syncer.metrics.writes.collect()
        for s in metric.samples
        if s.name.endswith("_total") and s.value
    }


def reconciles(syncer: Syncer) -> float:
    return sum(
        s.value
        for metric in syncer.metrics.reconciles.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    )


def pruned_gauge(syncer: Syncer, side: str) -> float | None:
    return syncer.metrics.registry.get_sample_value(
        "vwserver_syncer_pruned_fields", {"resource": controller(syncer).name, "side": side}
    )


def contested_gauge(syncer: Syncer) -> float | None:
    return syncer.metrics.registry.get_sample_value(
        "vwserver_syncer_contested_objects", {"resource": controller(syncer).name}
    )


async def eventually(
    what: str, probe: Callable[[], Awaitable[T | None]], *, within: float = WAIT
) -> T:
    return await until(what, probe, within=within, interval=0.2)


async def resyncs(syncers: list[Syncer], *, objects: int, rounds: int) -> None:
    """Until each syncer has reconciled ``rounds`` times ``objects`` more times (a resync reconciles
    every object once: this is ``rounds`` resyncs, whatever they take on a busy machine)."""
    start = [reconciles(s) for s in syncers]

    async def done() -> bool:
        return all(
            reconciles(s) - before >= rounds * objects
            for s, before in zip(syncers, start, strict=True)
        )

    await eventually(f"{rounds} resyncs", done, within=WAIT + rounds * 10)


async def settled(syncers: list[Syncer], *, objects: int) -> None:
    """Until one resync of every syncer passes without a single write (bounded: a syncer that
    writes on every reconcile never gets there and fails here)."""
    deadline = time.monotonic() + 2 * WAIT
    while True:
        before = [writes(s) for s in syncers]
        await resyncs(syncers, objects=objects, rounds=2)
        after = [writes(s) for s in syncers]
        if before == after:
            return
        if time.monotonic() > deadline:
            growth = [
                {k: v - b.get(k, 0) for k, v in a.items() if v != b.get(k, 0)}
                for b, a in zip(before, after, strict=True)
            ]
            raise AssertionError(f"the syncers never stop writing: last round wrote {growth}")


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


async def originals(env: WidgetWorld) -> dict[ObjectKey, dict[str, Any]]:
    out = {}
    for key in env.keys:
        obj = await env.get(env.up_url(key))
        assert obj is not None, key
        out[key] = obj
    return out


# --------------------------------------------------------------------------------------------
# Nothing is written when nothing changed


async def test_idle_syncer_writes_nothing(widgets: WidgetWorld) -> None:
    """Sync the demo's Widgets (kcp prunes the Synced condition and ``observedSize``, the
    downstream defaults ``spec.replicas``); once settled, three resyncs
    over every object write nothing — no status PATCH, no apply, no finalizer — and no Widget's
    resourceVersion moves."""
    env = widgets
    n = len(env.keys)
    original = await originals(env)
    try:
        async with running(env, env.syncer_config("quiet", prefix="q2-")) as syncer:

            async def everything_synced() -> bool:
                for key in env.keys:
                    up = await env.get(env.up_url(key)) or {}
                    if (up.get("status") or {}).get("phase") != "Ready":
                        return False
                    if finalizer("quiet") not in up["metadata"].get("finalizers", []):
                        return False
                return True

            await eventually("every Widget synced and its status up", everything_synced)
            up = await env.get(env.up_url(next(iter(env.keys))))
            assert up is not None
            assert "conditions" not in up["status"] and "observedSize" not in up["status"]
            await settled([syncer], objects=n)

            versions = await env.upstream_versions()
            before, looked = writes(syncer), reconciles(syncer)
            await resyncs([syncer], objects=n, rounds=3)
            assert delta(before, writes(syncer)) == {}
            assert reconciles(syncer) - looked >= 3 * n  # every object was looked at, thrice
            assert await env.upstream_versions() == versions
            # what it learned about kcp's schema: status.conditions and status.observedSize
            assert controller(syncer).upstream_schema.pruned == {
                ("status", "conditions"),
                ("status", "observedSize"),
            }
            assert pruned_gauge(syncer, "upstream") == 2
            assert pruned_gauge(syncer, "downstream") == 0
            copies = await env.get(env.down_url())
            mine = [
                c
                for c in (copies or {}).get("items", [])
                if c["metadata"]["labels"].get(LABEL_SYNCER) == "quiet"
            ]
            assert len(mine) == n
            assert all(c["spec"]["replicas"] == 1 and c["spec"]["color"] for c in mine)
    finally:
        await env.restore(original)


# --------------------------------------------------------------------------------------------
# Two syncers that see the same objects do not fight


async def test_second_syncer_on_the_same_objects_stands_back(
    widgets: WidgetWorld, caplog: pytest.LogCaptureFixture
) -> None:
    """``first`` owns the Widgets (its finalizer); ``second`` sees the same objects through the
    same endpoint and writes to the same downstream workspace. ``second`` writes nothing, reports
    every Widget as contested (gauge, ``contested()``, one log line each), and over three resyncs
    of both nobody writes and no resourceVersion moves. An object carrying both syncers' claims
    (both finalizers, each written by its syncer's field manager) belongs to the one listed
    first: ``second`` takes that one over, ``first`` stands back from it, and both settle
    again."""
    env = widgets
    n = len(env.keys)
    original = await originals(env)
    caplog.set_level(logging.INFO, logger="vwserver.syncer.sync_loop")
    try:
        async with running(env, env.syncer_config("first", prefix="q3-")) as first:

            async def owned_by_first() -> bool:
                for key in env.keys:
                    up = await env.get(env.up_url(key))
                    fins = [
                        f
                        for f in (up or {}).get("metadata", {}).get("finalizers", [])
                        if f.startswith(FINALIZER_PREFIX)
                    ]
                    if fins != [finalizer("first")]:
                        return False
                return True

            await eventually("first owns every Widget", owned_by_first)
            await settled([first], objects=n)
            async with running(env, env.syncer_config("second", prefix="q3-")) as second:
                versions = await env.upstream_versions()
                first_before = writes(first)
                await resyncs([first, second], objects=n, rounds=3)
                assert writes(second) == {}  # not one write, ever
                assert delta(first_before, writes(first)) == {}
                assert await env.upstream_versions() == versions
                assert await owned_by_first()
                # ... and says so
                assert {c.key for c in controller(second).contested()} == env.keys
                assert {c.owner for c in controller(second).contested()} == {"first"}
                assert contested_gauge(second) == n
                assert contested_gauge(first) == 0
                assert (controller(second).contention() or "").startswith(
                    f"widgets.example.io: {n} object(s) owned by other syncer(s) (first)"
                )
                assert controller(first).contention() is None
                # /readyz stays 200 and says so in its body; the leader with nothing contested
                # says nothing.
                assert second.readiness() == []
                assert second.readiness_notes() == [controller(second).contention()]
                assert first.readiness_notes() == []
                contested_lines = [
                    r for r in caplog.records if "is owned by syncer first" in r.getMessage()
                ]
                assert len(contested_lines) == n  # one line per object, not per reconcile

                # Both finalizers, second's first and written under second's field manager
                # (second's claim, as if second had added it): second owns it now, first
                # stands back. (A consumer writing the names is no claim:
                # tests/e2e/test_syncer_tenants_kcp.py.)
                key = sorted(env.keys)[0]
                up = await env.get(env.up_url(key))
                assert up is not None
                status, body = await env.call(
                    "PATCH",
                    f"{env.up_url(key)}?fieldManager={field_manager('second')}",
                    {
                        "metadata": {
                            "finalizers": [finalizer("second"), finalizer("first")],
                            "resourceVersion": up["metadata"]["resourceVersion"],
                        }
                    },
                    ctype=MERGE_PATCH,
                )
                assert status == 200, body

                async def handed_over() -> bool:
                    return [c.key for c in controller(first).contested()] == [key] and len(
                        controller(second).contested()
                    ) == n - 1

                await eventually("first stands back from the object second owns", handed_over)
                await settled([first, second], objects=n)
                versions = await env.upstream_versions()
                befores = [writes(first), writes(second)]
                await resyncs([first, second], objects=n, rounds=3)
                assert [
                    delta(b, writes(s)) for b, s in zip(befores, [first, second], strict=True)
                ] == [{}, {}]
                assert await env.upstream_versions() == versions
                namespace = downstream_namespace(key.cluster, key.namespace, prefix="q3-")
                copy = await env.get(env.down_url(namespace, key.name))
                assert copy is not None and copy["metadata"]["labels"][LABEL_SYNCER] == "second"
    finally:
        await env.restore(original)


async def _value(value: bool) -> bool:
    return value
