"""Guarded writes through vwserver against the fake upstream."""

from __future__ import annotations

import json
from typing import Any

from tests.integration.conftest import Env, widget

MERGE = {"Content-Type": "application/merge-patch+json"}
JSONPATCH = {"Content-Type": "application/json-patch+json"}
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}
APPLY = {"Content-Type": "application/apply-patch+yaml"}


async def send(env: Env, method: str, url: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
    data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
    headers = kw.pop("headers", {"Content-Type": "application/json"})
    async with env.session.request(method, url, data=data, headers=headers, **kw) as r:
        raw = await r.read()
        return r.status, json.loads(raw) if raw else None


def stored(env: Env, name: str, cluster: str = "c1", ns: str = "ns1") -> dict[str, Any] | None:
    return env.fake.get(cluster=cluster, namespace=ns, name=name)


async def test_create_adds_match_labels(env: Env) -> None:
    status, doc = await send(env, "POST", env.widgets(), widget("n1"))
    assert status == 201, doc
    assert doc["metadata"]["labels"] == {"env": "prod"}
    assert (stored(env, "n1") or {})["metadata"]["labels"] == {"env": "prod"}


async def test_create_with_conflicting_label_is_rejected(env: Env) -> None:
    status, doc = await send(env, "POST", env.widgets(), widget("n1", env="dev"))
    assert status == 422
    assert doc["kind"] == "Status" and doc["reason"] == "Invalid"
    assert "metadata.labels[env]" in doc["message"]
    assert doc["details"]["causes"][0]["field"] == "metadata.labels[env]"
    assert stored(env, "n1") is None


async def test_create_violating_expressions_is_rejected(env: Env) -> None:
    url = env.widgets(name="eu-not-dev")
    status, doc = await send(env, "POST", url, widget("n1", env="dev"))
    assert status == 422 and "metadata.labels[env]" in doc["message"]
    status, doc = await send(env, "POST", url, widget("n2", env="staging"))
    assert status == 201 and doc["metadata"]["labels"] == {"env": "staging", "region": "eu"}


async def test_update_rules(env: Env) -> None:
    obj = stored(env, "w0")
    assert obj is not None
    obj["spec"]["size"] = 7
    status, doc = await send(env, "PUT", env.widgets() + "/w0", obj)
    assert status == 200 and doc["spec"]["size"] == 7
    # moving it out of the slice: 422 and nothing changes
    obj = stored(env, "w0")
    assert obj is not None
    obj["metadata"]["labels"]["env"] = "dev"
    status, doc = await send(env, "PUT", env.widgets() + "/w0", obj)
    assert status == 422 and "out of the slice" in doc["message"]
    assert (stored(env, "w0") or {})["metadata"]["labels"]["env"] == "prod"
    # an object outside the slice cannot be updated, even into it
    other = stored(env, "w1")
    assert other is not None
    other["metadata"]["labels"]["env"] = "prod"
    status, doc = await send(env, "PUT", env.widgets() + "/w1", other)
    assert status == 404 and doc["reason"] == "NotFound"
    assert (stored(env, "w1") or {})["metadata"]["labels"]["env"] == "dev"


async def test_update_without_resource_version_is_made_conditional(env: Env) -> None:
    obj = stored(env, "w0")
    assert obj is not None
    del obj["metadata"]["resourceVersion"]
    obj["spec"]["size"] = 5
    env.fake.faults.requests.clear()
    status, _ = await send(env, "PUT", env.widgets() + "/w0", obj)
    assert status == 200
    puts = [r for r in env.fake.faults.requests if r.method == "PUT"]
    assert len(puts) == 1
    assert json.loads(puts[0].body)["metadata"]["resourceVersion"]


async def test_patches(env: Env) -> None:
    url = env.widgets() + "/w0"
    status, doc = await send(env, "PATCH", url, {"spec": {"size": 2}}, headers=MERGE)
    assert status == 200 and doc["spec"]["size"] == 2
    status, doc = await send(
        env, "PATCH", url, [{"op": "replace", "path": "/spec/size", "value": 3}], headers=JSONPATCH
    )
    assert status == 200 and doc["spec"]["size"] == 3
    # Custom resources do not support strategic merge: the apiserver's 415 passes through.
    status, doc = await send(env, "PATCH", url, {"spec": {"size": 4}}, headers=STRATEGIC)
    assert status == 415, doc
    assert doc["reason"] == "UnsupportedMediaType"
    apply = "apiVersion: example.io/v1alpha1\nkind: Widget\nmetadata:\n  name: w0\n  namespace: ns1\nspec:\n  size: 5\n"
    status, doc = await send(
        env, "PATCH", url, apply, headers=APPLY, params={"fieldManager": "test"}
    )
    assert status == 200 and doc["spec"]["size"] == 5


async def test_patch_out_of_slice_is_422_and_nothing_changes(env: Env) -> None:
    url = env.widgets() + "/w0"
    before = stored(env, "w0")
    for body, headers in (
        ({"metadata": {"labels": {"env": "dev"}}}, MERGE),
        ([{"op": "replace", "path": "/metadata/labels/env", "value": "dev"}], JSONPATCH),
        ({"metadata": {"labels": {"env": None}}}, MERGE),
        ([{"op": "remove", "path": "/metadata/labels"}], JSONPATCH),
    ):
        status, doc = await send(env, "PATCH", url, body, headers=headers)
        assert status == 422, (body, doc)
        assert "out of the slice" in doc["message"]
    assert stored(env, "w0") == before


async def test_patch_of_invisible_object_is_404(env: Env) -> None:
    status, doc = await send(
        env, "PATCH", env.widgets() + "/w1", {"spec": {"size": 9}}, headers=MERGE
    )
    assert status == 404
    assert (stored(env, "w1") or {})["spec"]["size"] == 1


async def test_apply_creates_with_labels(env: Env) -> None:
    apply = "apiVersion: example.io/v1alpha1\nkind: Widget\nmetadata:\n  name: fresh\n  namespace: ns1\nspec:\n  size: 1\n"
    status, doc = await send(
        env, "PATCH", env.widgets() + "/fresh", apply, headers=APPLY, params={"fieldManager": "t"}
    )
    assert status in (200, 201), doc
    assert doc["metadata"]["labels"] == {"env": "prod"}


async def test_status_subresource(env: Env) -> None:
    url = env.widgets() + "/w0/status"
    status, doc = await send(env, "PATCH", url, {"status": {"phase": "Ready"}}, headers=MERGE)
    assert status == 200 and doc["status"]["phase"] == "Ready"
    obj = stored(env, "w0")
    assert obj is not None
    obj["status"] = {"phase": "Done"}
    status, doc = await send(env, "PUT", url, obj)
    assert status == 200 and doc["status"]["phase"] == "Done"
    status, doc = await send(
        env, "PATCH", env.widgets() + "/w1/status", {"status": {"phase": "X"}}, headers=MERGE
    )
    assert status == 404


async def test_delete(env: Env) -> None:
    status, doc = await send(env, "DELETE", env.widgets() + "/w1")
    assert status == 404 and doc["reason"] == "NotFound"
    assert stored(env, "w1") is not None
    status, _ = await send(env, "DELETE", env.widgets() + "/w0")
    assert status == 200
    assert stored(env, "w0") is None


async def test_deletecollection_only_deletes_the_slice(env: Env) -> None:
    status, _ = await send(env, "DELETE", env.widgets())
    assert status == 200
    assert stored(env, "w0") is None and stored(env, "w2") is None
    assert stored(env, "w1") is not None


async def test_writes_on_wildcard_are_405(env: Env) -> None:
    for method, suffix in (("POST", ""), ("PUT", "/w0"), ("PATCH", "/w0"), ("DELETE", "/w0")):
        url = env.widgets(cluster="*") + suffix
        status, doc = await send(env, method, url, {}, headers=MERGE)
        assert status == 405, (method, doc)
        assert doc["kind"] == "Status" and doc["reason"] == "MethodNotAllowed"


async def test_malformed_bodies_are_400(env: Env) -> None:
    status, doc = await send(env, "POST", env.widgets(), b"{not json")
    assert status == 400 and doc["reason"] == "BadRequest"
    status, doc = await send(env, "POST", env.widgets(), b"[1,2]")
    assert status == 400
    status, doc = await send(
        env, "PATCH", env.widgets() + "/w0", b"{}", headers={"Content-Type": "text/plain"}
    )
    assert status in (400, 415)


async def test_gc_finalizers_are_kcps_on_every_write_path(env: Env) -> None:
    """``orphan``/``foregroundDeletion`` are kcp's garbage collector's: no write through a slice
    adds or removes them (issue 22, finding 12; the real-kcp proof of the harm is in
    tests/security/test_write_options_kcp.py)."""
    obj = widget("gc1", env="prod", region="eu")
    obj["metadata"]["finalizers"] = ["orphan", "x.example/f"]
    env.fake.create(cluster="c1", obj=obj)
    url = env.widgets() + "/gc1"
    current = stored(env, "gc1")
    assert current is not None
    put = {**current, "metadata": {**current["metadata"], "finalizers": ["x.example/f"]}}
    for body, headers in (
        ([{"op": "remove", "path": "/metadata/finalizers/0"}], JSONPATCH),
        ({"metadata": {"finalizers": ["x.example/f"]}}, MERGE),
        ({"metadata": {"finalizers": ["orphan", "foregroundDeletion"]}}, MERGE),
        (put, {"Content-Type": "application/json"}),
    ):
        method = "PUT" if body is put else "PATCH"
        status, doc = await send(env, method, url, body, headers=headers)
        assert status == 422, (body, doc)
        assert "garbage collector" in doc["message"], doc
    after = stored(env, "gc1")
    assert after is not None
    assert after["metadata"]["finalizers"] == ["orphan", "x.example/f"]
    # the slice's own finalizer beside kcp's: fine
    status, doc = await send(
        env, "PATCH", url, [{"op": "remove", "path": "/metadata/finalizers/1"}], headers=JSONPATCH
    )
    assert status == 200, doc
    assert doc["metadata"]["finalizers"] == ["orphan"]
    # adding, on a live object: every path
    live = env.widgets() + "/w0"
    apply = (
        "apiVersion: example.io/v1alpha1\nkind: Widget\nmetadata:\n  name: w0\n  namespace: ns1\n"
        "  labels: {env: prod}\n  finalizers: [foregroundDeletion]\n"
    )
    w0 = stored(env, "w0")
    assert w0 is not None
    for body, headers, params in (
        ({"metadata": {"finalizers": ["orphan"]}}, MERGE, None),
        ([{"op": "add", "path": "/metadata/finalizers", "value": ["orphan"]}], JSONPATCH, None),
        (apply, APPLY, {"fieldManager": "test"}),
    ):
        status, doc = await send(env, "PATCH", live, body, headers=headers, params=params)
        assert status == 422, (body, doc)
    w0_put = {**w0, "metadata": {**w0["metadata"], "finalizers": ["foregroundDeletion"]}}
    status, doc = await send(env, "PUT", live, w0_put)
    assert status == 422, doc
    created = widget("gc2", env="prod")
    created["metadata"]["finalizers"] = ["orphan"]
    status, doc = await send(env, "POST", env.widgets(), created)
    assert status == 422, doc
    assert stored(env, "gc2") is None
    assert (stored(env, "w0") or {})["metadata"].get("finalizers") in (None, [])
