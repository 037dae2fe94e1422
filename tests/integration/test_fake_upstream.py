"""The fake APIExport virtual workspace must behave like kcp + the apiserver over real HTTP.

Every other integration test and benchmark trusts this fake, so these tests pin the apiserver
semantics a filtering proxy depends on: consistent paging, resourceVersion rules, watch-cache
selector transitions, watch-list bookmarks, 410s, write strategy and preconditions, dry-run,
negotiation (Table, PartialObjectMetadata, gzip), kcp's wildcard and APIBinding rules, and the
fault switches.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import ssl
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import trustme

from fakekcp.upstream import (
    FakeApiError,
    FakeUpstream,
    ResourceSpec,
    demo_objects,
    start_fake_upstream,
)
from vwserver.k8s.status import not_found

WIDGETS = "apis/example.io/v1alpha1"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
POML = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
Served = tuple[FakeUpstream, str]
Session = aiohttp.ClientSession


def widget(name: str, ns: str = "ns", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"size": 1},
    }


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def served() -> AsyncIterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream(bookmark_interval=0.1, history_size=20)
    async with start_fake_upstream(fake) as pair:
        yield pair


def ns_url(base: str, cluster: str = "c1", ns: str = "ns") -> str:
    return f"{base}/clusters/{cluster}/{WIDGETS}/namespaces/{ns}/widgets"


async def get_json(
    session: aiohttp.ClientSession, url: str, **kwargs: Any
) -> tuple[int, dict[str, Any]]:
    async with session.get(url, **kwargs) as resp:
        return resp.status, json.loads(await resp.read())


async def send(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: Any = None,
    content_type: str = "application/json",
) -> tuple[int, dict[str, Any]]:
    data = (
        None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    )
    headers = {"Content-Type": content_type}
    async with session.request(method, url, data=data, headers=headers) as resp:
        return resp.status, json.loads(await resp.read())


async def next_event(resp: aiohttp.ClientResponse, *, bookmarks: bool = False) -> dict[str, Any]:
    """The next watch event (BOOKMARKs skipped unless asked for)."""
    async with asyncio.timeout(3):
        while True:
            line = await resp.content.readline()
            assert line, "watch ended"
            event: dict[str, Any] = json.loads(line)
            if bookmarks or event["type"] != "BOOKMARK":
                return event


def names(items: list[dict[str, Any]]) -> list[str]:
    return [item["metadata"]["name"] for item in items]


# --- LIST -------------------------------------------------------------------------------------


async def test_paging_is_a_consistent_snapshot(served: Served, session: Session) -> None:
    fake, base = served
    for i in range(8):
        fake.create(cluster="c1", obj=widget(f"w{i}"))
    status, first = await get_json(session, ns_url(base) + "?limit=3")
    assert status == 200
    rv = first["metadata"]["resourceVersion"]
    assert names(first["items"]) == ["w0", "w1", "w2"]
    assert first["metadata"]["remainingItemCount"] == 5
    # Changes after the first page must not show up in later pages.
    changed = fake.get(cluster="c1", namespace="ns", name="w6")
    assert changed is not None
    changed["spec"]["size"] = 99
    fake.update(cluster="c1", obj=changed)
    fake.delete(cluster="c1", namespace="ns", name="w4")
    fake.create(cluster="c1", obj=widget("w9"))
    pages = [first]
    while pages[-1]["metadata"].get("continue"):
        token = pages[-1]["metadata"]["continue"]
        status, page = await get_json(session, ns_url(base) + f"?limit=3&continue={token}")
        assert status == 200
        pages.append(page)
    assert [p["metadata"]["resourceVersion"] for p in pages] == [rv] * 3
    items = [item for p in pages for item in p["items"]]
    assert names(items) == [f"w{i}" for i in range(8)]
    assert items[6]["spec"]["size"] == 1
    assert "remainingItemCount" not in pages[-1]["metadata"]
    # A fresh list sees the new state.
    _, now = await get_json(session, ns_url(base))
    assert names(now["items"]) == ["w0", "w1", "w2", "w3", "w5", "w6", "w7", "w9"]
    assert int(now["metadata"]["resourceVersion"]) == fake.resource_version


async def test_lists_are_in_kcps_key_order(served: Served, session: Session) -> None:
    """kcp lists in etcd's key order, the bytes of ``<cluster>/<namespace>/<name>`` (kcp
    v0.32.3, tests/e2e/test_list_pushdown_kcp.py): namespace ``ns-x`` before ``ns``, cluster
    ``c1-x`` before ``c1`` — as the fake does, across pages."""
    fake, base = served
    for cluster, ns, name in (("c1", "ns", "a"), ("c1", "ns-x", "a"), ("c1", "ns", "a-b")):
        fake.create(cluster=cluster, obj=widget(name, ns))
    fake.create(cluster="c1-x", obj=widget("z", "ns"))
    expected = ["c1-x/ns/z", "c1/ns-x/a", "c1/ns/a", "c1/ns/a-b"]
    for limit in ("", "1", "2"):
        got: list[str] = []
        token = ""
        while True:
            query = "&".join(q for q in (f"limit={limit}" if limit else "", token) if q)
            status, page = await get_json(session, f"{base}/clusters/*/{WIDGETS}/widgets?{query}")
            assert status == 200, page
            got += [
                f"{i['metadata']['annotations']['kcp.io/cluster']}/{i['metadata']['namespace']}/"
                f"{i['metadata']['name']}"
                for i in page["items"]
            ]
            token = page["metadata"].get("continue", "")
            if not token:
                break
            token = f"continue={token}"
        assert got == expected, (limit, got)


async def test_expired_continue_gives_410_with_an_inconsistent_continue_token(
    session: Session,
) -> None:
    fake = FakeUpstream(history_size=3)
    async with start_fake_upstream(fake) as (_, base):
        for i in range(4):
            fake.create(cluster="c1", obj=widget(f"w{i}"))
        _, first = await get_json(session, ns_url(base) + "?limit=2")
        for i in range(4):
            fake.create(cluster="c1", obj=widget(f"x{i}"))
        token = first["metadata"]["continue"]
        status, body = await get_json(session, ns_url(base) + f"?limit=2&continue={token}")
        assert status == 410
        assert body["reason"] == "Expired"
        assert body["message"].startswith("The provided continue parameter is too old")
        status, rest = await get_json(
            session, ns_url(base) + f"?continue={body['metadata']['continue']}"
        )
        assert status == 200
        assert names(rest["items"]) == ["w2", "w3", "x0", "x1", "x2", "x3"]
        assert int(rest["metadata"]["resourceVersion"]) == fake.resource_version


async def test_resource_version_semantics(served: Served, session: Session) -> None:
    fake, base = served
    for i in range(3):
        fake.create(cluster="c1", obj=widget(f"w{i}"))
    old_rv = fake.resource_version
    fake.create(cluster="c1", obj=widget("w3"))
    # resourceVersion=0 is served from the watch cache, which ignores limit.
    _, any_rv = await get_json(session, ns_url(base) + "?resourceVersion=0&limit=1")
    assert len(any_rv["items"]) == 4
    assert "continue" not in any_rv["metadata"]
    # Exact reads an older snapshot; so does the legacy "resourceVersion + limit".
    for query in (
        f"resourceVersion={old_rv}&resourceVersionMatch=Exact",
        f"resourceVersion={old_rv}&limit=10",
    ):
        _, exact = await get_json(session, ns_url(base) + "?" + query)
        assert names(exact["items"]) == ["w0", "w1", "w2"], query
        assert exact["metadata"]["resourceVersion"] == str(old_rv)
    future = fake.resource_version + 1
    status, body = await get_json(
        session, ns_url(base) + f"?resourceVersion={future}&resourceVersionMatch=Exact"
    )
    assert (status, body["reason"]) == (504, "Timeout")
    assert body["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"
    # NotOlderThan a future version waits for the store to catch up.
    url = ns_url(base) + f"?resourceVersion={future}&resourceVersionMatch=NotOlderThan"
    pending = asyncio.ensure_future(get_json(session, url))
    await asyncio.sleep(0.2)
    assert not pending.done()
    fake.create(cluster="c1", obj=widget("w4"))
    status, fresh = await pending
    assert status == 200
    assert len(fresh["items"]) == 5
    status, body = await get_json(session, ns_url(base) + "?resourceVersionMatch=Exact")
    assert status == 422
    assert body["message"] == (
        'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
        "resourceVersionMatch is forbidden unless resourceVersion is provided"
    )
    _, page = await get_json(session, ns_url(base) + "?limit=1")
    token = page["metadata"]["continue"]
    status, body = await get_json(session, ns_url(base) + f"?continue={token}&resourceVersion=5")
    assert (status, body["message"]) == (
        400,
        "specifying resource version is not allowed when using continue",
    )
    status, body = await get_json(session, ns_url(base) + "?continue=abc")
    assert status == 400
    assert body["message"].startswith("invalid continue token: continue key is not valid")


async def test_selectors_remaining_count_and_bad_input(served: Served, session: Session) -> None:
    fake, base = served
    for i in range(6):
        fake.create(cluster="c1", obj=widget(f"w{i}", env="prod" if i % 2 else "dev"))
    fake.create(cluster="c1", obj=widget("other", ns="ns2", env="prod"))
    _, prod = await get_json(session, ns_url(base) + "?labelSelector=env%3Dprod&limit=2")
    assert names(prod["items"]) == ["w1", "w3"]
    assert "continue" in prod["metadata"]
    assert "remainingItemCount" not in prod["metadata"]  # only for unfiltered lists
    _, by_field = await get_json(
        session,
        f"{base}/clusters/c1/{WIDGETS}/widgets?fieldSelector=metadata.namespace%3Dns2",
    )
    assert names(by_field["items"]) == ["other"]
    _, by_name = await get_json(session, ns_url(base) + "?fieldSelector=metadata.name!%3Dw0")
    assert "w0" not in names(by_name["items"])
    status, body = await get_json(session, ns_url(base) + "?labelSelector=env%20in%20(")
    assert (status, body["reason"]) == (400, "BadRequest")
    status, body = await get_json(session, ns_url(base) + "?fieldSelector=spec.size%3D1")
    assert (status, body["message"]) == (400, "field label not supported: spec.size")


async def test_wildcard_lists_all_clusters_and_rejects_namespaces(
    served: Served, session: Session
) -> None:
    fake, base = served
    fake.create(cluster="c1", obj=widget("a"))
    fake.create(cluster="c2", obj=widget("b", ns="other"))
    _, everything = await get_json(session, f"{base}/clusters/*/{WIDGETS}/widgets")
    clusters = [i["metadata"]["annotations"]["kcp.io/cluster"] for i in everything["items"]]
    assert (names(everything["items"]), clusters) == (["a", "b"], ["c1", "c2"])
    async with session.get(ns_url(base, cluster="*")) as resp:
        assert resp.status == 400
        assert await resp.read() == (
            b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":'
            b'"cross-cluster LIST and WATCH are required to be cross-namespace, not scoped to '
            b'namespace ns","code":400}\n'
        )
    status, body = await send(session, "POST", ns_url(base, cluster="*"), widget("c"))
    assert status == 405
    assert body["message"] == (
        'create is not supported on resources of kind "widgets.example.io" in the `*` logical '
        "cluster"
    )


# --- WATCH ------------------------------------------------------------------------------------


async def test_watch_selector_transitions_like_the_watch_cache(
    served: Served, session: Session
) -> None:
    fake, base = served
    fake.create(cluster="c1", obj=widget("w", env="prod"))
    start = fake.resource_version
    url = f"{base}/clusters/*/{WIDGETS}/widgets?watch=1&labelSelector=env%3Dprod"
    url += f"&resourceVersion={start}"
    async with session.get(url) as resp:
        current = fake.get(cluster="c1", namespace="ns", name="w")
        assert current is not None
        current["metadata"]["labels"] = {"env": "dev"}
        fake.update(cluster="c1", obj=current)
        left = await next_event(resp)
        assert left["type"] == "DELETED"
        assert left["object"]["metadata"]["labels"] == {"env": "prod"}  # previous content
        assert left["object"]["metadata"]["resourceVersion"] == str(fake.resource_version)
        current["metadata"]["labels"] = {"env": "prod"}
        fake.update(cluster="c1", obj=current)
        back = await next_event(resp)
        assert (back["type"], back["object"]["metadata"]["labels"]) == ("ADDED", {"env": "prod"})
        current["spec"]["size"] = 2
        fake.update(cluster="c1", obj=current)
        modified = await next_event(resp)
        assert (modified["type"], modified["object"]["metadata"]["generation"]) == ("MODIFIED", 2)
        fake.create(cluster="c2", obj=widget("ignored", env="dev"))
        fake.delete(cluster="c1", namespace="ns", name="w")
        gone = await next_event(resp)
        assert (gone["type"], gone["object"]["metadata"]["name"]) == ("DELETED", "w")
        assert gone["object"]["metadata"]["resourceVersion"] == str(fake.resource_version)


async def test_watch_list_initial_events_end_with_annotated_bookmark(
    served: Served, session: Session
) -> None:
    fake, base = served
    for i in range(3):
        fake.create(cluster="c1", obj=widget(f"w{i}", env="prod" if i < 2 else "dev"))
    expected_rv = str(fake.resource_version)
    queries = [
        "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
        "allowWatchBookmarks=true",  # WatchList defaulting turns a legacy watch into a watch-list
    ]
    for query in queries:
        url = ns_url(base) + f"?watch=true&labelSelector=env%3Dprod&{query}"
        async with session.get(url) as resp:
            added = [await next_event(resp, bookmarks=True) for _ in range(2)]
            assert [(e["type"], e["object"]["metadata"]["name"]) for e in added] == [
                ("ADDED", "w0"),
                ("ADDED", "w1"),
            ]
            end = await next_event(resp, bookmarks=True)
            assert end == {
                "type": "BOOKMARK",
                "object": {
                    "apiVersion": "example.io/v1alpha1",
                    "kind": "Widget",
                    "metadata": {
                        "annotations": {"k8s.io/initial-events-end": "true"},
                        "resourceVersion": expected_rv,
                    },
                },
            }
            periodic = await next_event(resp, bookmarks=True)
            assert periodic["type"] == "BOOKMARK"
            assert "annotations" not in periodic["object"]["metadata"]


async def test_watch_from_resource_version_replays_or_expires(session: Session) -> None:
    fake = FakeUpstream(history_size=3)
    async with start_fake_upstream(fake) as (_, base):
        fake.create(cluster="c1", obj=widget("w0"))
        start = fake.resource_version
        for i in range(1, 3):
            fake.create(cluster="c1", obj=widget(f"w{i}"))
        async with session.get(ns_url(base) + f"?watch=1&resourceVersion={start}") as resp:
            replayed = [await next_event(resp) for _ in range(2)]
            assert names([e["object"] for e in replayed]) == ["w1", "w2"]
        for i in range(3, 6):
            fake.create(cluster="c1", obj=widget(f"w{i}"))
        async with session.get(ns_url(base) + f"?watch=1&resourceVersion={start}") as resp:
            assert resp.status == 200
            error = json.loads(await resp.content.readline())
            assert error["type"] == "ERROR"
            status = error["object"]
            assert (status["code"], status["reason"]) == (410, "Expired")
            assert status["message"].startswith(f"too old resource version: {start} (")
            assert await resp.content.readline() == b""


async def test_active_watches_follow_client_disconnects(served: Served, session: Session) -> None:
    fake, base = served
    fake.bind(cluster="c1")
    assert fake.active_watches == 0
    async with session.get(ns_url(base) + f"?watch=1&resourceVersion={fake.resource_version}"):
        await asyncio.sleep(0.1)
        assert fake.active_watches == 1
    for _ in range(30):
        if fake.active_watches == 0:
            break
        await asyncio.sleep(0.05)
    assert fake.active_watches == 0


async def test_watch_timeout_seconds_ends_the_stream(served: Served, session: Session) -> None:
    fake, base = served
    fake.bind(cluster="c1")
    began = time.monotonic()
    query = f"?watch=1&timeoutSeconds=1&resourceVersion={fake.resource_version}"
    async with session.get(ns_url(base) + query) as resp:
        assert await resp.read() == b""
    assert 0.9 < time.monotonic() - began < 3


# --- GET and writes ---------------------------------------------------------------------------


async def test_get_and_not_found_body(served: Served, session: Session) -> None:
    fake, base = served
    fake.create(cluster="c1", obj=widget("w"))
    status, obj = await get_json(session, ns_url(base) + "/w")
    assert status == 200
    meta = obj["metadata"]
    assert meta["annotations"]["kcp.io/cluster"] == "c1"
    assert {"uid", "resourceVersion", "generation", "creationTimestamp"} <= meta.keys()
    async with session.get(ns_url(base) + "/missing") as resp:
        assert resp.status == 404
        assert await resp.read() == not_found(
            resource="widgets", group="example.io", name="missing"
        )


async def test_create_update_and_status_strategy(served: Served, session: Session) -> None:
    fake, base = served
    fake.bind(cluster="c1")
    body = widget("w") | {"status": {"ready": True}}
    status, created = await send(session, "POST", ns_url(base), body)
    assert status == 201
    assert "status" not in created  # create cannot set status when /status exists
    assert created["metadata"]["generation"] == 1
    status, again = await send(session, "POST", ns_url(base), body)
    assert (status, again["reason"]) == (409, "AlreadyExists")
    stale = json.loads(json.dumps(created))
    created["metadata"]["labels"] = {"x": "y"}
    status, relabeled = await send(session, "PUT", ns_url(base) + "/w", created)
    assert status == 200
    assert relabeled["metadata"]["generation"] == 1  # metadata-only change
    status, conflict = await send(session, "PUT", ns_url(base) + "/w", stale)
    assert (status, conflict["reason"]) == (409, "Conflict")
    assert conflict["message"].endswith(
        "the object has been modified; please apply your changes to the latest version and "
        "try again"
    )
    no_rv = json.loads(json.dumps(relabeled))
    del no_rv["metadata"]["resourceVersion"]
    status, missing = await send(session, "PUT", ns_url(base) + "/w", no_rv)
    assert (status, missing["reason"]) == (422, "Invalid")
    relabeled["spec"]["size"] = 5
    relabeled["status"] = {"ignored": True}
    status, respec = await send(session, "PUT", ns_url(base) + "/w", relabeled)
    assert (respec["metadata"]["generation"], "status" in respec) == (2, False)
    respec["status"] = {"ready": True}
    respec["metadata"]["labels"] = {"ignored": "on-status"}
    status, with_status = await send(session, "PUT", ns_url(base) + "/w/status", respec)
    assert status == 200
    assert with_status["status"] == {"ready": True}
    assert with_status["metadata"]["labels"] == {"x": "y"}
    assert with_status["metadata"]["generation"] == 2
    status, got = await get_json(session, ns_url(base) + "/w/status")
    assert got["status"] == {"ready": True}


async def test_patch_types(served: Served, session: Session) -> None:
    fake, base = served
    fake.create(cluster="c1", obj=widget("w", a="1"))
    url = ns_url(base) + "/w"
    status, merged = await send(
        session,
        "PATCH",
        url,
        {"metadata": {"labels": {"a": None, "b": "2"}}},
        "application/merge-patch+json",
    )
    assert (status, merged["metadata"]["labels"]) == (200, {"b": "2"})
    ops = [
        {"op": "test", "path": "/spec/size", "value": 1},
        {"op": "replace", "path": "/spec/size", "value": 3},
    ]
    status, patched = await send(session, "PATCH", url, ops, "application/json-patch+json")
    assert (status, patched["spec"]["size"]) == (200, 3)
    async with session.patch(
        url, data=json.dumps(ops).encode(), headers={"Content-Type": "application/json-patch+json"}
    ) as resp:
        assert resp.status == 422
        assert await resp.read() == (
            b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":'
            b'"the server rejected our request due to an error in our request","reason":"Invalid",'
            b'"details":{},"code":422}\n'
        )
    status, body = await send(
        session, "PATCH", url, {"spec": {}}, "application/strategic-merge-patch+json"
    )
    assert (status, body["reason"]) == (415, "UnsupportedMediaType")
    apply_body = (
        b"apiVersion: example.io/v1alpha1\nkind: Widget\nmetadata:\n  name: w\n"
        b"spec:\n  color: red\n"
    )
    status, body = await send(session, "PATCH", url, apply_body, "application/apply-patch+yaml")
    assert (status, body["details"]["causes"][0]["field"]) == (422, "fieldManager")
    status, applied = await send(
        session, "PATCH", url + "?fieldManager=test", apply_body, "application/apply-patch+yaml"
    )
    assert (status, applied["spec"]) == (200, {"size": 3, "color": "red"})
    new = apply_body.replace(b"name: w", b"name: fresh")
    status, created = await send(
        session,
        "PATCH",
        ns_url(base) + "/fresh?fieldManager=test",
        new,
        "application/apply-patch+yaml",
    )
    assert (status, created["metadata"]["name"]) == (201, "fresh")
    status, patched_status = await send(
        session,
        "PATCH",
        url + "/status",
        {"status": {"ok": 1}, "spec": {"size": 9}},
        "application/merge-patch+json",
    )
    assert (patched_status["status"], patched_status["spec"]["size"]) == ({"ok": 1}, 3)


async def test_dry_run_changes_nothing(served: Served, session: Session) -> None:
    fake, base = served
    fake.create(cluster="c1", obj=widget("w"))
    rv = fake.resource_version
    status, created = await send(session, "POST", ns_url(base) + "?dryRun=All", widget("new"))
    assert (status, created["metadata"]["name"]) == (201, "new")
    assert "resourceVersion" not in created["metadata"]
    status, patched = await send(
        session,
        "PATCH",
        ns_url(base) + "/w?dryRun=All",
        {"spec": {"size": 7}},
        "application/merge-patch+json",
    )
    assert (status, patched["spec"]["size"]) == (200, 7)
    async with session.delete(ns_url(base) + "/w?dryRun=All") as resp:
        assert resp.status == 200
    assert fake.resource_version == rv
    assert fake.get(cluster="c1", namespace="ns", name="new") is None
    current = fake.get(cluster="c1", namespace="ns", name="w")
    assert current is not None
    assert current["spec"]["size"] == 1
    status, body = await send(session, "POST", ns_url(base) + "?dryRun=Some", widget("x"))
    assert status == 422
    assert body["message"] == (
        'CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: ["Some"]: '
        'supported values: "All"'
    )


async def test_delete_preconditions_and_finalizers(served: Served, session: Session) -> None:
    fake, base = served
    created = fake.create(
        cluster="c1",
        obj=widget("w") | {"metadata": {"name": "w", "namespace": "ns", "finalizers": ["x/y"]}},
    )
    url = ns_url(base) + "/w"
    status, body = await send(session, "DELETE", url, {"preconditions": {"uid": "nope"}})
    assert (status, body["reason"]) == (409, "Conflict")
    assert "the UID in the precondition (nope) does not match" in body["message"]
    status, body = await send(session, "DELETE", url, {"preconditions": {"resourceVersion": "1"}})
    assert status == 409
    async with session.get(
        ns_url(base) + f"?watch=1&resourceVersion={fake.resource_version}"
    ) as watch:
        status, marked = await send(
            session, "DELETE", url, {"preconditions": {"uid": created["metadata"]["uid"]}}
        )
        assert status == 200
        assert "deletionTimestamp" in marked["metadata"]
        assert marked["metadata"]["generation"] == 2
        assert (await next_event(watch))["type"] == "MODIFIED"
        marked["metadata"]["finalizers"] = []
        status, _ = await send(session, "PUT", url, marked)
        assert status == 200
        gone = await next_event(watch)
        assert gone["type"] == "DELETED"
        assert gone["object"]["metadata"]["finalizers"] == ["x/y"]  # last stored state
    assert fake.get(cluster="c1", namespace="ns", name="w") is None
    fake.create(cluster="c1", obj=widget("plain"))
    status, success = await send(session, "DELETE", ns_url(base) + "/plain")
    assert (status, success["status"], success["details"]["kind"]) == (200, "Success", "widgets")


async def test_delete_collection_honours_label_selector(served: Served, session: Session) -> None:
    fake, base = served
    for i in range(4):
        fake.create(cluster="c1", obj=widget(f"w{i}", env="prod" if i % 2 else "dev"))
    status, deleted = await send(session, "DELETE", ns_url(base) + "?labelSelector=env%3Ddev")
    assert (status, deleted["kind"], names(deleted["items"])) == (200, "WidgetList", ["w0", "w2"])
    _, rest = await get_json(session, ns_url(base))
    assert names(rest["items"]) == ["w1", "w3"]


async def test_apibindings_are_read_only_and_gate_clusters(
    served: Served, session: Session
) -> None:
    fake, base = served
    fake.create(cluster="c1", obj=widget("w"))
    bindings = f"{base}/clusters/*/apis/apis.kcp.io/v1alpha2/apibindings"
    _, listed = await get_json(session, bindings)
    assert [b["metadata"]["annotations"]["kcp.io/cluster"] for b in listed["items"]] == ["c1"]
    status, body = await send(session, "POST", bindings.replace("*", "c1"), {"kind": "APIBinding"})
    assert (status, body["reason"]) == (403, "Forbidden")
    assert body["message"].endswith(
        "write access to APIBinding is not allowed from virtual workspace"
    )
    status, body = await send(session, "DELETE", bindings + "/x")
    assert (status, body["reason"]) == (405, "MethodNotAllowed")
    status, body = await get_json(session, ns_url(base, cluster="unbound"))
    assert (status, body["reason"]) == (403, "Forbidden")
    fake.delete(cluster="c1", namespace="", name="widgets.example.io", resource="apibindings")
    status, _ = await get_json(session, ns_url(base))
    assert status == 403


async def test_discovery(served: Served, session: Session) -> None:
    _, base = served
    _, groups = await get_json(session, f"{base}/clusters/*/apis")
    assert [g["name"] for g in groups["groups"]] == ["example.io", "apis.kcp.io"]
    _, resources = await get_json(session, f"{base}/clusters/c1/{WIDGETS}")
    assert [r["name"] for r in resources["resources"]] == ["widgets", "widgets/status"]
    _, core = await get_json(session, f"{base}/clusters/*/api/v1")
    assert core["resources"] == []
    status, openapi = await get_json(session, f"{base}/clusters/c1/openapi/v3")
    assert status == 200
    assert "apis/example.io/v1alpha1" in openapi["paths"]


# --- negotiation ------------------------------------------------------------------------------


async def test_table_partial_metadata_and_protobuf(served: Served, session: Session) -> None:
    fake, base = served
    fake.create(cluster="c1", obj=widget("w", env="prod"))
    _, table = await get_json(session, ns_url(base), headers={"Accept": TABLE})
    # kcp prints a schema without printer columns with Name only (no defaulted Age column).
    assert (table["kind"], [c["name"] for c in table["columnDefinitions"]]) == ("Table", ["Name"])
    row = table["rows"][0]
    assert row["cells"][0] == "w"
    assert row["object"]["kind"] == "PartialObjectMetadata"  # the apiserver's default
    _, full = await get_json(
        session, ns_url(base) + "?includeObject=Object", headers={"Accept": TABLE}
    )
    assert full["rows"][0]["object"]["spec"] == {"size": 1}
    _, partial = await get_json(session, ns_url(base), headers={"Accept": POML})
    assert partial["kind"] == "PartialObjectMetadataList"
    assert partial["items"][0]["metadata"]["labels"] == {"env": "prod"}
    assert "spec" not in partial["items"][0]
    status, body = await get_json(
        session, ns_url(base), headers={"Accept": "application/vnd.kubernetes.protobuf"}
    )
    assert (status, body["reason"]) == (406, "NotAcceptable")
    status, fallback = await get_json(
        session,
        ns_url(base),
        headers={"Accept": "application/vnd.kubernetes.protobuf, application/json"},
    )
    assert (status, fallback["kind"]) == (200, "WidgetList")
    # On a watch, only the first Table carries column definitions.
    url = ns_url(base) + f"?watch=1&resourceVersion={fake.resource_version}"
    async with session.get(url, headers={"Accept": TABLE}) as resp:
        fake.create(cluster="c1", obj=widget("t1"))
        fake.create(cluster="c1", obj=widget("t2"))
        first, second = await next_event(resp), await next_event(resp)
    assert (first["object"]["kind"], len(first["object"]["columnDefinitions"])) == ("Table", 1)
    assert second["object"]["columnDefinitions"] is None
    assert second["object"]["rows"][0]["cells"][0] == "t2"
    url = ns_url(base) + f"?watch=1&resourceVersion={fake.resource_version}"
    accept = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"
    async with session.get(url, headers={"Accept": accept}) as resp:
        fake.create(cluster="c1", obj=widget("t3"))
        event = await next_event(resp)
    assert (event["object"]["kind"], event["object"]["metadata"]["name"]) == (
        "PartialObjectMetadata",
        "t3",
    )
    assert "spec" not in event["object"]


async def test_gzip_lists(session: Session) -> None:
    fake = FakeUpstream(gzip=True)
    async with start_fake_upstream(fake) as (_, base):
        fake.create(cluster="c1", obj=widget("w"))
        async with aiohttp.ClientSession(auto_decompress=False) as raw_session:
            async with raw_session.get(ns_url(base), headers={"Accept-Encoding": "gzip"}) as resp:
                assert resp.headers["Content-Encoding"] == "gzip"
                listed = json.loads(gzip.decompress(await resp.read()))
                assert names(listed["items"]) == ["w"]
            async with raw_session.get(
                ns_url(base), headers={"Accept-Encoding": "identity"}
            ) as resp:
                assert "Content-Encoding" not in resp.headers
                assert json.loads(await resp.read())["kind"] == "WidgetList"


# --- faults -----------------------------------------------------------------------------------


async def test_fault_switches(served: Served, session: Session) -> None:
    fake, base = served
    fake.create(cluster="c1", obj=widget("w0", env="prod"))
    fake.create(cluster="c1", obj=widget("w1", env="dev"))
    faults = fake.faults
    faults.status_code = 503
    async with session.get(ns_url(base)) as resp:
        assert (resp.status, resp.headers["Retry-After"]) == (503, "1")
        assert (await resp.json())["reason"] == "ServiceUnavailable"
    faults.reset()
    faults.delay = 0.3
    began = time.monotonic()
    await get_json(session, ns_url(base))
    assert time.monotonic() - began >= 0.3
    faults.reset()
    faults.unreachable = True
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await get_json(session, ns_url(base))
    faults.reset()
    faults.garbage = True
    async with session.get(ns_url(base)) as resp:
        with pytest.raises(json.JSONDecodeError):
            json.loads(await resp.read())
    faults.reset()
    faults.ignore_selectors = True
    _, unfiltered = await get_json(session, ns_url(base) + "?labelSelector=env%3Dprod")
    assert names(unfiltered["items"]) == ["w0", "w1"]
    faults.reset()
    await get_json(session, ns_url(base) + "?limit=5", headers={"X-Probe": "yes"})
    (recorded,) = faults.requests
    assert (recorded.method, recorded.query, recorded.headers["x-probe"]) == (
        "GET",
        {"limit": "5"},
        "yes",
    )
    assert recorded.path.endswith("/clusters/c1/apis/example.io/v1alpha1/namespaces/ns/widgets")


async def test_watch_faults(served: Served, session: Session) -> None:
    fake, base = served
    fake.create(cluster="c1", obj=widget("w0"))
    fake.faults.die_mid_watch_after = 2
    async with session.get(ns_url(base) + "?watch=1&resourceVersion=1") as resp:
        first = await next_event(resp)
        fake.create(cluster="c1", obj=widget("w1"))
        fake.create(cluster="c1", obj=widget("w2"))
        second = await next_event(resp)
        assert names([first["object"], second["object"]]) == ["w0", "w1"]
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.content.read()
    fake.faults.reset()
    async with session.get(
        ns_url(base) + f"?watch=1&resourceVersion={fake.resource_version}"
    ) as resp:
        fake.create(cluster="c1", obj=widget("w3"))
        assert (await next_event(resp))["object"]["metadata"]["name"] == "w3"
        fake.faults.garbage = True
        fake.create(cluster="c1", obj=widget("w4"))
        line = await resp.content.readline()
        with pytest.raises(json.JSONDecodeError):
            json.loads(line)


# --- scale, TLS and the CLI -------------------------------------------------------------------


async def test_bulk_load_streams_large_lists_and_watch_lists(session: Session) -> None:
    fake = FakeUpstream(resources=[ResourceSpec()])
    by_cluster = demo_objects(6000, clusters=2, namespaces=3)
    for cluster, objects in by_cluster.items():
        fake.bulk_load(cluster=cluster, objects=objects)
    assert fake.get(cluster="cluster-1", namespace="ns-0", name="widget-000001") is not None
    with pytest.raises(FakeApiError):
        fake.bulk_load(cluster="cluster-0", objects=by_cluster["cluster-0"][:1])
    async with start_fake_upstream(fake) as (_, base):
        _, listed = await get_json(session, f"{base}/clusters/*/{WIDGETS}/widgets")
        assert len(listed["items"]) == 6000
        keys = [
            (
                i["metadata"]["annotations"]["kcp.io/cluster"],
                i["metadata"]["namespace"],
                i["metadata"]["name"],
            )
            for i in listed["items"]
        ]
        assert keys == sorted(keys)
        _, prod = await get_json(
            session, f"{base}/clusters/*/{WIDGETS}/widgets?labelSelector=env%3Dprod%2Cregion%3Deu"
        )
        assert len(prod["items"]) == 1500
        url = f"{base}/clusters/cluster-0/{WIDGETS}/widgets?watch=1&allowWatchBookmarks=1"
        async with session.get(url) as resp:
            types = [(await next_event(resp, bookmarks=True))["type"] for _ in range(3001)]
            assert types.count("ADDED") == 3000
            assert types[-1] == "BOOKMARK"


async def test_tls(session: Session) -> None:
    authority = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    authority.configure_trust(client_context)
    async with start_fake_upstream(ssl_context=server_context) as (fake, base):
        assert base.startswith("https://127.0.0.1:")
        assert base.endswith(fake.base_path)
        status, groups = await get_json(session, f"{base}/clusters/*/apis", ssl=client_context)
        assert (status, groups["kind"]) == (200, "APIGroupList")


async def test_module_entry_point_serves_a_preloaded_store(session: Session) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fakekcp.upstream",
        "--objects",
        "40",
        "--port",
        "0",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(10):
            base = (await process.stdout.readline()).decode().strip()
        _, listed = await get_json(
            session, f"{base}/clusters/*/{WIDGETS}/widgets?labelSelector=env%3Dprod"
        )
        assert len(listed["items"]) == 20
        assert {i["metadata"]["labels"]["region"] for i in listed["items"]} == {"eu", "us"}
    finally:
        process.terminate()
        await process.wait()
