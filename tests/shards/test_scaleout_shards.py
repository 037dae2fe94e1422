"""Scale-out on a sharded kcp (issue #24, "Scale-out story"): shard-scoped vwserver replicas
(``controller.shards``) side by side on one slice.

Three in-process replicas over the session's sharded kcp: two of replica set ``root`` (the root
shard; the second one publishes the first one's external URL, as two pods behind one Service
do) and one of replica set ``second`` (the second shard). The slice lives on the second shard,
the export on the root shard, with bindings on both.

* They never fight over the slice's status: once it holds both sets' parts, a quiet period of
  several resyncs sees no status write from any replica and no new resourceVersion, and the
  slice's managedFields have one status entry per replica set (its field manager), each owning
  its own endpoint.
* Removing replica set ``second`` (its graceful shutdown) removes its endpoint and conditions
  only; replica set ``root`` writes nothing for it.
* A replica serves only its shards: the root replica's watch cache holds collections of the root
  shard only, also after a LIST and a WATCH through its endpoint and a request naming the second
  shard's id (answered 404, nothing asked of kcp); the second replica's only of the second shard.
  (Both replicas watch vwserver's own slices on every shard that has a slice workspace: that is
  where the slices are; the export's objects are what grows with the shards.)
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from devenv.shards import ROOT_SHARD, SECOND_SHARD
from tests.e2e.controller_env import Served, eventually, unique
from tests.shards.conftest import ShardedWorld
from tests.shards.test_slices_shards import PROD, call, kcp_vw_urls, serving_slices, widgets
from vwserver.controller.scope import ShardScope, owned
from vwserver.controller.slice_status import slice_key
from vwserver.k8s.kcp import shard_id
from vwserver.metrics import upstream_name

RESYNC = 3.0
"""The replicas' resync (``serving_slices``): every ready slice is reconciled this often."""
QUIET_RESYNCS = 4


def record_status_writes(served: Served) -> list[tuple[str, str]]:
    """The slices (cluster, name) whose status the replica writes from now on, in order.

    ``vwserver_controller_status_writes_total`` counts the writes to every slice the replica
    serves — in this session's kcp that includes the slices other test modules left behind,
    which may change (and be written) at any time — so the quiet check counts this slice's own
    writes, at the one place the controller makes them."""
    written: list[tuple[str, str]] = []
    controller = served.controller
    write = controller._write_status

    async def recording(obj: dict[str, Any], status: dict[str, Any]) -> None:
        written.append(slice_key(obj))
        await write(obj, status)

    controller._write_status = recording  # type: ignore[method-assign]
    return written


def cache_shards(served: Served) -> set[str]:
    """The shards (digests of their origins) of the collections the replica's cache holds."""
    return {
        sample.labels["shard"]
        for family in served.metrics.registry.collect()
        if family.name == "vwserver_cache_synced"
        for sample in family.samples
    }


async def slice_doc(w: ShardedWorld, served: Served, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = await served.kubectl(
        w.slices,
        "get",
        "filteredapiexportendpointslice",
        name,
        "-o",
        "json",
        "--show-managed-fields",
    )
    return doc


def endpoint_urls(doc: dict[str, Any]) -> set[str]:
    return {e["url"] for e in (doc.get("status") or {}).get("endpoints") or []}


def condition_types(doc: dict[str, Any]) -> set[str]:
    return {c["type"] for c in (doc.get("status") or {}).get("conditions") or []}


def status_managers(doc: dict[str, Any]) -> list[str]:
    """The managers of the slice's status subresource."""
    return sorted(
        str(m.get("manager"))
        for m in doc["metadata"].get("managedFields") or []
        if m.get("subresource") == "status"
    )


async def seen_by(served: Served, key: tuple[str, str], rv: str) -> bool:
    obj = served.controller.slice_object(key)
    return obj is not None and obj["metadata"].get("resourceVersion") == rv


async def test_replica_sets_write_only_their_part_and_leave_only_theirs(
    sharded_world: ShardedWorld,
) -> None:
    w = sharded_world
    root = ShardScope(name="root", virtual_workspace_urls=(w.bed.shard(ROOT_SHARD).url,))
    second = ShardScope(name="second", virtual_workspace_urls=(w.bed.shard(SECOND_SHARD).url,))
    ids = {w.bed.shard_of_url(u): shard_id(u) for u in await kcp_vw_urls(w, w.world.export_name)}
    assert set(ids) == {ROOT_SHARD, SECOND_SHARD}
    name = unique("prod")
    async with contextlib.AsyncExitStack() as stack:
        r1 = await stack.enter_async_context(serving_slices(w, scope=root))
        r2 = await stack.enter_async_context(serving_slices(w, scope=root, external_url=r1.base))
        leaving = contextlib.AsyncExitStack()
        s = await leaving.enter_async_context(serving_slices(w, scope=second))
        stack.push_async_callback(leaving.aclose)
        await r1.create_slice(w.slices, name, selector=PROD)
        key = (w.slices.cluster, name)
        mine = {
            f"{r1.base}/services/filtered-apiexport/{w.slices.cluster}/{name}/shards/{ids[ROOT_SHARD]}",
            f"{s.base}/services/filtered-apiexport/{w.slices.cluster}/{name}/shards/{ids[SECOND_SHARD]}",
        }

        async def both_parts() -> dict[str, Any] | None:
            doc = await slice_doc(w, r1, name)
            ready = {
                c["type"]
                for c in doc.get("status", {}).get("conditions") or []
                if c["type"].endswith("/Ready") and c["status"] == "True"
            }
            ok = endpoint_urls(doc) == mine and ready == {"root/Ready", "second/Ready"}
            return doc if ok else None

        doc = await eventually(both_parts, within=120, what="both replica sets' parts")
        # Quiet: every replica has seen the current object and reconciled it again (resyncs);
        # nobody writes, the object does not change.
        rv = doc["metadata"]["resourceVersion"]
        for replica in (r1, r2, s):
            await eventually(
                lambda replica=replica: seen_by(replica, key, rv), within=60, what="rv seen"
            )
        recorded = [record_status_writes(replica) for replica in (r1, r2, s)]
        await asyncio.sleep(QUIET_RESYNCS * RESYNC)
        quiet = await slice_doc(w, r1, name)
        assert quiet["metadata"]["resourceVersion"] == rv, "the status changed while idle"
        ours = [[k for k in written if k == key] for written in recorded]
        assert ours == [[], [], []], "a replica wrote the slice's status while idle"
        assert status_managers(quiet) == ["vwserver-root", "vwserver-second"]
        assert owned(quiet, "vwserver-root").endpoints == {u for u in mine if u.startswith(r1.base)}
        assert owned(quiet, "vwserver-second").endpoints == {
            u for u in mine if u.startswith(s.base)
        }
        assert {t.partition("/")[0] for t in condition_types(quiet)} == {"root", "second"}

        # Replica set "second" goes (graceful shutdown): only its part leaves.
        root_conditions = [
            c for c in quiet["status"]["conditions"] if c["type"].startswith("root/")
        ]
        after_leave = [record_status_writes(replica) for replica in (r1, r2)]
        await leaving.aclose()

        async def only_root() -> dict[str, Any] | None:
            doc = await slice_doc(w, r1, name)
            ok = endpoint_urls(doc) == {u for u in mine if u.startswith(r1.base)}
            return (
                doc
                if ok and not any(t.startswith("second/") for t in condition_types(doc))
                else None
            )

        after = await eventually(only_root, within=60, what="replica set second removed")
        assert [c for c in after["status"]["conditions"] if c["type"].startswith("root/")] == (
            root_conditions
        )
        gone = owned(after, "vwserver-second")
        assert not gone.endpoints and not gone.conditions
        rv = after["metadata"]["resourceVersion"]
        for replica in (r1, r2):
            await eventually(
                lambda replica=replica: seen_by(replica, key, rv), within=60, what="rv seen"
            )
        await asyncio.sleep(2 * RESYNC)
        ours = [[k for k in written if k == key] for written in after_leave]
        assert ours == [[], []], "set root wrote the slice's status after set second left"
        assert (await slice_doc(w, r1, name))["metadata"]["resourceVersion"] == rv


async def test_a_replica_opens_no_upstream_watch_to_a_shard_it_does_not_serve(
    sharded_world: ShardedWorld,
) -> None:
    w = sharded_world
    root_shard, second_shard = w.bed.shard(ROOT_SHARD), w.bed.shard(SECOND_SHARD)
    root = ShardScope(name="root", virtual_workspace_urls=(root_shard.url,))
    second = ShardScope(name="second", virtual_workspace_urls=(second_shard.url,))
    ids = {w.bed.shard_of_url(u): shard_id(u) for u in await kcp_vw_urls(w, w.world.export_name)}
    digest = {s: upstream_name(w.bed.shard(s).url + "/x").shard for s in (ROOT_SHARD, SECOND_SHARD)}
    name = unique("prod")
    async with (
        serving_slices(w, scope=root) as r,
        serving_slices(w, scope=second) as s,
        w.bed.front.http_session(timeout=30) as session,
    ):
        await r.create_slice(w.slices, name, selector=PROD)
        base = f"/services/filtered-apiexport/{w.slices.cluster}/{name}/shards"

        async def serving() -> bool:
            doc = await slice_doc(w, r, name)
            return len(endpoint_urls(doc)) == 2

        await eventually(serving, within=120, what="both endpoints")
        for replica, shard in ((r, ROOT_SHARD), (s, SECOND_SHARD)):
            url = f"{replica.base}{base}/{ids[shard]}"
            code, body = await call(session, "GET", widgets(w, url, "*"))
            assert code == 200, body
            async with session.get(
                widgets(w, url, "*")
                + f"?watch=1&resourceVersion={body['metadata']['resourceVersion']}&timeoutSeconds=1"
            ) as resp:
                assert resp.status == 200
                await resp.read()
        # The other shard's id on the root replica: unknown there (not served), kcp not asked.
        upstream_before = _upstream_requests(r)
        code, body = await call(
            session, "GET", widgets(w, f"{r.base}{base}/{ids[SECOND_SHARD]}", "*")
        )
        assert code == 404, body
        assert body["kind"] == "Status"
        assert _upstream_requests(r) == upstream_before
        assert cache_shards(r) == {digest[ROOT_SHARD]}
        assert cache_shards(s) == {digest[SECOND_SHARD]}


def _upstream_requests(served: Served) -> float:
    total = 0.0
    for family in served.metrics.registry.collect():
        if family.name == "vwserver_upstream_requests":
            total += sum(x.value for x in family.samples if x.name.endswith("_total"))
    return total
