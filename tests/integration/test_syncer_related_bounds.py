"""What one consumer workspace can make the syncer hold covers its related objects (issue #25,
§3 held to §2), end to end: the real syncer against the real local servers of
:mod:`tests.integration.related_support`.

Workspace ``c2`` has twelve Secrets of ~150 KiB (``app=shop``, copied down by selector) against a
``maxClusterBytes`` of 1 MiB: the syncer holds at most 1 MiB of ``c2``'s objects in full (its
ledger, and the Secrets its cache holds in full), copies only those, and shows ``Synced=False``,
``ObjectTooLarge`` on ``c2``'s widget naming a Secret not copied (kind and name, no address).
It does not re-send anything for ``c2`` over several resyncs (the long backoff, which the resync
respects), and workspace ``c1`` keeps syncing meanwhile, changes included.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.related_support import (
    RelatedWorld,
    changed,
    eventually,
    quiet_round,
    related_world,
    resyncs,
    running,
    secret,
    settled,
    value,
    writes,
)
from tests.integration.syncer_support import DOWN_CLUSTER, widget
from vwserver.syncer.memory import object_size
from vwserver.syncer.naming import ObjectKey, downstream_namespace
from vwserver.syncer.runner import Syncer

KiB = 1024
BUDGET = 1024 * KiB
BIG = 110 * KiB  # ~147 KiB of base64: under maxObjectBytes (256 KiB)
COUNT = 12


@pytest.fixture
async def related(tmp_path: Path) -> AsyncIterator[RelatedWorld]:
    async with related_world(tmp_path) as world:
        for i in range(COUNT):
            world.upstream.create(
                cluster="c2", obj=secret(f"big-{i:02d}", "ns1", f"{i:02d}" + "x" * BIG, app="shop")
            )
        world.upstream.create(cluster="c2", obj=widget("w9"))
        yield world


def synced_condition(w: RelatedWorld, cluster: str, name: str) -> dict[str, Any] | None:
    obj = w.upstream.get(cluster=cluster, namespace="ns1", name=name)
    for c in ((obj or {}).get("status") or {}).get("conditions") or ():
        if c["type"] == "Synced":
            return dict(c)
    return None


async def test_a_workspaces_related_objects_share_its_budget_and_others_keep_syncing(
    related: RelatedWorld,
) -> None:
    w = related
    syncer = Syncer(w.config(maxClusterBytes=BUDGET), base_dir=w.dir, identity="replica-1")
    c2_down = downstream_namespace("c2", "ns1", prefix="kcp-")
    async with running(syncer):
        await settled(w)  # c1: its Secrets down, the operator's up

        async def too_large() -> dict[str, Any] | None:
            c = synced_condition(w, "c2", "w9")
            return c if c is not None and c["reason"] == "ObjectTooLarge" else None

        condition = await eventually("w9: ObjectTooLarge", too_large)
        assert condition["status"] == "False"
        assert condition["message"].startswith("related creds: Secret ns1/big-")
        assert "1048576 bytes in total" in condition["message"]
        assert "127.0.0.1" not in condition["message"] and "http" not in condition["message"]

        (controller,) = syncer.controllers
        assert 0 < controller.ledger.cluster_bytes["c2"] <= BUDGET
        creds = next(r for r in controller.related if r.spec.name == "creds")
        (sources,) = creds.reflectors.values()
        held = {n: s for n, s in sources.handler.in_group(("c2", "ns1")).items() if "data" in s}
        assert 0 < len(held) < COUNT
        assert sum(object_size(s) for s in held.values()) <= BUDGET
        copied = {
            n
            for n in (f"big-{i:02d}" for i in range(COUNT))
            if w.downstream.get(cluster=DOWN_CLUSTER, namespace=c2_down, name=n, resource="secrets")
        }
        assert copied == set(held)  # only what is held in full is copied
        assert condition["message"].split(" ")[3] not in copied  # the one named is not

        # nothing more for c2 over several resyncs, and the key waits on the long backoff
        await eventually("a quiet round", lambda: quiet_round(w, syncer))
        key = ObjectKey("c2", "ns1", "w9")
        failures = controller.queue.failures(key)
        assert failures >= 1 and controller.queue.backing_off(key)
        down, up = len(writes(w.downstream)), len(writes(w.upstream))
        await resyncs(syncer, rounds=3)
        assert writes(w.downstream)[down:] == [] and writes(w.upstream)[up:] == []
        assert controller.queue.failures(key) == failures

        # c1 keeps syncing
        changed(w.upstream, "c1", "ns1", "s1", "changed")
        await eventually("c1's change copied", lambda: _is(value(w.copy_down("s1")), "changed"))
        c1 = synced_condition(w, "c1", "w1")
        assert c1 is not None and c1["status"] == "True"


async def _is(actual: str | None, expected: str) -> bool:
    return actual == expected
