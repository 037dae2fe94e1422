"""The network between vwserver and kcp fails while writes happen directly in kcp and client-go
informers follow the slice on both read paths (``prod``: the shared watch cache;
``prod-direct``: pass-through). A relay (:class:`tests.support.relay.Relay`) carries every byte
between vwserver and kcp — the controller's, the cache's, the proxy's, the reviews' — and fails
three ways in turn, each while a part of the writes happens:

* **stall** (a black hole: nothing moves, connections stay open), then it flows again: the bytes
  arrive late, nothing is lost, no watch even restarts;
* **cut** (every connection reset, several times): each reflector resumes from its
  resourceVersion (the cache's own and the clients');
* **down** (connections refused) for longer than the controller's resync: the slice fails
  closed — its export and its owner's consent cannot be re-checked, so it answers 503 until
  they can — and every request through either slice gets a clean 503 Status; once the relay
  is back, both slices serve again, ``/readyz`` is 200 and the cache reports no error.

Then every informer holds exactly kcp's objects in the slice and every handler call fits the
writes (:mod:`tests.chaos.history`). What ``/readyz`` and the slice's status said in each phase
is printed: ``/readyz`` stays ``200`` (readiness does not depend on kcp, see
``vwserver.server.upstream_notes``) and, while kcp cannot be reached, says which of vwserver's
upstream watches fail (``upstream: …`` lines; asserted for the refused connections); the slice's
status stays ``Ready`` — vwserver cannot write status to a kcp it cannot reach (its
``UpstreamReachable`` condition says so when only the export's watches fail, e.g. on another
shard: tests/integration/test_upstream_outage_reporting.py).

Length: ``VWSERVER_CHAOS_STALL_SECONDS`` (default 10), ``VWSERVER_CHAOS_DOWN_SECONDS``
(default 25, with a resync of 8 s), ``VWSERVER_CHAOS_RELAY_WRITES`` (default 300).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.chaos.bed import DIRECT_SLICE, SLICE, ChaosKcp, VwServer, wait_served
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

STALL = float(os.environ.get("VWSERVER_CHAOS_STALL_SECONDS", "10"))
DOWN = float(os.environ.get("VWSERVER_CHAOS_DOWN_SECONDS", "25"))
WRITES = int(os.environ.get("VWSERVER_CHAOS_RELAY_WRITES", "300"))
RESYNC = 8.0
SERVED_AGAIN_WITHIN = 60.0
PROBE_TIMEOUT = 5.0

pytestmark = pytest.mark.timeout(300 + STALL + DOWN + WRITES // 5)


async def test_informers_converge_through_a_stalled_cut_and_refused_connection_to_kcp(
    bed: ChaosKcp,
    namespace: str,
    go_clients: Path,
    reaper: Reaper,
    tmp_path: Path,
    observe: Callable[[str], None],
) -> None:
    assert DOWN > 2 * RESYNC, "the outage must outlast the controller's resync"
    server = VwServer(
        "vwserver", workdir=tmp_path, config=bed.vwserver_config(resync=RESYNC), reaper=reaper
    )
    consumers = {ws.cluster: ws for ws in bed.world.consumers}
    plan = relabel_plan(list(consumers), namespace, writes=WRITES, seed=20260303)
    parts = [plan[i::4] for i in range(4)]  # before, while stalled, while cut, while down
    said: dict[str, Counter[str]] = {}
    phase = ["before"]

    async def listen() -> None:
        """What /readyz, the slice's status and a LIST through each slice say, per phase (each
        probe in a loop of its own: one that hangs in a stall does not hold up the others)."""

        def record(line: str, started_in: str) -> None:
            said.setdefault(started_in, Counter())[line] += 1

        async def probe(ask: Callable[[], Awaitable[str]]) -> None:
            while True:
                started_in = phase[0]
                record(await ask(), started_in)
                await asyncio.sleep(0.5)

        async def readyz() -> str:
            status, text = await server.get("/readyz")
            return f"/readyz {status} {text.strip()!r}"

        async def slice_status() -> str:
            conditions = (await bed.slice_status()).get("conditions") or []
            said = []
            for kind in ("Ready", "UpstreamReachable"):
                found: dict[str, Any] = next((c for c in conditions if c.get("type") == kind), {})
                said.append(f"{kind}={found.get('status')} ({found.get('reason')})")
            return "status " + " ".join(said)

        # A short timeout: during a stall a request through vwserver hangs, and that is what
        # is recorded (as TimeoutError).
        async with bed.kcp.http_session(timeout=PROBE_TIMEOUT) as session:

            async def lists(name: str) -> str:
                return f"LIST {name} {await _list(session, bed, server, name)}"

            await asyncio.gather(
                probe(readyz),
                probe(slice_status),
                *(probe(functools.partial(lists, name)) for name in (SLICE, DIRECT_SLICE)),
            )

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

            listening = asyncio.create_task(listen())
            async with bed.kcp.http_session(timeout=30) as session:
                writer = Writer(session, collection=collection, gate=bed.serving)

                def write(part: Sequence[Planned]) -> asyncio.Task[None]:
                    return asyncio.create_task(writer.run(part, concurrency=4, pause=0.3, seed=3))

                try:
                    await write(parts[0])

                    phase[0] = "stall"
                    bed.relay.stall()
                    writing = write(parts[1])
                    await asyncio.sleep(STALL)
                    bed.relay.up()
                    await writing

                    phase[0] = "cut"
                    writing = write(parts[2])
                    cuts = 0
                    while not writing.done() or cuts < 3:
                        bed.relay.cut()
                        cuts += 1
                        await asyncio.sleep(1.5)
                    await writing

                    phase[0] = "down"
                    bed.relay.down()
                    writing = write(parts[3])
                    await asyncio.sleep(DOWN)
                    await writing
                    phase[0] = "up again"
                    bed.relay.up()
                    await _served_again(bed, server)
                    await _cache_recovered(server)
                finally:
                    bed.relay.up()
                    listening.cancel()
                    await asyncio.gather(listening, return_exceptions=True)
            truth = await read_truth(bed, namespace)
            took = await converge(informers, namespace, truth)
            codes = {i.name: await i.client.stop() for i in informers}
        status, text = await server.get("/readyz")
    finally:
        bed.relay.up()
        await server.stop()

    assert codes == dict.fromkeys(codes, 0), codes
    assert (status, text) == (200, "ok")
    for informer in informers:
        assert final_cache(informer, namespace) == truth, f"{informer.name}: final cache"
    figures = assert_histories(informers, plan, namespace)
    # refused connections: every answer through either slice was a clean 503 (a probe that got
    # no answer in time on a busy machine is no answer)
    down = said.get("down", Counter())
    answers = {line for line in down if line.startswith("LIST ") and "Timeout" not in line}
    assert answers == {f"LIST {n} 503" for n in (SLICE, DIRECT_SLICE)}, down
    # ... and /readyz, still 200, said which upstream watches failed
    readiness = [line for line in down if line.startswith("/readyz ")]
    assert all(line.startswith("/readyz 200 ") for line in readiness), down
    assert any("upstream: the slice controller" in line for line in readiness), down
    assert any("upstream: the watch cache" in line for line in readiness), down
    observe(
        f"{writer.done} direct writes on {len(plan)} objects; relay stalled {STALL:.0f} s, "
        f"cut {cuts}x ({bed.relay.cuts} connections reset in all), down {DOWN:.0f} s; "
        f"informers converged {took:.1f} s after the writes\n"
        + "\n".join(
            f"  {p}: " + "; ".join(f"{line} x{n}" for line, n in sorted(seen.items()))
            for p, seen in said.items()
        )
        + "\n"
        + "\n".join(f"  {name}: {line}" for name, line in figures.items())
    )


async def _list(session: aiohttp.ClientSession, bed: ChaosKcp, server: VwServer, name: str) -> str:
    """The status of a (consistent) LIST through slice ``name``, or why there was none."""
    url = bed.slice_url(server.base, name=name) + "/apis/example.io/v1alpha1/widgets"
    try:
        async with session.get(url) as resp:
            await resp.read()
            return str(resp.status)
    except (aiohttp.ClientError, TimeoutError) as e:
        return type(e).__name__


async def _served_again(bed: ChaosKcp, server: VwServer) -> None:
    """Until both slices answer a LIST through ``server`` again and ``/readyz`` is 200."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SERVED_AGAIN_WITHIN
    async with bed.kcp.http_session(timeout=15) as session:
        while True:
            answers = {n: await _list(session, bed, server, n) for n in (SLICE, DIRECT_SLICE)}
            ready = (await server.get("/readyz"))[0]
            if set(answers.values()) == {"200"} and ready == 200:
                return
            if loop.time() > deadline:
                raise AssertionError(
                    f"not served again within {SERVED_AGAIN_WITHIN:.0f}s of the relay's return:"
                    f" {answers}, /readyz {ready}\n{server.log_tail()}"
                )
            await asyncio.sleep(0.5)


async def _cache_recovered(server: VwServer) -> None:
    """Until ``/debug/cache`` shows no error for any shared resource: the outage's error is
    cleared once a new watch delivers, not when that watch ends minutes later."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SERVED_AGAIN_WITHIN
    while True:
        status, text = await server.get("/debug/cache", health=True)
        resources = json.loads(text)["resources"] if status == 200 else []
        if resources and all(r["last_error"] is None and r["synced"] for r in resources):
            return
        if loop.time() > deadline:
            raise AssertionError(f"the cache still reports an error after the outage: {text}")
        await asyncio.sleep(0.5)
