"""Watches across creates, updates, relabels in and out, and deletions: through a slice the
event sequence equals kcp's own label-selector watch, in every representation and for kubectl's
default ``get -w`` (a Table watch)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.conformance.conftest import SELECTOR, Pair
from tests.conformance.harness import normalise
from tests.support.kubectl import watch_lines

W = "/apis/example.io/v1alpha1"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
POM = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"
WITHIN = 30.0


async def _write_story(pair: Pair, ns: str, marker: str) -> None:
    """Changes made directly in kcp (not through any virtual workspace)."""
    ws = pair.world.consumer("consumer-a")

    async def kubectl(*args: str, input: str | None = None) -> None:
        await pair.kcp.kubectl(*args, "-n", ns, server=ws.url, input=input)

    def widget(name: str, env: str) -> str:
        return json.dumps(
            {
                "apiVersion": "example.io/v1alpha1",
                "kind": "Widget",
                "metadata": {"name": name, "namespace": ns, "labels": {"env": env}},
                "spec": {"size": 1, "color": "red"},
            }
        )

    await kubectl("create", "-f", "-", input=widget("a", "prod"))
    await kubectl("create", "-f", "-", input=widget("b", "dev"))
    await kubectl("patch", "widget", "a", "--type=merge", "-p", '{"spec":{"size":5}}')
    await kubectl("label", "widget", "a", "env=dev", "--overwrite")  # leaves the slice
    await kubectl("label", "widget", "b", "env=prod", "--overwrite")  # enters it
    await kubectl("patch", "widget", "b", "--type=merge", "-p", '{"spec":{"color":"blue"}}')
    await kubectl("delete", "widget", "b")
    await kubectl("delete", "widget", "a")  # outside the slice by now
    await kubectl("create", "-f", "-", input=widget(marker, "prod"))


@contextlib.asynccontextmanager
async def _namespace(pair: Pair) -> AsyncIterator[str]:
    ns = f"conf-{uuid.uuid4().hex[:6]}"
    ws = pair.world.consumer("consumer-a")
    await pair.kcp.kubectl("create", "namespace", ns, server=ws.url)
    try:
        yield ns
    finally:
        # Waited for: kcp deletes the namespace's objects (the marker) asynchronously, and a
        # differential read of a later test must not see them vanish between its two reads.
        await pair.kcp.kubectl("delete", "namespace", ns, "--timeout=120s", server=ws.url)


async def _current_rv(pair: Pair) -> str:
    url = pair.direct_url("*") + f"{W}/widgets"
    headers = {"Authorization": f"Bearer {pair.token}"}
    async with pair.session.get(url, params={"limit": "1"}, headers=headers) as r:
        return str((await r.json())["metadata"]["resourceVersion"])


async def _events(
    pair: Pair, url: str, query: list[tuple[str, str]], accept: str | None, marker: str
) -> list[dict[str, Any]]:
    """Watch events until the marker object's ADDED (bounded by WITHIN seconds)."""
    headers = {"Authorization": f"Bearer {pair.token}"}
    if accept:
        headers["Accept"] = accept
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(WITHIN), pair.session.get(url, params=query, headers=headers) as r:
        assert r.status == 200, await r.read()
        async for line in r.content:
            if not line.strip():
                continue
            event = json.loads(line)
            if event["type"] == "BOOKMARK":
                continue
            events.append(event)
            if marker in line.decode():
                return events
    raise AssertionError(f"watch ended before {marker} arrived: {events}")


def _summary(events: list[dict[str, Any]], ns: str) -> list[tuple[str, Any]]:
    """Events of the test's namespace, normalised (resourceVersions and ages dropped)."""
    out = []
    for event in events:
        text = json.dumps(event)
        if f'"{ns}"' in text:
            out.append((event["type"], normalise(event["object"])))
    return out


@pytest.mark.parametrize(
    ("label", "accept", "extra"),
    [
        ("plain", None, ()),
        ("table", TABLE, ()),
        ("pom", POM, ()),
        # From resourceVersion=0 (the state, then the changes): the cache always serves these
        # (a watch from kcp's current resourceVersion falls back when kcp's moved on with
        # writes the cache has not heard of yet).
        ("table-rv0", TABLE, (("resourceVersion", "0"),)),
        ("table-rv0-object", TABLE, (("resourceVersion", "0"), ("includeObject", "Object"))),
    ],
)
async def test_watch_events_equal_kcps_selector_watch(
    pair: Pair, label: str, accept: str | None, extra: tuple[tuple[str, str], ...]
) -> None:
    async with _namespace(pair) as ns:
        marker = f"marker-{uuid.uuid4().hex[:6]}"
        rv = "0" if ("resourceVersion", "0") in extra else await _current_rv(pair)
        query = [
            ("watch", "1"),
            ("resourceVersion", rv),
            ("allowWatchBookmarks", "false"),
            *(kv for kv in extra if kv[0] != "resourceVersion"),
        ]
        served = await pair.cache_reads("watch", "served")
        through = asyncio.create_task(
            _events(pair, pair.slice_url("*") + f"{W}/widgets", query, accept, marker)
        )
        direct = asyncio.create_task(
            _events(
                pair,
                pair.direct_url("*") + f"{W}/widgets",
                [*query, ("labelSelector", SELECTOR.render())],
                accept,
                marker,
            )
        )
        await asyncio.sleep(0.5)  # both watches are open (they start at rv anyway)
        await _write_story(pair, ns, marker)
        got, expected = await through, await direct
        summary = _summary(got, ns)
        assert summary == _summary(expected, ns)
        # the story's transitions, as the slice shows them: a enters, is updated, leaves (a
        # DELETED); b enters (ADDED), is updated and deleted; the marker is added
        assert [t for t, _ in summary] == [
            "ADDED",
            "MODIFIED",
            "DELETED",
            "ADDED",
            "MODIFIED",
            "DELETED",
            "ADDED",
        ]
    if rv == "0":
        await pair.served_from_cache("watch", served)


_AGE_COLUMN = re.compile(r"\s+\S+\s*$")


async def _kubectl_watch(pair: Pair, server: str, extra: list[str], marker: str) -> list[str]:
    """``kubectl get widgets -A -w`` (default table output) until the marker's line."""
    return await watch_lines(
        pair.kcp,
        *("get", "widgets", "-A", "--watch-only", *extra),
        server=server,
        until=marker,
        within=WITHIN,
    )


async def test_kubectl_default_watch_shows_relabels(pair: Pair) -> None:
    """What `make run` prints: kubectl's default `get -w` (a Table watch) through a slice shows
    the same rows as kcp's own watch with the selector, relabels in and out included."""
    async with _namespace(pair) as ns:
        marker = f"marker-{uuid.uuid4().hex[:6]}"
        through = asyncio.create_task(_kubectl_watch(pair, pair.slice_url("*"), [], marker))
        direct = asyncio.create_task(
            _kubectl_watch(pair, pair.direct_url("*"), ["-l", SELECTOR.render()], marker)
        )
        await asyncio.sleep(2.0)  # kubectl has listed and is watching
        await _write_story(pair, ns, marker)
        got, expected = await through, await direct

        def rows(lines: list[str]) -> list[str]:
            return [_AGE_COLUMN.sub("", line) for line in lines if line.startswith(ns)]

        assert rows(got) == rows(expected)
        names = [line.split()[1] for line in got if line.startswith(ns)]
        # a: added, modified, leaves; b: enters, modified, deleted; then the marker
        assert names == ["a", "a", "a", "b", "b", "b", marker], got
