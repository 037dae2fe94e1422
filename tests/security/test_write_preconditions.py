"""Every write through a slice is conditional on the exact object the proxy checked, whatever
the client sends (against the fake upstream, which records what the proxy sent)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.conftest import Env, env
from tests.integration.test_proxy_writes import APPLY, JSONPATCH, MERGE, send

__all__ = ["env"]  # the fixture, imported so that pytest finds it here


def stored(env: Env, name: str, ns: str = "ns1") -> dict[str, Any]:
    obj = env.fake.get(cluster="c1", namespace=ns, name=name)
    assert obj is not None
    return obj


def sent(env: Env, method: str) -> list[Any]:
    return [json.loads(r.body) for r in env.fake.faults.requests if r.method == method and r.body]


@pytest.mark.parametrize(
    "op",
    [
        {"op": "copy", "from": "/metadata/resourceVersion", "path": "/metadata/resourceVersion"},
        {"op": "replace", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "remove", "path": "/metadata/resourceVersion"},
        {"op": "move", "from": "/metadata/resourceVersion", "path": "/metadata/annotations/x"},
        {"op": "replace", "path": "/metadata", "value": {"name": "w0"}},
        {"op": "replace", "path": "", "value": {}},
    ],
)
async def test_json_patch_cannot_touch_the_precondition(env: Env, op: dict[str, Any]) -> None:
    before = stored(env, "w0")
    env.fake.faults.requests.clear()
    status, doc = await send(env, "PATCH", env.widgets() + "/w0", [op], headers=JSONPATCH)
    assert status == 422, doc
    assert doc["kind"] == "Status" and "resourceVersion" in doc["message"]
    assert sent(env, "PATCH") == []
    assert stored(env, "w0") == before


async def test_json_patch_always_starts_with_the_proxys_test(env: Env) -> None:
    rv = stored(env, "w0")["metadata"]["resourceVersion"]
    env.fake.faults.requests.clear()
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "replace", "path": "/spec/size", "value": 9},
    ]
    status, doc = await send(env, "PATCH", env.widgets() + "/w0", ops, headers=JSONPATCH)
    assert status == 200, doc
    patches = sent(env, "PATCH")
    assert len(patches) == 1  # one write (the proxy applies a JSON patch itself: no dry run)
    for patch in patches:
        assert patch[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": rv}
    # a client test that disagrees is the client's failure, and nothing is written
    status, doc = await send(
        env,
        "PATCH",
        env.widgets() + "/w0",
        [{"op": "test", "path": "/metadata/resourceVersion", "value": "1"}],
        headers=JSONPATCH,
    )
    assert status in (409, 422), doc
    assert stored(env, "w0")["spec"]["size"] == 9


@pytest.mark.parametrize("headers", [MERGE, APPLY])
async def test_merge_and_apply_patches_carry_the_checked_version(
    env: Env, headers: dict[str, str]
) -> None:
    rv = stored(env, "w0")["metadata"]["resourceVersion"]
    env.fake.faults.requests.clear()
    body: Any = {"spec": {"size": 4}}
    if headers is APPLY:
        body = json.dumps({"apiVersion": "example.io/v1alpha1", "kind": "Widget", **body})
    status, doc = await send(
        env, "PATCH", env.widgets() + "/w0", body, headers=headers, params={"fieldManager": "t"}
    )
    assert status == 200, doc
    for patch in sent(env, "PATCH"):
        assert patch["metadata"]["resourceVersion"] == rv
    # the client's own, stale resourceVersion is its 409; it cannot replace the proxy's
    status, doc = await send(
        env,
        "PATCH",
        env.widgets() + "/w0",
        {"metadata": {"resourceVersion": rv}, "spec": {"size": 5}},
        headers=MERGE,
    )
    assert status == 409 and doc["reason"] == "Conflict", doc


async def test_update_with_a_stale_version_is_409(env: Env) -> None:
    obj = stored(env, "w0")
    await send(env, "PATCH", env.widgets() + "/w0", {"spec": {"size": 2}}, headers=MERGE)
    obj["spec"]["size"] = 3
    env.fake.faults.requests.clear()
    status, doc = await send(env, "PUT", env.widgets() + "/w0", obj)
    assert status == 409 and doc["reason"] == "Conflict"
    assert sent(env, "PUT") == []


@pytest.mark.parametrize("preconditions", [{}, None, "uid-only"])
async def test_delete_is_conditional_whatever_the_client_sends(
    env: Env, preconditions: Any
) -> None:
    obj = stored(env, "w0")
    meta = obj["metadata"]
    options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
    if preconditions == "uid-only":
        options["preconditions"] = {"uid": meta["uid"]}
    elif preconditions is not None:
        options["preconditions"] = preconditions
    env.fake.faults.requests.clear()
    status, doc = await send(env, "DELETE", env.widgets() + "/w0", options)
    assert status == 200, doc
    (delete,) = sent(env, "DELETE")
    assert delete["preconditions"] == {
        "uid": meta["uid"],
        "resourceVersion": meta["resourceVersion"],
    }


async def test_delete_with_a_foreign_uid_is_409_and_deletes_nothing(env: Env) -> None:
    env.fake.faults.requests.clear()
    status, doc = await send(
        env, "DELETE", env.widgets() + "/w0", {"preconditions": {"uid": "someone-else"}}
    )
    assert status == 409 and doc["reason"] == "Conflict"
    assert "Precondition failed: UID" in doc["message"]
    assert sent(env, "DELETE") == []
    stored(env, "w0")


async def test_delete_options_are_allow_listed(env: Env) -> None:
    status, doc = await send(
        env,
        "DELETE",
        env.widgets() + "/w0",
        {"ignoreStoreReadErrorWithClusterBreakingPotential": True},
    )
    assert status == 400, doc
    stored(env, "w0")


async def test_deletecollection_deletes_each_checked_object_conditionally(env: Env) -> None:
    env.fake.faults.ignore_selectors = True  # the proxy's own check is what is tested
    env.fake.faults.requests.clear()
    status, doc = await send(env, "DELETE", env.widgets())
    assert status == 200, doc
    assert sorted(i["metadata"]["name"] for i in doc["items"]) == ["w0", "w2"]
    deletes = [r for r in env.fake.faults.requests if r.method == "DELETE"]
    assert sorted(r.path.rsplit("/", 1)[1] for r in deletes) == ["w0", "w2"]
    for r in deletes:
        assert set(json.loads(r.body)["preconditions"]) == {"uid", "resourceVersion"}
    assert env.fake.get(cluster="c1", namespace="ns1", name="w1") is not None
