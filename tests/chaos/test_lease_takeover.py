"""Two vwserver replicas with a Lease; the one holding it is killed (SIGKILL: no release).

vwserver's controller elects a leader with a ``coordination.k8s.io`` Lease
(``controller.lease``; :mod:`vwserver.k8s.lease`, client-go's algorithm: lease 15 s, renew
deadline 10 s, retry 2 s). Every replica watches the slices, keeps its routes and serves; only
the holder writes slice status. So:

* both replicas serve the slices before the kill, and the survivor without a single failed
  request through it while it takes over;
* the survivor takes the Lease once the dead holder's record has stood still for the lease
  duration, and then writes the status the dead one left unwritten: a slice created right
  after the kill (the standby already serves it) gets its status soon after the takeover —
  without waiting for the resync (set to 300 s here, far beyond the bound);
* the killed replica, started again, serves again as a standby (the Lease stays where it is).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devenv.slices import KIND, slice_manifest
from tests.chaos.bed import SLICE, ChaosKcp, VwServer, wait_served
from tests.support.vwserver_process import Reaper

LEASE_DURATION = 15.0  # vwserver.k8s.lease.LeaderElector's default
TAKEOVER_WITHIN = 60.0
"""Seconds a takeover may take in this test: the lease duration, a candidate's retry period with
its jitter (2 s x 2.2), a reconcile — and a wide margin for a loaded machine. The resync (300 s)
is far beyond it: a status written only at the next resync fails."""

pytestmark = pytest.mark.timeout(300)


async def test_the_other_replica_takes_over_status_writes_and_both_serve(
    bed: ChaosKcp,
    reaper: Reaper,
    tmp_path: Path,
    observe: Callable[[str], None],
) -> None:
    lease = f"chaos-{uuid.uuid4().hex[:6]}"
    shared_url = "https://vwserver.chaos.example"  # the Service both replicas are behind
    replicas = {
        identity: VwServer(
            identity,
            workdir=tmp_path,
            config=bed.vwserver_config(
                external_url=shared_url,
                lease={"name": lease, "identity": identity},
                resync=300,
            ),
            reaper=reaper,
        )
        for identity in ("replica-a", "replica-b")
    }
    a, b = replicas["replica-a"], replicas["replica-b"]
    probes = [f"probe-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    loop = asyncio.get_running_loop()
    try:
        await a.start()
        await _until("replica-a holds the lease", lambda: _holder(bed, lease), "replica-a")
        await b.start()
        await wait_served(bed, a)
        await wait_served(bed, b)
        for replica in (a, b):
            assert await _lists(bed, replica) == 200, f"{replica.name} does not serve"

        # the leader writes a new slice's status; then it dies and another slice is created
        await _create_probe(bed, probes[0])
        await _until(f"{probes[0]} Ready", lambda: _ready(bed, probes[0]), True)
        failures: list[int] = []
        serving = asyncio.create_task(_serve_all_along(bed, b, failures))
        await a.kill()
        killed = loop.time()
        await _create_probe(bed, probes[1])
        holder = await _until(
            "replica-b holds the lease", lambda: _holder(bed, lease), "replica-b",
            within=TAKEOVER_WITHIN,
        )  # fmt: skip
        took_lease = loop.time() - killed
        await _until(
            f"{probes[1]} Ready, written by replica-b", lambda: _ready(bed, probes[1]), True,
            within=TAKEOVER_WITHIN,
        )  # fmt: skip
        wrote_status = loop.time() - killed
        assert await _serves(bed, b, probes[1]) == 200, "replica-b does not serve the new slice"

        # the killed replica comes back as a standby and serves again
        await a.start()
        await wait_served(bed, a)
        assert await _lists(bed, a) == 200
        standby = f"lease default/{lease} is held by replica-b"
        await _until(
            "replica-a to read the lease as a standby",
            lambda: _logged(a.log_file.read_text(errors="replace"), standby), True,
        )  # fmt: skip
        assert await _holder(bed, lease) == "replica-b"
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    finally:
        for replica in (a, b):
            await replica.stop()
        for probe in probes:
            await bed.kcp.kubectl(
                "delete", KIND, probe, "--ignore-not-found", server=bed.world.provider.url,
                check=False,
            )  # fmt: skip

    assert holder == "replica-b"
    assert not failures, f"requests through replica-b failed during the takeover: {failures}"
    observe(
        f"replica-a killed: replica-b held the lease after {took_lease:.1f} s (lease "
        f"{LEASE_DURATION:.0f} s) and wrote the new slice's status after "
        f"{wrote_status:.1f} s; replica-b answered every LIST meanwhile"
    )


async def _until(what: str, probe: Callable[[], Any], want: object, *, within: float = 60.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: object = None
    while loop.time() < deadline:
        last = await probe()
        if last == want:
            return last
        await asyncio.sleep(0.25)
    raise AssertionError(f"not within {within:.0f}s: {what} (last seen: {last!r})")


async def _logged(log: str, text: str) -> bool:
    """Whether ``text`` is in the log (a replica's first run, as the first holder, never
    logs whom the lease is held by)."""
    return text in log


async def _holder(bed: ChaosKcp, lease: str) -> str | None:
    result = await bed.kcp.kubectl(
        "get", "lease", lease, "-n", "default", "-o", "json", server=bed.api.url, check=False
    )
    if result.returncode != 0:
        return None
    holder: str | None = json.loads(result.stdout)["spec"].get("holderIdentity")
    return holder


async def _ready(bed: ChaosKcp, name: str) -> bool:
    """Whether the slice's status says Ready, with its endpoint."""
    status = await bed.slice_status(name)
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return ready and bool(status.get("endpoints"))


async def _create_probe(bed: ChaosKcp, name: str) -> None:
    manifest = slice_manifest(
        name,
        export_path=bed.world.provider.path,
        export_name=bed.world.export_name,
        selector={"matchLabels": {"env": "prod"}},
    )
    await bed.kcp.kubectl("apply", "-f", "-", server=bed.world.provider.url, input=manifest)


async def _lists(bed: ChaosKcp, replica: VwServer) -> int:
    return await _serves(bed, replica, SLICE)


async def _serves(bed: ChaosKcp, replica: VwServer, name: str) -> int:
    """The status of a LIST through slice ``name`` of ``replica``."""
    url = bed.slice_url(replica.base, name=name) + "/apis/example.io/v1alpha1/widgets"
    async with bed.kcp.http_session(timeout=10) as session, session.get(url) as resp:
        await resp.read()
        return resp.status


async def _serve_all_along(bed: ChaosKcp, replica: VwServer, failures: list[int]) -> None:
    """LISTs through ``replica`` every half second; every answer but 200 is recorded."""
    while True:
        try:
            status = await _lists(bed, replica)
        except (aiohttp.ClientError, TimeoutError):
            status = 0
        if status != 200:
            failures.append(status)
        await asyncio.sleep(0.5)
