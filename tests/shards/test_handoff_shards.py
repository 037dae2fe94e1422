"""The graceful handoff between two slices whose objects live on the second shard (issue #24
point 4): holds are per object, so per shard — the holds annotation and finalizers are on the
object in the second shard's etcd, recorded and released through the slices' endpoints for
that shard (``/shards/<id>``).

Slices ``a`` (``region=a``) and ``b`` (``region=b``) in ``root:slices`` (second shard) over the
demo export (root shard), served by the shard suites' vwserver from the shared watch cache (the
read path that records holds); the objects in a namespace of the consumer on the second shard.
The one-shard suite's bed (:class:`tests.e2e.test_handoff_kcp.Bed`) is reused with the URLs of
the sharded world.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest_asyncio

from devenv.shards import ROOT_SHARD, SECOND_SHARD
from devenv.slices import wait_slice_ready
from tests.e2e.controller_env import Served
from tests.e2e.test_handoff_kcp import FIN, WAIT, Bed, first_event, holds
from tests.shards.conftest import ShardedWorld
from tests.shards.test_slices_shards import endpoints_by_shard, served
from tests.support.watches import Recorder, recording
from tests.support.widgets import API, make_namespace, remove_namespace

__all__ = ["served"]  # the module fixture of test_slices_shards, one vwserver per module


@dataclass
class ShardBed(Bed):
    """The one-shard bed with each slice's endpoint for one shard as its URL (``base`` is not
    used: the endpoint names the server) and the slices' ids in ``root:slices``."""

    slices_cluster: str = ""
    endpoints: dict[str, str] = field(default_factory=dict)
    """Slice name → its endpoint URL for the second shard."""
    root_endpoints: dict[str, str] = field(default_factory=dict)
    """Slice name → its endpoint URL for the root shard."""

    def slice_cluster_url(self, base: str, slice_name: str) -> str:
        return f"{self.endpoints[slice_name]}/clusters/{self.ws.cluster}"

    def slice_id(self, slice_name: str) -> str:
        return f"{self.slices_cluster}/{slice_name}"


@pytest_asyncio.fixture(loop_scope="session")
async def bed(sharded_world: ShardedWorld, served: Served) -> AsyncIterator[ShardBed]:
    w = sharded_world
    front = w.bed.front
    ws = w.consumer_on(SECOND_SHARD)
    endpoints: dict[str, dict[str, str]] = {}
    for name in FIN:
        await served.create_slice(w.slices, name, selector={"matchLabels": {"region": name}})
        await wait_slice_ready(front, w.slices, name, within=60)
        endpoints[name] = await endpoints_by_shard(w, served, name, count=2)
    namespace = f"handoff-{uuid.uuid4().hex[:6]}"
    await make_namespace(front, [ws], namespace)
    try:
        async with front.http_session(timeout=30) as session:
            yield ShardBed(
                front,
                w.world,
                ws,
                namespace,
                session,
                slices_cluster=w.slices.cluster,
                endpoints={name: urls[SECOND_SHARD] for name, urls in endpoints.items()},
                root_endpoints={name: urls[ROOT_SHARD] for name, urls in endpoints.items()},
            )
    finally:
        await remove_namespace(front, [ws], namespace)


async def test_a_handoff_on_the_second_shard_waits_for_the_release(bed: ShardBed) -> None:
    """An object of the second shard's consumer, held by ``a`` (its finalizer added through
    ``a``'s second-shard endpoint), moved to region=b directly in kcp: ``a`` sees a graceful
    deletion (GET, LIST and its watch: a deletionTimestamp, the object outside region=a), the
    move recorded in the object's holds annotation in kcp; ``b`` does not see it until ``a``
    releases its finalizer, then its watch's ADDED carries a resourceVersion at or after the
    release. The root shard's endpoints never serve this consumer (403, kcp's answer)."""
    name = f"move-{uuid.uuid4().hex[:6]}"
    base = ""  # the bed's URLs name the endpoints
    await bed.create(name, region="a")
    await bed.add_finalizer(base, "a", name)
    async with (
        recording(bed.session, bed.slice_url(base, "a")) as in_a,
        recording(bed.session, bed.slice_url(base, "b")) as in_b,
    ):
        moved_rv = await bed.relabel(name, "b")
        since = await bed.leaving_since(name, "a")
        assert since
        shown = await bed.get(bed.slice_url(base, "a", name))
        assert shown is not None
        assert shown["metadata"]["deletionTimestamp"] == since
        assert shown["metadata"]["labels"]["region"] == "b"
        status, listing = await bed.call("GET", bed.slice_url(base, "a"))
        assert status == 200, listing
        (listed,) = (i for i in listing["items"] if i["metadata"]["name"] == name)
        assert listed["metadata"]["deletionTimestamp"] == since
        assert await bed.get(bed.slice_url(base, "b", name)) is None
        deleting = await in_a.wait_for(
            f"{name} being deleted in a",
            functools.partial(_deleting, in_a, name),
            within=WAIT,
        )
        assert int(deleting["object"]["metadata"]["resourceVersion"]) >= moved_rv
        assert first_event(in_b, name) is None
        stored = await bed.stored(name)
        assert FIN["a"] in stored["metadata"]["finalizers"]
        assert holds(stored)[bed.slice_id("a")]["leavingSince"] == since

        released = await bed.release(base, "a", name)
        release_rv = int(released["metadata"]["resourceVersion"])
        added = await in_b.wait_for(
            f"{name} in b", functools.partial(first_event, in_b, name), within=WAIT
        )
        assert added["type"] == "ADDED"
        assert int(added["object"]["metadata"]["resourceVersion"]) >= release_rv
        assert "deletionTimestamp" not in added["object"]["metadata"]
        shown_b = await bed.get(bed.slice_url(base, "b", name))
        assert shown_b is not None and shown_b["metadata"]["labels"]["region"] == "b"
        assert FIN["a"] not in (await bed.stored(name))["metadata"].get("finalizers", [])
    for slice_name, url in bed.root_endpoints.items():
        root = f"{url}/clusters/{bed.ws.cluster}/{API}/namespaces/{bed.namespace}/widgets"
        status, body = await bed.call("GET", f"{root}/{name}")
        assert (status, body["reason"]) == (403, "Forbidden"), (slice_name, body)


def _deleting(recorder: Recorder, name: str) -> dict[str, Any] | None:
    """The first event of ``recorder`` that shows ``name`` being deleted."""
    return next(
        (e for e in recorder.of(name) if e["object"]["metadata"].get("deletionTimestamp")), None
    )
