"""Stock Go clients through vwserver against real kcp (conformance: "real Go clients").

``clients/go`` builds ``vwclient`` (see ``tests/e2e/conftest.py``): a client-go informer with a
cluster-aware key (``<kcp.io/cluster>|<namespace>/<name>``) and a controller-runtime manager with
a finalizer/status reconciler. Both print JSON lines; these tests read them while a few hundred
writes happen directly in kcp (as kcp-admin, not through vwserver), then compare what the clients
saw with what kcp holds.

The proxy runs in-process on the session's event loop with static routes for the slices ``prod``
(env=prod) and ``dev`` (env=dev) of the demo export, as in ``test_proxy_kcp.py``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from devenv.bootstrap import Bootstrap, Workspace
from devenv.kcp import KcpInstance
from tests.support.go_clients import (
    GoClient,
    Key,
    clients,
    informer_args,
    is_watch,
    view,
    widget_requests,
)
from tests.support.slices import slices_over_kcp
from tests.support.widgets import (
    API,
    MERGE_PATCH,
    list_widgets,
    make_namespace,
    remove_namespace,
)
from vwserver.selector import Selector

FINALIZER = "example.io/test-finalizer"
PHASE = "Reconciled"  # what the reconciler writes to status.phase (the schema's one status field)
SYNC_TIMEOUT = 30.0
SETTLE_TIMEOUT = 45.0
OBJECTS_PER_WORKSPACE = 30
WRITE_CONCURRENCY = 16


# --------------------------------------------------------------------------------------------
# The proxy and the Go client processes


@dataclass
class Proxy:
    base: str
    world: Bootstrap

    def url(self, slice_name: str, cluster: str) -> str:
        return (
            f"{self.base}/services/filtered-apiexport/{self.world.provider.cluster}/"
            f"{slice_name}/clusters/{cluster}"
        )


@pytest_asyncio.fixture(scope="module", loop_scope="session", params=["passthrough", "cache"])
async def proxy(
    request: pytest.FixtureRequest, kcp: KcpInstance, world: Bootstrap
) -> AsyncIterator[Proxy]:
    """Both read paths: LIST and WATCH passed to kcp, and served from the shared watch cache."""
    # A small page size: the informer's LIST (watch-list off) is paged upstream by the proxy.
    slices = {env: Selector.parse(f"env={env}") for env in ("prod", "dev")}
    # The same slice served all through to kcp: a reconciler there adds its finalizer without a
    # hold (vwserver.holds), so an object it finalized leaves the slice as a plain DELETED —
    # what these tests model. The handoff of held objects: test_handoff_kcp.py.
    slices["prod-unheld"] = Selector.parse("env=prod")
    cache = request.param == "cache"
    async with slices_over_kcp(
        kcp, world, slices=slices, page_size=10, cache=cache, uncached=("prod-unheld",)
    ) as base:
        yield Proxy(base, world)


# --------------------------------------------------------------------------------------------
# Writes directly in kcp


@dataclass(frozen=True)
class Op:
    kind: str  # create | env | region | size | delete
    value: Any = None


@dataclass(frozen=True)
class Write:
    """One write as kcp answered it."""

    kind: str
    rv: int
    labels: dict[str, str]
    gone: bool = False  # a DELETE that removed the object (no finalizer held it)


@dataclass
class Planned:
    ws: Workspace
    name: str
    ops: list[Op]
    writes: list[Write] = field(default_factory=list)

    def key(self, namespace: str) -> Key:
        return f"{self.ws.cluster}|{namespace}/{self.name}"

    @property
    def deleted(self) -> bool:
        return self.ops[-1].kind == "delete"

    @property
    def ever_prod(self) -> bool:
        return any(w.labels.get("env") == "prod" for w in self.writes)

    def final_size(self) -> int:
        sizes = [op.value for op in self.ops if op.kind == "size"]
        return int(sizes[-1]) if sizes else 0


def make_plan(consumers: Sequence[Workspace], *, seed: int) -> list[Planned]:
    """Per consumer, objects named ``<letter>-NNN`` (unique across workspaces) with 2-6 changes
    each: relabels in and out of env=prod, another label, spec updates; some are deleted. In the
    reconciler's workspace (the first), an object that ever was in the slice is deleted only
    while in it: out of it, its finalizer could not be removed through the slice."""
    rng = random.Random(seed)
    plan = []
    for index, ws in enumerate(consumers):
        for i in range(OBJECTS_PER_WORKSPACE):
            env = rng.choice(["prod", "prod", "dev", None])
            labels = {"region": rng.choice(["eu", "us"])} | ({"env": env} if env else {})
            ops = [Op("create", labels)]
            ever_prod = env == "prod"
            for _ in range(rng.randint(2, 6)):
                r = rng.random()
                if r < 0.45:
                    env = rng.choice([e for e in ("prod", "dev", None) if e != env])
                    ever_prod |= env == "prod"
                    ops.append(Op("env", env))
                elif r < 0.6:
                    ops.append(Op("region", rng.choice(["eu", "us"])))
                else:
                    ops.append(Op("size", rng.randint(0, 1000)))
            if rng.random() < 0.35:
                if index == 0 and ever_prod and env != "prod":
                    ops.append(Op("env", "prod"))
                ops.append(Op("delete"))
            plan.append(Planned(ws, f"{'abcdefgh'[index]}-{i:03d}", ops))
    return plan


async def perform(session: aiohttp.ClientSession, obj: Planned, namespace: str, op: Op) -> Write:
    collection = f"{obj.ws.url}/{API}/namespaces/{namespace}/widgets"
    url = f"{collection}/{obj.name}"
    if op.kind == "create":
        body = {
            "apiVersion": "example.io/v1alpha1",
            "kind": "Widget",
            "metadata": {"name": obj.name, "namespace": namespace, "labels": op.value},
            "spec": {"size": 0, "color": "red"},
        }
        request = session.post(collection, json=body)
    elif op.kind in ("env", "region"):
        patch = {"metadata": {"labels": {op.kind: op.value}}}
        request = session.patch(url, data=json.dumps(patch), headers=MERGE_PATCH)
    elif op.kind == "size":
        patch = {"spec": {"size": op.value}}
        request = session.patch(url, data=json.dumps(patch), headers=MERGE_PATCH)
    else:
        request = session.delete(url)
    async with request as resp:
        answer = await resp.json()
        assert resp.status in (200, 201, 202), f"{op} on {url}: {resp.status} {answer}"
    if answer.get("kind") == "Status":  # a DELETE that removed the object at once
        last = obj.writes[-1]
        return Write(kind=op.kind, rv=last.rv, labels=last.labels, gone=True)
    meta = answer["metadata"]
    held = bool(meta.get("deletionTimestamp") and meta.get("finalizers"))
    return Write(
        kind=op.kind,
        rv=int(meta["resourceVersion"]),
        labels=meta.get("labels") or {},
        gone=op.kind == "delete" and not held,
    )


async def drive(
    kcp: KcpInstance, plan: Sequence[Planned], namespace: str, ops: slice, *, pause: float
) -> None:
    """``obj.ops[ops]`` of every object in order, objects interleaved, at most
    WRITE_CONCURRENCY requests at a time; up to ``pause`` seconds between an object's writes, so
    that the reconciler's writes interleave with ours."""
    gate = asyncio.Semaphore(WRITE_CONCURRENCY)
    rng = random.Random(len(plan))
    async with kcp.http_session(timeout=30) as session:

        async def run(obj: Planned) -> None:
            for op in obj.ops[ops]:
                async with gate:
                    obj.writes.append(await perform(session, obj, namespace, op))
                await asyncio.sleep(rng.uniform(0, pause))

        await asyncio.gather(*(run(obj) for obj in plan))


async def poll(what: str, probe: Callable[[], Any], *, within: float) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not (value := await probe()):
        assert loop.time() < deadline, f"timed out after {within:.0f}s waiting for {what}"
        await asyncio.sleep(0.5)
    return value


# --------------------------------------------------------------------------------------------
# What the informer should have seen


def expected_events(
    writes: Sequence[Write], extra: Mapping[int, str]
) -> list[tuple[str, int | None]]:
    """The handler calls a correct informer makes for one object, from every write to it.

    ``writes``: ours; ``extra``: the reconciler's writes (resourceVersion -> action), which keep
    the labels. Removing the last finalizer of an object being deleted deletes it (the PUT
    answers with the object's last version, no new one), like a DELETE without finalizers.
    Returns (event, resourceVersion) pairs; None where kcp picks the version (the final DELETED
    of a removed object)."""
    timeline: list[tuple[int, str, dict[str, str] | None, bool]] = [
        (w.rv, w.kind, w.labels, w.gone) for w in writes
    ]
    timeline += [(rv, action, None, action == "finalizer-removed") for rv, action in extra.items()]
    timeline.sort(key=lambda t: (t[0], t[3]))
    events: list[tuple[str, int | None]] = []
    matched, last_rv, labels = False, None, dict[str, str]()
    for rv, _, new_labels, gone in timeline:
        if gone:
            if matched:
                events.append(("delete", None))
            break
        if rv == last_rv:
            continue  # a no-op write (kcp wrote nothing, no event)
        labels = new_labels if new_labels is not None else labels
        now = labels.get("env") == "prod"
        if now:
            events.append(("update" if matched else "add", rv))
        elif matched:
            events.append(("delete", rv))  # left the selector: DELETED with the new version
        matched, last_rv = now, rv
    return events


def check_informer(
    client: GoClient,
    plan: Sequence[Planned],
    namespace: str,
    reconciler_writes: Mapping[str, Mapping[int, str]],
) -> dict[str, int]:
    """Every handler call in ``namespace`` against the writes; returns counts for the record."""
    by_key = {obj.key(namespace): obj for obj in plan}
    seen: dict[Key, list[dict[str, Any]]] = {}
    synthetic = 0
    for e in client.events("add", "update", "delete"):
        if e["namespace"] != namespace:
            # other tests' and the sample objects: only ever objects of the slice
            assert e["labels"].get("env") == "prod" or (
                e["event"] == "delete" and not e["labels"]
            ), e
            continue
        assert e["key"] in by_key, f"{client.name}: an object nobody wrote: {e}"
        if e["event"] == "delete" and not e["labels"]:
            synthetic += 1  # the proxy's minimal DELETED: identifying metadata only
        else:
            assert e["labels"].get("env") == "prod", f"{client.name}: outside the slice: {e}"
        seen.setdefault(e["key"], []).append(e)
    for key, obj in by_key.items():
        events = seen.get(key, [])
        assert obj.ever_prod or not events, f"{client.name}: {key} never matched: {events}"
        rvs = [int(e["resourceVersion"]) for e in events]
        assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs), (
            f"{client.name}: {key}: resourceVersions out of order: {events}"
        )
        expected = expected_events(obj.writes, reconciler_writes.get(obj.name, {}))
        observed = [(e["event"], int(e["resourceVersion"])) for e in events]
        fits = len(observed) == len(expected) and all(
            event == got_event and rv in (None, got_rv)
            for (event, rv), (got_event, got_rv) in zip(expected, observed, strict=True)
        )
        assert fits, (
            f"{client.name}: {key}: handler calls differ from the writes\n"
            f"  expected {expected}\n  observed {observed}\n  writes {obj.writes}\n"
            f"  reconciler {reconciler_writes.get(obj.name)}"
        )
    return {"events": sum(len(v) for v in seen.values()), "synthetic_deletes": synthetic}


def last_word_fits(
    reconciler: GoClient, plan: Sequence[Planned], home: Workspace, in_slice: set[str]
) -> bool:
    """Whether the reconciler's last reconcile of each object of its cluster that ever was in
    the slice found it (in the slice now) or did not (out of it, or deleted)."""
    last = {line["name"]: line for line in reconciler.events("reconcile")}
    for obj in plan:
        if obj.ws != home or not obj.ever_prod:
            continue
        line = last.get(obj.name)
        if obj.name in in_slice:
            if line is None or "labels" not in line or "error" in line:
                return False
        elif line is None or line["actions"] != ["gone"]:
            return False
    return True


# --------------------------------------------------------------------------------------------
# The tests


async def test_informers_and_reconciler_follow_direct_writes(
    proxy: Proxy,
    kcp: KcpInstance,
    world: Bootstrap,
    go_clients: Path,
    tmp_path: Path,
    observe: Callable[[str], None],
) -> None:
    """Two cluster-aware informers on the prod slice's ``clusters/*`` (watch-list on and off)
    and a reconciler on the slice's first consumer cluster, while ~300 writes happen directly
    in kcp: creates, relabels in and out of env=prod, spec updates, deletes, in both consumers.

    Then: each informer's final cache is exactly kcp's env=prod objects (keys, labels,
    resourceVersions); each object's handler calls are exactly those its writes (ours and the
    reconciler's, ordered by resourceVersion) call for; no call carries an object outside the
    slice. The reconciler saw only (and all) of its cluster's slice objects, its finalizer and
    status landed through the slice on those only, and it released every deleted object."""
    consumers = world.consumers
    home = consumers[0]  # the reconciler's logical cluster
    namespace = f"go-{uuid.uuid4().hex[:6]}"
    plan = make_plan(consumers, seed=20261201)
    token = kcp.admin_token
    await make_namespace(kcp, consumers, namespace)
    try:
        async with clients() as add:
            informers = {
                mode: add(
                    await GoClient.start(
                        go_clients,
                        f"informer-watchlist-{mode}",
                        informer_args(
                            proxy.url("prod", "*"), f"--token={token}", watch_list=mode == "on"
                        ),
                        tmp_path,
                    )
                )
                for mode in ("on", "off")
            }
            reconciler = add(
                await GoClient.start(
                    go_clients,
                    "reconciler",
                    [
                        "reconciler",
                        f"--server={proxy.url('prod-unheld', home.cluster)}",
                        f"--token={token}",
                        f"--namespace={namespace}",
                        f"--finalizer={FINALIZER}",
                        f"--status-phase={PHASE}",
                    ],
                    tmp_path,
                )
            )
            for client in (*informers.values(), reconciler):
                await client.wait_until("cache sync", client.synced, within=SYNC_TIMEOUT)

            # First the creates; once the reconciler has taken on the slice's objects of its
            # cluster (finalizer and status), everything else, interleaved with its writes.
            started = time.monotonic()
            await drive(kcp, plan, namespace, slice(0, 1), pause=0)

            async def taken_on() -> bool:
                items = await list_widgets(kcp, [home], namespace)
                return all(
                    FINALIZER in item["metadata"].get("finalizers", [])
                    and item.get("status", {}).get("phase") == PHASE
                    for item in items.values()
                    if item["metadata"]["labels"].get("env") == "prod"
                )

            await poll("the reconciler to take on the new objects", taken_on, within=SYNC_TIMEOUT)
            await drive(kcp, plan, namespace, slice(1, None), pause=0.1)
            writes = sum(len(obj.writes) for obj in plan)
            wrote_in = time.monotonic() - started

            # Settled: deleted objects gone (finalizers removed through the slice), every object
            # of the slice in the reconciler's cluster carries the finalizer and the status.
            def settled(items: Mapping[Key, dict[str, Any]]) -> bool:
                for obj in plan:
                    item = items.get(obj.key(namespace))
                    if obj.deleted:
                        if item is not None:
                            return False
                    elif item is None:
                        return False
                    elif obj.ws == home and item["metadata"]["labels"].get("env") == "prod":
                        if FINALIZER not in item["metadata"].get("finalizers", []):
                            return False
                        if item.get("status", {}).get("phase") != PHASE:
                            return False
                return True

            async def truth_when_settled() -> dict[Key, dict[str, Any]] | None:
                items = await list_widgets(kcp, consumers, namespace)
                return items if settled(items) else None

            truth = await poll("the writes to settle", truth_when_settled, within=SETTLE_TIMEOUT)
            in_slice = {
                key: (item["metadata"]["resourceVersion"], item["metadata"]["labels"])
                for key, item in truth.items()
                if item["metadata"]["labels"].get("env") == "prod"
            }
            for client in informers.values():
                await client.wait_until(
                    "the final state",
                    functools.partial(client.holds, namespace, in_slice),
                    within=SETTLE_TIMEOUT,
                )
            home_in_slice = {
                key.split("/")[-1] for key in in_slice if key.startswith(f"{home.cluster}|")
            }
            await reconciler.wait_until(
                "a last reconcile of each object that fits its final state",
                functools.partial(last_word_fits, reconciler, plan, home, home_in_slice),
                within=SETTLE_TIMEOUT,
            )
            codes = {c.name: await c.stop() for c in (*informers.values(), reconciler)}
    finally:
        await remove_namespace(kcp, consumers, namespace)

    assert codes == dict.fromkeys(codes, 0), codes

    # kcp holds what we wrote: the reconciler's conditional writes lost none of ours
    for obj in plan:
        item = truth.get(obj.key(namespace))
        if obj.deleted:
            assert item is None, obj
            continue
        assert item is not None, obj
        assert item["metadata"]["labels"] == obj.writes[-1].labels, (item, obj)
        assert item["spec"]["size"] == obj.final_size(), (item, obj)
        # the finalizer and the status landed through the slice, on the slice's objects only
        # (an object that was in it only briefly may have left before the reconciler wrote)
        finalized = FINALIZER in item["metadata"].get("finalizers", [])
        observed = item.get("status", {}).get("phase") == PHASE
        if obj.ws != home or not obj.ever_prod:
            assert not finalized and not observed, (item, obj)
        elif item["metadata"]["labels"].get("env") == "prod":
            assert finalized and observed, (item, obj)

    # the reconciler: exactly the slice's objects of its cluster, each write recorded
    reconciles = reconciler.events("reconcile")
    reconciler_writes: dict[str, dict[int, str]] = {}
    errors = []
    for line in reconciles:
        assert line["namespace"] == namespace, line
        for w in line["writes"]:
            reconciler_writes.setdefault(line["name"], {})[int(w["resourceVersion"])] = w["action"]
        if "labels" in line:
            assert line["labels"].get("env") == "prod", line
            assert line["cluster"] == home.cluster, line
        if "error" in line:
            errors.append(line["error"])
    home_objects = {obj.name: obj for obj in plan if obj.ws == home}
    ever_in_slice = {name for name, obj in home_objects.items() if obj.ever_prod}
    found = {line["name"] for line in reconciles if "labels" in line}
    assert found <= ever_in_slice, found - ever_in_slice
    in_slice_now = {
        item["metadata"]["name"]
        for key, item in truth.items()
        if key.startswith(f"{home.cluster}|") and item["metadata"]["labels"].get("env") == "prod"
    }
    assert in_slice_now <= found, in_slice_now - found
    # conflicts (our writes raced its PUT), not-found (the object left the slice) and a request
    # cut short by the SIGTERM only
    retried = ("the object has been modified", "not found", "context canceled")
    unexpected = [e for e in errors if not any(r in e for r in retried)]
    assert not unexpected, unexpected
    # objects deleted while the finalizer held them: the reconciler removed it, they are gone
    held = {obj.name for obj in plan if obj.deleted and not obj.writes[-1].gone}
    assert held, "the plan deletes no finalized object: nothing tested the finalizer removal"
    removed = {line["name"] for line in reconciles if "finalizer-removed" in line["actions"]}
    assert removed == held, (removed, held)
    requests = reconciler.events("request")
    assert any(r["method"] == "PUT" and r.get("status") == 200 for r in requests), requests
    assert any(
        r["method"] == "PATCH" and r["path"].endswith("/status") and r.get("status") == 200
        for r in requests
    ), requests

    # the informers: the final cache is exactly the slice, every handler call fits the writes
    counts = {}
    for mode, client in informers.items():
        cache = {
            item["key"]: (item["resourceVersion"], item["labels"])
            for item in client.final_cache()
            if item["namespace"] == namespace
        }
        assert cache == in_slice, f"{client.name}: final cache differs from kcp"
        for item in client.final_cache():
            assert item["labels"].get("env") == "prod", item
        counts[mode] = check_informer(client, plan, namespace, reconciler_writes)
        start = client.events("start")[0]
        assert start["watchList"] is (mode == "on") and start["clusterAware"], start
        first = widget_requests(client)[0]
        if mode == "on":  # one watch with initial events, never a LIST
            assert is_watch(first) and "sendInitialEvents=true" in first["query"], first
            assert all(is_watch(r) for r in widget_requests(client)), widget_requests(client)
        else:  # LIST, then watch from its resourceVersion
            assert not is_watch(first) and "sendInitialEvents" not in first["query"], first
            assert all("sendInitialEvents" not in r["query"] for r in widget_requests(client))

    observe(
        f"{writes} direct writes in {wrote_in:.1f}s on {len(plan)} objects; "
        f"{len(in_slice)} in the slice at the end; informer handler calls (watch-list on/off): "
        f"{counts['on']} / {counts['off']}; reconciler: {len(reconciles)} reconciles, "
        f"{len(removed)} finalizer removals, retried errors: {sorted(set(errors))}"
    )


async def test_watch_list_collision_on_clusters_wildcard(
    proxy: Proxy,
    kcp: KcpInstance,
    world: Bootstrap,
    go_clients: Path,
    tmp_path: Path,
    observe: Callable[[str], None],
) -> None:
    """client-go's watch-list collects the initial events in a store keyed by namespace/name,
    whatever the informer's key: of two same-named objects in two workspaces, one is missing
    after the sync until it changes. Through the slice exactly as against kcp's own APIExport
    virtual workspace (a client-go limit, not the proxy's); with watch-list off, both arrive."""
    consumers = world.consumers
    namespace = f"same-{uuid.uuid4().hex[:6]}"
    token = kcp.admin_token
    await make_namespace(kcp, consumers, namespace)
    try:
        manifests = json.dumps(
            {
                "apiVersion": "example.io/v1alpha1",
                "kind": "Widget",
                "metadata": {"name": "twin", "namespace": namespace, "labels": {"env": "prod"}},
                "spec": {"size": 1, "color": "red"},
            }
        )
        for ws in consumers:
            await kcp.kubectl("create", "-f", "-", server=ws.url, input=manifests)
        twins = {f"{ws.cluster}|{namespace}/twin" for ws in consumers}
        slice_url, bearer = proxy.url("prod", "*"), f"--token={token}"
        # kcp's own VW with kcp's kubeconfig (its CA and token), the slice's selector as the
        # client's: the same objects as through the slice
        direct = (
            f"--kubeconfig={kcp.kubeconfig}",
            f"--context={kcp.admin_context}",
            "--label-selector=env=prod",
        )
        setups = {
            "slice, watch-list on": informer_args(slice_url, bearer, watch_list=True),
            "kcp VW, watch-list on": informer_args(
                f"{world.vw_url}/clusters/*", *direct, watch_list=True
            ),
            "slice, watch-list off": informer_args(slice_url, bearer, watch_list=False),
        }
        async with clients() as add:
            running = {
                label: add(
                    await GoClient.start(
                        go_clients,
                        label.replace(", ", "-").replace(" ", "-"),
                        args,
                        tmp_path,
                    )
                )
                for label, args in setups.items()
            }
            at_sync = {}
            for label, client in running.items():
                await client.wait_until("cache sync", client.synced, within=SYNC_TIMEOUT)
                at_sync[label] = set(view(client, namespace))
            # a change to both brings the lost one in (as an add: it was not in the store)
            for ws in consumers:
                await kcp.kubectl(
                    "patch", "widget", "twin", "-n", namespace, "--type=merge",
                    "-p", '{"spec":{"size":2}}', server=ws.url,
                )  # fmt: skip
            for client in running.values():
                await client.wait_until(
                    "both twins", functools.partial(client.holds, namespace, twins), within=20
                )
            codes = {label: await c.stop() for label, c in running.items()}
    finally:
        await remove_namespace(kcp, consumers, namespace)

    assert codes == dict.fromkeys(codes, 0), codes
    for client in running.values():
        assert {i["key"] for i in client.final_cache() if i["namespace"] == namespace} == twins
    assert at_sync["slice, watch-list off"] == twins
    kept = at_sync["kcp VW, watch-list on"]
    assert len(kept) == 1, at_sync  # client-go's limit against kcp itself ...
    assert at_sync["slice, watch-list on"] == kept, at_sync  # ... and the same through the slice
    added_later = [
        e
        for e in running["slice, watch-list on"].events("add")
        if e["namespace"] == namespace and not e["initial"]
    ]
    assert {e["key"] for e in added_later} == twins - kept, added_later
    observe(
        f"watch-list on, after sync: kept only {kept.pop().split('|')[0]} of "
        f"{sorted(k.split('|')[0] for k in twins)} (slice and kcp VW alike); watch-list off: both"
    )
