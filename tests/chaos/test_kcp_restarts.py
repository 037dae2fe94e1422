"""kcp killed (SIGKILL) and started again on its data, again and again, while ~1,000 writes
happen directly in kcp and client-go informers follow a slice through vwserver.

Both read paths at once: the slice ``prod`` is served from vwserver's shared watch cache (its
one upstream LIST+WATCH must resume after each restart: kcp's fresh watch cache answers an old
resourceVersion with 410, so the cache relists and ends its clients' watches, which re-watch,
get 410 themselves and relist), ``prod-direct`` (``cache: false``) passes every read to kcp.
Each informer must converge to exactly kcp's objects in the slice, and every object's handler
calls must fit its writes: nothing out of order, nothing lost or repeated except across a
relist (:mod:`tests.chaos.history`).

Length: ``VWSERVER_CHAOS_KCP_KILLS`` (default 5) kills spread over ``VWSERVER_CHAOS_WRITES``
(default 1000) writes; each restart of kcp takes ~20 s on 2 cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chaos.bed import DIRECT_SLICE, SLICE, ChaosKcp, VwServer, metric_sum, wait_served
from tests.chaos.informers import (
    assert_histories,
    converge,
    final_cache,
    read_truth,
    start_informers,
)
from tests.chaos.writes import API, Planned, Writer, relabel_plan
from tests.support.go_clients import clients
from tests.support.vwserver_process import Reaper

KILLS = int(os.environ.get("VWSERVER_CHAOS_KCP_KILLS", "5"))
WRITES = int(os.environ.get("VWSERVER_CHAOS_WRITES", "1000"))

pytestmark = pytest.mark.timeout(300 + 60 * KILLS + WRITES // 10)


async def test_informers_converge_while_kcp_is_killed_and_restarted(
    bed: ChaosKcp,
    namespace: str,
    go_clients: Path,
    reaper: Reaper,
    tmp_path: Path,
    observe: Callable[[str], None],
) -> None:
    server = VwServer("vwserver", workdir=tmp_path, config=bed.vwserver_config(), reaper=reaper)
    consumers = {ws.cluster: ws for ws in bed.world.consumers}
    plan = relabel_plan(list(consumers), namespace, writes=WRITES, seed=20260301)
    try:
        await server.start()
        await wait_served(bed, server)
        async with clients() as add:
            informers = await start_informers(
                go_clients, add, bed=bed, base=server.base, slices=(SLICE, DIRECT_SLICE),
                logs=tmp_path, reaper=reaper,
            )  # fmt: skip

            def collection(obj: Planned) -> str:
                return f"{consumers[obj.cluster].url}/{API}/namespaces/{obj.namespace}/widgets"

            async with bed.kcp.http_session(timeout=30) as session:
                writer = Writer(session, collection=collection, gate=bed.serving)
                total = sum(len(obj.ops) for obj in plan)
                writing = asyncio.create_task(writer.run(plan, concurrency=8, pause=0.3, seed=7))
                try:
                    for kill in range(1, KILLS + 1):
                        await writer.reached(kill * total // (KILLS + 1), running=writing)
                        await bed.crash()
                        await bed.start()
                    await writing
                finally:
                    writing.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await writing
            truth = await read_truth(bed, namespace)
            took = await converge(informers, namespace, truth)
            codes = {i.name: await i.client.stop() for i in informers}
        samples = await server.metrics()
    finally:
        await server.stop()

    assert codes == dict.fromkeys(codes, 0), codes
    for informer in informers:
        assert final_cache(informer, namespace) == truth, f"{informer.name}: final cache"
    figures = assert_histories(informers, plan, namespace)
    assert bed.restarts[-KILLS:], "kcp was never restarted"
    gone = metric_sum(samples, "vwserver_cache_reflector_restarts_total", cause="gone")
    errors = metric_sum(samples, "vwserver_cache_reflector_restarts_total", cause="error")
    # kcp refuses reviews for a few seconds after each start: for a served slice that is a
    # 503 (retry), never a 401 that would call the informers' valid tokens bad
    refused = metric_sum(samples, "vwserver_requests_total", code="401")
    assert refused == 0, f"{refused:.0f} requests with valid tokens answered 401"
    unavailable = metric_sum(samples, "vwserver_requests_total", code="503")
    observe(
        f"{writer.done} writes ({writer.retries} retried) on {len(plan)} objects, "
        f"{len(truth)} in the slice at the end; kcp killed {KILLS}x, ready again after "
        f"{', '.join(f'{s:.0f}' for s in bed.restarts[-KILLS:])} s; informers converged "
        f"{took:.1f} s after the writes; cache reflector restarts: {gone:.0f} relists "
        f"(410), {errors:.0f} errors; {unavailable:.0f} requests answered 503\n"
        + "\n".join(f"  {name}: {line}" for name, line in figures.items())
    )
