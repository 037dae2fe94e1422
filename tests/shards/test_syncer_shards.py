"""The syncer (``vwserver sync``) reading every endpoint of a slice on the sharded kcp, into one
downstream cluster (issue #24 point 5).

The slice (``root:slices``, second shard) over the Widget export (root shard) lists one
``/shards/<id>`` endpoint per shard; the syncer is configured with the slice
(``endpointSlice``, read from kcp through the front-proxy) and runs in-process
(:class:`vwserver.syncer.runner.Syncer`) with a plain ``widgets.example.io`` CRD in a downstream
workspace on the root shard as its downstream cluster. A poller plays the downstream operator:
it writes ``status.phase`` on every copy, naming the copy's own namespace.

The consumers on the two shards both hold an object of the same namespace/name: each gets its
own downstream copy — in a namespace derived from its logical cluster — with its own spec; each
copy's status goes back to its own object on its own shard; deleting the upstream objects
deletes exactly their copies, and then the objects go (the syncer's finalizer is released).
Objects outside the slice on either shard are never copied.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
import pytest_asyncio

from devenv.bootstrap import Workspace, apply_retrying, poll
from devenv.shards import ROOT_SHARD, SECOND_SHARD, SHARD_NAMES
from tests.e2e.controller_env import Served, unique
from tests.e2e.test_syncer_writes_kcp import DOWNSTREAM_CRD
from tests.shards.conftest import ShardedWorld
from tests.shards.test_slices_shards import call, serving_slices, suite_slice
from tests.support.widgets import remove_namespace
from vwserver.syncer.config import parse_syncer_config
from vwserver.syncer.naming import ANN_CLUSTER, LABEL_SYNCER, downstream_namespace, finalizer
from vwserver.syncer.runner import Syncer

API = "apis/example.io/v1alpha1"
PREFIX = "kcp-"
WAIT = 90.0
T = TypeVar("T")

pytestmark = pytest.mark.timeout(600)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(sharded_world: ShardedWorld) -> AsyncIterator[Served]:
    async with serving_slices(sharded_world) as served:
        yield served


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def downstream(sharded_world: ShardedWorld) -> Workspace:
    """A workspace on the root shard with the plain Widget CRD, its discovery serving it."""
    w = sharded_world
    front = w.bed.front
    ws = await w.bed.create_workspace(unique("downstream"), shard=ROOT_SHARD)
    await apply_retrying(front, ws.url, json.dumps(DOWNSTREAM_CRD), within=WAIT)

    async def discovered() -> bool | None:
        async with front.http_session(timeout=30) as session:
            code, body = await call(session, "GET", f"{ws.url}/{API}")
        names = [r.get("name") for r in body.get("resources") or []] if code == 200 else []
        return True if "widgets" in names else None

    await poll("the downstream CRD in discovery", discovered, within=WAIT)
    return ws


async def operate(session: aiohttp.ClientSession, down: Workspace) -> None:
    """The downstream operator: ``status.phase = ran-in-<namespace>`` on every copy."""
    while True:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, KeyError):
            _, listing = await call(session, "GET", f"{down.url}/{API}/widgets")
            for obj in listing.get("items") or []:
                meta = obj["metadata"]
                phase = f"ran-in-{meta['namespace']}"
                if (obj.get("status") or {}).get("phase") != phase:
                    url = f"{down.url}/{API}/namespaces/{meta['namespace']}/widgets/{meta['name']}"
                    headers = {"Content-Type": "application/merge-patch+json"}
                    body = json.dumps({"status": {"phase": phase}})
                    async with session.patch(f"{url}/status", data=body, headers=headers):
                        pass
        await asyncio.sleep(0.3)


def widget(name: str, namespace: str, labels: dict[str, str], color: str) -> dict[str, Any]:
    return {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"size": 1, "color": color},
    }


async def test_the_syncer_syncs_both_shards_into_one_downstream_without_collisions(
    sharded_world: ShardedWorld, served: Served, downstream: Workspace, tmp_path: Path
) -> None:
    w = sharded_world
    front = w.bed.front
    name, labels, endpoints = await suite_slice(w, served, "sync")
    consumers = {s: w.consumer_on(s) for s in SHARD_NAMES}
    namespace = unique("sync")
    front.write_admin_kubeconfig(tmp_path / "kcp.kubeconfig", server=front.url)
    front.write_admin_kubeconfig(tmp_path / "downstream.kubeconfig", server=downstream.url)
    config = parse_syncer_config(
        {
            "name": name,
            "upstream": {
                "kubeconfig": "kcp.kubeconfig",
                "endpointSlice": {
                    "kind": "FilteredAPIExportEndpointSlice",
                    "workspace": w.slices.path,
                    "name": name,
                },
                "refreshSeconds": 5,
            },
            "downstream": {"kubeconfig": "downstream.kubeconfig"},
            "resources": [
                {
                    "group": "example.io",
                    "version": "v1alpha1",
                    "resource": "widgets",
                    "kind": "Widget",
                }
            ],
            "namespacePrefix": PREFIX,
            "resyncSeconds": 5,
            # a fresh Lease (no holder yet): the default timings take it at once
            "leaderElection": {"namespace": "vwserver-syncer"},
            "health": {"port": 0},
        },
        base_dir=tmp_path,
    )
    collection = f"{API}/namespaces/{namespace}/widgets"
    down_ns = {
        s: downstream_namespace(ws.cluster, namespace, prefix=PREFIX) for s, ws in consumers.items()
    }
    assert len(set(down_ns.values())) == 2
    for ws in consumers.values():
        await front.kubectl("create", "namespace", namespace, server=ws.url)
    syncer = Syncer(config, base_dir=tmp_path)
    stop = asyncio.Event()
    async with front.http_session(timeout=30) as session:
        operator = asyncio.create_task(operate(session, downstream))
        running = asyncio.create_task(syncer.run(stop), name=f"syncer {name}")

        async def up(s: str, obj: str) -> dict[str, Any] | None:
            code, body = await call(session, "GET", f"{consumers[s].url}/{collection}/{obj}")
            return body if code == 200 else None

        async def down(s: str, obj: str) -> dict[str, Any] | None:
            url = f"{downstream.url}/{API}/namespaces/{down_ns[s]}/widgets/{obj}"
            code, body = await call(session, "GET", url)
            return body if code == 200 else None

        async def alive(probe: Awaitable[T]) -> T:
            if running.done():
                running.result()
                raise AssertionError("the syncer stopped by itself")
            return await probe

        try:
            for s, ws in consumers.items():
                for obj, lab in (("twin", labels), ("outside", {"env": "dev", "suite": name})):
                    code, body = await call(
                        session, "POST", f"{ws.url}/{collection}", widget(obj, namespace, lab, s)
                    )
                    assert code == 201, body
            await poll("syncer synced", lambda: alive(_true(syncer.synced)), within=WAIT)
            # the syncer reads both endpoints of the slice
            (controller,) = syncer.controllers
            assert set(controller.upstream_reflectors) == set(endpoints.values())

            async def copied(s: str) -> dict[str, Any] | None:
                return await alive(down(s, "twin"))

            async def status_back(s: str) -> dict[str, Any] | None:
                obj = await alive(up(s, "twin"))
                phase = ((obj or {}).get("status") or {}).get("phase")
                return obj if phase == f"ran-in-{down_ns[s]}" else None

            copies = {}
            ups = {}
            for s in SHARD_NAMES:
                copies[s] = await poll(
                    f"the copy of {s}'s twin", functools.partial(copied, s), within=WAIT
                )
                ups[s] = await poll(
                    f"{s}'s status back", functools.partial(status_back, s), within=WAIT
                )
            _, listing = await call(session, "GET", f"{downstream.url}/{API}/widgets")
            ours = [
                i for i in listing["items"] if i["metadata"]["labels"].get(LABEL_SYNCER) == name
            ]

            # delete both upstream objects: their copies go, then they do
            for ws in consumers.values():
                code, body = await call(session, "DELETE", f"{ws.url}/{collection}/twin")
                assert code in (200, 202), body

            async def all_gone() -> bool | None:
                for s in SHARD_NAMES:
                    if await down(s, "twin") is not None or await up(s, "twin") is not None:
                        return None
                return True

            await poll(
                "twins deleted downstream and upstream", lambda: alive(all_gone()), within=WAIT
            )
            _, after = await call(session, "GET", f"{downstream.url}/{API}/widgets")
            left = [i for i in after["items"] if i["metadata"]["labels"].get(LABEL_SYNCER) == name]
        finally:
            stop.set()
            operator.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await operator
            async with asyncio.timeout(30):
                await running  # a crashed syncer fails the test here
            await remove_namespace(front, list(consumers.values()), namespace)

    # one copy per (cluster, namespace, name): two twins, each its own source, spec, status
    assert len(ours) == 2, [i["metadata"] for i in ours]
    for s, ws in consumers.items():
        meta = copies[s]["metadata"]
        assert meta["namespace"] == down_ns[s]
        assert meta["annotations"][ANN_CLUSTER] == ws.cluster
        assert copies[s]["spec"]["color"] == s
        assert finalizer(name) in ups[s]["metadata"]["finalizers"]
        assert ups[s]["spec"]["color"] == s
    assert {i["metadata"]["name"] for i in ours} == {"twin"}  # "outside" never copied
    assert left == []
    assert {down_ns[ROOT_SHARD], down_ns[SECOND_SHARD]} == {
        i["metadata"]["namespace"] for i in ours
    }


async def _true(value: bool) -> bool | None:
    return True if value else None
