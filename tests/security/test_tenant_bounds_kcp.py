"""One tenant cannot starve another through the slice controller, and a slice's status tells
nothing about what exists elsewhere (issue #22, findings 3 and 6), against real kcp.

Any workspace that binds vwserver's API can create FilteredAPIExportEndpointSlices naming any
export, with any path or logical-cluster ID. Before the export's owner consented, vwserver reads
nothing of the export (no APIExport GET, no watch of it or of its endpoint slice) and answers one
``NotPermitted`` whatever exists; the work it does for one workspace is capped and fair, and the
provider's own slices are re-checked on workers and connections no tenant can occupy.

Setup (once per module, on the session's kcp and demo world): two fresh workspaces bound to
vwserver's API (``eve``: the oracle probes; ``flood``: the hostile slices) and an in-process
vwserver (:mod:`tests.e2e.controller_env`) that re-checks ready slices every ``RESYNC`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest_asyncio
from yarl import URL

from devenv.bootstrap import Bootstrap, Workspace
from devenv.kcp import KcpInstance
from devenv.slices import slice_manifest, wait_slice_ready
from tests.e2e.controller_env import (
    Served,
    condition,
    create_workspace,
    eventually,
    serving,
    unique,
)
from tests.support.procfs import tcp_connections
from vwserver.controller.slices import TENANT_CONNECTIONS
from vwserver.errors import ApiError, UpstreamUnavailable
from vwserver.k8s import kcp as kcp_api
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import load_kubeconfig

RESYNC = 2.0
HOSTILE = 1000
CREATE_CONCURRENCY = 25
PROD = {"matchLabels": {"env": "prod"}}
CLEANUP_TIMEOUT = 300.0
MAX_SLICES = 50
"""The controller's default cap (``controller.maxSlicesPerWorkspace``)."""


@dataclass
class Bed:
    served: Served
    eve: Workspace
    flood: Workspace

    @property
    def world(self) -> Bootstrap:
        return self.served.world


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def bed(kcp: KcpInstance, world: Bootstrap) -> AsyncIterator[Bed]:
    eve = await create_workspace(kcp, unique("eve"))
    flood = await create_workspace(kcp, unique("flood"))
    bind_in = (world.provider, eve, flood)
    async with serving(kcp, world, bind_in=bind_in, resync=RESYNC) as served:
        yield Bed(served, eve, flood)


def _slices(ws: Workspace) -> str:
    return kcp_api.SLICES.collection(kcp_api.workspace(ws.path))


def _manifest(name: str, *, path: str, export: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(
        slice_manifest(name, export_path=path, export_name=export, selector=PROD)
    )
    return doc


_HELPERS: set[KubeClient] = set()
"""The test's own clients of kcp open now (their connections are not vwserver's)."""


@contextlib.asynccontextmanager
async def _admin(kcp: KcpInstance, *, timeout: float = 30.0) -> AsyncIterator[KubeClient]:
    """kcp's admin, on connections of its own (see :data:`_HELPERS`)."""
    auth = await load_kubeconfig(kcp.kubeconfig, context=kcp.admin_context)
    async with KubeClient(auth=auth, timeout=timeout) as client:
        _HELPERS.add(client)
        try:
            yield client
        finally:
            _HELPERS.discard(client)


async def _conditions_written(
    served: Served, ws: Workspace, name: str, *, within: float = 30
) -> dict[str, Any]:
    async def written() -> dict[str, Any] | None:
        status = await served.slice_status(ws, name)
        return status if condition(status, "Ready") else None

    return await eventually(written, within=within, what=f"status of slice {name}")


async def _delete_all(kcp: KcpInstance, ws: Workspace) -> None:
    """Delete every slice of ``ws`` (deletecollection). kcp deletes a collection one object
    after the other and gives up after its request timeout (504) on a busy machine: ask again
    until none is left."""
    async with _admin(kcp, timeout=90) as admin, asyncio.timeout(CLEANUP_TIMEOUT):
        while True:
            with contextlib.suppress(ApiError, UpstreamUnavailable):
                await admin.request("DELETE", _slices(ws))
            left = await admin.request("GET", _slices(ws), query=[("limit", "1")])
            if not left.get("items"):
                return


def _normalized(status: dict[str, Any], *, path: str, export: str) -> dict[str, Any]:
    """The status with the names the slice gave replaced and the times dropped."""
    text = json.dumps(status, sort_keys=True)
    text = text.replace(export, "<EXPORT>")
    text = re.sub(rf"(?<![\w:-]){re.escape(path)}(?![\w:-])", "<PATH>", text)
    doc: dict[str, Any] = json.loads(text)
    for c in doc.get("conditions", []):
        c.pop("lastTransitionTime", None)
    return doc


async def test_status_is_one_answer_for_missing_and_existing_exports_by_path_and_id(
    bed: Bed, observe: Callable[[str], None]
) -> None:
    """Finding 6: "not found" vs "NotPermitted" told an attacker whether an export exists."""
    world, served, ws = bed.world, bed.served, bed.eve
    provider = world.provider
    made_up = f"nope-{uuid.uuid4().hex[:8]}.example.io"
    fake_id = uuid.uuid4().hex[:16]
    probes = {
        # name: (path, export)
        "missing-by-path": (provider.path, made_up),
        "existing-by-path": (provider.path, world.export_name),
        "missing-by-id": (provider.cluster, made_up),
        "existing-by-id": (provider.cluster, world.export_name),
        "no-such-workspace-path": (f"root:nope-{uuid.uuid4().hex[:8]}", world.export_name),
        "no-such-workspace-id": (fake_id, world.export_name),
    }
    async with _admin(served.kcp) as admin:
        for name, (path, export) in probes.items():
            await admin.request("POST", _slices(ws), body=_manifest(name, path=path, export=export))
    try:
        statuses = {
            name: _normalized(await _conditions_written(served, ws, name), path=path, export=export)
            for name, (path, export) in probes.items()
        }
        # nothing of those exports is watched (the provider's own slices watch theirs)
        followed = served.controller.followed_exports()
        assert not followed & {ref for name, ref in probes.items() if name != "existing-by-path"}
    finally:
        await _delete_all(served.kcp, ws)
    reference = statuses["existing-by-path"]
    assert condition(reference, "Ready")["reason"] == "NotPermitted"
    assert condition(reference, "APIExportValid")["reason"] == "NotPermitted"
    for name, status in statuses.items():
        assert status == reference, name  # byte-identical but for the names it gave
    observe(f"one answer for {len(probes)} probes: {condition(reference, 'Ready')['message']}")


async def test_a_thousand_hostile_slices_do_not_starve_the_providers_slices(
    bed: Bed, observe: Callable[[str], None]
) -> None:
    """Finding 3: 300 slices naming made-up exports exhausted vwserver's connections to kcp."""
    world, served, flood = bed.world, bed.served, bed.flood
    provider = world.provider
    kcp_port = URL(served.kcp.url).port
    assert kcp_port is not None

    steady, fresh = unique("steady"), unique("fresh")
    await served.create_slice(provider, steady, selector=PROD)
    status = await wait_slice_ready(served.kcp, provider, steady, within=30)
    collection = f"{status['endpoints'][0]['url']}/clusters/*/{world.api_path}/{world.resource}"
    victim = next(w for w in world.widgets if w.labels["env"] == "prod")
    one = (
        f"{status['endpoints'][0]['url']}/clusters/{victim.cluster}/{world.api_path}"
        f"/namespaces/{victim.namespace}/{world.resource}/{victim.name}"
    )

    def metric(name: str, **labels: str) -> int:
        return int(served.metrics.registry.get_sample_value(name, labels) or 0)

    def pool(name: str) -> int:
        return metric("vwserver_controller_upstream_connections", pool=name)

    def counts() -> tuple[int, int, int, int]:
        """The controller's upstream watches (its metric), this process's connections to kcp
        (vwserver's: the test's own helpers' are subtracted), and the controller's two pools
        (their metric)."""
        connections = tcp_connections(os.getpid(), port=kcp_port)
        connections -= sum(c.connections for c in _HELPERS)
        watches = metric("vwserver_controller_upstream_watches")
        return watches, connections, pool("provider"), pool("tenants")

    before = counts()
    watches_before, connections_before = before[0], before[1]
    answers: list[int] = []
    peak = list(before)
    stop = asyncio.Event()

    async def provider_reads(session: aiohttp.ClientSession) -> None:
        """The provider's existing slice keeps answering LIST and GET during the flood."""
        while not stop.is_set():
            for url in (collection, one):
                async with session.get(url) as r:
                    answers.append(r.status)
            peak[:] = [max(p, c) for p, c in zip(peak, counts(), strict=True)]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.3)

    def hostile(i: int) -> dict[str, Any]:
        made_up = f"x{i}-{uuid.uuid4().hex[:6]}.example.io"
        path, export = (
            (provider.path, made_up),  # a made-up export in a real workspace
            (f"root:nope-{i}", world.export_name),  # a made-up workspace
            (provider.path, world.export_name),  # a real export, no consent
            (provider.cluster, made_up),  # a made-up export by cluster ID
        )[i % 4]
        return _manifest(f"h-{i:04d}", path=path, export=export)

    loop = asyncio.get_running_loop()
    took: dict[str, float] = {}
    async with aiohttp.ClientSession() as session:
        reads = asyncio.create_task(provider_reads(session))
        try:
            started = loop.time()
            async with _admin(served.kcp) as admin:
                gate = asyncio.Semaphore(CREATE_CONCURRENCY)

                async def create(i: int) -> None:
                    async with gate:
                        await admin.request("POST", _slices(flood), body=hostile(i))

                await asyncio.gather(*(create(i) for i in range(HOSTILE)))
            took["create"] = loop.time() - started

            # A new provider slice becomes Ready within its normal time meanwhile.
            started = loop.time()
            await served.create_slice(provider, fresh, selector=PROD)
            await wait_slice_ready(served.kcp, provider, fresh, within=30)
            took["fresh Ready"] = loop.time() - started

            # A hostile slice beyond the cap is told why it is not looked at (its status is
            # all it costs); one within the cap is refused as any other.
            capped = await _conditions_written(served, flood, "h-0200", within=60)
            ready = condition(capped, "Ready")
            assert (ready["status"], ready["reason"]) == ("False", "TooManySlices")
            assert "controller.maxSlicesPerWorkspace" in ready["message"]
            assert str(MAX_SLICES) in ready["message"]
            oldest = await _conditions_written(served, flood, "h-0002")
            assert condition(oldest, "Ready")["reason"] == "NotPermitted"
        finally:
            started = loop.time()
            try:
                await _delete_all(served.kcp, flood)
            finally:
                took["cleanup"] = loop.time() - started
                stop.set()
                await reads
                for name in (steady, fresh):
                    await served.kubectl(
                        provider,
                        "delete",
                        "filteredapiexportendpointslice",
                        name,
                        "--ignore-not-found",
                    )
    observe(
        f"controller's upstream watches {watches_before} before, at most {peak[0]} during the "
        f"flood and its cleanup; process's connections to kcp {connections_before} before, at "
        f"most {peak[1]} during (controller's pools: provider {before[2]} before, at most "
        f"{peak[2]}; tenants {before[3]} before, at most {peak[3]}); provider reads answered {sorted(set(answers))} "
        f"({len(answers)} reads); seconds: "
        + ", ".join(f"{what} {seconds:.1f}" for what, seconds in took.items())
    )
    assert answers
    assert set(answers) == {200}
    assert peak[0] == watches_before  # nothing watched for the hostile slices' exports
    # The tenants' pool is bounded; the rest (watches, the provider's re-checks, the proxy's
    # own connections) does not grow with the hostile slices.
    assert peak[3] <= TENANT_CONNECTIONS
    assert peak[2] <= before[2] + 2
    assert peak[1] <= connections_before + TENANT_CONNECTIONS + 2
