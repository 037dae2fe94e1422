"""Every request is parsed into an operation the proxy understands, or refused before kcp sees it.

Against the fake upstream, which records every request it receives: a refused request must leave
no trace there, and an accepted one must reach it in the canonical form the proxy built (never
the client's raw path or query).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.integration.conftest import Env, env

__all__ = ["env"]  # the fixture, imported so that pytest finds it here

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
TABLE_BETA = "application/json;as=Table;v=v1beta1;g=meta.k8s.io"
POM = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"
POM_LIST = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"


async def fetch(env: Env, url: str, **kw: Any) -> tuple[int, bytes, str]:
    async with env.session.get(url, **kw) as r:
        return r.status, await r.read(), r.headers.get("Content-Type", "")


def group_url(env: Env, cluster: str = "c1") -> str:
    return env.slice_url("eu-not-dev", cluster) + "/apis/example.io/v1alpha1"


@pytest.mark.parametrize(
    ("suffix", "params"),
    [
        ("/namespaces/ns1/widgets", {"watch": "yes"}),
        ("/namespaces/ns1/widgets", {"watch": "2"}),
        ("/namespaces/ns1/widgets", [("watch", "1"), ("watch", "0")]),
        ("/namespaces/ns1/widgets", [("labelSelector", "a=b"), ("labelSelector", "c=d")]),
        ("/namespaces/ns1/widgets", {"unknownOption": "1"}),
        ("/namespaces/ns1/widgets", {"limit": "-1"}),
        ("/namespaces/ns1/widgets", {"includeObject": "All"}),
        ("/namespaces/ns1/widgets", {"resourceVersionMatch": "Newest"}),
        ("/namespaces/ns1/widgets/w0", {"dryRun": "All"}),
        ("/namespaces/ns1/widgets/w0", {"fieldSelector": "metadata.name=w0"}),
        ("/namespaces/ns1/widgets/w0/scale", {}),
        ("/watch/namespaces/ns1/widgets/w0/status", {}),
    ],
)
async def test_refused_requests_never_reach_the_upstream(
    env: Env, suffix: str, params: Any
) -> None:
    env.fake.faults.requests.clear()
    status, body, _ = await fetch(env, group_url(env) + suffix, params=params)
    assert status in (400, 404), body
    doc = json.loads(body)
    assert doc["kind"] == "Status"
    assert env.fake.faults.requests == []


async def test_deprecated_watch_paths_are_filtered_watches(env: Env) -> None:
    """/watch/ paths used to be forwarded as a GET of a resource named "watch", unfiltered."""
    url = group_url(env) + "/watch/namespaces/ns1/widgets"
    env.fake.faults.requests.clear()
    events = await _watch_events(env, url, params={"timeoutSeconds": "1"})
    names = {e["object"]["metadata"]["name"] for e in events if e["type"] == "ADDED"}
    # eu-not-dev: region=eu and env notin (dev): w0 (prod, eu) only in ns1
    assert names == {"w0"}
    sent = env.fake.faults.requests[0]
    assert sent.path.endswith("/apis/example.io/v1alpha1/namespaces/ns1/widgets")
    assert sent.query["watch"] == "true"
    assert "region=eu" in sent.query["labelSelector"]


async def test_deprecated_watch_of_one_object_is_a_name_field_selector(env: Env) -> None:
    url = group_url(env) + "/watch/namespaces/ns1/widgets/w0"
    env.fake.faults.requests.clear()
    events = await _watch_events(env, url, params={"timeoutSeconds": "1"})
    assert [e["object"]["metadata"]["name"] for e in events] == ["w0"]
    assert env.fake.faults.requests[0].query["fieldSelector"] == "metadata.name=w0"
    # a foreign object's watch shows nothing at all, like a missing one's
    for name in ("w1", "missing"):
        events = await _watch_events(
            env,
            group_url(env) + f"/watch/namespaces/ns1/widgets/{name}",
            params={"timeoutSeconds": "1"},
        )
        assert events == []
    status, body, _ = await fetch(
        env, url, params={"fieldSelector": "metadata.name=w1", "timeoutSeconds": "1"}
    )
    assert status == 400 and b"doesn't match requested name" in body


async def test_get_of_one_object_with_watch_is_a_get(env: Env) -> None:
    ok = await fetch(env, group_url(env) + "/namespaces/ns1/widgets/w0", params={"watch": "1"})
    assert ok[0] == 200 and json.loads(ok[1])["metadata"]["name"] == "w0"
    foreign = await fetch(env, group_url(env) + "/namespaces/ns1/widgets/w1", params={"watch": "1"})
    missing = await fetch(
        env, group_url(env) + "/namespaces/ns1/widgets/nope", params={"watch": "1"}
    )
    assert foreign[0] == missing[0] == 404
    assert foreign[1].replace(b"w1", b"X") == missing[1].replace(b"nope", b"X")


@pytest.mark.parametrize(
    "accept",
    ["application/yaml", TABLE, TABLE_BETA, POM, POM_LIST, "application/vnd.kubernetes.protobuf"],
)
async def test_foreign_and_missing_objects_answer_alike_in_every_representation(
    env: Env, accept: str
) -> None:
    base = group_url(env) + "/namespaces/ns1/widgets/"
    foreign = await fetch(env, base + "w1", headers={"Accept": accept})
    missing = await fetch(env, base + "nope", headers={"Accept": accept})
    assert foreign[0] == missing[0] and foreign[0] in (404, 406), foreign
    assert foreign[2] == missing[2]
    assert foreign[1].replace(b"w1", b"X") == missing[1].replace(b"nope", b"X")


async def test_yaml_get_and_list(env: Env) -> None:
    status, body, ctype = await fetch(
        env, group_url(env) + "/namespaces/ns1/widgets/w0", headers={"Accept": "application/yaml"}
    )
    assert status == 200 and ctype == "application/yaml"
    assert yaml.safe_load(body)["metadata"]["name"] == "w0"
    status, body, ctype = await fetch(
        env, group_url(env) + "/widgets", headers={"Accept": "application/yaml"}
    )
    doc = yaml.safe_load(body)
    assert status == 200 and doc["kind"] == "WidgetList"
    assert sorted(i["metadata"]["name"] for i in doc["items"]) == ["w0", "w4"]
    status, body, _ = await fetch(
        env,
        group_url(env) + "/widgets",
        params={"labelSelector": "env=nothing"},
        headers={"Accept": "application/yaml"},
    )
    assert status == 200 and yaml.safe_load(body)["items"] == []


async def test_unservable_accept_is_406_before_the_upstream(env: Env) -> None:
    env.fake.faults.requests.clear()
    for url, accept in (
        (group_url(env) + "/namespaces/ns1/widgets/w0", "text/html"),
        (group_url(env) + "/namespaces/ns1/widgets/w0", POM_LIST),
        (group_url(env) + "/widgets", POM),
        (group_url(env) + "/widgets?watch=1", "application/yaml"),
    ):
        status, body, _ = await fetch(env, url, headers={"Accept": accept})
        assert status == 406, (url, accept, body)
        assert json.loads(body)["reason"] == "NotAcceptable"
    assert env.fake.faults.requests == []


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_table_watch_matches_the_row_object(env: Env, version: str) -> None:
    """kubectl get -w asks for Tables: the labels are inside rows[].object, and a selector that
    matches unlabelled bodies (NotIn) must not let other slices' rows through."""
    env.fake.faults.ignore_selectors = True  # the proxy's own check is what is tested
    accept = f"application/json;as=Table;v={version};g=meta.k8s.io"
    events = await _watch_events(
        env,
        group_url(env) + "/widgets",
        params={"watch": "1", "timeoutSeconds": "1"},
        headers={"Accept": accept},
    )
    names = [
        e["object"]["rows"][0]["object"]["metadata"]["name"]
        for e in events
        if e["type"] != "BOOKMARK"
    ]
    assert sorted(names) == ["w0", "w4"], events


async def test_table_without_objects_is_served_and_stripped(env: Env) -> None:
    params = {"includeObject": "None"}
    status, body, _ = await fetch(
        env, group_url(env) + "/widgets", params=params, headers={"Accept": TABLE}
    )
    doc = json.loads(body)
    assert status == 200 and doc["kind"] == "Table" and len(doc["rows"]) == 2
    assert all(row["object"] is None for row in doc["rows"])
    status, body, _ = await fetch(
        env, group_url(env) + "/namespaces/ns1/widgets/w0", params=params, headers={"Accept": TABLE}
    )
    doc = json.loads(body)
    assert status == 200 and len(doc["rows"]) == 1 and doc["rows"][0]["object"] is None
    foreign = await fetch(
        env, group_url(env) + "/namespaces/ns1/widgets/w1", params=params, headers={"Accept": TABLE}
    )
    assert foreign[0] == 404


async def test_client_headers_are_not_forwarded_raw(env: Env) -> None:
    env.fake.faults.requests.clear()
    await fetch(
        env,
        group_url(env) + "/widgets",
        headers={"Accept": f"{TABLE}, application/json", "X-Custom": "admin"},
    )
    sent = env.fake.faults.requests[0]
    assert sent.headers["Accept"] == TABLE
    assert "X-Custom" not in sent.headers


async def _watch_events(env: Env, url: str, **kw: Any) -> list[dict[str, Any]]:
    async with env.session.get(url, **kw) as r:
        assert r.status == 200, await r.read()
        body = await r.read()
    return [json.loads(line) for line in body.splitlines() if line.strip()]
