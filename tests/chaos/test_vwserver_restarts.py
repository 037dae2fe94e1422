"""vwserver killed (SIGKILL) and started again while writes go through it and client-go
informers follow the slice through it.

* **No write half applied.** Every write through the proxy sets four values at once (a label,
  an annotation naming the write, two spec fields; :func:`~tests.chaos.writes.setting`), some
  try to take the object out of the slice (the proxy must refuse them: 422). Right after each
  kill, before anything is retried, every object in kcp shows exactly one write's values (or
  its creation's), never a mix and never a refused write's; at the end each shows its last
  write's. The proxy makes every write conditional on the resourceVersion it checked, so a
  write cut off by the kill is applied whole by kcp or not at all, and the writer's retry (an
  idempotent patch, a create answered 409, a delete answered 404) finds out which.
* **Informers catch up with what happened while it was dead**: during each outage more
  writes happen directly in kcp; nothing of them may be missing afterwards.
* **Informers resume without a relist storm.** A killed vwserver comes back with an empty
  cache; its first upstream LIST starts its window at kcp's current resourceVersion, so a
  watch that resumes from an older one gets ``410 Expired`` and client-go relists once — from
  the cache (``resourceVersion=N`` without a limit: not older than N). "No storm" in numbers:
  at most one relist per informer per restart, and at most two LISTs of the resource reach kcp
  per restart however many informers relist: the cache's own, and the test's probe through the
  pass-through slice that the restarted vwserver serves.
* Every informer converges to kcp's objects in the slice; every handler call fits the writes.

Length: ``VWSERVER_CHAOS_VWSERVER_KILLS`` (default 3) kills spread over
``VWSERVER_CHAOS_PROXY_WRITES`` (default 400) writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.bed import SLICE, ChaosKcp, VwServer, metric_sum, wait_served
from tests.chaos.informers import (
    assert_histories,
    check_history,
    converge,
    final_cache,
    read_truth,
    start_informers,
)
from tests.chaos.writes import (
    API,
    Planned,
    Writer,
    planned_seq,
    relabel_plan,
    settings_plan,
    written_by,
)
from tests.support.go_clients import clients
from tests.support.vwserver_process import Reaper

KILLS = int(os.environ.get("VWSERVER_CHAOS_VWSERVER_KILLS", "3"))
WRITES = int(os.environ.get("VWSERVER_CHAOS_PROXY_WRITES", "400"))

pytestmark = pytest.mark.timeout(300 + 30 * KILLS + WRITES // 5)


async def test_writes_through_a_killed_vwserver_are_whole_and_informers_resume(
    bed: ChaosKcp,
    namespace: str,
    go_clients: Path,
    reaper: Reaper,
    tmp_path: Path,
    observe: Callable[[str], None],
) -> None:
    server = VwServer("vwserver", workdir=tmp_path, config=bed.vwserver_config(), reaper=reaper)
    consumers = {ws.cluster: ws for ws in bed.world.consumers}
    plan = settings_plan(list(consumers), namespace, writes=WRITES, seed=20260302)
    # written directly in kcp while vwserver is dead, one part per outage
    direct = relabel_plan(list(consumers), namespace, writes=40 * KILLS, seed=20260304)
    parts = [direct[i::KILLS] for i in range(KILLS)]
    serving = asyncio.Event()
    lists_at_kcp = 0.0
    vwserver_lists = 0.0
    try:
        await server.start()
        await wait_served(bed, server)
        serving.set()
        async with clients() as add:
            informers = await start_informers(
                go_clients, add, bed=bed, base=server.base, slices=(SLICE,), logs=tmp_path,
                reaper=reaper,
            )  # fmt: skip

            def collection(obj: Planned) -> str:
                url = bed.slice_url(server.base, obj.cluster)
                return f"{url}/{API}/namespaces/{obj.namespace}/widgets"

            def in_kcp(obj: Planned) -> str:
                return f"{consumers[obj.cluster].url}/{API}/namespaces/{obj.namespace}/widgets"

            async with bed.kcp.http_session(timeout=30) as session:
                writer = Writer(session, collection=collection, gate=serving)
                meanwhile = Writer(session, collection=in_kcp, gate=bed.serving)
                total = sum(len(obj.ops) for obj in plan)
                weight = await bed.widget_lists_per_vw_list()
                lists_before = await bed.widget_lists()
                writing = asyncio.create_task(writer.run(plan, concurrency=8, pause=0.1, seed=11))
                try:
                    for kill in range(1, KILLS + 1):
                        await writer.reached(kill * total // (KILLS + 1), running=writing)
                        samples = await server.metrics()
                        vwserver_lists += metric_sum(
                            samples, "vwserver_requests_total", verb="list"
                        )
                        serving.clear()
                        await server.kill()
                        await _all_whole(bed, plan, when=f"after kill {kill}")
                        await meanwhile.run(parts[kill - 1], concurrency=8, pause=0, seed=kill)
                        await server.start()
                        await wait_served(bed, server)
                        serving.set()
                    await writing
                finally:
                    writing.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await writing
            truth = await read_truth(bed, namespace)
            took = await converge(informers, namespace, truth)
            lists_at_kcp = (await bed.widget_lists() - lists_before) / weight
            codes = {i.name: await i.client.stop() for i in informers}
        vwserver_lists += metric_sum(await server.metrics(), "vwserver_requests_total", verb="list")
    finally:
        await server.stop()

    assert codes == dict.fromkeys(codes, 0), codes
    # kcp holds each object as its last write left it (deleted ones gone); nothing refused landed
    objects = await _objects(bed, namespace)
    for obj in plan:
        item = objects.get(obj.key)
        if obj.deleted:
            assert item is None, f"{obj.key}: deleted, still in kcp: {item}"
            continue
        assert item is not None, f"{obj.key}: missing in kcp"
        seqs = [s for op in obj.ops if (s := planned_seq(op)) is not None]
        assert written_by(item) == (seqs[-1] if seqs else 0), f"{obj.key}: {item}"
    refused = sum(obj.refused for obj in plan)
    assert refused, "the plan tried no write out of the slice"
    # informers: exactly the slice, every call fitting the writes, at most one relist a restart
    for informer in informers:
        assert final_cache(informer, namespace) == truth, f"{informer.name}: final cache"
    figures = assert_histories(informers, [*plan, *direct], namespace)
    for informer in informers:
        _, relists = check_history(informer, [*plan, *direct], namespace)
        assert relists <= KILLS, f"{informer.name}: {relists} relists for {KILLS} restarts"
    allowed = 2 * KILLS
    assert lists_at_kcp <= allowed, f"kcp answered {lists_at_kcp:.0f} LISTs (at most {allowed})"
    observe(
        f"{writer.done} writes through vwserver ({writer.retries} attempts retried, {refused} "
        f"refused as out of the slice) on {len(plan)} objects, {meanwhile.done} directly in "
        f"kcp while it was dead; vwserver killed {KILLS}x; "
        f"informers converged {took:.1f} s after the writes; LISTs: {vwserver_lists:.0f} at "
        f"vwserver, {lists_at_kcp:.0f} at kcp (one counted as {weight:.0f} by kcp)\n"
        + "\n".join(f"  {name}: {line}" for name, line in figures.items())
    )


async def _objects(bed: ChaosKcp, namespace: str) -> dict[str, dict[str, Any]]:
    """Every widget of ``namespace`` in both consumers, read directly from kcp, by key."""
    found = {}
    async with bed.kcp.http_session(timeout=30) as session:
        for ws in bed.world.consumers:
            async with session.get(f"{ws.url}/{API}/namespaces/{namespace}/widgets") as resp:
                assert resp.status == 200, await resp.text()
                for item in (await resp.json())["items"]:
                    found[f"{ws.cluster}|{namespace}/{item['metadata']['name']}"] = item
    return found


async def _all_whole(bed: ChaosKcp, plan: Sequence[Planned], *, when: str) -> None:
    """Every object of ``plan`` in kcp shows one whole write, in the slice."""
    objects = await _objects(bed, plan[0].namespace)
    for obj in plan:
        item = objects.get(obj.key)
        if item is None:
            continue  # not created yet, or deleted
        labels = item["metadata"].get("labels") or {}
        assert labels.get("env") == "prod", f"{when}: {obj.key} left the slice: {item}"
        assert written_by(item) is not None, f"{when}: {obj.key} is half written: {item}"
