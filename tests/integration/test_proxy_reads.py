"""LIST, GET, WATCH and pass-through reads through vwserver against the fake upstream."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from tests.integration.conftest import PROXY_TOKEN, Env, widget
from tests.support.serve import NO_AUTH, serve_app
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.proxy import filtering
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Route, Routes, RouteTable
from vwserver.selector import Selector
from vwserver.server import build_app

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
PARTIAL = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"


def names(doc: dict[str, Any]) -> list[str]:
    return sorted(
        f"{i['metadata']['annotations']['kcp.io/cluster']}/{i['metadata']['name']}"
        for i in doc["items"]
    )


async def next_event(resp: aiohttp.ClientResponse, timeout: float = 5.0) -> dict[str, Any]:
    line = await asyncio.wait_for(resp.content.readline(), timeout)
    assert line, "watch stream ended"
    event: dict[str, Any] = json.loads(line)
    return event


async def test_wildcard_list_shows_only_the_slice(env: Env) -> None:
    status, doc = await env.get_json(env.widgets(cluster="*", ns=None))
    assert status == 200
    assert doc["kind"] == "WidgetList"
    assert names(doc) == ["c1/w0", "c1/w2", "c1/w4", "c2/w0", "c2/w2", "c2/w4"]
    assert doc["metadata"]["resourceVersion"]
    assert "continue" not in doc["metadata"]


async def test_unpaged_list_is_one_upstream_request_with_the_selector(env: Env) -> None:
    env.fake.faults.requests.clear()
    status, doc = await env.get_json(env.widgets(cluster="c1", ns=None))
    assert status == 200
    assert names(doc) == ["c1/w0", "c1/w2", "c1/w4"]
    lists = [r for r in env.fake.faults.requests if r.method == "GET"]
    # an unpaged LIST is kcp's whole answer, streamed: one request, no limit, the selector
    assert len(lists) == 1
    assert lists[0].query.get("labelSelector") == "env=prod"
    assert "limit" not in lists[0].query
    assert "continue" not in lists[0].query


async def test_unpaged_list_streamed_in_batches_is_whole_and_in_order(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches smaller than one object: every entry is split off on its own."""
    monkeypatch.setattr(filtering, "STREAM_BATCH", 1)
    env.fake.faults.requests.clear()
    status, doc = await env.get_json(env.widgets(cluster="*", ns=None))
    assert status == 200
    assert names(doc) == ["c1/w0", "c1/w2", "c1/w4", "c2/w0", "c2/w2", "c2/w4"]
    assert doc["kind"] == "WidgetList"
    assert doc["apiVersion"] == "example.io/v1alpha1"
    assert doc["metadata"]["resourceVersion"]
    assert "continue" not in doc["metadata"]
    assert len([r for r in env.fake.faults.requests if r.method == "GET"]) == 1


async def test_proxy_paged_yaml_list_doubles_its_upstream_pages(env: Env) -> None:
    env.fake.faults.requests.clear()
    async with env.session.get(
        env.widgets(cluster="*", ns=None), headers={"Accept": "application/yaml"}
    ) as r:
        assert r.status == 200
        doc = yaml.safe_load(await r.read())
    assert len(doc["items"]) == 6
    lists = [r for r in env.fake.faults.requests if r.method == "GET"]
    # a YAML answer is written from pages the proxy reads (page size 2, 6 matching objects:
    # 2, then 4: each page's small objects fit the byte bound)
    assert [r.query.get("limit") for r in lists] == ["2", "4"]
    assert "continue" in lists[1].query


async def test_client_paging_is_honoured(env: Env) -> None:
    url = env.widgets(cluster="*", ns=None)
    seen: list[str] = []
    status, doc = await env.get_json(url, params={"limit": "4"})
    assert status == 200
    assert len(doc["items"]) == 4
    token = doc["metadata"]["continue"]
    seen += names(doc)
    status, doc = await env.get_json(url, params={"limit": "4", "continue": token})
    assert status == 200
    seen += names(doc)
    assert "continue" not in doc["metadata"]
    assert sorted(seen) == ["c1/w0", "c1/w2", "c1/w4", "c2/w0", "c2/w2", "c2/w4"]


async def test_continue_without_a_limit_is_the_rest_of_the_list(env: Env) -> None:
    url = env.widgets(cluster="*", ns=None)
    status, doc = await env.get_json(url, params={"limit": "2"})
    assert status == 200
    first = names(doc)
    status, doc = await env.get_json(url, params={"continue": doc["metadata"]["continue"]})
    assert status == 200
    assert first + names(doc) == ["c1/w0", "c1/w2", "c1/w4", "c2/w0", "c2/w2", "c2/w4"]
    assert "continue" not in doc["metadata"]


async def test_client_selector_is_combined(env: Env) -> None:
    status, doc = await env.get_json(
        env.widgets(cluster="*", ns=None), params={"labelSelector": "region=us"}
    )
    assert status == 200
    assert names(doc) == ["c1/w2", "c2/w2"]
    # a client selector cannot widen the slice
    status, doc = await env.get_json(
        env.widgets(cluster="*", ns=None), params={"labelSelector": "env=dev"}
    )
    assert status == 200 and doc["items"] == []


async def test_malformed_client_selector_is_a_400_status(env: Env) -> None:
    status, doc = await env.get_json(
        env.widgets(cluster="*", ns=None), params={"labelSelector": "env in prod"}
    )
    assert status == 400
    assert doc["kind"] == "Status" and doc["reason"] == "BadRequest"
    assert "labelSelector" in doc["message"]


async def test_list_is_checked_even_when_upstream_does_not_filter(env: Env) -> None:
    env.fake.faults.ignore_selectors = True
    status, doc = await env.get_json(env.widgets(cluster="*", ns=None))
    assert status == 200
    assert names(doc) == ["c1/w0", "c1/w2", "c1/w4", "c2/w0", "c2/w2", "c2/w4"]
    status, doc = await env.get_json(
        env.widgets(name="eu-not-dev", cluster="*", ns=None), params={"limit": "100"}
    )
    assert names(doc) == ["c1/w0", "c1/w4", "c2/w0", "c2/w4"]


async def test_table_and_partial_metadata_lists(env: Env) -> None:
    env.fake.faults.ignore_selectors = True
    status, doc = await env.get_json(env.widgets(cluster="c1", ns=None), headers={"Accept": TABLE})
    assert status == 200
    assert doc["kind"] == "Table"
    assert doc["columnDefinitions"]
    assert sorted(r["object"]["metadata"]["name"] for r in doc["rows"]) == ["w0", "w2", "w4"]
    status, doc = await env.get_json(
        env.widgets(cluster="c1", ns=None), headers={"Accept": PARTIAL}
    )
    assert status == 200
    assert doc["kind"] == "PartialObjectMetadataList"
    assert sorted(i["metadata"]["name"] for i in doc["items"]) == ["w0", "w2", "w4"]
    assert all("spec" not in i for i in doc["items"])


async def test_gzip_to_clients_that_accept_it(env: Env) -> None:
    async with env.session.get(
        env.widgets(cluster="*", ns=None),
        headers={"Accept-Encoding": "gzip"},
        auto_decompress=False,
    ) as r:
        assert r.status == 200
        assert r.headers.get("Content-Encoding") == "gzip"
        doc = json.loads(gzip.decompress(await r.read()))
    assert len(doc["items"]) == 6


async def test_protobuf_is_asked_upstream_as_json(env: Env) -> None:
    env.fake.faults.requests.clear()
    status, doc = await env.get_json(
        env.widgets(cluster="c1", ns=None),
        headers={"Accept": "application/vnd.kubernetes.protobuf,application/json"},
    )
    assert status == 200 and len(doc["items"]) == 3
    accepts = {r.headers.get("Accept") for r in env.fake.faults.requests}
    assert accepts == {"application/json"}


async def test_get_of_invisible_object_is_byte_identical_to_missing(env: Env) -> None:
    async with env.session.get(env.widgets() + "/w1") as invisible:  # exists, env=dev
        body_invisible = await invisible.read()
        headers_invisible = dict(invisible.headers)
    env.fake.delete(cluster="c1", namespace="ns1", name="w1")
    async with env.session.get(env.widgets() + "/w1") as missing:
        body_missing = await missing.read()
        headers_missing = dict(missing.headers)
    assert invisible.status == missing.status == 404
    assert body_invisible == body_missing
    for h in (headers_invisible, headers_missing):
        h.pop("Date", None)
    assert headers_invisible == headers_missing
    doc = json.loads(body_missing)
    assert doc["reason"] == "NotFound"
    assert doc["message"] == 'widgets.example.io "w1" not found'


async def test_get_of_visible_object_and_table(env: Env) -> None:
    status, doc = await env.get_json(env.widgets() + "/w0")
    assert status == 200 and doc["metadata"]["name"] == "w0"
    status, doc = await env.get_json(env.widgets() + "/w0", headers={"Accept": TABLE})
    assert status == 200 and doc["kind"] == "Table"
    status, doc = await env.get_json(env.widgets() + "/w1", headers={"Accept": TABLE})
    assert status == 404
    status, doc = await env.get_json(env.widgets() + "/w0/status")
    assert status == 200
    status, doc = await env.get_json(env.widgets() + "/w1/status")
    assert status == 404


async def test_watch_streams_transitions_and_never_leaks(env: Env) -> None:
    url = env.widgets(cluster="*", ns=None)
    status, doc = await env.get_json(url)
    rv = doc["metadata"]["resourceVersion"]
    async with env.session.get(url, params={"watch": "1", "resourceVersion": rv}) as w:
        assert w.status == 200
        obj = env.fake.get(cluster="c1", namespace="ns1", name="w0")
        assert obj is not None
        obj["metadata"]["labels"]["env"] = "dev"
        env.fake.update(cluster="c1", obj=obj)
        out = await next_event(w)
        assert out["type"] == "DELETED"
        assert out["object"]["metadata"]["name"] == "w0"
        obj["metadata"]["labels"]["env"] = "prod"
        env.fake.update(cluster="c1", obj=obj)
        back = await next_event(w)
        assert back["type"] == "ADDED" and back["object"]["metadata"]["name"] == "w0"
        # a change to an object outside the slice produces nothing
        other = env.fake.get(cluster="c1", namespace="ns1", name="w1")
        assert other is not None
        other["spec"]["size"] = 99
        env.fake.update(cluster="c1", obj=other)
        env.fake.create(cluster="c2", obj=widget("new", env="prod"))
        added = await next_event(w)
        assert added["type"] == "ADDED" and added["object"]["metadata"]["name"] == "new"


async def test_watch_synthesizes_minimal_deleted_when_upstream_does_not_filter(env: Env) -> None:
    env.fake.faults.ignore_selectors = True
    url = env.widgets(cluster="c1", ns=None)
    status, doc = await env.get_json(url)
    rv = doc["metadata"]["resourceVersion"]
    async with env.session.get(url, params={"watch": "1", "resourceVersion": rv}) as w:
        obj = env.fake.get(cluster="c1", namespace="ns1", name="w0")
        assert obj is not None
        obj["metadata"]["labels"]["env"] = "dev"
        env.fake.update(cluster="c1", obj=obj)
        out = await next_event(w)
        assert out["type"] == "DELETED"
        assert set(out["object"]) == {"apiVersion", "kind", "metadata"}
        assert set(out["object"]["metadata"]) <= {
            "name",
            "namespace",
            "uid",
            "resourceVersion",
            "annotations",
        }
        assert "labels" not in out["object"]["metadata"]
        # an object that never matched: an ADDED for it is not sent
        env.fake.create(cluster="c1", obj=widget("devonly", env="dev"))
        env.fake.create(cluster="c1", obj=widget("marker", env="prod"))
        marker = await next_event(w)
        assert marker["object"]["metadata"]["name"] == "marker"


async def test_watch_initial_events_and_bookmarks_pass(env: Env) -> None:
    params = {
        "watch": "1",
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
    }
    async with env.session.get(env.widgets(cluster="*", ns=None), params=params) as w:
        assert w.status == 200
        added = []
        while True:
            event = await next_event(w)
            if event["type"] == "BOOKMARK":
                annotations = event["object"]["metadata"].get("annotations", {})
                assert annotations.get("k8s.io/initial-events-end") == "true"
                break
            assert event["type"] == "ADDED"
            added.append(event["object"]["metadata"]["name"])
        assert sorted(added) == ["w0", "w0", "w2", "w2", "w4", "w4"]


async def test_watch_too_old_resource_version_passes_410(env: Env) -> None:
    obj = env.fake.get(cluster="c1", namespace="ns1", name="w0")
    assert obj is not None
    for i in range(30):  # push resourceVersion 1 out of the fake's 20-event history
        obj["spec"]["size"] = i
        env.fake.update(cluster="c1", obj=obj)
    async with env.session.get(
        env.widgets(cluster="*", ns=None), params={"watch": "1", "resourceVersion": "1"}
    ) as w:
        if w.status == 410:  # some servers answer the request itself with 410
            return
        event = await next_event(w)
        assert event["type"] == "ERROR"
        assert event["object"]["code"] == 410


async def test_watch_ends_cleanly_when_upstream_dies(env: Env) -> None:
    env.fake.faults.die_mid_watch_after = 1
    url = env.widgets(cluster="*", ns=None)
    status, doc = await env.get_json(url)
    async with env.session.get(
        url, params={"watch": "1", "resourceVersion": doc["metadata"]["resourceVersion"]}
    ) as w:
        env.fake.create(cluster="c1", obj=widget("x1", env="prod"))
        env.fake.create(cluster="c1", obj=widget("x2", env="prod"))
        first = await next_event(w)
        assert first["object"]["metadata"]["name"] == "x1"
        assert await asyncio.wait_for(w.content.readline(), 5) == b""


async def test_watch_ends_on_garbage(env: Env) -> None:
    env.fake.faults.garbage = True
    url = env.widgets(cluster="*", ns=None)
    async with env.session.get(url, params={"watch": "1", "resourceVersion": "10"}) as w:
        env.fake.create(cluster="c1", obj=widget("x1", env="prod"))
        while line := await asyncio.wait_for(w.content.readline(), 5):
            json.loads(line)  # whatever arrives is valid JSON; then the stream ends


async def test_client_disconnect_closes_the_upstream_watch(env: Env) -> None:
    url = env.widgets(cluster="*", ns=None)
    async with env.session.get(url, params={"watch": "1"}) as w:
        assert w.status == 200
        await asyncio.sleep(0.2)
        assert env.fake.active_watches == 1
    for _ in range(50):
        if env.fake.active_watches == 0:
            break
        await asyncio.sleep(0.1)
    assert env.fake.active_watches == 0


async def test_large_object_through_watch(env: Env) -> None:
    url = env.widgets(cluster="c1", ns=None)
    _, doc = await env.get_json(url)
    rv = doc["metadata"]["resourceVersion"]
    async with env.session.get(url, params={"watch": "1", "resourceVersion": rv}) as w:
        big = widget("big", env="prod")
        big["spec"]["blob"] = "x" * (3 * 2**20 - 1024)
        env.fake.create(cluster="c1", obj=big)
        event = await next_event(w, timeout=10)
        assert event["object"]["metadata"]["name"] == "big"
        assert len(event["object"]["spec"]["blob"]) == 3 * 2**20 - 1024


async def test_discovery_and_apibindings_pass_through(env: Env) -> None:
    for path in ("/api", "/apis", "/apis/example.io", "/apis/example.io/v1alpha1"):
        status, doc = await env.get_json(env.slice_url(cluster="c1") + path)
        assert status == 200, path
    status, doc = await env.get_json(
        env.slice_url(cluster="*") + "/apis/apis.kcp.io/v1alpha2/apibindings"
    )
    assert status == 200 and doc["kind"] == "APIBindingList"
    async with env.session.post(
        env.slice_url(cluster="c1") + "/apis/apis.kcp.io/v1alpha2/apibindings", json={}
    ) as r:
        assert r.status == 403
        assert (await r.json())["reason"] == "Forbidden"


async def test_client_credentials_and_hop_by_hop_headers_never_reach_upstream(env: Env) -> None:
    # (Impersonate-* and X-Remote-* are refused: tests/security/test_impersonation.py)
    env.fake.faults.requests.clear()
    headers = {
        "Authorization": "Bearer client-token",
        "Connection": "keep-alive, X-Custom",
        "X-Custom": "hop",
        "Proxy-Authorization": "Basic eA==",
    }
    status, _ = await env.get_json(env.widgets(), headers=headers)
    assert status == 200
    for request in env.fake.faults.requests:
        sent = {k.lower(): v for k, v in request.headers.items()}
        assert sent.get("authorization") == f"Bearer {PROXY_TOKEN}"
        assert "x-custom" not in sent and "proxy-authorization" not in sent


async def test_unknown_and_not_ready_slices(env: Env) -> None:
    status, doc = await env.get_json(env.widgets(name="nope"))
    assert status == 404 and doc["kind"] == "Status" and "nope" in doc["message"]
    async with env.session.get(env.widgets(name="broken")) as r:
        assert r.status == 503
        assert r.headers["Retry-After"]
        doc = await r.json()
        assert "not found" in doc["message"] and doc["reason"] == "ServiceUnavailable"


async def test_bad_paths_never_reach_upstream(env: Env) -> None:
    env.fake.faults.requests.clear()
    base = env.slice_url(cluster="c1")
    for tail in (
        "/apis/example.io/v1alpha1/namespaces/%2e%2e/widgets",
        "/apis/example.io/v1alpha1/namespaces/a%2Fb/widgets",
        "/apis/example.io/v1alpha1//widgets",
    ):
        async with env.session.get(aiohttp.client.URL(base + tail, encoded=True)) as r:
            assert r.status == 400, tail
            assert (await r.json())["kind"] == "Status"
    async with env.session.get(
        aiohttp.client.URL(
            env.proxy_base + "/services/filtered-apiexport/slicews/prod/clusters/root:x/api",
            encoded=True,
        )
    ) as r:
        assert r.status == 400
    assert env.fake.faults.requests == []


async def test_upstream_unreachable_is_503_with_retry_after(env: Env) -> None:
    env.fake.faults.unreachable = True
    async with env.session.get(env.widgets()) as r:
        assert r.status == 503
        assert r.headers["Retry-After"] == "1"
        assert (await r.json())["kind"] == "Status"


async def test_health_endpoints(env: Env) -> None:
    for path in ("/healthz", "/livez", "/readyz"):
        async with env.session.get(env.proxy_base + path) as r:
            assert r.status == 200


async def test_undecodable_upstream_list_is_502(env: Env) -> None:
    env.fake.faults.garbage = True
    async with env.session.get(env.widgets(cluster="*", ns=None)) as r:
        assert r.status == 502
        doc = await r.json()
        assert doc["kind"] == "Status"
        assert "undecodable" in doc["message"]


async def test_upstream_errors_are_relayed(env: Env) -> None:
    env.fake.faults.status_code = 500
    async with env.session.get(env.widgets(cluster="*", ns=None)) as r:
        assert r.status == 500
        assert (await r.json())["kind"] == "Status"


@pytest.mark.parametrize("shown", [True, False], ids=["after-an-entry", "before-any-entry"])
async def test_list_broken_mid_stream_is_not_a_short_list(shown: bool) -> None:
    """A later page failing (here: 410 Expired) must break the response, never end it as a valid
    but shorter list. A tiny scripted upstream makes the failure deterministic; it pages the
    answer (a continue token) although the proxy asked for the whole list. Before any entry
    went out (the first page's object is outside the request's cluster) the response has not
    begun: the client gets the 502."""
    first = widget("a", env="prod")
    if shown:
        first["metadata"]["annotations"] = {"kcp.io/cluster": "c1"}
    page1 = {
        "apiVersion": "example.io/v1alpha1",
        "kind": "WidgetList",
        "metadata": {"resourceVersion": "5", "continue": "next"},
        "items": [first],
    }

    async def handler(request: web.Request) -> web.Response:
        if "continue" not in request.query:
            return web.json_response(page1)
        return web.json_response({"kind": "Status", "code": 410, "reason": "Expired"}, status=410)

    upstream = web.Application()
    upstream.router.add_get("/{tail:.*}", handler)
    async with serve_app(upstream) as up_base:
        route = Route(
            cluster="s", name="prod", selector=Selector.parse("env=prod"), upstream_url=up_base
        )
        app = build_app(
            routes=Routes(RouteTable([route])),
            upstream=UpstreamClient(auth=ClientAuth(server=up_base)),
            page_size=1,
            guard=NO_AUTH,
        )
        async with serve_app(app) as proxy, aiohttp.ClientSession() as session:
            url = (
                f"{proxy}/services/filtered-apiexport/s/prod/clusters/c1/apis/example.io/v1/widgets"
            )
            async with session.get(url) as r:
                if not shown:
                    assert r.status == 502
                    return
                assert r.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    await r.read()


async def test_slow_watch_client_slows_the_upstream_read(env: Env) -> None:
    """A client that stops reading must not make the proxy buffer the stream: the proxy stops
    reading upstream, so the events back up at the upstream (issue #2 §3), and none is lost."""
    url = env.widgets(cluster="c1", ns=None)
    _, doc = await env.get_json(url)
    rv = doc["metadata"]["resourceVersion"]
    count, blob = 600, "x" * 100_000  # ~60 MB: far more than the sockets between can hold
    # a client with small read buffers, so that what is in flight is mostly socket buffers
    async with (
        aiohttp.ClientSession(read_bufsize=2**17) as client,
        client.get(url, params={"watch": "1", "resourceVersion": rv}) as w,
    ):
        assert w.status == 200
        for i in range(count):
            big = widget(f"big-{i}", env="prod")
            big["spec"]["blob"] = blob
            env.fake.create(cluster="c1", obj=big)
        await asyncio.sleep(1.0)  # let everything flow that can flow
        # Without backpressure the proxy would take everything and the upstream's backlog
        # would be ~0; with it, most of the 60 MB waits at the upstream.
        backlog = env.fake.watch_write_backlog
        assert backlog > 20_000_000, f"only {backlog} bytes held back upstream"
        names = [
            (await next_event(w, timeout=20))["object"]["metadata"]["name"] for _ in range(count)
        ]
    assert names == [f"big-{i}" for i in range(count)]
