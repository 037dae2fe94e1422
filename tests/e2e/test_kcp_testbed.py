"""What real kcp's APIExport virtual workspace does, recorded as tests (vwserver not involved).

vwserver sits in front of this virtual workspace and must reproduce its wire behaviour: the
watch events a label change produces, its error bodies, its wildcard rules, WatchList bookmarks.
The field notes describe these from kcp's sources; these tests pin down what a running kcp
actually emits, so that a kcp upgrade that changes any of it fails here first, and so that the
proxy's own tests can assert "same as kcp" with confidence. Each test's docstring states the
observation. Clients: kubectl and plain aiohttp, directly on the VW URL from the
APIExportEndpointSlice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devenv.bootstrap import SAMPLE_NAMESPACES, Bootstrap, SampleWidget, Workspace
from devenv.kcp import KcpError, KcpInstance, start_kcp

Observe = Callable[[str], None]

EVENT_TIMEOUT = 15.0  # seconds to wait for one expected watch event


# --------------------------------------------------------------------------------------------
# Helpers


def collection_url(world: Bootstrap, cluster: str, namespace: str | None = None) -> str:
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"{world.vw_url}/clusters/{cluster}/{world.api_path}{ns}/{world.resource}"


def object_url(world: Bootstrap, ws: Workspace, namespace: str, name: str) -> str:
    return f"{collection_url(world, ws.cluster, namespace)}/{name}"


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return (meta["annotations"]["kcp.io/cluster"], meta["namespace"], meta["name"])


def sample_key(w: SampleWidget) -> tuple[str, str, str]:
    return (w.cluster, w.namespace, w.name)


def samples(objects: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """The sorted keys of the objects in the sample namespaces (other tests of the session
    create objects in namespaces of their own)."""
    return sorted(k for k in map(key, objects) if k[1] in SAMPLE_NAMESPACES)


class WatchStream:
    """Newline-delimited watch events from one streaming response."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def next(self, *, within: float = EVENT_TIMEOUT) -> dict[str, Any]:
        async with asyncio.timeout(within):
            line = await self.response.content.readline()
        assert line, "the watch ended unexpectedly"
        event: dict[str, Any] = json.loads(line)
        return event


@contextlib.asynccontextmanager
async def open_watch(
    session: aiohttp.ClientSession, url: str, **params: str
) -> AsyncIterator[WatchStream]:
    # No total timeout on the stream itself: each read is bounded by WatchStream.next, and
    # timeoutSeconds makes kcp end the watch even if this test is stuck.
    params = {"watch": "true", "timeoutSeconds": "60", **params}
    async with session.get(url, params=params, timeout=aiohttp.ClientTimeout(total=None)) as resp:
        assert resp.status == 200, await resp.text()
        yield WatchStream(resp)


async def json_request(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    body: Any = None,
    content_type: str = "application/json",
    params: dict[str, str] | None = None,
    expect: int = 200,
) -> dict[str, Any]:
    data = json.dumps(body) if body is not None else None
    headers = {"Content-Type": content_type} if body is not None else {}
    async with session.request(method, url, data=data, headers=headers, params=params) as resp:
        text = await resp.text()
        assert resp.status == expect, f"{method} {url} -> {resp.status}: {text}"
        result: dict[str, Any] = json.loads(text)
        return result


async def merge_patch(session: aiohttp.ClientSession, url: str, patch: Any) -> dict[str, Any]:
    return await json_request(
        session, "PATCH", url, body=patch, content_type="application/merge-patch+json"
    )


def summary(event: dict[str, Any]) -> str:
    meta = event["object"]["metadata"]
    return (
        f"{event['type']} {meta.get('name')} rv={meta.get('resourceVersion')} "
        f"labels={meta.get('labels')} spec={event['object'].get('spec')}"
    )


# --------------------------------------------------------------------------------------------
# The world itself


async def test_bootstrap_world(kcp: KcpInstance, world: Bootstrap, observe: Observe) -> None:
    """The endpoint slice publishes ``<shard>/services/apiexport/<provider cluster ID>/<export>``:
    the provider segment is a logical-cluster ID, not a workspace path."""
    observe(f"kcp ready after {kcp.ready_seconds}s; bootstrap {world.duration:.1f}s")
    observe(world.describe())
    clusters = {world.provider.cluster, *(ws.cluster for ws in world.consumers)}
    assert len(clusters) == 3
    assert all(c and ":" not in c for c in clusters)
    assert world.vw_urls == (
        f"{kcp.url}/services/apiexport/{world.provider.cluster}/{world.export_name}",
    )
    assert len(world.widgets) == 16
    assert set(world.tokens) == {"alice", "bob"}


async def test_kubectl_lists_widgets_across_and_per_cluster(
    kcp: KcpInstance, world: Bootstrap, observe: Observe
) -> None:
    """kubectl works directly on the VW (discovery under ``clusters/*`` lists ``widgets`` and the
    read-only ``apibindings``). The wildcard list returns the objects of every bound workspace,
    each with its ``kcp.io/cluster`` annotation; a label selector is applied server-side."""
    wildcard = f"{world.vw_url}/clusters/*"
    out = await kcp.kubectl("get", "widgets", "-A", "-o", "json", server=wildcard)
    items = [
        i
        for i in json.loads(out.stdout)["items"]
        if i["metadata"]["namespace"] in SAMPLE_NAMESPACES
    ]
    assert samples(items) == sorted(sample_key(w) for w in world.widgets)
    for item in items:
        sample = next(w for w in world.widgets if sample_key(w) == key(item))
        assert {k: item["metadata"]["labels"][k] for k in ("env", "region")} == sample.labels

    out = await kcp.kubectl("get", "widgets", "-A", "-l", "env=prod", "-o", "json", server=wildcard)
    prod = samples(json.loads(out.stdout)["items"])
    assert prod == sorted(sample_key(w) for w in world.widgets if w.labels["env"] == "prod")

    for ws in world.consumers:
        server = f"{world.vw_url}/clusters/{ws.cluster}"
        out = await kcp.kubectl("get", "widgets", "-A", "-o", "json", server=server)
        mine = samples(json.loads(out.stdout)["items"])
        assert mine == sorted(sample_key(w) for w in world.widgets if w.cluster == ws.cluster)

    out = await kcp.kubectl("api-resources", "-o", "name", server=wildcard, check=False)
    observe(f"api-resources on clusters/*: {out.stdout.split()} (stderr: {out.stderr.strip()})")
    assert {"widgets.example.io", "apibindings.apis.kcp.io"} <= set(out.stdout.split())


async def test_only_users_with_apiexport_content_get_in(kcp: KcpInstance, world: Bootstrap) -> None:
    """The demo grants ``apiexports/content`` to no user (slice users must not have it): alice
    and bob get 403 Forbidden, on the wildcard and per cluster; kcp-admin may list."""
    urls = [collection_url(world, "*"), collection_url(world, world.consumers[0].cluster)]
    for user, expected in (("alice", 403), ("bob", 403), (None, 200)):
        token = world.tokens[user] if user else None
        async with kcp.http_session(token=token) as session:
            for url in urls:
                async with session.get(url) as resp:
                    assert resp.status == expected, (user, url, await resp.text())


# --------------------------------------------------------------------------------------------
# Watch semantics


@pytest.mark.parametrize("scope", ["wildcard", "cluster"])
async def test_label_selector_watch_on_label_change(
    kcp: KcpInstance, world: Bootstrap, observe: Observe, scope: str
) -> None:
    """A watch with ``labelSelector=env=prod`` while one object's label changes (observed on kcp
    v0.32.3, the same on ``clusters/*`` and on one cluster):

    * prod -> dev: **DELETED**, carrying the *previous* content (``env=prod``, old spec) with the
      *new* resourceVersion (that of the update that made it stop matching);
    * a change while dev: **no event**;
    * dev -> prod: **ADDED** with the new content and new resourceVersion;
    * a change while prod: MODIFIED (new content, new resourceVersion);
    * DELETE while prod: DELETED with the last content; its resourceVersion is the deletion's
      (newer than the last update). The DELETE response itself is a ``Status`` (Success), not
      the object.

    That is plain Kubernetes semantics: kcp's fork does not change them on the VW path.
    """
    ws = world.consumers[0]
    name = f"watch-probe-{scope}"
    url = object_url(world, ws, "team-red", name)
    watched = collection_url(world, "*" if scope == "wildcard" else ws.cluster)
    widget = {
        "apiVersion": f"{world.group}/{world.version}",
        "kind": "Widget",
        "metadata": {"name": name, "labels": {"env": "prod", "region": "eu"}},
        "spec": {"size": 1, "color": "red"},
    }
    async with kcp.http_session() as session:
        created = await json_request(
            session,
            "POST",
            collection_url(world, ws.cluster, "team-red"),
            body=widget,
            expect=201,
        )
        try:
            rv0 = created["metadata"]["resourceVersion"]
            async with open_watch(
                session, watched, labelSelector="env=prod", resourceVersion=rv0
            ) as watch:

                async def next_probe_event() -> dict[str, Any]:
                    while True:
                        event = await watch.next()
                        if event["object"]["metadata"].get("name") == name:
                            observe(summary(event))
                            return event

                to_dev = await merge_patch(session, url, {"metadata": {"labels": {"env": "dev"}}})
                event = await next_probe_event()
                assert event["type"] == "DELETED"
                assert event["object"]["metadata"]["labels"]["env"] == "prod"  # previous content
                assert event["object"]["spec"] == {"size": 1, "color": "red"}
                assert (
                    event["object"]["metadata"]["resourceVersion"]
                    == (
                        to_dev["metadata"]["resourceVersion"]  # the new resourceVersion
                    )
                )
                assert int(to_dev["metadata"]["resourceVersion"]) > int(rv0)

                await merge_patch(session, url, {"spec": {"size": 2}})  # unseen: not matching
                to_prod = await merge_patch(session, url, {"metadata": {"labels": {"env": "prod"}}})
                event = await next_probe_event()
                assert event["type"] == "ADDED"
                assert event["object"]["metadata"]["labels"]["env"] == "prod"
                assert event["object"]["spec"]["size"] == 2
                assert (
                    event["object"]["metadata"]["resourceVersion"]
                    == (to_prod["metadata"]["resourceVersion"])
                )

                resized = await merge_patch(session, url, {"spec": {"size": 3}})
                event = await next_probe_event()
                assert event["type"] == "MODIFIED"
                assert event["object"]["spec"]["size"] == 3
                assert (
                    event["object"]["metadata"]["resourceVersion"]
                    == (resized["metadata"]["resourceVersion"])
                )

                deleted = await json_request(session, "DELETE", url)
                observe(f"DELETE response: {json.dumps(deleted)}")
                assert (deleted["kind"], deleted["status"]) == ("Status", "Success")
                event = await next_probe_event()
                assert event["type"] == "DELETED"
                assert event["object"]["metadata"]["labels"]["env"] == "prod"
                assert event["object"]["spec"]["size"] == 3
                delete_rv = int(event["object"]["metadata"]["resourceVersion"])
                assert delete_rv > int(resized["metadata"]["resourceVersion"])
        finally:
            async with session.delete(url) as resp:  # gone already unless the test failed
                assert resp.status in (200, 404), await resp.text()


@pytest.mark.parametrize("scope", ["wildcard", "cluster"])
async def test_watch_list_ends_initial_events_with_bookmark(
    kcp: KcpInstance, world: Bootstrap, observe: Observe, scope: str
) -> None:
    """``sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true``
    (WatchList, what recent client-go informers send) works on the VW, wildcard and per cluster:
    one ADDED per existing object, then a BOOKMARK whose object is ``apiVersion``/``kind`` plus
    ``metadata`` with only ``resourceVersion`` and the annotation
    ``k8s.io/initial-events-end: "true"``; its resourceVersion is at least every listed one."""
    cluster = "*" if scope == "wildcard" else world.consumers[0].cluster
    expected = sorted(
        sample_key(w) for w in world.widgets if scope == "wildcard" or w.cluster == cluster
    )
    added: list[dict[str, Any]] = []
    async with (
        kcp.http_session() as session,
        open_watch(
            session,
            collection_url(world, cluster),
            sendInitialEvents="true",
            resourceVersionMatch="NotOlderThan",
            allowWatchBookmarks="true",
        ) as watch,
    ):
        while (event := await watch.next())["type"] == "ADDED":
            added.append(event["object"])
    observe(f"{len(added)} ADDED, then {event['type']}: {json.dumps(event['object'])}")
    assert samples(added) == expected
    assert event["type"] == "BOOKMARK"
    assert set(event["object"]) == {"apiVersion", "kind", "metadata"}
    meta = event["object"]["metadata"]
    assert set(meta) == {"annotations", "resourceVersion"}
    assert meta["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert int(meta["resourceVersion"]) >= max(int(o["metadata"]["resourceVersion"]) for o in added)


# --------------------------------------------------------------------------------------------
# Request rules and error bodies


async def test_namespaced_request_on_wildcard(
    kcp: KcpInstance, world: Bootstrap, observe: Observe
) -> None:
    """On ``clusters/*`` a namespaced list or watch is a 400 whose Status has **no** ``reason``
    (``message``: "cross-cluster LIST and WATCH are required to be cross-namespace, not scoped
    to namespace <ns>"). Non-list verbs on the wildcard (GET by name, POST) are 404 with the
    generic "the server could not find the requested resource" Status, not 400 (a POST whose
    body is not a decodable Widget is a 400 BadRequest first: the body is decoded before the
    wildcard is rejected)."""
    namespaced = collection_url(world, "*", "team-red")
    expected_400 = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "cross-cluster LIST and WATCH are required to be cross-namespace, "
        "not scoped to namespace team-red",
        "code": 400,
    }
    async with kcp.http_session() as session:
        for params in ({}, {"watch": "true"}):
            async with session.get(namespaced, params=params) as resp:
                body = await resp.read()
                observe(
                    f"GET clusters/*/…/namespaces/team-red/widgets {params}: {resp.status} {body!r}"
                )
                assert resp.status == 400
                assert json.loads(body) == expected_400

        async with session.get(f"{collection_url(world, '*')}/prod-eu") as resp:
            body = await resp.read()
            observe(f"GET clusters/*/…/widgets/prod-eu: {resp.status} {body!r}")
            assert resp.status == 404
            status = json.loads(body)
            assert status["message"] == "the server could not find the requested resource"
            assert status["reason"] == "NotFound"

        widget = {"apiVersion": "example.io/v1alpha1", "kind": "Widget", "metadata": {"name": "x"}}
        async with session.post(namespaced, json=widget) as resp:
            body = await resp.read()
            observe(f"POST clusters/*/…/namespaces/team-red/widgets: {resp.status} {body!r}")
            assert resp.status == 404


async def test_dry_run_patch(kcp: KcpInstance, world: Bootstrap, observe: Observe) -> None:
    """``PATCH ?dryRun=All`` works through the VW: 200 with the would-be object (new labels,
    *unchanged* resourceVersion), nothing stored; a dry-run patch that violates the schema is a
    422 Invalid, exactly like a real one."""
    ws = world.consumers[0]
    url = object_url(world, ws, "team-red", "prod-eu")
    async with kcp.http_session() as session:
        before = await json_request(session, "GET", url)
        patched = await json_request(
            session,
            "PATCH",
            url,
            body={"metadata": {"labels": {"env": "staging"}}},
            content_type="application/merge-patch+json",
            params={"dryRun": "All"},
        )
        observe(
            f"dry-run PATCH: rv {before['metadata']['resourceVersion']} -> "
            f"{patched['metadata']['resourceVersion']}, labels {patched['metadata']['labels']}"
        )
        assert patched["metadata"]["labels"]["env"] == "staging"
        assert patched["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        after = await json_request(session, "GET", url)
        assert after["metadata"] == before["metadata"]

        invalid = await json_request(
            session,
            "PATCH",
            url,
            body={"spec": {"size": -1}},
            content_type="application/merge-patch+json",
            params={"dryRun": "All"},
            expect=422,
        )
        observe(f"invalid dry-run PATCH: {json.dumps(invalid)}")
        assert invalid["reason"] == "Invalid"


NOT_FOUND_BODY = (
    b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
    b'"message":"widgets.example.io \\"nope\\" not found","reason":"NotFound",'
    b'"details":{"name":"nope","group":"example.io","kind":"widgets"},"code":404}\n'
)


async def test_missing_object_404_body(
    kcp: KcpInstance, world: Bootstrap, observe: Observe
) -> None:
    """GET of a missing object: 404, ``Content-Type: application/json``, body exactly
    ``NOT_FOUND_BODY`` (compact JSON, key order kind/apiVersion/metadata/status/message/reason/
    details/code, ``details.kind`` is the *resource* plural, trailing newline). A curl-like
    User-Agent gets the same Status pretty-printed (apiserver behaviour), so byte comparisons
    must not use one."""
    url = object_url(world, world.consumers[0], "team-red", "nope")
    async with kcp.http_session() as session:
        async with session.get(url) as resp:
            body = await resp.read()
            observe(f"404 body: {body!r}")
            assert resp.status == 404
            assert resp.headers["Content-Type"] == "application/json"
            assert body == NOT_FOUND_BODY
        async with session.get(url, headers={"User-Agent": "curl/8.5.0"}) as resp:
            pretty = await resp.read()
            assert json.loads(pretty) == json.loads(NOT_FOUND_BODY)
            assert pretty.startswith(b'{\n  "kind": "Status"')


def test_vwserver_not_found_matches_kcp() -> None:
    """vwserver's own NotFound (used for objects outside a slice, so they cannot be told apart
    from missing ones) is byte-identical to kcp's."""
    from vwserver.k8s.status import not_found

    assert not_found(resource="widgets", group="example.io", name="nope") == NOT_FOUND_BODY


# --------------------------------------------------------------------------------------------
# devenv's own failure handling (needs the local binary, not the shared instance)


def kcp_processes_using(root_dir: Path) -> list[int]:
    """PIDs whose command line mentions ``root_dir`` (Linux /proc)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if str(root_dir).encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
    return pids


def temp_kcp_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("vwserver-kcp-*"))


async def test_start_kcp_reports_early_exit_with_log(kcp_binary: Path) -> None:
    """kcp that exits at once (a bad flag) is reported with its exit code and log tail, and the
    temporary root directory is removed."""
    before = temp_kcp_dirs()
    with pytest.raises(KcpError) as failure:
        async with start_kcp(binary=kcp_binary, extra_args=["--no-such-flag"], ready_timeout=60):
            pytest.fail("kcp started despite a bad flag")
    message = str(failure.value)
    assert "exited with code 1 before it was ready" in message
    assert "unknown flag: --no-such-flag" in message
    assert "--- last" in message
    assert temp_kcp_dirs() - before == set()


async def test_start_kcp_not_ready_in_time_is_killed(kcp_binary: Path, tmp_path: Path) -> None:
    """A kcp not ready within ``ready_timeout`` is killed and the error carries its log tail; a
    caller-provided root directory is kept (with kcp.log)."""
    with pytest.raises(KcpError) as failure:
        async with start_kcp(binary=kcp_binary, root_dir=tmp_path, ready_timeout=2, stop_grace=5):
            pytest.fail("kcp was ready in 2s")
    message = str(failure.value)
    assert "not ready within 2s" in message
    assert "--- last" in message and str(tmp_path / "kcp.log") in message
    assert kcp_processes_using(tmp_path) == []
    assert (tmp_path / "kcp.log").exists()
