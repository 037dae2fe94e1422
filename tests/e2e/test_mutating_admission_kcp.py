"""kcp's mutating admission and the proxy's local patches, against real kcp (issue 23).

kcp runs the mutating webhooks and MutatingAdmissionPolicies of the APIExport's (the
provider's) workspace on every write through the virtual workspace, after the patch
(:data:`vwserver.proxy.patches.ADMISSION`). A merge or JSON patch the proxy applied itself and
found inside the slice can then be stored outside it. Here a policy of the provider's workspace
relabels a widget out of the ``env=prod`` slice when a patch labels it ``admission-probe=yes``:

* by default (``mutatingAdmission: false``) the patch is one write: it is made, and the proxy
  counts it in ``vwserver_writes_moved_by_admission_total`` (the operator's signal to set the
  option);
* with ``mutatingAdmission: true`` the patch keeps its dry run, whose result (admission
  included) is outside the slice: 422, nothing written.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from devenv.bootstrap import Bootstrap, poll
from devenv.kcp import KcpInstance
from tests.support.admission import PROBE, mutating_policy
from tests.support.slices import slice_url, slices_over_kcp
from tests.support.widgets import API, make_namespace, remove_namespace, widget
from vwserver.selector import Selector

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

MERGE = {"Content-Type": "application/merge-patch+json"}
JSON = {"Content-Type": "application/json"}
NAMESPACE = "admission-moves"
POLICY = mutating_policy("moves-out", labels={"env": "dev"})


def moved(metrics: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("vwserver_writes_moved_by_admission_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_admission_that_moves_a_patched_object_out_is_counted_or_refused(
    kcp: KcpInstance, world: Bootstrap
) -> None:
    consumer = world.consumer("consumer-a")
    direct = f"{consumer.url}/{API}/namespaces/{NAMESPACE}/widgets"
    vw_item = f"{world.vw_url}/clusters/{consumer.cluster}/{API}/namespaces/{NAMESPACE}/widgets"
    await make_namespace(kcp, [consumer], NAMESPACE)
    try:
        await kcp.kubectl("apply", "-f", "-", server=world.provider.url, input=POLICY)
        async with kcp.http_session(timeout=30) as admin:
            for name in ("probe", "counted", "refused"):
                body = json.dumps(widget(name, NAMESPACE, {"env": "prod"}))
                async with admin.post(direct, data=body, headers=JSON) as resp:
                    assert resp.status == 201, await resp.text()

            async def policy_active() -> bool | None:
                # A dry run directly on the VW: the policy took effect once it relabels.
                patch = json.dumps({"metadata": {"labels": {PROBE: "yes"}}})
                async with admin.patch(
                    f"{vw_item}/probe", data=patch, headers=MERGE, params={"dryRun": "All"}
                ) as resp:
                    answer = await resp.json()
                return answer["metadata"]["labels"].get("env") == "dev" or None

            await poll("the provider's policy relabelling widgets", policy_active, within=60)

            async def stored(name: str) -> dict[str, Any]:
                async with admin.get(f"{direct}/{name}") as resp:
                    assert resp.status == 200, await resp.text()
                    return dict((await resp.json())["metadata"]["labels"])

            patch = json.dumps({"metadata": {"labels": {PROBE: "yes"}}})
            for option in (False, True):
                name = "refused" if option else "counted"
                async with (
                    slices_over_kcp(
                        kcp,
                        world,
                        slices={"prod": Selector.parse("env=prod")},
                        page_size=50,
                        cache=True,
                        mutating_admission=option,
                    ) as base,
                    aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as client,
                ):
                    url = f"{slice_url(base, world, 'prod', consumer.cluster)}/{API}"
                    item = f"{url}/namespaces/{NAMESPACE}/widgets/{name}"
                    async with client.patch(item, data=patch, headers=MERGE) as resp:
                        status, answer = resp.status, await resp.json()
                    async with client.get(f"{base}/metrics") as resp:
                        metrics = await resp.text()
                labels = await stored(name)
                if option:
                    # The dry run's result, admission included, leaves the slice: refused.
                    assert status == 422, answer
                    assert "env" in answer["message"], answer
                    assert labels == {"env": "prod"}, labels  # nothing written
                    assert moved(metrics) == 0
                else:
                    # One write, made; admission moved it out, and that is counted.
                    assert status == 200, answer
                    assert labels.get("env") == "dev" and labels.get(PROBE) == "yes", labels
                    assert moved(metrics) == 1
    finally:
        await kcp.kubectl(
            "delete", "-f", "-", "--ignore-not-found", server=world.provider.url, input=POLICY,
            check=False,
        )  # fmt: skip
        await remove_namespace(kcp, [consumer], NAMESPACE)
