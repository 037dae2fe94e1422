"""``kubectl get`` and ``kubectl get -w`` through a slice, answered from the shared watch cache's
Table rows, against the session's kcp.

kubectl lists without a resourceVersion (a consistent read): the cache answers only once it has
seen kcp's current resourceVersion, which also moves with kcp's own writes to other resources
(every few seconds on an idle kcp), heard of only with kcp's next bookmark. So before each
kubectl run the test writes to the resource itself — the cache then hears of kcp's latest
resourceVersion at once — and checks with vwserver's metrics that the cache answered; a run
that a write of kcp's own slipped in front of is answered by kcp (correctly, just not from the
cache) and is run again, a bounded number of times.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator

import aiohttp

from devenv.bootstrap import Bootstrap
from devenv.kcp import KcpInstance
from tests.support.cache import cache_reads
from tests.support.kubectl import watch_lines
from tests.support.slices import slices_over_kcp
from vwserver.selector import Selector

SELECTOR = Selector.parse("env=prod")
ATTEMPTS = 5
WAIT = 60.0
_AGE = re.compile(r"\b\d+[smhdy](\d+[smh])?\b")


async def _served(session: aiohttp.ClientSession, base: str, verb: str) -> float:
    return await cache_reads(session, base, verb=verb, outcome="served")


@contextlib.asynccontextmanager
async def _namespace(kcp: KcpInstance, world: Bootstrap) -> AsyncIterator[str]:
    ns = f"tables-{uuid.uuid4().hex[:6]}"
    server = world.consumer("consumer-a").url
    await kcp.kubectl("create", "namespace", ns, server=server)
    try:
        yield ns
    finally:
        await kcp.kubectl("delete", "namespace", ns, "--timeout=120s", server=server)


async def _write(kcp: KcpInstance, world: Bootstrap, ns: str, name: str, env: str) -> None:
    """Create or relabel a widget directly in kcp (a change of the resource the cache hears)."""
    manifest = json.dumps(
        {
            "apiVersion": "example.io/v1alpha1",
            "kind": "Widget",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": {"env": env, "touch": uuid.uuid4().hex[:8]},
            },
            "spec": {"size": 1},
        }
    )
    server = world.consumer("consumer-a").url
    await kcp.kubectl("apply", "-f", "-", server=server, input=manifest)


async def test_kubectl_get_and_get_watch_are_answered_from_the_cache(
    kcp: KcpInstance, world: Bootstrap
) -> None:
    async with (
        slices_over_kcp(kcp, world, slices={"prod": SELECTOR}, page_size=500, cache=True) as base,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as session,
        _namespace(kcp, world) as ns,
    ):
        slice_url = f"{base}/services/filtered-apiexport/{world.provider.cluster}/prod/clusters/*"
        direct_url = f"{world.vw_url}/clusters/*"

        # kubectl get (a Table LIST), printed as kcp prints it with the slice's selector
        for _ in range(ATTEMPTS):
            before = await _served(session, base, "list")
            await _write(kcp, world, ns, "touch", env="dev")
            through = await kcp.kubectl("get", "widgets", "-A", server=slice_url)
            if await _served(session, base, "list") > before:
                break
        else:
            raise AssertionError(f"kubectl get was never answered from the cache: {through}")
        direct = await kcp.kubectl(
            "get", "widgets", "-A", "-l", SELECTOR.render(), server=direct_url
        )
        assert _AGE.sub("<age>", through.stdout) == _AGE.sub("<age>", direct.stdout)
        assert "prod-eu" in through.stdout and "dev-eu" not in through.stdout

        # kubectl get -w (a Table LIST, then a Table WATCH from its resourceVersion)
        for attempt in range(ATTEMPTS):
            before = await _served(session, base, "watch")
            await _write(kcp, world, ns, "touch", env="dev")
            name = f"watched-{attempt}"
            lines = await watch_lines(
                kcp,
                *("get", "widgets", "-A", "-w"),
                server=slice_url,
                until=name,
                within=WAIT,
                then=_write(kcp, world, ns, name, env="prod"),
            )
            assert any(line.startswith(f"{ns} ") and name in line for line in lines), lines
            assert not any("touch" in line for line in lines)  # outside the slice
            # the watch is counted when it ends (kubectl was stopped): wait for the count
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    while await _served(session, base, "watch") == before:  # noqa: ASYNC110
                        await asyncio.sleep(0.05)
            if await _served(session, base, "watch") > before:
                break
        else:
            raise AssertionError("kubectl get -w was never answered from the cache")
