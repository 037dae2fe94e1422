"""Property-based write race against real kcp: writes through a slice never move an object into
or out of the slice, and never touch an object outside it — also while someone else relabels the
same objects directly in kcp at the same moment.

Setup: a fresh namespace in consumer-a holding a small pool of Widgets. During every example a
*direct writer* (kcp-admin, straight to the workspace, merge patches as field manager
``direct-writer``) keeps flipping their ``env`` label between ``prod`` (in the slice) and ``dev``
and their ``spec.color`` between ``prod``/``dev``/``red``, while hypothesis-generated writes go
through the proxy's ``prod`` slice (field manager ``proxy-attacker``): JSON patches (add, remove,
replace, copy, move, test; on labels, ``/metadata/resourceVersion``, ``/metadata``, ``/spec``,
copies from ``/spec/color`` to ``/metadata/labels/env``), merge patches with nulls, server-side
apply, strategic merge, updates (from a fresh read, blind, with stale resourceVersions), deletes
(no options, ``preconditions: {}``, uid only, resourceVersion only), creates, status writes,
dry runs — a few at once.

The judge is kcp's own history: a watch on the namespace, read directly from kcp, sees every
revision of every object. A revision whose resourceVersion the direct writer did not get back
from kcp was made through the proxy, and for those:

* ADDED: the new object is in the slice;
* MODIFIED: the object was in the slice just before (the revision before it) and is in it after;
* DELETED: the deleted object (its last state) was in the slice.

A 5xx answer of the proxy to any of these writes is reported too.

After each example the direct writer stops, a sentinel write marks the end of the example in the
history, every revision up to it is judged, and the pool is restored (recreated directly).
Violations are collected over all examples and reported at the end with the operations of the
example, the offending revision (labels before/after, managers) and what the proxy answered.

Twice: through a proxy whose write checks read the stored object from kcp, and through one
serving the slices from the shared watch cache, whose write checks read it from the cache —
which the direct writers keep behind kcp (a write conditional on the cache's version then fails
upstream and is checked again from kcp's).

Size: ``VWSERVER_RACE_EXAMPLES`` (default 50, about 20 s once kcp is up; the full run is 300,
about 80 s: ``VWSERVER_RACE_EXAMPLES=300 .venv/bin/pytest tests/security/test_write_race_kcp.py``).
Examples are derandomized: the same count replays the same operations (the interleaving with the
direct writer is what varies). Against an existing kcp: ``KCP_KUBECONFIG=...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from devenv.bootstrap import Bootstrap, Workspace
from devenv.kcp import KcpInstance
from tests.e2e.test_proxy_kcp import Proxy
from tests.security.support import env_int
from tests.support.properties import bounded_settings
from tests.support.slices import slices_over_kcp
from tests.support.widgets import API
from vwserver.selector import Selector

EXAMPLES = env_int("VWSERVER_RACE_EXAMPLES", 50)
ROUNDS = 4  # each example's operations are sent this many times while the writers run
SLICE = "prod"
POOL = tuple(f"obj-{i}" for i in range(3))
NEW = ("new-0", "new-1")
MISSING = "missing-0"
SENTINEL = "sentinel"
ATTACKER = "proxy-attacker"
DIRECT = "direct-writer"
WRITERS = 2  # concurrent direct writers
WRITER_PAUSE = (0.0, 0.008)  # seconds between one writer's patches
EVENT_TIMEOUT = 20.0

APPLY_PROBE = {"apiVersion": "example.io/v1alpha1", "kind": "Widget", "spec": {"color": "prod"}}

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]


def in_slice(obj: dict[str, Any] | None) -> bool:
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return labels.get("env") == "prod"


def managers(obj: dict[str, Any]) -> list[str]:
    return [
        f"{m.get('manager')}/{m.get('operation')}{'/' + m['subresource'] if m.get('subresource') else ''}"
        for m in (obj.get("metadata") or {}).get("managedFields") or []
    ]


# --- operations ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One write through the proxy."""

    kind: str  # json-patch | merge | apply | strategic | update | delete | create
    name: str
    sub: str = ""
    body: Any = None
    dry_run: bool = False
    extra: tuple[tuple[str, str], ...] = ()
    how: str = ""
    """update: fresh | blind | stale; delete: none | empty | uid | rv | both."""

    def describe(self) -> str:
        where = f"{self.name}{'/' + self.sub if self.sub else ''}"
        flags = " dryRun" if self.dry_run else ""
        body = json.dumps(self.body) if self.body is not None else ""
        return f"{self.kind}{'(' + self.how + ')' if self.how else ''} {where}{flags} {body}"


POINTERS = [
    "/metadata/labels/env",
    "/metadata/labels/env",
    "/metadata/labels/region",
    "/metadata/labels",
    "/metadata/resourceVersion",
    "/metadata/annotations/note",
    "/metadata",
    "/spec/color",
    "/spec/size",
    "/status/phase",
]
SOURCES = ["/spec/color", "/metadata/labels/env", "/metadata/resourceVersion", "/status/phase"]
VALUES = st.sampled_from(["prod", "dev", "", "red", 1, {"env": "dev"}, {"env": "prod"}, None])


@st.composite
def json_patch_op(draw: st.DrawFn) -> dict[str, Any]:
    op = draw(st.sampled_from(["add", "remove", "replace", "copy", "move", "test"]))
    out: dict[str, Any] = {"op": op, "path": draw(st.sampled_from(POINTERS))}
    if op in ("copy", "move"):
        out["from"] = draw(st.sampled_from(SOURCES))
    if op in ("add", "replace", "test"):
        out["value"] = draw(VALUES)
    return out


LABELS = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {},
        optional={
            "env": st.sampled_from(["prod", "dev", None]),
            "region": st.sampled_from(["eu", None]),
        },
    ),
)


KINDS = ["json-patch", "json-patch", "merge", "merge", "apply", "update", "delete", "create"]
KINDS.append("strategic")


@st.composite
def ops(draw: st.DrawFn) -> Op:
    kind = draw(st.sampled_from(KINDS))
    name = draw(st.sampled_from([*POOL, *POOL, MISSING]))
    sub = draw(st.sampled_from(["", "", "", "status"])) if kind != "delete" else ""
    dry_run = draw(st.booleans()) and draw(st.booleans())
    if kind == "json-patch":
        body: Any = draw(st.lists(json_patch_op(), min_size=1, max_size=3))
        return Op(kind, name, sub, body, dry_run)
    if kind in ("merge", "strategic"):
        meta: dict[str, Any] = {}
        labels = draw(LABELS)
        if labels is not None or draw(st.booleans()):
            meta["labels"] = labels
        if draw(st.booleans()):
            meta["resourceVersion"] = draw(st.sampled_from(["1", None, "stale"]))
        patch: dict[str, Any] = {"spec": {"color": draw(st.sampled_from(["blue", None]))}}
        if meta:
            patch["metadata"] = meta
        if draw(st.booleans()):
            patch["status"] = {"phase": "Merged"}
        return Op(kind, name, sub, patch, dry_run)
    if kind == "apply":
        labels = draw(LABELS) or {}
        obj = {
            "apiVersion": "example.io/v1alpha1",
            "kind": "Widget",
            "metadata": {"name": name, "labels": {k: v for k, v in labels.items() if v}},
            "spec": {"color": draw(st.sampled_from(["green", "prod", "dev"]))},
        }
        if sub:
            obj["status"] = {"phase": "Applied"}
        force = draw(st.booleans())
        return Op(kind, name, sub, obj, dry_run, (("force", "true"),) if force else ())
    if kind == "update":
        how = draw(st.sampled_from(["fresh", "fresh", "blind", "stale"]))
        labels = draw(LABELS)
        return Op(kind, name, sub, {"labels": labels}, dry_run, how=how)
    if kind == "delete":
        how = draw(st.sampled_from(["none", "empty", "uid", "rv", "both"]))
        return Op(kind, name, "", None, dry_run, how=how)
    labels = draw(LABELS) or {}
    return Op("create", draw(st.sampled_from(NEW)), "", {"labels": labels}, dry_run)


# --- the world of one test run ------------------------------------------------------------------


@dataclass
class Outcome:
    op: Op
    status: int
    body: str


@dataclass
class Race:
    kcp: KcpInstance
    ws: Workspace
    proxy: Proxy
    namespace: str
    admin: aiohttp.ClientSession
    client: aiohttp.ClientSession
    events: list[dict[str, Any]] = field(default_factory=list)
    event_rvs: set[str] = field(default_factory=set)
    direct_rvs: set[str] = field(default_factory=set)
    direct_failures: list[str] = field(default_factory=list)
    uids: dict[str, str] = field(default_factory=dict)
    state: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each object as of the last judged revision."""
    checked: int = 0
    """Events judged so far."""
    violations: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    seq: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def direct_url(self) -> str:
        return f"{self.ws.url}/apis/example.io/v1alpha1/namespaces/{self.namespace}/widgets"

    @property
    def proxy_url(self) -> str:
        base = self.proxy.url(SLICE, self.ws.cluster)
        return f"{base}/apis/example.io/v1alpha1/namespaces/{self.namespace}/widgets"

    # -- direct writes (recorded) --

    async def direct(self, method: str, url: str, **kw: Any) -> tuple[int, dict[str, Any]]:
        try:
            async with self.admin.request(method, url, **kw) as r:
                body = await r.json(content_type=None)
                if r.status in (200, 201):
                    rv = (body.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        self.direct_rvs.add(rv)
                return r.status, body
        except (aiohttp.ClientError, TimeoutError) as e:
            # a write that may have happened without our knowing its resourceVersion
            self.direct_failures.append(f"{method} {url}: {type(e).__name__}: {e}")
            return 0, {}

    async def direct_create(self, name: str, env: str) -> None:
        obj = {
            "apiVersion": "example.io/v1alpha1",
            "kind": "Widget",
            "metadata": {
                "name": name,
                "labels": {"env": env, "region": "eu"},
                "annotations": {"race/writer": "direct"},
            },
            "spec": {"size": 1, "color": "red"},
        }
        status, body = await self.direct(
            "POST", self.direct_url, params={"fieldManager": DIRECT}, json=obj
        )
        assert status == 201, body
        self.uids[name] = body["metadata"]["uid"]

    async def flip(self, rng: random.Random) -> None:
        """One direct relabel/flip of a random pool object."""
        self.seq += 1
        name = rng.choice(POOL)
        patch = {
            "metadata": {
                "labels": {"env": rng.choice(["prod", "dev"])},
                "annotations": {"race/writer": "direct", "race/seq": str(self.seq)},
            },
            "spec": {"color": rng.choice(["prod", "dev", "red"])},
        }
        await self.direct(
            "PATCH",
            f"{self.direct_url}/{name}",
            params={"fieldManager": DIRECT},
            data=json.dumps(patch),
            headers={"Content-Type": "application/merge-patch+json"},
        )

    async def writer(self, rng: random.Random, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.flip(rng)
            await asyncio.sleep(rng.uniform(*WRITER_PAUSE))

    # -- the history --

    async def watch(self, since: str) -> None:
        """Follow the namespace's history from ``since`` (re-watching if kcp ends the watch)."""
        rv = since
        while True:
            params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true"}
            async with self.admin.get(
                self.direct_url, params=params, timeout=aiohttp.ClientTimeout(total=None)
            ) as r:
                assert r.status == 200, await r.text()
                async for line in r.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj_rv = event["object"]["metadata"].get("resourceVersion", "")
                    rv = obj_rv or rv
                    if event["type"] == "ERROR":
                        raise AssertionError(f"watch error: {event}")
                    if event["type"] == "BOOKMARK":
                        continue
                    self.events.append(event)
                    self.event_rvs.add(obj_rv)
                    self.arrived.set()

    async def mark(self) -> str:
        """A sentinel write; returns once the watch has seen it (and so everything before it)."""
        self.seq += 1
        status, body = await self.direct(
            "PATCH",
            f"{self.direct_url}/{SENTINEL}",
            params={"fieldManager": DIRECT},
            data=json.dumps({"metadata": {"annotations": {"race/mark": str(self.seq)}}}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert status == 200, body
        rv: str = body["metadata"]["resourceVersion"]
        async with asyncio.timeout(EVENT_TIMEOUT):
            while rv not in self.event_rvs:
                self.arrived.clear()
                await self.arrived.wait()
        return rv

    def judge(self, up_to: str, *, ops: list[Op], outcomes: list[Outcome]) -> None:
        """Judge every revision up to the sentinel revision ``up_to``."""
        while self.checked < len(self.events):
            event = self.events[self.checked]
            self.checked += 1
            obj = event["object"]
            name = obj["metadata"]["name"]
            rv = obj["metadata"].get("resourceVersion", "")
            before = self.state.get(name)
            if event["type"] == "DELETED":
                self.state.pop(name, None)
            else:
                self.state[name] = obj
            if rv in self.direct_rvs or name == SENTINEL:
                if rv == up_to:
                    return
                continue
            self.stats[f"proxy {event['type']}"] = self.stats.get(f"proxy {event['type']}", 0) + 1
            problem = None
            if event["type"] == "ADDED" and not in_slice(obj):
                problem = "created outside the slice"
            elif event["type"] == "MODIFIED" and not in_slice(before):
                problem = "modified while outside the slice (it entered or was touched)"
            elif event["type"] == "MODIFIED" and not in_slice(obj):
                problem = "modified out of the slice (it left through the proxy)"
            elif event["type"] == "DELETED" and not in_slice(obj):
                problem = "deleted while outside the slice"
            if problem:
                labels_before = ((before or {}).get("metadata") or {}).get("labels")
                landed = [o for o in outcomes if 200 <= o.status < 300 and not o.op.dry_run]
                self.violations.append(
                    f"{name} rv {rv} {event['type']}: {problem}\n"
                    f"    labels before {labels_before}, after {obj['metadata'].get('labels')}; "
                    f"managers {managers(obj)}\n"
                    f"    the example's operations ({ROUNDS} rounds):\n      "
                    + "\n      ".join(op.describe() for op in ops)
                    + "\n    of which these succeeded:\n      "
                    + "\n      ".join(f"{o.op.describe()} -> {o.status}" for o in landed)
                )
        raise AssertionError(f"sentinel revision {up_to} not among the events")

    async def restore(self) -> None:
        """The pool back (recreated directly if deleted), objects the proxy created gone."""
        current = {name for name in self.state if name != SENTINEL}
        rng = random.Random(self.seq)
        for name in POOL:
            if name not in current:
                await self.direct_create(name, rng.choice(["prod", "dev"]))
        for name in current - set(POOL):
            await self.direct("DELETE", f"{self.direct_url}/{name}")
        mark = await self.mark()
        # everything up to here was ours: take it as state, judge nothing
        while self.checked < len(self.events):
            event = self.events[self.checked]
            self.checked += 1
            obj = event["object"]
            name = obj["metadata"]["name"]
            if event["type"] == "DELETED":
                self.state.pop(name, None)
            else:
                self.state[name] = obj
            if obj["metadata"].get("resourceVersion") == mark:
                break

    # -- writes through the proxy --

    async def through_proxy(self, op: Op) -> Outcome:
        url = f"{self.proxy_url}/{op.name}" + (f"/{op.sub}" if op.sub else "")
        query: list[tuple[str, str]] = [*op.extra]
        if op.dry_run:
            query.append(("dryRun", "All"))
        method = "PATCH"
        data: bytes | None = None
        content_type = "application/json"
        if op.kind != "delete":
            query.append(("fieldManager", ATTACKER))
        if op.kind == "json-patch":
            content_type, data = "application/json-patch+json", json.dumps(op.body).encode()
        elif op.kind in ("merge", "strategic"):
            body = json.loads(json.dumps(op.body))
            meta = body.get("metadata") or {}
            if meta.get("resourceVersion") == "stale":
                meta["resourceVersion"] = await self._current_rv(op.name) or "1"
            content_type = (
                "application/merge-patch+json"
                if op.kind == "merge"
                else "application/strategic-merge-patch+json"
            )
            data = json.dumps(body).encode()
        elif op.kind == "apply":
            content_type, data = "application/apply-patch+yaml", yaml.safe_dump(op.body).encode()
        elif op.kind == "update":
            method = "PUT"
            data = json.dumps(await self._update_body(op)).encode()
        elif op.kind == "delete":
            method = "DELETE"
            data = await self._delete_body(op)
        else:  # create
            method, url = "POST", self.proxy_url
            obj = {
                "apiVersion": "example.io/v1alpha1",
                "kind": "Widget",
                "metadata": {"name": op.name, "labels": op.body["labels"]},
                "spec": {"color": "made"},
            }
            data = json.dumps(obj).encode()
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self.client.request(method, url, params=query, data=data, headers=headers) as r:
            return Outcome(op, r.status, (await r.text()).strip())

    async def _current_rv(self, name: str) -> str | None:
        async with self.admin.get(f"{self.direct_url}/{name}") as r:
            if r.status != 200:
                return None
            rv: str = (await r.json())["metadata"]["resourceVersion"]
            return rv

    async def _update_body(self, op: Op) -> dict[str, Any]:
        obj: dict[str, Any]
        if op.how == "fresh":  # what a client would do: read through the slice, change, write
            async with self.client.get(f"{self.proxy_url}/{op.name}") as r:
                obj = await r.json() if r.status == 200 else {}
        else:
            obj = {}
        if not obj:
            obj = {
                "apiVersion": "example.io/v1alpha1",
                "kind": "Widget",
                "metadata": {"name": op.name, "namespace": self.namespace},
                "spec": {"size": 1, "color": "updated"},
            }
            if op.how == "stale":
                obj["metadata"]["resourceVersion"] = await self._current_rv(op.name) or "1"
        meta = obj.setdefault("metadata", {})
        if op.body["labels"] is not None:
            meta["labels"] = {k: v for k, v in op.body["labels"].items() if v is not None}
        obj.setdefault("spec", {})["size"] = 7
        if op.sub:
            obj["status"] = {"phase": "Updated"}
        return obj

    async def _delete_body(self, op: Op) -> bytes | None:
        if op.how == "none":
            return None
        pre: dict[str, str] = {}
        if op.how in ("uid", "both"):
            pre["uid"] = self.uids.get(op.name, str(uuid.uuid4()))
        if op.how in ("rv", "both"):
            pre["resourceVersion"] = await self._current_rv(op.name) or "1"
        body: dict[str, Any] = {"preconditions": pre}
        if op.dry_run:
            body["dryRun"] = ["All"]
        return json.dumps(body).encode()


@pytest_asyncio.fixture(scope="module", loop_scope="session", params=["kcp-reads", "cached"])
async def race(
    request: pytest.FixtureRequest, kcp: KcpInstance, world: Bootstrap
) -> AsyncIterator[Race]:
    """The race, through a proxy whose write checks read kcp (no cache) — or, ``cached``,
    through one serving the slices from the shared watch cache, whose write checks read the
    stored object from the cache (started by a LIST through the slice, as a controller's
    watch would), behind kcp whenever the direct writers are faster than its watch."""
    cached = request.param == "cached"
    slices = {env: Selector.parse(f"env={env}") for env in ("prod", "dev")}
    async with slices_over_kcp(kcp, world, slices=slices, page_size=3, cache=cached) as base:
        proxy = Proxy(base, kcp, world)
        if cached:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
                url = f"{proxy.url(SLICE, world.consumer('consumer-a').cluster)}/{API}/widgets"
                async with s.get(url) as r:
                    assert r.status == 200, await r.text()
        async for made in _race(kcp, world, proxy):
            yield made


async def _race(kcp: KcpInstance, world: Bootstrap, proxy: Proxy) -> AsyncIterator[Race]:
    ws = world.consumer("consumer-a")
    namespace = f"race-{uuid.uuid4().hex[:6]}"
    admin = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=kcp.ssl_context()),
        headers={"Authorization": f"Bearer {kcp.admin_token}"},
        timeout=aiohttp.ClientTimeout(total=30),
    )
    client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    await kcp.kubectl("create", "namespace", namespace, server=ws.url)
    race = Race(kcp, ws, proxy, namespace, admin, client)
    watcher: asyncio.Task[None] | None = None
    try:
        for i, name in enumerate(POOL):
            await race.direct_create(name, "prod" if i % 2 == 0 else "dev")
        await race.direct_create(SENTINEL, "dev")
        async with admin.get(race.direct_url) as r:
            listed = await r.json()
        race.state = {o["metadata"]["name"]: o for o in listed["items"]}
        watcher = asyncio.ensure_future(race.watch(listed["metadata"]["resourceVersion"]))
        await race.mark()
        race.checked = len(race.events)
        yield race
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
        with contextlib.suppress(Exception):
            await kcp.kubectl("delete", "namespace", namespace, "--wait=false", server=ws.url)
        await admin.close()
        await client.close()


async def run_example(race: Race, batch: list[Op], seed: int) -> None:
    stop = asyncio.Event()
    writers = [
        asyncio.ensure_future(race.writer(random.Random(f"{seed}:{i}"), stop))
        for i in range(WRITERS)
    ]
    try:
        outcomes: list[Outcome] = []
        for _ in range(ROUNDS):
            await asyncio.sleep(0.003)
            outcomes += await asyncio.gather(*(race.through_proxy(op) for op in batch))
    finally:
        stop.set()
        await asyncio.gather(*writers)
    for outcome in outcomes:
        key = f"{outcome.op.kind} -> {outcome.status}"
        race.stats[key] = race.stats.get(key, 0) + 1
        if outcome.status >= 500:
            race.violations.append(
                f"{outcome.op.describe()} -> {outcome.status} {outcome.body}\n"
                f"    the example's operations ({ROUNDS} rounds, each round at once):\n      "
                + "\n      ".join(op.describe() for op in batch)
            )
    mark = await race.mark()
    race.judge(mark, ops=batch, outcomes=outcomes)
    await race.restore()


async def test_writes_through_the_slice_race_direct_relabels(race: Race) -> None:
    loop = asyncio.get_running_loop()
    examples: list[list[Op]] = []

    @bounded_settings(EXAMPLES)
    @given(st.lists(ops(), min_size=1, max_size=4))
    @example(
        [
            Op(
                "json-patch",
                "obj-0",
                body=[{"op": "copy", "from": "/spec/color", "path": "/metadata/labels/env"}],
            )
        ]
    )
    @example([Op("merge", "obj-1", body={"metadata": {"labels": {"env": "prod"}}})])
    @example([Op("delete", "obj-1", how="empty"), Op("delete", "obj-2", how="none")])
    @example([Op("delete", n, how=h) for n, h in zip(POOL, ("none", "uid", "rv"), strict=True)])
    @example([Op("delete", n, how="both") for n in POOL])
    @example([Op("update", "obj-0", body={"labels": None}, how="fresh")] * 2)
    @example(
        [
            Op(
                "apply",
                "obj-2",
                body={
                    "apiVersion": "example.io/v1alpha1",
                    "kind": "Widget",
                    "metadata": {"name": "obj-2", "labels": {"env": "prod"}},
                    "spec": {"color": "x"},
                },
                extra=(("force", "true"),),
            )
        ]
    )
    @example([Op("merge", "obj-2", sub="status", body={"status": {"phase": "Hijacked"}})])
    @example(  # an apply racing a delete of the same object (seen answering 500)
        [
            Op("apply", "obj-1", body={**APPLY_PROBE, "metadata": {"name": "obj-1", "labels": {}}}),
            Op("delete", "obj-1", how="rv"),
        ]
    )
    def property_(batch: list[Op]) -> None:
        examples.append(batch)
        future = asyncio.run_coroutine_threadsafe(run_example(race, batch, len(examples)), loop)
        future.result(timeout=120)

    # hypothesis drives the examples from a worker thread; the proxy, kcp clients and the
    # watch live on this (the session's) event loop, which keeps running meanwhile.
    await asyncio.to_thread(property_)
    stats = ", ".join(f"{k}: {v}" for k, v in sorted(race.stats.items()))
    print(f"write race: {len(examples)} examples; {stats}")
    assert not race.direct_failures, race.direct_failures
    # the test must have exercised something: writes that landed, and writes refused
    assert race.stats.get("proxy MODIFIED", 0) > 0, stats
    assert not race.violations, (
        f"{len(race.violations)} violation(s) in {len(examples)} examples "
        f"(VWSERVER_RACE_EXAMPLES={EXAMPLES}):\n\n" + "\n\n".join(race.violations[:20])
    )
