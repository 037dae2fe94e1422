"""What one tenant can make the syncer hold covers its related objects too (issue #25, §3 held
to the related objects of §2): one budget per consumer workspace for a resource's primaries and
their related objects (:class:`~vwserver.syncer.memory.TenantLedger`), a related object over it
not copied and reported on the primary naming it (kind and name, no address), on the long
backoff that the resync does not cut short; another workspace keeps syncing; a copy and its
source held once. Measured with tracemalloc and the ledger's own accounting, on the real
controller with fake API servers (:mod:`tests.support.syncer_fakes`).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from tests.support.clock import FakeClock
from tests.support.syncer_fakes import (
    DOWNSTREAM,
    UPSTREAM,
    ControllerBed,
    controller_bed,
    known_namespace,
    list_related,
    start_related,
    thing,
)
from tests.unit.test_syncer_memory import measured
from tests.unit.test_syncer_related import PASSWORD
from vwserver.k8s.client import JSON
from vwserver.syncer.memory import TenantBudget, TenantLedger
from vwserver.syncer.naming import (
    ANN_CLUSTER,
    ANN_NAMESPACE,
    ANN_SOURCE,
    LABEL_RELATED,
    LABEL_SYNCER,
    ObjectKey,
    field_manager,
    finalizer,
    upstream_key,
)
from vwserver.syncer.related_io import _CopyAdmission
from vwserver.syncer.related_plan import owned_copy
from vwserver.syncer.sync_loop import PERMANENT_BACKOFF

KiB = 1024
MiB = 1024 * KiB
SECRET = 200 * KiB  # each under maxObjectBytes (256 KiB)
BUDGET = 1 * MiB  # maxClusterBytes in these tests


def bed_with_related(tmp_path: Path, **resource: Any) -> ControllerBed:
    things = {
        "group": "g.io",
        "version": "v1",
        "resource": "things",
        "kind": "Thing",
        "maxClusterBytes": BUDGET,
        "related": [PASSWORD],
        **resource,
    }
    bed = controller_bed(tmp_path, clock=FakeClock(), resources=[things])
    start_related(bed)
    return bed


def secret(name: str, *, cluster: str = "tenant", size: int = SECRET) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "resourceVersion": "3",
            "annotations": {"kcp.io/cluster": cluster},
        },
        # a new string per object, as decoded
        "data": {"password": f"{name:>12}" + "A" * size},
    }


def database(name: str, *passwords: str, cluster: str = "tenant", blob: int = 0) -> JSON:
    users = [{"name": p, "passwordSecretRef": {"name": p}} for p in passwords]
    obj = thing(name, cluster=cluster, finalizers=(finalizer("eu"),), users=users)
    if blob:
        obj["spec"]["blob"] = "x" * blob
    return obj


async def process(bed: ControllerBed, key: ObjectKey) -> None:
    queue = bed.controller.queue
    while True:  # the key may be behind others queued by the same lists
        queued = await queue.get()
        try:
            if queued == key:
                await bed.controller._process(queued)
                return
        finally:
            queue.done(queued)


def applied(bed: ControllerBed) -> list[str]:
    return [url for m, url, _ in bed.downstream.calls if m == "apply"]


def condition(bed: ControllerBed, name: str) -> dict[str, Any]:
    patches = [p for m, u, p in bed.upstream.calls if m == "merge_patch" and f"/{name}/" in u]
    (synced,) = patches[-1]["status"]["conditions"]
    result: dict[str, Any] = synced
    return result


async def test_primaries_and_related_objects_share_one_budget_per_tenant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tenant's database of 400 KiB and twelve 200 KiB Secrets it names, against 1 MiB:
    the database and three Secrets are held, the other nine are stubs — measured (tracemalloc)
    and by the ledger; another workspace's Secret is held in full all the same."""
    bed = bed_with_related(tmp_path, maxObjectBytes=512 * KiB)
    names = [f"pw-{i:02d}" for i in range(12)]
    bed.list_upstream(
        database("db", *names, blob=400 * KiB), database("other-db", "pw", cluster="other")
    )
    ledger = bed.controller.ledger
    assert 400 * KiB < ledger.cluster_bytes["tenant"] < 401 * KiB  # the primary's charge
    with measured() as used:
        list_related(bed, "password", *(secret(n) for n in names), secret("pw", cluster="other"))
    watch = bed.controller.related[0]
    budget = watch._budgets[UPSTREAM]
    stubs = sorted(k.name for k in budget.too_large)
    assert stubs == names[3:]  # first come, first kept: the primary came first
    assert ledger.cluster_bytes["tenant"] <= BUDGET
    assert ledger.cluster_bytes["other"] > SECRET  # another workspace: its own budget
    held = watch.reflectors[UPSTREAM].handler.in_group(("tenant", "default"))
    assert [n for n, s in sorted(held.items()) if "data" in s] == names[:3]
    # what the twelve Secrets cost: three of them and the other workspace's, plus stubs
    assert used["retained"] < 4 * SECRET + 64 * KiB
    with capsys.disabled():
        print(
            f"\n12 related Secrets of {SECRET // KiB} KiB, budget {BUDGET // KiB} KiB with a "
            f"{400} KiB primary: retained {used['retained'] / MiB:.2f} MiB "
            f"(unbounded: {12 * SECRET / MiB:.2f} MiB)"
        )
    # a relist gives back only what this reflector's objects took (the primary's stays)
    list_related(bed, "password")
    assert 400 * KiB < ledger.cluster_bytes["tenant"] < 401 * KiB
    assert ledger.cluster_bytes["other"] < 1 * KiB  # its database only
    bed.controller.queue.shutdown()


async def test_a_related_object_over_the_budget_is_reported_and_not_resent(
    tmp_path: Path,
) -> None:
    """The database names seven 200 KiB Secrets, 1 MiB is room for five: the five are copied,
    the primary shows ``Synced=False``, ``ObjectTooLarge``, naming the two not copied
    (kind and name, no address); the key is on the long backoff, and a resync does not queue
    it; another workspace's database syncs."""
    bed = bed_with_related(tmp_path)
    names = [f"pw-{i}" for i in range(7)]
    (key, other) = bed.list_upstream(database("db", *names), database("db", "pw", cluster="o"))
    list_related(bed, "password", *(secret(n) for n in names), secret("pw", cluster="o"))
    for k in (key, other):
        known_namespace(bed, k)
    await process(bed, key)
    copies = [u.rsplit("/", 1)[1] for u in applied(bed) if "/secrets/" in u]
    assert copies == names[:5]  # the ones held in full, before the primary's copy
    assert applied(bed)[-1].endswith("/things/db")
    synced = condition(bed, "db")
    assert (synced["status"], synced["reason"]) == ("False", "ObjectTooLarge")
    assert synced["message"].startswith(
        "related password: Secret default/pw-5, default/pw-6 are not copied: "
    )
    assert "1048576 bytes in total" in synced["message"]
    for address in ("vw.example", "downstream.example", DOWNSTREAM, UPSTREAM, "http"):
        assert address not in synced["message"]
    queue = bed.controller.queue
    assert queue.failures(key) == 1 and queue.backing_off(key)
    assert queue._waiting[key] - bed.controller._clock.monotonic() >= PERMANENT_BACKOFF.initial * (
        1 - PERMANENT_BACKOFF.jitter
    )
    # the resync leaves it waiting (it queues the other workspace's key)
    bed.controller.resync()
    assert key not in queue._dirty and other in queue._dirty
    await process(bed, other)
    ok = condition(bed, "db")  # the other workspace's, written last
    assert (ok["status"], ok["reason"]) == ("True", "Synced")
    assert applied(bed)[-2].endswith("/secrets/pw") and applied(bed)[-1].endswith("/things/db")
    queue.shutdown()


def owned_copy_of(
    source: JSON, *, down_ns: str, cluster: str = "tenant", label: str = "password"
) -> JSON:
    """Syncer eu's copy of ``source`` as the downstream server would show it (decoded
    separately: equal strings, not the same ones)."""
    meta = source["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": meta["name"],
            "namespace": down_ns,
            "uid": f"copy-{meta['name']}",
            "labels": {LABEL_SYNCER: "eu", LABEL_RELATED: label},
            "annotations": {
                ANN_CLUSTER: cluster,
                ANN_NAMESPACE: "default",
                ANN_SOURCE: f"default/{meta['name']}",
            },
            "managedFields": [
                {
                    "manager": field_manager("eu"),
                    "operation": "Apply",
                    "fieldsV1": {"f:metadata": {"f:labels": {f"f:{LABEL_SYNCER}": {}}}},
                }
            ],
        },
        "data": {k: "".join(list(v)) for k, v in source["data"].items()},
    }


@pytest.mark.parametrize("sources_first", [True, False])
async def test_a_copy_and_its_source_are_held_once(tmp_path: Path, sources_first: bool) -> None:
    """Five 200 KiB Secrets and their downstream copies, cached in either order: every copy's
    data is its source's string, and the second list retains next to nothing."""
    bed = bed_with_related(tmp_path, maxClusterBytes=4 * MiB)
    (key,) = bed.list_upstream(database("db", *(f"pw-{i}" for i in range(5))))
    down_ns = bed.controller._namespace_of(key)
    sources = [secret(f"pw-{i}") for i in range(5)]
    label = bed.controller.related[0].spec.label
    copies = [owned_copy_of(s, down_ns=down_ns, label=label) for s in sources]
    assert copies[0]["data"]["password"] is not sources[0]["data"]["password"]
    first, second = (sources, copies) if sources_first else (copies, sources)
    list_related(bed, "password", *first, downstream=not sources_first)
    del first
    with measured() as used:
        list_related(bed, "password", *second, downstream=sources_first)
        del second, sources, copies
        gc.collect()
    watch = bed.controller.related[0]
    held_sources = watch.reflectors[UPSTREAM].handler.in_group(("tenant", "default"))
    held_copies = watch.downstream_reflector.handler.in_group(down_ns)
    assert sorted(held_copies) == sorted(held_sources) == [f"pw-{i}" for i in range(5)]
    assert all("data" in c for c in held_copies.values())  # held in full: copies of ours
    for name, copy in held_copies.items():
        assert copy["data"]["password"] is held_sources[name]["data"]["password"]
    assert used["retained"] < 5 * SECRET / 10  # not five more Secrets: only their metadata
    bed.controller.queue.shutdown()


def test_copies_beyond_the_syncers_own_are_kept_as_metadata() -> None:
    """The copies' reflector: a consumer's own Secret carrying the labels (no field manager of
    the syncer's) is a stub; a copy of ours inflated past maxObjectBytes keeps its metadata
    only (the plan sees it drifted and applies it again from its source)."""
    admission = _CopyAdmission(syncer="eu", label="password", max_object_bytes=256 * KiB)
    ours = owned_copy_of(secret("pw"), down_ns="kcp-x")
    assert admission.admit("ADDED", ours) is ours
    forged = owned_copy_of(secret("pw", size=2 * MiB), down_ns="kcp-x")
    forged["metadata"]["managedFields"][0]["manager"] = "kubectl-edit"
    kept = admission.admit("ADDED", forged)
    assert "data" not in kept and not owned_copy(kept, syncer="eu", label="password")
    inflated = owned_copy_of(secret("pw", size=300 * KiB), down_ns="kcp-x")
    kept = admission.admit("MODIFIED", inflated)
    assert "data" not in kept and kept["metadata"] == inflated["metadata"]


def test_the_ledger_is_one_budget_across_reflectors() -> None:
    """Two budgets on one ledger: what one holds is room the other has not; deleting gives it
    back; an account function charges objects to another workspace than their key says."""
    ledger = TenantLedger(3 * SECRET + 4 * KiB)  # three Secrets
    primaries = TenantBudget(key=upstream_key, max_object_bytes=256 * KiB, ledger=ledger)
    related = TenantBudget(
        key=upstream_key,
        max_object_bytes=256 * KiB,
        ledger=ledger,
        account=lambda k: "tenant" if k.cluster == "ns-of-tenant" else k.cluster,
    )
    assert "data" in primaries.admit("ADDED", secret("a"))
    assert "data" in related.admit("ADDED", secret("b"))
    assert "data" in related.admit("ADDED", secret("c", cluster="ns-of-tenant"))
    assert "data" not in primaries.admit("ADDED", secret("d"))  # the tenant's room is used up
    assert "data" in primaries.admit("ADDED", secret("d", cluster="another"))
    related.admit("DELETED", secret("b"))
    assert "data" in primaries.admit("MODIFIED", secret("d"))
    assert primaries.held_bytes + related.held_bytes == sum(ledger.cluster_bytes.values())


async def test_a_related_object_found_by_selector_is_reported_when_too_large(
    tmp_path: Path,
) -> None:
    """A stub keeps its labels: a Secret found by a label selector that is over
    ``maxObjectBytes`` is still found, and reported on the primary instead of left out."""
    creds = {
        "name": "creds",
        "origin": "kcp",
        "version": "v1",
        "resource": "secrets",
        "kind": "Secret",
        "selector": {"matchLabels": {"app": "shop"}},
    }
    bed = bed_with_related(tmp_path, related=[creds])
    (key,) = bed.list_upstream(database("db"))
    known_namespace(bed, key)
    small, big = secret("small"), secret("big", size=300 * KiB)
    for s in (small, big):
        s["metadata"]["labels"] = {"app": "shop"}
    list_related(bed, "creds", small, big)
    await process(bed, key)
    assert [u.rsplit("/", 1)[1] for u in applied(bed) if "/secrets/" in u] == ["small"]
    synced = condition(bed, "db")
    assert synced["reason"] == "ObjectTooLarge"
    assert synced["message"].startswith("related creds: Secret default/big is not copied: ")
    assert "bytes per object" in synced["message"]
    bed.controller.queue.shutdown()


async def test_a_new_copy_waits_for_the_related_caches_first_lists(tmp_path: Path) -> None:
    """Until the related sources have listed, a new primary is not copied (its Secrets found
    by selector are not known yet, and they go first); once they have, they do go first."""
    bed = bed_with_related(tmp_path)
    watch = bed.controller.related[0]
    sources = watch.reflectors[UPSTREAM]
    sources.synced.clear()
    (key,) = bed.list_upstream(database("db", "pw"))
    known_namespace(bed, key)
    await process(bed, key)
    assert applied(bed) == [] and bed.upstream.calls == []
    assert key in bed.controller.queue._waiting  # looked at again shortly
    list_related(bed, "password", secret("pw"))
    sources.synced.set()
    await bed.controller._process(key)
    assert [u.rsplit("/", 1)[1] for u in applied(bed)] == ["pw", "db"]
    bed.controller.queue.shutdown()


async def test_a_downstream_source_counts_against_the_workspace_of_its_namespace(
    tmp_path: Path,
) -> None:
    """Origin downstream: the operator's Secret in a workspace's downstream namespace takes
    that workspace's budget (the one its primaries use), not a budget of its own."""
    connection = {
        "name": "connection",
        "origin": "downstream",
        "version": "v1",
        "resource": "secrets",
        "kind": "Secret",
        "nameTemplate": "{{ .metadata.name }}-conn",
    }
    bed = bed_with_related(tmp_path, related=[connection])
    (key,) = bed.list_upstream(database("db"))
    ledger = bed.controller.ledger
    before = ledger.cluster_bytes["tenant"]
    down = secret("db-conn")
    down["metadata"]["namespace"] = bed.controller._namespace_of(key)
    del down["metadata"]["annotations"]  # no kcp.io/cluster downstream
    list_related(bed, "connection", down, downstream=True)
    assert ledger.cluster_bytes["tenant"] > before + SECRET
    assert set(ledger.cluster_bytes) == {"tenant"}
    # past the budget: a stub, and the copy up is not made
    many = []
    for i in range(6):
        s = secret(f"db-conn-{i}")
        s["metadata"]["namespace"] = down["metadata"]["namespace"]
        del s["metadata"]["annotations"]
        many.append(s)
    list_related(bed, "connection", down, *many, downstream=True)
    assert ledger.cluster_bytes["tenant"] <= BUDGET
    (budget,) = bed.controller.related[0]._budgets.values()
    assert len(budget.too_large) == 2  # 1 MiB: the database and five of the seven
    bed.controller.queue.shutdown()
