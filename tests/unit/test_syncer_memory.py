"""What one tenant can make the syncer hold is bounded — measured with tracemalloc on the real
list path (:class:`~vwserver.k8s.reflector.Reflector` → :class:`~vwserver.syncer.memory.
TenantBudget` → cache), with a client that builds each LIST page fresh, as decoding does
(issue #25, §3: 40 objects of ~1.4 MiB took a syncer from 116 to 244 MB).

The figures are bytes Python allocated (tracemalloc), not RSS: deterministic, no timing.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from tests.support.clock import FakeClock
from tests.support.syncer_fakes import controller_bed, known_namespace, thing
from vwserver.k8s.cache import Cache
from vwserver.k8s.client import JSON, KubeClient
from vwserver.k8s.reflector import Reflector
from vwserver.syncer.memory import UPSTREAM_PAGE, SharingCache, TenantBudget, share_strings
from vwserver.syncer.naming import ANN_CLUSTER, ANN_NAME, ANN_NAMESPACE, finalizer, upstream_key

MiB = 1024 * 1024
BIG = 1_400_000  # ~1.4 MiB of spec, as in the report


class Nothing:
    def on_upsert(self, obj: JSON) -> None:
        pass

    def on_delete(self, obj: JSON) -> None:
        pass


class PagingServer:
    """Answers LISTs with ``make(i)`` for ``count`` objects, ``limit`` per page, each page's
    objects built when it is asked for (a decoded answer)."""

    def __init__(self, count: int, make: Callable[[int], JSON]) -> None:
        self.count, self.make, self.pages = count, make, 0

    async def request(self, method: str, url: str, *, query: Any = (), **_: Any) -> JSON:
        params = dict(query)
        start = int(params.get("continue") or 0)
        end = min(self.count, start + int(params.get("limit") or self.count))
        self.pages += 1
        meta = {"resourceVersion": "9", **({"continue": str(end)} if end < self.count else {})}
        return {"items": [self.make(i) for i in range(start, end)], "metadata": meta}


def big(i: int, *, size: int = BIG, cluster: str = "tenant") -> JSON:
    obj = thing(f"db-{i}", cluster=cluster)
    obj["spec"]["blob"] = f"{i:08d}" + "x" * size  # a new string per object, as decoded
    return obj


@contextmanager
def measured() -> Iterator[dict[str, int]]:
    """``retained`` (allocated and still alive at the end) and ``peak`` bytes of the block."""
    gc.collect()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    out: dict[str, int] = {}
    try:
        yield out
    finally:
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out.update(retained=current - base, peak=peak - base)


async def listed(server: PagingServer, budget: TenantBudget | None, **options: Any) -> Cache[Any]:
    cache: Cache[Any] = Cache(key=upstream_key, handler=Nothing())
    reflector = Reflector(
        name="t",
        client=cast(KubeClient, server),
        url="https://kcp/x",
        handler=cache,
        clock=FakeClock(),
        admission=budget,
        **options,
    )
    await reflector._list()
    return cache


def budget(*, per_object: int = 256 * 1024, per_cluster: int = 32 * MiB) -> TenantBudget:
    return TenantBudget(
        key=upstream_key, max_object_bytes=per_object, max_cluster_bytes=per_cluster
    )


async def test_objects_over_the_limit_are_held_as_stubs_and_a_list_holds_one_page(
    capsys: Any,
) -> None:
    count = 60
    with measured() as unbounded:
        cache = await listed(PagingServer(count, big), None)
    assert len(cache) == count
    del cache
    bounds = budget()
    server = PagingServer(count, big)
    with measured() as bounded:
        cache = await listed(server, bounds, page_size=UPSTREAM_PAGE)
    assert len(cache) == count and len(bounds.too_large) == count
    assert server.pages == -(-count // UPSTREAM_PAGE)
    reason = bounds.too_large[upstream_key(big(0))]  # type: ignore[index]
    assert "more than this syncer's limit of 262144 bytes per object" in reason
    stub = next(iter(cache.objects.values()))
    assert "spec" not in stub and stub["metadata"]["name"].startswith("db-")
    with capsys.disabled():
        print(
            f"\n{count} objects of {BIG / MiB:.2f} MiB: retained {unbounded['retained'] / MiB:.1f}"
            f" MiB, peak {unbounded['peak'] / MiB:.1f} MiB unbounded; with the limit retained "
            f"{bounded['retained'] / MiB:.2f} MiB, peak {bounded['peak'] / MiB:.1f} MiB"
        )
    assert unbounded["retained"] > count * BIG  # the problem: every object held in full
    assert bounded["retained"] < 1 * MiB  # stubs only: ~1 KiB an object
    # a list holds at most two pages of full objects at once (the one read, the one admitted)
    assert bounded["peak"] < 2 * UPSTREAM_PAGE * BIG * 1.2
    assert bounded["peak"] < unbounded["peak"] / 1.2


async def test_one_tenant_gets_its_budget_and_no_more() -> None:
    """40 objects of 200 KiB (each under the per-object limit) in one workspace, a budget of
    2 MiB: ten are kept, thirty are stubs; another workspace's object is kept."""
    size = 200 * 1024

    def make(i: int) -> JSON:
        return big(i, size=size, cluster="other" if i == 40 else "tenant")

    bounds = budget(per_cluster=2 * MiB)
    with measured() as used:
        cache = await listed(PagingServer(41, make), bounds, page_size=UPSTREAM_PAGE)
    assert len(cache) == 41
    assert len(bounds.too_large) == 30
    assert all(k.cluster == "tenant" for k in bounds.too_large)
    assert bounds.cluster_bytes["tenant"] <= 2 * MiB and bounds.cluster_bytes["other"] > size
    assert used["retained"] < 2 * MiB + size + 1 * MiB
    assert "exceed this syncer's limit of 2097152 bytes in total" in next(
        iter(bounds.too_large.values())
    )
    # the budget is given back when an object goes, and a changed object is admitted again
    gone = next(k for k in cache.objects if k.cluster == "tenant" and k not in bounds.too_large)
    bounds.admit("DELETED", cache.objects[gone])
    stubbed = min(bounds.too_large)
    assert bounds.admit("MODIFIED", make(int(stubbed.name.split("-")[1]))).get("spec")
    assert stubbed not in bounds.too_large


async def test_a_downstream_copy_shares_the_upstream_objects_big_strings() -> None:
    up = big(1, size=200 * 1024)
    key = upstream_key(up)
    assert key is not None
    cache = SharingCache(
        key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]),
        handler=Nothing(),
        upstream_of=lambda o: up,
    )
    annotations = {ANN_CLUSTER: key.cluster, ANN_NAMESPACE: key.namespace, ANN_NAME: key.name}
    with measured() as used:
        copy = big(1, size=200 * 1024)  # decoded separately: equal, not the same string
        copy["metadata"] = {"name": "db-1", "namespace": "kcp-x", "annotations": annotations}
        assert copy["spec"]["blob"] is not up["spec"]["blob"]
        cache.on_event("ADDED", copy)
        del copy
    assert cache.objects[("kcp-x", "db-1")]["spec"]["blob"] is up["spec"]["blob"]
    assert used["retained"] < 8 * 1024  # the copy's own 200 KiB string was freed
    # only equal strings at the same place, only big ones
    assert share_strings({"a": "y" * 2000, "b": "short"}, {"a": "z" * 2000, "b": "short"}) == {
        "a": "y" * 2000,
        "b": "short",
    }


async def test_a_too_large_object_is_reported_and_never_applied(tmp_path: Path) -> None:
    bed = controller_bed(tmp_path, clock=FakeClock())
    obj = big(0, size=300 * 1024)
    obj["metadata"]["finalizers"] = [finalizer("eu")]
    (key,) = bed.list_upstream(obj)
    known_namespace(bed, key)
    queued = await bed.controller.queue.get()
    await bed.controller._process(queued)
    bed.controller.queue.done(queued)
    assert bed.downstream.count("apply") == 0
    (patch,) = [p for m, u, p in bed.upstream.calls if m == "merge_patch"]
    (condition,) = patch["status"]["conditions"]
    assert condition["reason"] == "ObjectTooLarge" and condition["status"] == "False"
    assert "more than this syncer's limit of 262144 bytes per object" in condition["message"]
    assert bed.controller.queue.failures(key) == 1  # on the long backoff
    bed.controller.queue.shutdown()
