"""Tenants are untrusted in the syncer too (issue #25, §3) — against real kcp, with the world of
``tests/e2e/test_syncer_kcp.py`` (a provider, two consumers, a downstream kcp workspace with the
MongoDBCommunity CRD and the test operator there; set up again for this module).

Each test is one way a consumer attacked the syncer: its metadata overriding the operator's, an
object the downstream refuses forever, a status message naming the downstream server, two
syncers' finalizers raising the "contested" alarm, ``Synced=True`` after leaving the slice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

from devenv.bootstrap import Workspace
from tests.e2e.test_syncer_kcp import (
    SyncWorld,
    _copy_owned_by,
    downstream_copy,
    env,
    eventually,
    mongo,
    region_urls,
    running,
    synced_condition,
    unique,
    upstream_status,
)
from vwserver.syncer.naming import ObjectKey, finalizer
from vwserver.syncer.runner import Syncer
from vwserver.syncer.sync_loop import FLIP_LIMIT

__all__ = ["env", "region_urls"]  # the shared fixtures, set up for this module

OPERATOR_KEY = "mongodb.com/v1.lastAppliedMongoDBVersion"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
CRD = "apis/apiextensions.k8s.io/v1/customresourcedefinitions/mongodbcommunity.mongodbcommunity.mongodb.com"
MEMBERS = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/members/maximum"


async def create(env: SyncWorld, name: str, **fields: Any) -> dict[str, Any]:
    """Create ``name`` in consumer a with extra metadata/spec (``labels``, ``annotations``,
    ``finalizers``, ``members``)."""
    obj = mongo(name, labels=fields.pop("labels", {}))
    meta = obj["metadata"]
    for key in ("annotations", "finalizers"):
        if key in fields:
            meta[key] = fields.pop(key)
    obj["spec"].update(fields)
    ws = env.consumers["a"]
    status, body = await env.call("POST", env.up_url(ws, "default"), obj)
    assert status == 201, body
    result: dict[str, Any] = body
    return result


def condition_of(obj: dict[str, Any] | None) -> dict[str, Any]:
    return synced_condition(obj or {})


async def up(env: SyncWorld, name: str) -> dict[str, Any] | None:
    return await env.get(env.up_url(env.consumers["a"], "default", name))


def errors(syncer: Syncer, reason: str) -> float:
    return sum(
        s.value
        for metric in syncer.metrics.sync_errors.collect()
        for s in metric.samples
        if s.name.endswith("_total") and s.labels.get("reason") == reason
    )


def ok_reconciles(syncer: Syncer) -> float:
    return sum(
        s.value
        for metric in syncer.metrics.reconciles.collect()
        for s in metric.samples
        if s.name.endswith("_total") and s.labels.get("result") == "ok"
    )


@pytest_asyncio.fixture(loop_scope="session")
async def named(env: SyncWorld) -> AsyncIterator[list[str]]:
    """Names the test creates in consumer a; purged afterwards whatever their finalizers."""
    names: list[str] = []
    yield names
    for name in names:
        await env.purge(env.consumers["a"], name)


# --------------------------------------------------------------------------------------------


async def test_metadata_the_operator_writes_is_left_to_it_and_never_fought(
    env: SyncWorld, named: list[str]
) -> None:
    """The consumer sets the operator's own annotation: the first copy carries it (nobody else
    wrote it yet); once the operator has written its value, the syncer's applies leave it alone
    (before: a forced apply put the consumer's value back every time), and the condition names
    it. A label the operator keeps removing is put back at most FLIP_LIMIT times, then no more,
    and reported."""
    ws = env.consumers["a"]
    name = unique("meta")
    named.append(name)
    async with running(env, env.syncer_config("main")):
        await create(env, name, labels={"team": "x"}, annotations={OPERATOR_KEY: "9.9.9"})
        copy = await eventually("copy", lambda: downstream_copy(env, ws, name))
        url = env.down_url(env.down_ns(ws), name)
        assert copy["metadata"]["annotations"][OPERATOR_KEY] == "9.9.9"
        # the operator writes its own value (an update under its own field manager)
        status, body = await env.call(
            "PATCH",
            f"{url}?fieldManager=mongodb-operator",
            {"metadata": {"annotations": {OPERATOR_KEY: "6.0.5"}}},
            ctype=MERGE,
        )
        assert status == 200, body
        # a consumer change makes the syncer apply again
        await env.patch(env.up_url(ws, "default", name), {"spec": {"members": 5}})

        async def applied() -> dict[str, Any] | None:
            copy = await downstream_copy(env, ws, name)
            return copy if copy and copy["spec"]["members"] == 5 else None

        copy = await eventually("members 5 applied", applied)
        assert copy["metadata"]["annotations"][OPERATOR_KEY] == "6.0.5"

        async def reported() -> dict[str, Any] | None:
            cond = condition_of(await up(env, name))
            return cond if f"annotation {OPERATOR_KEY}" in cond.get("message", "") else None

        cond = await eventually("the annotation reported", reported)
        assert cond["status"] == "True"
        copy = await downstream_copy(env, ws, name)
        assert copy is not None and copy["metadata"]["annotations"][OPERATOR_KEY] == "6.0.5"

        # the operator removes the consumer's label, again and again
        rounds = 0
        for _ in range(FLIP_LIMIT + 2):
            status, body = await env.call(
                "PATCH", url, {"metadata": {"labels": {"team": None}}}, ctype=MERGE
            )
            assert status == 200, body
            removed_at = int(body["metadata"]["resourceVersion"])

            async def answered(after: int = removed_at) -> str | None:
                """``back``: the syncer put the label back; ``withheld``: it reports it."""
                copy = await downstream_copy(env, ws, name)
                meta = (copy or {}).get("metadata", {})
                if (
                    int(meta.get("resourceVersion") or 0) > after
                    and meta.get("labels", {}).get("team") == "x"
                ):
                    return "back"
                if "label team" in condition_of(await up(env, name)).get("message", ""):
                    return "withheld"
                return None

            if await eventually("the syncer's answer", answered) == "withheld":
                break
            rounds += 1
        assert rounds < FLIP_LIMIT, rounds
        assert "label team" in condition_of(await up(env, name))["message"]
        # and it stays so: no more writes of the label
        copy = await downstream_copy(env, ws, name)
        assert copy is not None and "team" not in copy["metadata"].get("labels", {})


async def test_an_object_the_downstream_refuses_backs_off_and_names_no_address(
    env: SyncWorld, named: list[str]
) -> None:
    """The downstream cluster refuses the copy (its CRD, changed for this test, takes at most 50
    members; kcp's schema any number): ``Synced=False``, reason ``Invalid``, a message naming the failure and not the
    downstream server's URL or query; the object is retried on the long backoff, so the
    resyncs meanwhile do not re-send it (before: at least one apply per resync)."""
    ws = env.consumers["a"]
    healthy, refused = unique("fine"), unique("huge")
    named.extend([healthy, refused])
    crd = f"{env.downstream.url}/{CRD}"
    async with running(env, env.syncer_config("main", resyncSeconds=2)) as syncer:
        await create(env, healthy)
        await eventually("healthy copy", lambda: downstream_copy(env, ws, healthy))
        # downstream only: at most 50 members (kcp's schema takes any number)
        status, body = await env.call(
            "PATCH", crd, [{"op": "add", "path": MEMBERS, "value": 50}], ctype=JSON_PATCH
        )
        assert status == 200, body
        try:
            await _refused(env, syncer, ws, healthy=healthy, refused=refused)
        finally:
            status, body = await env.call(
                "PATCH", crd, [{"op": "remove", "path": MEMBERS}], ctype=JSON_PATCH
            )
            assert status == 200, body


async def _refused(
    env: SyncWorld, syncer: Syncer, ws: Workspace, *, healthy: str, refused: str
) -> None:
    async def enforced() -> bool:
        # the changed schema takes a moment to be served: probe with a dry run
        obj = mongo(unique("probe"), labels={})
        obj["spec"]["members"] = 99
        url = f"{env.down_url(env.down_ns(ws))}?dryRun=All"
        obj["metadata"]["namespace"] = env.down_ns(ws)
        status, _ = await env.call("POST", url, obj)
        return status == 422

    await eventually("the downstream schema enforced", enforced)
    await create(env, refused, members=99)

    async def failed() -> dict[str, Any] | None:
        cond = condition_of(await up(env, refused))
        return cond if cond.get("status") == "False" else None

    cond = await eventually("Synced=False", failed)
    assert cond["reason"] == "Invalid", cond
    message = cond["message"]
    assert message.startswith("the downstream cluster answered 422 Invalid: "), message
    assert "spec.members" in message and "50" in message
    host = env.kcp.url.split("://", 1)[1]
    for secret in (host, "https://", env.downstream.path, "fieldManager", "/apis/"):
        assert secret not in message, (secret, message)
    assert await downstream_copy(env, ws, refused) is None
    # three resyncs of the healthy object (each one reconcile of it, at least) ...
    before_ok, before_errors = ok_reconciles(syncer), errors(syncer, "Invalid")
    await eventually(
        "three resyncs", lambda: _value(ok_reconciles(syncer) - before_ok >= 3), within=60
    )
    # ... and the refused object was not sent again (its next retry is 30 s after the 2nd)
    controller = syncer.controllers[0]
    key = ObjectKey(ws.cluster, "default", refused)
    assert controller.queue.backing_off(key)
    assert errors(syncer, "Invalid") - before_errors <= 1
    assert controller.queue.failures(key) <= 3


async def test_finalizers_a_consumer_wrote_are_no_claim(env: SyncWorld, named: list[str]) -> None:
    """A consumer creates its object with two syncers' finalizers, another syncer's first:
    before, syncer ``main`` stood back ("owned by syncer us") and raised the provider's
    contested alarm; now only a syncer's own write is a claim — ``main`` syncs the object, adds
    its finalizer under its field manager (a claim from then on), and nothing is contested."""
    ws = env.consumers["a"]
    name = unique("forged")
    named.append(name)
    async with running(env, env.syncer_config("main")) as syncer:
        await create(env, name, finalizers=[finalizer("us"), finalizer("main")])
        await eventually("main's copy", lambda: _copy_owned_by(env, ws, name, "main"))
        await eventually("Running", lambda: upstream_status(env, ws, name, phase="Running"))
        assert all(not c.contested() for c in syncer.controllers)
        assert syncer.readiness_notes() == []
        # a finalizer main adds itself is its claim: a consumer's copy of the name is not
        other = unique("claimed")
        named.append(other)
        await create(env, other)

        async def claimed() -> dict[str, Any] | None:
            obj = await up(env, other)
            managers = [
                e["manager"]
                for e in (obj or {}).get("metadata", {}).get("managedFields", [])
                if f'v:"{finalizer("main")}"'
                in e.get("fieldsV1", {}).get("f:metadata", {}).get("f:finalizers", {})
            ]
            return obj if managers == ["vwserver-syncer-main"] else None

        await eventually("main's finalizer claimed by its field manager", claimed)


async def test_leaving_the_slice_clears_synced_before_the_finalizer_goes(
    env: SyncWorld, region_urls: dict[str, str], named: list[str]
) -> None:
    """Moved from ``region=eu`` to ``region=us`` (no syncer for us): the eu syncer deletes its
    copy and, before it releases its finalizer, replaces the mirrored status (``Running``) and
    its ``Synced=True`` with ``Synced=False``, reason ``Released`` — through the holding slice,
    which now takes status writes of an object leaving it (before: 409, the status said
    synced/Running for good)."""
    ws = env.consumers["a"]
    name = unique("leaver")
    named.append(name)
    async with running(env, env.syncer_config("eu", urls=[region_urls["eu"]])):
        await create(env, name, labels={"region": "eu"})
        await eventually("Running", lambda: upstream_status(env, ws, name, phase="Running"))
        await env.patch(env.up_url(ws, "default", name), {"metadata": {"labels": {"region": "us"}}})

        async def released() -> dict[str, Any] | None:
            obj = await up(env, name)
            fins = (obj or {}).get("metadata", {}).get("finalizers") or []
            return obj if obj is not None and finalizer("eu") not in fins else None

        obj = await eventually("eu's finalizer released", released)
        assert await downstream_copy(env, ws, name) is None
        cond = condition_of(obj)
        assert (cond.get("status"), cond.get("reason")) == ("False", "Released"), obj["status"]
        assert "phase" not in obj["status"], obj["status"]


async def _value(value: bool) -> bool:
    return value
