"""A client-go informer per endpoint of a slice on the sharded kcp (issue #24 points 5 and 6).

One slice (``env=prod``, in ``root:provider`` on the root shard, so that its status can still
be written while the second shard is away) has one ``/shards/<id>`` endpoint per shard; a
cluster-aware ``vwclient informer`` (watch-list on) follows ``<endpoint>/clusters/*`` of each.
Writes happen directly in kcp (through the front-proxy) in a namespace of this test in the
consumer of each shard, relabelling objects in and out of the slice (tests.chaos.writes).

1. **Churn on both shards**: after the writes each informer's view of the namespace is exactly
   kcp's objects in the slice *on its shard* (keys, resourceVersions, labels) — nothing of the
   other shard.
2. **The second shard goes away during churn** (its kcp process SIGKILLed, as
   test_shard_outage.py does, then started again on its data): the root shard's writes go on
   and its informer converges while the shard is still down; once the shard is back, its
   informer resumes and converges with no missing, extra or stale object. Every object's
   handler calls fit its writes (tests.chaos.history: only a relist may fold or repeat), and
   each informer's final cache (printed at SIGTERM) is kcp's state.

The module restarts the shard whatever happens, so that later modules find the bed whole.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from devenv.bootstrap import Workspace
from devenv.shards import ROOT_SHARD, SECOND_SHARD, SHARD_NAMES
from devenv.slices import wait_slice_ready
from tests.chaos.informers import (
    Informer,
    assert_histories,
    converge,
    final_cache,
    read_truth_in,
)
from tests.chaos.writes import API, Planned, Writer, relabel_plan
from tests.e2e.controller_env import Served, eventually, unique
from tests.shards.conftest import ShardedWorld
from tests.shards.test_slices_shards import PROD, kcp_vw_urls, serving_slices
from tests.support.go_clients import GoClient, clients, informer_args
from tests.support.widgets import remove_namespace
from vwserver.k8s.kcp import shard_id

SYNC_TIMEOUT = 90.0
CONVERGE_WITHIN = 180.0
"""Seconds an informer gets to converge once its writes are done: after an outage client-go's
reflector backs off up to 30 s (plus jitter) between attempts, and vwserver's shared cache of
the shard relists first."""
RESTART_TIMEOUT = 240.0
WRITE_WITHIN = 600.0
"""Seconds one write may wait for its shard (the second shard's wait through the outage)."""
WRITES = 240  # per phase, spread over both shards

pytestmark = pytest.mark.timeout(1200)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(sharded_world: ShardedWorld) -> AsyncIterator[Served]:
    async with serving_slices(sharded_world) as served:
        yield served


async def slice_endpoints(w: ShardedWorld, served: Served, name: str) -> dict[str, str]:
    """The slice's (in ``root:provider``) endpoint URLs by shard, once it lists both."""
    ids = {shard_id(u): w.bed.shard_of_url(u) for u in await kcp_vw_urls(w, w.world.export_name)}

    async def listed() -> dict[str, str] | None:
        status = await served.slice_status(w.world.provider, name)
        urls = [e["url"] for e in status.get("endpoints") or []]
        return {ids[u.rpartition("/shards/")[2]]: u for u in urls} if len(urls) == 2 else None

    return await eventually(listed, within=60, what=f"slice {name}: two endpoints")


async def test_an_informer_per_endpoint_converges_under_churn_and_across_a_shard_outage(
    sharded_world: ShardedWorld,
    served: Served,
    go_clients: Path,
    tmp_path: Path,
    observe: Callable[[str], None],
) -> None:
    w = sharded_world
    front = w.bed.front
    shard = w.bed.shard(SECOND_SHARD)
    name = unique("informed")
    await served.create_slice(w.world.provider, name, selector=PROD)
    await wait_slice_ready(front, w.world.provider, name, within=60)
    endpoints = await slice_endpoints(w, served, name)
    consumers: dict[str, Workspace] = {s: w.consumer_on(s) for s in SHARD_NAMES}
    by_cluster = {ws.cluster: ws for ws in consumers.values()}
    namespace = unique("inf")
    for ws in consumers.values():
        await front.kubectl("create", "namespace", namespace, server=ws.url)

    def collection(obj: Planned) -> str:
        return f"{by_cluster[obj.cluster].url}/{API}/namespaces/{obj.namespace}/widgets"

    async def truth(s: str) -> dict[str, tuple[str, dict[str, str]]]:
        return await read_truth_in(front, [consumers[s]], namespace)

    plans: dict[str, list[Planned]] = {s: [] for s in SHARD_NAMES}
    gates = {s: asyncio.Event() for s in SHARD_NAMES}
    for gate in gates.values():
        gate.set()
    took: dict[str, float] = {}
    try:
        async with clients() as add, front.http_session(timeout=30) as session:
            informers = {}
            for s, url in endpoints.items():
                args = informer_args(
                    f"{url}/clusters/*", f"--token={front.admin_token}", watch_list=True
                )
                client = add(await GoClient.start(go_clients, f"informer-{s}", args, tmp_path))
                informers[s] = Informer(client, name, watch_list=True)
            for informer in informers.values():
                await informer.client.wait_until(
                    "cache sync", informer.client.synced, within=SYNC_TIMEOUT
                )
            writers = {
                s: Writer(session, collection=collection, gate=gates[s], within=WRITE_WITHIN)
                for s in SHARD_NAMES
            }

            async def churn(phase: str, seed: int) -> dict[str, asyncio.Task[None]]:
                tasks = {}
                for i, s in enumerate(SHARD_NAMES):
                    plan = relabel_plan(
                        [consumers[s].cluster], namespace, writes=WRITES // 2, seed=seed + i
                    )
                    for obj in plan:
                        obj.name = f"{phase}-{obj.name}"
                    plans[s].extend(plan)
                    run = writers[s].run(plan, concurrency=4, pause=0.3, seed=seed + i)
                    tasks[s] = asyncio.create_task(run, name=f"writes {phase} {s}")
                return tasks

            # 1. churn on both shards; each informer converges to its own shard's objects
            tasks = await churn("one", 20261202)
            await asyncio.gather(*tasks.values())
            for s in SHARD_NAMES:
                took[f"churn {s}"] = await converge([informers[s]], namespace, await truth(s))

            # 2. churn again; the second shard is killed a third of the way through its writes
            tasks = await churn("two", 20261203)
            try:
                total = sum(
                    len(obj.ops) for obj in plans[SECOND_SHARD] if obj.name.startswith("two-")
                )
                await writers[SECOND_SHARD].reached(
                    writers[SECOND_SHARD].done + total // 3, running=tasks[SECOND_SHARD]
                )
                gates[SECOND_SHARD].clear()
                try:
                    await shard.process.kill()
                    # the root shard's writes finish, and its informer converges, while the
                    # second shard is down
                    await tasks[ROOT_SHARD]
                    took["outage root"] = await converge(
                        [informers[ROOT_SHARD]],
                        namespace,
                        await truth(ROOT_SHARD),
                        within=CONVERGE_WITHIN,
                    )
                    assert shard.process.pid is None, "the shard came back by itself"
                finally:
                    if shard.process.pid is None:  # killed (KcpProcess.kill forgets the process)
                        await shard.process.start()
                    await shard.process.wait_ready(timeout=RESTART_TIMEOUT)
                    gates[SECOND_SHARD].set()
                await tasks[SECOND_SHARD]
            finally:
                for task in tasks.values():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            finals = {s: await truth(s) for s in SHARD_NAMES}
            for s in SHARD_NAMES:
                took[f"after outage {s}"] = await converge(
                    [informers[s]], namespace, finals[s], within=CONVERGE_WITHIN
                )
            codes = {s: await i.client.stop() for s, i in informers.items()}
    finally:
        await remove_namespace(front, list(consumers.values()), namespace)

    assert codes == dict.fromkeys(codes, 0), codes
    for s, informer in informers.items():
        assert final_cache(informer, namespace) == finals[s], f"{informer.name}: final cache"
        mine = consumers[s].cluster
        assert {k.split("|")[0] for k in finals[s]} <= {mine}
        # nothing of the other shard's consumer, ever (in any namespace)
        seen = {e["cluster"] for e in informer.client.events("add", "update", "delete")}
        foreign = {c for c in seen if c in by_cluster and c != mine}
        assert not foreign, f"{informer.name} saw objects of {foreign}"
    figures = {}
    for s, informer in informers.items():
        figures.update(assert_histories([informer], plans[s], namespace))
    observe(
        f"{sum(wr.done for wr in writers.values())} writes "
        f"({sum(wr.retries for wr in writers.values())} retried); "
        f"{', '.join(f'{s}: {len(finals[s])}' for s in SHARD_NAMES)} objects in the slice at the "
        f"end; converged (s): {', '.join(f'{k} {v:.1f}' for k, v in took.items())}\n"
        + "\n".join(f"  {n}: {line}" for n, line in figures.items())
    )
