"""The differential conformance harness (:mod:`tests.conformance`) on each shard of the sharded
kcp (issue #24 point 2): every case of its table through the slice's endpoint for one shard
equals kcp's own APIExport VW of *that* shard with the slice's selector — in particular the
second shard's, whose VW is not the one the one-shard suite compares with.

The harness's cases name the one-shard world's ``consumer-a``; here a named consumer is the
demo consumer that lives on the shard under test (the same sample objects: ``devenv.bootstrap``
seeds every consumer alike). Reads come from the shared watch cache (the shard suites' server,
:func:`tests.shards.test_slices_shards.serving_slices`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from devenv.shards import SHARD_NAMES
from devenv.slices import wait_slice_ready
from tests.conformance.conftest import SELECTOR, Pair
from tests.conformance.test_differential import (
    test_slice_equals_kcp_with_the_selector,
    test_tables_from_the_cache_equal_kcps,
)
from tests.e2e.controller_env import Served, unique
from tests.shards.conftest import ShardedWorld
from tests.shards.test_slices_shards import endpoints_by_shard, served
from vwserver.k8s.kubeconfig import load_kubeconfig

# The harness's own tests, collected here with this module's ``pair`` (one per shard);
# ``served``: the module fixture of test_slices_shards, one vwserver per module.
__all__ = [
    "served",
    "test_slice_equals_kcp_with_the_selector",
    "test_tables_from_the_cache_equal_kcps",
]


@dataclass
class ShardPair(Pair):
    """The harness's pair for one shard: the slice's endpoint URL for the shard, and that
    shard's VW URL of the export."""

    endpoint: str = ""
    vw: str = ""
    consumer: str = ""
    """The logical cluster of the demo consumer on the shard (every named case's)."""

    def cluster(self, name: str) -> str:
        return "*" if name == "*" else self.consumer

    def slice_url(self, cluster: str) -> str:
        return f"{self.endpoint}/clusters/{self.cluster(cluster)}"

    def direct_url(self, cluster: str) -> str:
        return f"{self.vw}/clusters/{self.cluster(cluster)}"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def endpoints(sharded_world: ShardedWorld, served: Served) -> dict[str, str]:
    """The endpoint URL per shard of one slice with the harness's selector."""
    w = sharded_world
    name = unique("conformance")
    await served.create_slice(w.slices, name, selector={"matchLabels": {"env": "prod"}})
    await wait_slice_ready(w.bed.front, w.slices, name, within=60)
    return await endpoints_by_shard(w, served, name, count=2)


@pytest_asyncio.fixture(scope="module", loop_scope="session", params=SHARD_NAMES)
async def pair(
    request: pytest.FixtureRequest,
    sharded_world: ShardedWorld,
    served: Served,
    endpoints: dict[str, str],
) -> AsyncIterator[ShardPair]:
    w, shard = sharded_world, request.param
    front = w.bed.front
    auth = await load_kubeconfig(front.kubeconfig, context=front.admin_context)
    async with front.http_session(timeout=60) as session:
        yield ShardPair(
            proxy_base=served.base,
            kcp=front,
            world=w.world,
            auth=auth,
            session=session,
            cached=True,
            endpoint=endpoints[shard],
            vw=w.vw_url(shard),
            consumer=w.consumer_on(shard).cluster,
        )


def test_the_harness_selector_is_the_slices() -> None:
    """The harness compares with kcp under its SELECTOR: the slice above must be that one."""
    assert SELECTOR.render() == "env=prod"
