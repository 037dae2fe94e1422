"""The graceful handoff between slices against real kcp (``vwserver.holds``,
``vwserver.proxy.holding``, ``vwserver.controller.handoff``).

Slices ``a`` (``region=a``) and ``b`` (``region=b``) of the demo export, served from the shared
watch cache (the only read path that records holds), the handoff loop scanning every
:data:`INTERVAL` seconds. Consumers relabel objects directly in kcp; controllers hold them with
finalizers added through their slice. What every test checks, from kcp's own versions of the
objects and from what the slices' clients received:

* a slice that holds an object it no longer matches sees it being deleted (the time vwserver
  first saw the move, the same for every replica and after a restart), and can still release
  its finalizer through the slice;
* the slice the object moves to sees it only once that release is done (its ADDED carries the
  release's resourceVersion);
* kcp never loses a finalizer that was not released through its slice (or ended by the
  operator's release annotation or the slice's hold timeout).

Every object lives in a namespace of its test in the first consumer workspace.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from devenv.bootstrap import Bootstrap, Workspace, poll
from devenv.kcp import KcpError, KcpInstance
from tests.security.support import unselected_lists
from tests.support.clock import ManualClock
from tests.support.go_clients import GoClient, clients, informer_args, reconciler_args
from tests.support.rest import MERGE_PATCH, RestCalls
from tests.support.slices import slice_url, slices_over_kcp
from tests.support.upstream_record import RecordingUpstream
from tests.support.watches import Recorder, recording
from tests.support.widgets import API, make_namespace, remove_namespace, widget
from vwserver.clock import rfc3339
from vwserver.selector import Selector

# The contract's names, spelled out (not imported): clients and operators rely on them.
HOLDS = "sync.edge-connect.eu/holds"
RELEASE = "sync.edge-connect.eu/release"


def holder_label(sid: str) -> str:
    """The holder label of slice ``sid`` (what a LIST asks kcp for its holds with)."""
    return "holder.sync.edge-connect.eu/" + hashlib.sha256(sid.encode()).hexdigest()[:40]


FIN = {"a": "a.handoff.example.io/cleanup", "b": "b.handoff.example.io/cleanup"}
PHASE = {"a": "HeldByA", "b": "HeldByB"}
INTERVAL = 0.5  # the handoff loop's scan interval
WAIT = 30.0  # seconds for one expected convergence
SYNC_TIMEOUT = 30.0

Labels = Mapping[str, str]
Predicate = Callable[[Labels], bool]
REGION: dict[str, Predicate] = {
    "a": lambda labels: labels.get("region") == "a",
    "b": lambda labels: labels.get("region") == "b",
}


# --------------------------------------------------------------------------------------------
# The test bed


@dataclass
class Bed(RestCalls):
    """One test's namespace in the first consumer workspace, and kcp-admin's session (which
    also reaches the unauthenticated proxies: their guard ignores the token)."""

    kcp: KcpInstance
    world: Bootstrap
    ws: Workspace
    namespace: str
    session: aiohttp.ClientSession

    # URLs --------------------------------------------------------------------------------------

    def kcp_url(self, name: str = "") -> str:
        url = f"{self.ws.url}/{API}/namespaces/{self.namespace}/widgets"
        return f"{url}/{name}" if name else url

    def slice_cluster_url(self, base: str, slice_name: str) -> str:
        """Slice ``slice_name`` (served at ``base``) for the bed's consumer cluster."""
        return slice_url(base, self.world, slice_name, self.ws.cluster)

    def slice_url(self, base: str, slice_name: str, name: str = "") -> str:
        url = (
            f"{self.slice_cluster_url(base, slice_name)}/{API}/namespaces/{self.namespace}/widgets"
        )
        return f"{url}/{name}" if name else url

    def slice_id(self, slice_name: str) -> str:
        return f"{self.world.provider.cluster}/{slice_name}"

    def key(self, name: str) -> str:
        return f"{self.ws.cluster}|{self.namespace}/{name}"

    # direct writes in kcp ----------------------------------------------------------------------

    async def create(self, name: str, **labels: str) -> dict[str, Any]:
        status, body = await self.call("POST", self.kcp_url(), widget(name, self.namespace, labels))
        assert status == 201, f"create {name}: {status} {body}"
        return dict(body)

    async def patch_kcp(self, name: str, patch: Any) -> dict[str, Any]:
        status, body = await self.call("PATCH", self.kcp_url(name), patch, ctype=MERGE_PATCH)
        assert status == 200, f"PATCH {name}: {status} {body}"
        return dict(body)

    async def relabel(self, name: str, region: str) -> int:
        """Move ``name`` to ``region`` directly in kcp; the resourceVersion of the move."""
        moved = await self.patch_kcp(name, {"metadata": {"labels": {"region": region}}})
        return int(moved["metadata"]["resourceVersion"])

    async def stored(self, name: str) -> dict[str, Any]:
        obj = await self.get(self.kcp_url(name))
        assert obj is not None, f"{name} is gone from kcp"
        return obj

    # through a slice ---------------------------------------------------------------------------

    async def add_finalizer(self, base: str, slice_name: str, name: str) -> dict[str, Any]:
        """Add the slice's finalizer through the slice (a conditional merge patch)."""
        shown = await self.get(self.slice_url(base, slice_name, name))
        assert shown is not None, f"{slice_name} does not see {name}"
        meta = shown["metadata"]
        patch = {
            "metadata": {
                "finalizers": [*(meta.get("finalizers") or []), FIN[slice_name]],
                "resourceVersion": meta["resourceVersion"],
            }
        }
        url = self.slice_url(base, slice_name, name)
        status, body = await self.call("PATCH", url, patch, ctype=MERGE_PATCH)
        assert status == 200, f"add {FIN[slice_name]} through {slice_name}: {status} {body}"
        return dict(body)

    async def release(self, base: str, slice_name: str, name: str) -> dict[str, Any]:
        """What a controller does with an object being deleted: PUT it back as the slice shows
        it, without the slice's finalizer. The answer (200) as the slice shows it."""
        shown = await self.get(self.slice_url(base, slice_name, name))
        assert shown is not None, f"{slice_name} does not see {name}"
        shown["metadata"]["finalizers"] = [
            f for f in shown["metadata"].get("finalizers") or [] if f != FIN[slice_name]
        ]
        status, body = await self.call("PUT", self.slice_url(base, slice_name, name), shown)
        assert status == 200, f"release through {slice_name}: {status} {body}"
        return dict(body)

    # waiting -----------------------------------------------------------------------------------

    async def leaving_since(self, name: str, slice_name: str) -> str:
        """Once recorded in kcp: when vwserver first saw ``name`` leave ``slice_name``."""

        async def recorded() -> str | None:
            hold = holds(await self.stored(name)).get(self.slice_id(slice_name), {})
            return hold.get("leavingSince") or None

        return await poll(f"leavingSince of {name} in {slice_name}", recorded, within=WAIT)

    async def sentinel(self, recorders: Iterable[Recorder], region: str) -> None:
        """Create an object in ``region`` and wait until every recorder (a watch of a slice that
        matches it) has its ADDED: a watch delivers in resourceVersion order, so each one has
        then delivered everything written before."""
        name = f"sentinel-{uuid.uuid4().hex[:6]}"
        await self.create(name, region=region)
        for recorder in recorders:
            await recorder.wait_for(
                f"{name} through {recorder.url}",
                functools.partial(first_event, recorder, name),
                within=WAIT,
            )


def first_event(recorder: Recorder, name: str) -> dict[str, Any] | None:
    """The first event a recorder has about ``name``, if any."""
    events = recorder.of(name)
    return events[0] if events else None


def holds(obj: Mapping[str, Any]) -> dict[str, Any]:
    raw = (obj["metadata"].get("annotations") or {}).get(HOLDS)
    return dict(json.loads(raw)) if raw else {}


def holders(
    annotations: Mapping[str, str], finalizers: Sequence[str], slice_of: Callable[[str], str]
) -> set[str]:
    """The slices (by name) that hold an object: entries of the holds annotation with a
    finalizer still on it."""
    raw = annotations.get(HOLDS)
    if not raw:
        return set()
    present = set(finalizers)
    return {
        slice_of(sid) for sid, hold in json.loads(raw).items() if present & set(hold["finalizers"])
    }


def sees(
    slice_name: str,
    selectors: Mapping[str, Predicate],
    *,
    labels: Labels,
    annotations: Mapping[str, str],
    finalizers: Sequence[str],
    slice_of: Callable[[str], str],
) -> bool:
    """The contract's membership, written out independently of vwserver.holds: a slice sees
    an object iff (its labels match and no slice that holds it is letting go of it — stopped
    matching, or its leave was recorded) or the slice holds it."""
    held_by = holders(annotations, finalizers, slice_of)
    if slice_name in held_by:
        return True
    raw = annotations.get(HOLDS)
    entries = json.loads(raw) if raw else {}
    recorded = {slice_of(sid) for sid, h in entries.items() if h.get("leavingSince")}
    return (
        selectors[slice_name](labels)
        and all(selectors[h](labels) for h in held_by)
        and not (held_by & recorded)
    )


@pytest_asyncio.fixture(loop_scope="session")
async def bed(kcp: KcpInstance, world: Bootstrap) -> AsyncIterator[Bed]:
    ws = world.consumers[0]
    namespace = f"handoff-{uuid.uuid4().hex[:6]}"
    await make_namespace(kcp, [ws], namespace)
    try:
        async with kcp.http_session(timeout=30) as session:
            yield Bed(kcp, world, ws, namespace, session)
    finally:
        await remove_namespace(kcp, [ws], namespace)


REGIONS = {name: Selector.parse(f"region={name}") for name in ("a", "b")}


def regions(*names: str) -> dict[str, Selector]:
    return {name: Selector.parse(f"region={name}") for name in names}


@contextlib.asynccontextmanager
async def serving(bed: Bed, slices: Mapping[str, Selector], **options: Any) -> AsyncIterator[str]:
    """A vwserver (its own shared cache and handoff loop, every :data:`INTERVAL` seconds unless
    ``handoff_interval`` says otherwise) serving ``slices``; its base URL."""
    options.setdefault("handoff_interval", INTERVAL)
    async with slices_over_kcp(
        bed.kcp, bed.world, slices=slices, page_size=50, cache=True, **options
    ) as base:
        yield base


async def metrics(bed: Bed, base: str, prefix: str) -> dict[str, float]:
    """The samples (``name{labels}`` → value) on the server's /metrics that start with
    ``prefix``."""
    async with bed.session.get(f"{base}/metrics") as resp:
        text = await resp.text()
    samples = (line.rsplit(" ", 1) for line in text.splitlines() if line.startswith(prefix))
    return {sample: float(value) for sample, value in samples}


async def metric(bed: Bed, base: str, sample: str) -> float:
    """The value of one sample (``name{labels}``) on the server's /metrics (0 when absent)."""
    return (await metrics(bed, base, sample + " ")).get(sample, 0.0)


# --------------------------------------------------------------------------------------------
# 1. Go controllers on both slices during relabel churn


@dataclass(frozen=True)
class Move:
    name: str
    src: str
    dst: str
    rv: int  # the relabel's resourceVersion


@dataclass
class Handover:
    """What the checks of one move found (for the record)."""

    move: Move
    release_rv: int
    added_rv: int


@dataclass
class Churn:
    bed: Bed
    base: str
    informers: dict[str, GoClient]
    reconcilers: dict[str, GoClient]
    kcp_watch: Recorder
    moves: list[Move] = field(default_factory=list)

    def slice_of(self, sid: str) -> str:
        cluster, _, name = sid.partition("/")
        assert cluster == self.bed.world.provider.cluster, sid
        return name

    def versions(self, name: str) -> list[dict[str, Any]]:
        """Every version of ``name`` kcp's watch delivered, in order."""
        return [e["object"] for e in self.kcp_watch.of(name) if e["type"] != "DELETED"]

    def version(self, name: str, rv: int) -> dict[str, Any]:
        for obj in self.versions(name):
            if int(obj["metadata"]["resourceVersion"]) == rv:
                return obj
        raise AssertionError(f"kcp's watch delivered no version {rv} of {name}")

    def releases(self, slice_name: str, name: str) -> list[int]:
        """The resourceVersions of the slice's reconciler's finalizer removals of ``name``."""
        return [
            int(w["resourceVersion"])
            for line in self.reconcilers[slice_name].events("reconcile")
            if line["name"] == name
            for w in line["writes"]
            if w["action"] == "finalizer-removed"
        ]

    async def wait(self, what: str, probe: Callable[[], Awaitable[bool | None]]) -> None:
        """``poll`` with what a failure's analysis needs: the objects in kcp, the proxy's
        reads that kcp answered instead of the cache, the clients' last words."""
        try:
            await poll(what, probe, within=WAIT)
        except KcpError as e:
            objects = {
                name: (obj["metadata"]["labels"], obj["metadata"].get("finalizers"), holds(obj))
                for name in sorted({e["object"]["metadata"]["name"] for e in self.kcp_watch.events})
                if (obj := await self.bed.get(self.bed.kcp_url(name))) is not None
            }
            fallbacks = await metrics(
                self.bed, self.base, 'vwserver_cache_reads_total{outcome="fallback"'
            )
            tails = "\n".join(
                c.stderr_tail(10) for c in (*self.informers.values(), *self.reconcilers.values())
            )
            raise AssertionError(
                f"{e}\nobjects (labels, finalizers, holds): {objects}\n"
                f"reads kcp answered: {fallbacks}\n{tails}"
            ) from e

    async def taken_on(self, names: Iterable[str]) -> bool | None:
        """Whether each object carries exactly the finalizer and phase of the slice it is in,
        and that slice's hold."""
        for name in names:
            obj = await self.bed.stored(name)
            region = obj["metadata"]["labels"]["region"]
            if obj["metadata"].get("finalizers") != [FIN[region]]:
                return None
            if (obj.get("status") or {}).get("phase") != PHASE[region]:
                return None
            if set(holds(obj)) != {self.bed.slice_id(region)}:
                return None
        return True


async def test_go_controllers_hand_objects_over_during_relabel_churn(
    bed: Bed, go_clients: Path, tmp_path: Path, observe: Callable[[str], None]
) -> None:
    """A client-go informer and a controller-runtime reconciler (its own finalizer and phase)
    on each of the slices ``a`` and ``b``, while objects are relabelled directly in kcp between
    the two, several at once, in three rounds. For every move: the leaving slice's reconciler
    sees the object being deleted (at the recorded ``leavingSince``) and removes its finalizer
    through its slice; the other slice's informer and reconciler see the object only from that
    release on. Every version kcp stored never loses a finalizer other than by such a release,
    never carries both finalizers, and records each finalizer's slice in the same write; no
    event or read delivered to a slice's client carries an object outside its membership."""
    token = f"--token={bed.kcp.admin_token}"
    names = [f"churn-{i}" for i in range(6)]
    start = {name: "a" if i < 4 else "b" for i, name in enumerate(names)}
    rounds = [[0, 1, 2, 3, 4], [0, 1, 5], [0, 1, 2, 3, 4, 5]]
    async with (
        serving(bed, regions("a", "b")) as base,
        recording(bed.session, bed.kcp_url()) as kcp_watch,
        clients() as add,
    ):
        informers = {
            s: add(
                await GoClient.start(
                    go_clients,
                    f"informer-{s}",
                    informer_args(slice_url(base, bed.world, s, "*"), token, watch_list=s == "a"),
                    tmp_path,
                )
            )
            for s in ("a", "b")
        }
        reconcilers = {
            s: add(
                await GoClient.start(
                    go_clients,
                    f"reconciler-{s}",
                    reconciler_args(
                        slice_url(base, bed.world, s, bed.ws.cluster),
                        token,
                        namespace=bed.namespace,
                        finalizer=FIN[s],
                        phase=PHASE[s],
                    ),
                    tmp_path,
                )
            )
            for s in ("a", "b")
        }
        for client in (*informers.values(), *reconcilers.values()):
            await client.wait_until("cache sync", client.synced, within=SYNC_TIMEOUT)
        churn = Churn(bed, base, informers, reconcilers, kcp_watch)
        for name in names:
            await bed.create(name, region=start[name])
        await churn.wait("the objects taken on", functools.partial(churn.taken_on, names))
        where = dict(start)
        for indices in rounds:
            moving = [names[i] for i in indices]
            dst = {name: "b" if where[name] == "a" else "a" for name in moving}
            rvs = await asyncio.gather(*(bed.relabel(name, dst[name]) for name in moving))
            churn.moves += [
                Move(name, where[name], dst[name], rv) for name, rv in zip(moving, rvs, strict=True)
            ]
            where.update(dst)
            await churn.wait(
                "the moved objects taken on", functools.partial(churn.taken_on, moving)
            )
        final = {name: await bed.stored(name) for name in names}
        last_rv = max(int(obj["metadata"]["resourceVersion"]) for obj in final.values())
        await kcp_watch.wait_for(
            "kcp's watch at the last version",
            lambda: _yes(kcp_watch.reached(last_rv)),
            within=WAIT,
        )
        for s, informer in informers.items():
            inside = {bed.key(n) for n in names if where[n] == s}
            await informer.wait_until(
                "its final view",
                functools.partial(_views, informer, bed.key(""), inside),
                within=WAIT,
            )
        fallbacks = await metrics(bed, base, 'vwserver_cache_reads_total{outcome="fallback"')
        codes = {c.name: await c.stop() for c in (*informers.values(), *reconcilers.values())}
    assert codes == dict.fromkeys(codes, 0), codes

    handovers = [check_move(churn, move) for move in churn.moves]
    for name in names:
        check_kcp_versions(churn, name)
    events = check_membership(churn, names)
    same = sum(h.added_rv == h.release_rv for h in handovers)
    observe(
        f"{len(churn.moves)} moves in {len(rounds)} rounds; each: release through the leaving "
        f"slice, then ADDED to the other ({same} of {len(handovers)} ADDED at the release's own "
        f"resourceVersion); {sum(len(churn.versions(n)) for n in names)} kcp versions checked, "
        f"{events} client events/reads checked for membership; reads kcp answered instead "
        f"of the cache: {fallbacks or 'none'}"
    )


def _views(client: GoClient, prefix: str, keys: set[str]) -> bool:
    """Whether the informer's handler calls so far leave exactly ``keys`` among the keys that
    start with ``prefix``."""
    state: set[str] = set()
    for e in client.events("add", "update", "delete"):
        if e["event"] == "delete":
            state.discard(e["key"])
        elif e["key"].startswith(prefix):
            state.add(e["key"])
    return state == keys


def check_move(churn: Churn, move: Move) -> Handover:
    """One move: the leaving slice released through itself having seen the deletion, and the
    other slice saw the object from the release on, never before."""
    bed = churn.bed
    name, key = move.name, bed.key(move.name)
    # the leaving slice's reconciler read the object being deleted since leavingSince ...
    lines = [
        line
        for line in churn.reconcilers[move.src].events("reconcile")
        if line["name"] == name and "labels" in line and int(line["resourceVersion"]) > move.rv
    ]
    removals = [line for line in lines if "finalizer-removed" in line["actions"]]
    assert removals, f"{move}: {move.src}'s reconciler never released it: {lines}"
    removal = removals[0]
    read = churn.version(name, int(removal["resourceVersion"]))
    since = holds(read)[bed.slice_id(move.src)]["leavingSince"]
    assert since and removal["deletionTimestamp"] == since, (move, removal, read)
    (release_rv,) = [
        int(w["resourceVersion"]) for w in removal["writes"] if w["action"] == "finalizer-removed"
    ]
    released = churn.version(name, release_rv)
    assert FIN[move.src] not in (released["metadata"].get("finalizers") or []), released
    # ... which its informer showed as an update with that deletionTimestamp, then a delete
    src_events = [
        e
        for e in churn.informers[move.src].events("add", "update", "delete")
        if e["key"] == key and int(e["resourceVersion"]) > move.rv
    ]
    leaving = [e for e in src_events if e["event"] == "update" and e["deletionTimestamp"]]
    assert leaving and leaving[0]["deletionTimestamp"] == since, (move, src_events)
    gone = [e for e in src_events if e["event"] == "delete"]
    assert gone and int(gone[0]["resourceVersion"]) == release_rv, (move, src_events)
    # the other slice: nothing between the move and the release, then ADDED
    dst_events = [
        e
        for e in churn.informers[move.dst].events("add", "update", "delete")
        if e["key"] == key and int(e["resourceVersion"]) > move.rv
    ]
    assert dst_events and dst_events[0]["event"] == "add", (move, dst_events)
    added_rv = int(dst_events[0]["resourceVersion"])
    assert added_rv >= release_rv, (
        f"{move}: {move.dst} saw ADDED at {added_rv} before {move.src} released at "
        f"{release_rv}: {dst_events}"
    )
    early = [
        line
        for line in churn.reconcilers[move.dst].events("reconcile")
        if line["name"] == name
        and "labels" in line
        and move.rv < int(line["resourceVersion"]) < release_rv
    ]
    assert not early, f"{move}: {move.dst}'s reconciler read it before the release: {early}"
    return Handover(move, release_rv, added_rv)


def check_kcp_versions(churn: Churn, name: str) -> None:
    """Every version of ``name`` in kcp: a finalizer is recorded for its slice in the write
    that adds it, never both slices' finalizers at once, and a finalizer disappears only in a
    release its slice's reconciler made."""
    bed = churn.bed
    previous: dict[str, Any] | None = None
    for obj in churn.versions(name):
        meta = obj["metadata"]
        finalizers = meta.get("finalizers") or []
        recorded = holds(obj)
        assert not {FIN["a"], FIN["b"]} <= set(finalizers), f"both finalizers: {meta}"
        for s, fin in FIN.items():
            if fin in finalizers:
                assert fin in recorded.get(bed.slice_id(s), {}).get("finalizers", []), (
                    f"{fin} on {name} without {s}'s hold: {meta}"
                )
        if previous is not None:
            lost = set(previous["metadata"].get("finalizers") or []) - set(finalizers)
            rv = int(meta["resourceVersion"])
            for fin in lost:
                (s,) = [s for s, f in FIN.items() if f == fin]
                assert rv in churn.releases(s, name), (
                    f"{name} lost {fin} at {rv}, not in a release by {s}'s reconciler "
                    f"({churn.releases(s, name)}): {meta}"
                )
        previous = obj


def check_membership(churn: Churn, names: Sequence[str]) -> int:
    """No handler call of an informer and no read of a reconciler carried an object outside
    its slice's membership (a DELETED carries the last content the slice saw); a deletion is
    shown only to a slice the object is leaving. Returns how many were checked."""
    bed = churn.bed
    checked = 0
    for s, client in (*churn.informers.items(), *churn.reconcilers.items()):
        kind = "informer" if client in churn.informers.values() else "reconciler"
        lines = (
            client.events("add", "update", "delete")
            if kind == "informer"
            else [line for line in client.events("reconcile") if "labels" in line]
        )
        for line in lines:
            ours = line["namespace"] == bed.namespace
            assert line["name"] in names or not ours, line
            assert sees(
                s,
                REGION,
                labels=line["labels"],
                annotations=line["annotations"],
                finalizers=line["finalizers"],
                slice_of=churn.slice_of,
            ), f"{kind} {s}: an object outside its membership: {line}"
            if line["deletionTimestamp"] and ours:
                assert not REGION[s](line["labels"]), f"{kind} {s}: deleted in view: {line}"
            if ours and not REGION[s](line["labels"]):
                # never outside the slice without the deletion, not even before the move is
                # recorded (#22 finding 15)
                assert line["deletionTimestamp"], f"{kind} {s}: outside, not deleted: {line}"
            checked += ours
    return checked


# --------------------------------------------------------------------------------------------
# 1b. A controller whose cache selects by the slice's own label; what the holding slice sees


async def test_a_reconciler_selecting_by_the_slices_label_releases_what_leaves(
    bed: Bed, go_clients: Path, tmp_path: Path
) -> None:
    """A controller-runtime reconciler on slice ``a`` whose cache selects widgets by ``a``'s
    own label (``cache.ByObject`` ``Label: region=a``: its informer lists and watches with
    ``labelSelector=region=a``). An object relabelled to ``b`` reaches it being deleted — not
    as a plain DELETED with its finalizer still on — so it releases it, and ``b`` gets it. A
    watch with the same selector shows the same; a LIST with it (from the cache, and one kcp
    answers) has the leaving object."""
    token = f"--token={bed.kcp.admin_token}"
    names = ["selected-1", "selected-2"]
    async with (
        serving(bed, regions("a", "b")) as base,
        recording(bed.session, bed.slice_url(base, "a"), labelSelector="region=a") as in_a,
        recording(bed.session, bed.slice_url(base, "b")) as in_b,
        recording(bed.session, bed.kcp_url()) as kcp_watch,
        clients() as add,
    ):
        reconciler = add(
            await GoClient.start(
                go_clients,
                "reconciler-a-selective",
                reconciler_args(
                    slice_url(base, bed.world, "a", bed.ws.cluster),
                    token,
                    namespace=bed.namespace,
                    finalizer=FIN["a"],
                    phase=PHASE["a"],
                    label_selector="region=a",
                ),
                tmp_path,
            )
        )
        await reconciler.wait_until("cache sync", reconciler.synced, within=SYNC_TIMEOUT)
        for name in names:
            await bed.create(name, region="a")

        async def taken_on() -> bool | None:
            for name in names:
                obj = await bed.stored(name)
                if obj["metadata"].get("finalizers") != [FIN["a"]]:
                    return None
            return True

        await poll("the reconciler took the objects on", taken_on, within=WAIT)
        moved = {name: await bed.relabel(name, "b") for name in names}
        for query in (
            "?labelSelector=region%3Da&resourceVersion=0",  # the cache
            f"?labelSelector=region%3Da&fieldSelector=metadata.namespace%3D{bed.namespace}",
        ):
            # the reconciler may have released an object already (then it is gone from a),
            # and resourceVersion=0 may be older than the move (then it is in region a)
            status, listing = await bed.call("GET", bed.slice_url(base, "a") + query)
            assert status == 200, listing
            for item in listing["items"]:
                meta = item["metadata"]
                if meta["name"] in names and meta["labels"]["region"] != "a":
                    assert meta.get("deletionTimestamp"), (query, item)

        async def released() -> bool | None:
            for name in names:
                obj = await bed.stored(name)
                if obj["metadata"].get("finalizers") or HOLDS in (
                    obj["metadata"].get("annotations") or {}
                ):
                    return None
            return True

        try:
            await poll("the reconciler released the leaving objects", released, within=WAIT)
        except KcpError as e:
            raise AssertionError(f"{e}\n{reconciler.stderr_tail(20)}") from e
        for name in names:
            await in_b.wait_for(
                f"b's ADDED of {name}", functools.partial(first_event, in_b, name), within=WAIT
            )
        await bed.sentinel([in_a], "a")
        for name in names:
            last = int((await bed.stored(name))["metadata"]["resourceVersion"])
            await kcp_watch.wait_for(
                f"kcp's watch at {name}'s last version",
                lambda: _yes(kcp_watch.reached(last, name=name)),  # noqa: B023 (awaited here)
                within=WAIT,
            )
        assert await reconciler.stop() == 0
    for name in names:
        # when the move was recorded, from kcp's own versions
        (since,) = {
            hold["leavingSince"]
            for e in kcp_watch.of(name)
            if (hold := holds(e["object"]).get(bed.slice_id("a"), {})).get("leavingSince")
        }
        removals = [
            line
            for line in reconciler.events("reconcile")
            if line["name"] == name and "finalizer-removed" in line["actions"]
        ]
        assert removals and removals[0]["deletionTimestamp"] == since, removals
        events = [
            e
            for e in in_a.of(name)
            if int(e["object"]["metadata"]["resourceVersion"]) >= moved[name]
        ]
        kinds = [(e["type"], e["object"]["metadata"].get("deletionTimestamp")) for e in events]
        assert kinds and kinds[0] == ("MODIFIED", since), kinds
        assert kinds[-1] == ("DELETED", since), kinds


async def test_the_holding_slice_never_sees_a_move_without_its_deletion(bed: Bed) -> None:
    """While objects are moved out of ``a`` (several at once, some back again before the
    release, some released), ``a``'s watches — one with ``a``'s own label as its selector —
    and LISTs and GETs read all the time never show an object outside region=a without a
    deletionTimestamp, not even before the move is recorded; and once a watch showed the
    deletion, it stays until DELETED (#22 findings 14-16)."""
    names = [f"never-{i}" for i in range(4)]
    problems: list[str] = []

    def check(where: str, item: Mapping[str, Any]) -> None:
        meta = item["metadata"]
        if meta.get("namespace") != bed.namespace or meta["name"] not in names:
            return
        if (meta.get("labels") or {}).get("region") != "a" and not meta.get("deletionTimestamp"):
            problems.append(f"{where}: {meta['name']} outside a, not being deleted: {meta}")

    async with (
        serving(bed, regions("a", "b"), handoff_interval=5.0) as base,
        recording(bed.session, bed.slice_url(base, "a")) as in_a,
        recording(bed.session, bed.slice_url(base, "a"), labelSelector="region=a") as own_a,
    ):
        stop = asyncio.Event()

        async def reads() -> int:
            count = 0
            while not stop.is_set():
                for query in (
                    "?resourceVersion=0",
                    "",
                    "?labelSelector=region%3Da",
                    # a LIST kcp answers
                    f"?labelSelector=region%3Da&fieldSelector=metadata.namespace%3D{bed.namespace}",
                ):
                    status, listing = await bed.call("GET", bed.slice_url(base, "a") + query)
                    assert status == 200, listing
                    for item in listing["items"]:
                        check(f"LIST{query}", item)
                for name in names:
                    obj = await bed.get(bed.slice_url(base, "a", name))
                    if obj is not None:
                        check("GET", obj)
                count += 1
            return count

        for name in names:
            await bed.create(name, region="a")
            await bed.add_finalizer(base, "a", name)
        reader = asyncio.ensure_future(reads())
        try:
            await asyncio.gather(*(bed.relabel(name, "b") for name in names))
            for name in names:
                await bed.leaving_since(name, "a")
            # two move back before the release (A → B → A), all are released in the end
            await asyncio.gather(*(bed.relabel(name, "a") for name in names[:2]))
            await asyncio.gather(*(bed.relabel(name, "x") for name in names[2:3]))
            for name in names:
                await bed.release(base, "a", name)
            await bed.sentinel([in_a, own_a], "a")
        finally:
            stop.set()
            rounds = await reader
    assert rounds > 0
    for recorder in (in_a, own_a):
        for item in recorder.initial:
            check("initial LIST", item)
        for name in names:
            deleting = False
            for event in recorder.of(name):
                if event["type"] == "DELETED":
                    deleting = False
                    continue
                check(f"watch {recorder.params}", event["object"])
                has = bool(event["object"]["metadata"].get("deletionTimestamp"))
                if deleting and not has:
                    problems.append(f"{recorder.params}: {name}'s deletion went away")
                deleting = deleting or has
    assert not problems, problems[:5]


# --------------------------------------------------------------------------------------------
# 2. A restart between the move and the release


async def test_restart_shows_the_same_deletion_from_kcp_alone(bed: Bed) -> None:
    """vwserver stopped after the move was recorded and started anew (a new cache, the same
    routes): the leaving slice shows the same deletionTimestamp, in GET and LIST; the other
    slice still does not see the object; the release through the new server hands it over. An
    object moved while no vwserver ran is held back from the other slice from the start."""
    early, late = "restart-early", "restart-late"
    async with (
        serving(bed, regions("a", "b")) as first,
        recording(bed.session, bed.slice_url(first, "a")),
    ):
        for name in (early, late):
            await bed.create(name, region="a")
            await bed.add_finalizer(first, "a", name)
        await bed.relabel(early, "b")
        since = await bed.leaving_since(early, "a")
        shown = await bed.get(bed.slice_url(first, "a", early))
        assert shown is not None
        assert shown["metadata"]["deletionTimestamp"] == since
        assert shown["metadata"]["deletionGracePeriodSeconds"] == 0
        # through the leaving slice, anything but the release is a conflict
        status, body = await bed.call(
            "PATCH", bed.slice_url(first, "a", early), {"spec": {"size": 7}}, ctype=MERGE_PATCH
        )
        assert (status, body["reason"]) == (409, "Conflict"), body
        assert "leaving the slice" in body["message"], body
    await bed.relabel(late, "b")  # no vwserver is running
    async with serving(bed, regions("a", "b")) as second:
        # the other slice: neither object, from the first request on
        for name in (early, late):
            assert await bed.get(bed.slice_url(second, "b", name)) is None
        async with (
            recording(bed.session, bed.slice_url(second, "a")) as in_a,
            recording(bed.session, bed.slice_url(second, "b")) as in_b,
        ):
            assert not in_b.initial
            listed = {i["metadata"]["name"]: i["metadata"] for i in in_a.initial}
            assert listed[early]["deletionTimestamp"] == since
            shown = await bed.get(bed.slice_url(second, "a", early))
            assert shown is not None
            assert shown["metadata"]["deletionTimestamp"] == since
            assert await bed.leaving_since(early, "a") == since  # not recorded anew
            late_since = await bed.leaving_since(late, "a")
            late_shown = await bed.get(bed.slice_url(second, "a", late))
            assert late_shown is not None
            assert late_shown["metadata"]["deletionTimestamp"] == late_since
            released = await bed.release(second, "a", early)
            assert FIN["a"] not in (released["metadata"].get("finalizers") or [])
            stored = await bed.stored(early)
            assert not stored["metadata"].get("finalizers"), stored
            assert HOLDS not in (stored["metadata"].get("annotations") or {}), stored
            added = await in_b.wait_for(
                "ADDED of the released object",
                functools.partial(first_event, in_b, early),
                within=WAIT,
            )
            assert added["type"] == "ADDED", added
            rv = added["object"]["metadata"]["resourceVersion"]
            assert rv == stored["metadata"]["resourceVersion"], (added, stored)
            assert await bed.get(bed.slice_url(second, "a", early)) is None
            assert await bed.get(bed.slice_url(second, "b", early)) is not None
            assert not in_b.of(late)


# --------------------------------------------------------------------------------------------
# 3. Two replicas


async def test_two_replicas_show_the_same_leaving_object(bed: Bed) -> None:
    """Two vwservers with their own caches and handoff loops over the same kcp (racing to
    record the move): both show each leaving object with the same deletionTimestamp, and a
    release through either one hands it over on both."""
    names = ["replica-1", "replica-2"]
    async with (
        serving(bed, regions("a", "b")) as one,
        serving(bed, regions("a", "b")) as two,
        recording(bed.session, bed.slice_url(one, "b")) as b_one,
        recording(bed.session, bed.slice_url(two, "b")) as b_two,
        recording(bed.session, bed.slice_url(one, "a")),
        recording(bed.session, bed.slice_url(two, "a")),
    ):
        for name, base in zip(names, (one, two), strict=True):
            await bed.create(name, region="a")
            await bed.add_finalizer(base, "a", name)
        for name in names:
            await bed.relabel(name, "b")
        for name in names:
            since = await bed.leaving_since(name, "a")
            for base in (one, two):
                shown = await bed.get(bed.slice_url(base, "a", name))
                assert shown is not None and shown["metadata"]["deletionTimestamp"] == since
                # as informers list (resourceVersion=0: from the cache); a LIST that kcp
                # answers: test_a_list_kcp_answers_shows_the_leaving_object
                status, listing = await bed.call(
                    "GET", bed.slice_url(base, "a") + "?resourceVersion=0"
                )
                assert status == 200, listing
                (item,) = [i for i in listing["items"] if i["metadata"]["name"] == name]
                assert item["metadata"]["deletionTimestamp"] == since
                assert await bed.get(bed.slice_url(base, "b", name)) is None
        # released through the other replica than the one that added the finalizer
        for name, base in zip(names, (two, one), strict=True):
            await bed.release(base, "a", name)
        for name in names:
            stored = await bed.stored(name)
            assert not stored["metadata"].get("finalizers"), stored
            for watch in (b_one, b_two):
                added = await watch.wait_for(
                    f"ADDED of {name}",
                    functools.partial(first_event, watch, name),
                    within=WAIT,
                )
                assert added["type"] == "ADDED"
                rv = added["object"]["metadata"]["resourceVersion"]
                assert rv == stored["metadata"]["resourceVersion"]


async def test_a_list_kcp_answers_shows_the_leaving_object(bed: Bed) -> None:
    """A LIST through the leaving slice that the cache leaves to kcp — here one with a
    ``metadata.namespace`` field selector (whether a resource is namespaced is kcp's to know);
    the same path serves a consistent LIST whenever the cache is behind kcp by more than its
    freshness wait — shows the held object being deleted, as the cache does. kcp is asked twice,
    each time naming the slice: with its selector, and with its holder label (which the write
    that recorded the hold set); the two answers are merged in kcp's order at one
    resourceVersion, paged with one continue token, and slice ``b``, which the object is
    arriving in, does not see it (it is in b's selected answer, left out)."""
    name = "kcp-answers"
    sent: list[RecordingUpstream] = []

    def upstream(**kw: Any) -> RecordingUpstream:
        sent.append(RecordingUpstream(**kw))
        return sent[-1]

    async with (
        serving(bed, regions("a", "b"), upstream=upstream) as base,
        recording(bed.session, bed.slice_url(base, "a")),
    ):
        for before in ("kcp-answer", "kcp-answers-z"):  # in a, before and after it in key order
            await bed.create(before, region="a")
        await bed.create(name, region="a")
        await bed.add_finalizer(base, "a", name)
        holder = holder_label(bed.slice_id("a"))
        assert (await bed.stored(name))["metadata"]["labels"].get(holder) == "true"
        await bed.relabel(name, "b")
        since = await bed.leaving_since(name, "a")
        (proxy,) = sent
        fields = {"fieldSelector": f"metadata.namespace={bed.namespace}"}
        order = ["kcp-answer", name, "kcp-answers-z"]
        proxy.sent.clear()
        status, listing = await bed.call("GET", f"{bed.slice_url(base, 'a')}?{_q(fields)}")
        assert status == 200, listing
        shown = {i["metadata"]["name"]: i["metadata"] for i in listing["items"]}
        assert list(shown) == order, f"the LIST kcp answered: {sorted(shown)}"
        assert shown[name].get("deletionTimestamp") == since, shown[name]
        assert len(proxy.lists("widgets")) == 2  # the selected and the held list
        # client pages: one entry each, one continue token across both lists
        pages: list[list[str]] = []
        token = ""
        while True:
            query = {**fields, "limit": "1", **({"continue": token} if token else {})}
            status, page = await bed.call("GET", f"{bed.slice_url(base, 'a')}?{_q(query)}")
            assert status == 200, page
            pages.append([i["metadata"]["name"] for i in page["items"]])
            token = page["metadata"].get("continue", "")
            if not token:
                break
        assert pages == [[n] for n in order], pages
        lists = proxy.lists("widgets")
        assert not unselected_lists(lists, slice_selector=REGIONS["a"], holder=holder), lists
        # b: the arriving object is in its selected answer, and left out
        proxy.sent.clear()
        status, in_b = await bed.call("GET", f"{bed.slice_url(base, 'b')}?{_q(fields)}")
        assert status == 200 and in_b["items"] == [], in_b
        lists = proxy.lists("widgets")
        assert len(lists) == 2 and not unselected_lists(
            lists, slice_selector=REGIONS["b"], holder=holder_label(bed.slice_id("b"))
        ), lists
        # the release ends the hold and its label in one write
        await bed.release(base, "a", name)
        stored = await bed.stored(name)
        assert holder not in stored["metadata"]["labels"], stored["metadata"]


def _q(query: Mapping[str, str]) -> str:
    return urllib.parse.urlencode(query)


# --------------------------------------------------------------------------------------------
# 4. A move back before the release


async def test_a_move_back_before_the_release(bed: Bed) -> None:
    """a → b → a while ``a`` still holds the object: a deletion never goes away (Kubernetes
    never takes a deletionTimestamp back), so ``a`` keeps seeing it being deleted — the
    recorded ``leavingSince`` stays through the loop's scans — until it releases its
    finalizer; then ``a``'s watch gets DELETED and ADDED (the object, in region a, is ``a``'s
    again) at the release's resourceVersion. ``b`` never sees it."""
    name = "back-and-forth"
    async with (
        serving(bed, regions("a", "b")) as base,
        recording(bed.session, bed.slice_url(base, "a")) as in_a,
        recording(bed.session, bed.slice_url(base, "b")) as in_b,
    ):
        await bed.create(name, region="a")
        await bed.add_finalizer(base, "a", name)
        await bed.relabel(name, "b")
        since = await bed.leaving_since(name, "a")
        assert await bed.get(bed.slice_url(base, "b", name)) is None
        back_rv = await bed.relabel(name, "a")
        # the loop scans every INTERVAL: after a sentinel written later reached a's watch and
        # three intervals more, it has seen the move back several times
        await bed.sentinel([in_a], "a")
        await asyncio.sleep(3 * INTERVAL)
        stored = await bed.stored(name)
        assert holds(stored)[bed.slice_id("a")]["leavingSince"] == since, stored
        assert stored["metadata"]["finalizers"] == [FIN["a"]]
        shown = await bed.get(bed.slice_url(base, "a", name))
        assert shown is not None and shown["metadata"].get("deletionTimestamp") == since, shown
        status, listing = await bed.call("GET", bed.slice_url(base, "a") + "?resourceVersion=0")
        assert status == 200, listing
        (item,) = [i for i in listing["items"] if i["metadata"]["name"] == name]
        assert item["metadata"]["deletionTimestamp"] == since
        assert await bed.get(bed.slice_url(base, "b", name)) is None
        released = await bed.release(base, "a", name)
        release_rv = int(released["metadata"]["resourceVersion"])
        await in_a.wait_for(
            "a's watch: DELETED and ADDED at the release",
            lambda: _yes(
                sum(
                    int(e["object"]["metadata"]["resourceVersion"]) >= release_rv
                    for e in in_a.of(name)
                )
                >= 2
            ),
            within=WAIT,
        )
        shown = await bed.get(bed.slice_url(base, "a", name))
        assert shown is not None and "deletionTimestamp" not in shown["metadata"], shown
        await bed.sentinel([in_b], "b")
        assert not in_b.of(name), in_b.of(name)
    events = in_a.of(name)
    seen = [(e["type"], e["object"]["metadata"].get("deletionTimestamp")) for e in events]
    assert ("MODIFIED", since) in seen, seen
    first = seen.index(("MODIFIED", since))
    # from the first deletion on: being deleted until DELETED, then ADDED without it
    tail = seen[first:]
    assert tail[-2:] == [("DELETED", since), ("ADDED", None)], seen
    assert all(ts == since for _, ts in tail[:-1]), seen
    added = events[-1]["object"]
    assert int(added["metadata"]["resourceVersion"]) == release_rv >= back_rv
    assert added["metadata"]["labels"]["region"] == "a"
    assert not added["metadata"].get("finalizers"), added


# --------------------------------------------------------------------------------------------
# 5. A real deletion during a handoff


async def test_a_real_deletion_during_a_handoff(bed: Bed) -> None:
    """An object deleted in kcp while it is leaving ``a``: ``a`` (the one slice that sees it)
    shows kcp's own deletionTimestamp, no longer the move's; ``a``'s release lets kcp delete
    it; ``b`` never sees it, nor does the overlapping ``ab`` from the move on (``a``, which
    holds it, stopped matching)."""
    name = "deleted-while-leaving"
    slices = {**regions("a", "b"), "ab": Selector.parse("region in (a,b)")}
    async with (
        serving(bed, slices) as base,
        recording(bed.session, bed.slice_url(base, "a")) as in_a,
        recording(bed.session, bed.slice_url(base, "b")) as in_b,
        recording(bed.session, bed.slice_url(base, "ab")) as in_ab,
    ):
        await bed.create(name, region="a")
        await bed.add_finalizer(base, "a", name)
        moved_rv = await bed.relabel(name, "b")
        since = await bed.leaving_since(name, "a")

        async def later_second() -> bool | None:
            # the deletion's timestamp (whole seconds) must differ from the move's
            return True if rfc3339(datetime.now(UTC)) > since else None

        await poll("a second after the move was recorded", later_second, within=5)
        status, body = await bed.call("DELETE", bed.kcp_url(name))
        assert status == 200, body
        deleted_at = (await bed.stored(name))["metadata"]["deletionTimestamp"]
        assert deleted_at != since
        shown = await in_a.wait_for(
            "a's watch shows kcp's deletion",
            lambda: next(
                (
                    e["object"]
                    for e in in_a.of(name)
                    if e["object"]["metadata"].get("deletionTimestamp") == deleted_at
                ),
                None,
            ),
            within=WAIT,
        )
        assert shown["metadata"]["deletionTimestamp"] == deleted_at
        got = await bed.get(bed.slice_url(base, "a", name))
        assert got is not None and got["metadata"]["deletionTimestamp"] == deleted_at
        for other in ("b", "ab"):
            assert await bed.get(bed.slice_url(base, other, name)) is None
        await bed.release(base, "a", name)
        assert await bed.get(bed.kcp_url(name)) is None  # no finalizer left: kcp deleted it
        gone = await in_a.wait_for(
            "a's DELETED",
            lambda: next((e for e in in_a.of(name) if e["type"] == "DELETED"), None),
            within=WAIT,
        )
        assert gone["object"]["metadata"]["name"] == name
        await bed.sentinel([in_b, in_ab], "b")
        assert not in_b.of(name), in_b.of(name)
        # ab saw it while it was in a; the move (a holder stopped matching) took it out of ab
        after_move = [
            (e["type"], int(e["object"]["metadata"]["resourceVersion"]))
            for e in in_ab.of(name)
            if int(e["object"]["metadata"]["resourceVersion"]) >= moved_rv
        ]
        assert after_move == [("DELETED", moved_rv)], in_ab.of(name)


# --------------------------------------------------------------------------------------------
# 6. Overlapping selectors


async def test_overlapping_selectors_share_an_object(bed: Bed) -> None:
    """``ab`` (region in (a,b)) and ``b`` (region=b): an object in both is seen by both; one
    that ``ab`` holds and that moves from a to b stays in ``ab`` (not leaving: it still
    matches) and enters ``b``; while both see it, either may finish the other's finalizer."""
    shared, moving, witness = "overlap-shared", "overlap-moving", "overlap-witness"
    slices = {"ab": Selector.parse("region in (a,b)"), "b": Selector.parse("region=b")}
    fin_ab = "ab.handoff.example.io/cleanup"
    async with (
        serving(bed, slices) as base,
        recording(bed.session, bed.slice_url(base, "ab")) as in_ab,
        recording(bed.session, bed.slice_url(base, "b")) as in_b,
    ):
        await bed.create(shared, region="b")
        for s in ("ab", "b"):
            assert await bed.get(bed.slice_url(base, s, shared)) is not None
        await bed.create(moving, region="a")
        await bed.create(witness, region="a")
        assert await bed.get(bed.slice_url(base, "b", moving)) is None
        for name in (moving, witness):
            shown = await bed.get(bed.slice_url(base, "ab", name))
            assert shown is not None
            status, body = await bed.call(
                "PATCH",
                bed.slice_url(base, "ab", name),
                {
                    "metadata": {
                        "finalizers": [fin_ab],
                        "resourceVersion": shown["metadata"]["resourceVersion"],
                    }
                },
                ctype=MERGE_PATCH,
            )
            assert status == 200, body
        moved_rv = await bed.relabel(moving, "b")
        # the witness leaves ab after the move: once its leavingSince is recorded, a scan has
        # seen the moved object too (the cache applies changes in resourceVersion order)
        await bed.relabel(witness, "c")
        await bed.leaving_since(witness, "ab")
        stored = await bed.stored(moving)
        assert not holds(stored)[bed.slice_id("ab")].get("leavingSince"), stored
        for s in ("ab", "b"):
            shown = await bed.get(bed.slice_url(base, s, moving))
            assert shown is not None, s
            assert "deletionTimestamp" not in shown["metadata"], (s, shown)
        added = await in_b.wait_for(
            "b's ADDED", functools.partial(first_event, in_b, moving), within=WAIT
        )
        assert added["type"] == "ADDED"
        assert int(added["object"]["metadata"]["resourceVersion"]) == moved_rv
        assert all(e["type"] == "MODIFIED" for e in in_ab.of(moving)[1:]), in_ab.of(moving)
        # b holds it too; while both still see it as a member, either may finish the other's
        # finalizer (as in Kubernetes), and the holder's entry loses it in the same write
        await bed.add_finalizer(base, "b", moving)
        stored = await bed.stored(moving)
        assert set(holds(stored)) == {bed.slice_id("ab"), bed.slice_id("b")}, stored
        status, body = await bed.call(
            "PATCH",
            bed.slice_url(base, "b", moving),
            {
                "metadata": {
                    "finalizers": [FIN["b"]],
                    "resourceVersion": stored["metadata"]["resourceVersion"],
                }
            },
            ctype=MERGE_PATCH,
        )
        assert status == 200, body
        stored = await bed.stored(moving)
        assert stored["metadata"]["finalizers"] == [FIN["b"]], stored
        assert set(holds(stored)) == {bed.slice_id("b")}, stored
        for s in ("ab", "b"):
            assert await bed.get(bed.slice_url(base, s, moving)) is not None


# --------------------------------------------------------------------------------------------
# 7. The operator's escape hatch and the hold timeout


async def test_release_annotation_ends_a_hold(bed: Bed, caplog: pytest.LogCaptureFixture) -> None:
    """``sync.edge-connect.eu/release: <a's id>`` set directly in kcp on an object ``a`` holds
    while it leaves: vwserver removes ``a``'s finalizer, its hold and the annotation in one
    write, counted as released; ``b`` sees ADDED at that write, nothing before."""
    caplog.set_level(logging.INFO, logger="vwserver.controller.handoff")  # its failed writes too
    name = "escape-hatch"
    async with (
        serving(bed, regions("a", "b")) as base,
        recording(bed.session, bed.slice_url(base, "a")),
        recording(bed.session, bed.slice_url(base, "b")) as in_b,
    ):
        await bed.create(name, region="a")
        await bed.add_finalizer(base, "a", name)
        await bed.relabel(name, "b")
        await bed.leaving_since(name, "a")
        before = await metric(bed, base, 'vwserver_handoff_holds_ended_total{reason="released"}')
        await bed.patch_kcp(name, {"metadata": {"annotations": {RELEASE: bed.slice_id("a")}}})

        async def ended() -> dict[str, Any] | None:
            obj = await bed.stored(name)
            annotations = obj["metadata"].get("annotations") or {}
            done = not obj["metadata"].get("finalizers") and HOLDS not in annotations
            return obj if done and RELEASE not in annotations else None

        stored = await poll("the hold ended by the release annotation", ended, within=WAIT)
        added = await in_b.wait_for(
            "b's ADDED", functools.partial(first_event, in_b, name), within=WAIT
        )
        assert added["type"] == "ADDED"
        assert (
            added["object"]["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
        )
        # The handoff loop counts the hold once its write is known to be made — kcp's answer,
        # or (that answer lost to a timeout while kcp made the write) the object read back or
        # its next version in the cache — and b's watch can deliver that write's event first:
        # wait for the count, then check it is exactly one (a count per attempt, or none for
        # a lost answer, would fail here).
        sample = 'vwserver_handoff_holds_ended_total{reason="released"}'

        async def counted() -> float | None:
            value = await metric(bed, base, sample)
            return value if value > before else None

        try:
            assert await poll("the released hold counted", counted, within=WAIT) == before + 1
        except KcpError as e:
            # What the loop did (a write that failed here while the hold ended says another
            # handoff loop — a server some test left running — made it) and who else scans.
            loops = [t.get_name() for t in asyncio.all_tasks() if t.get_name() == "handoff"]
            done = await metrics(bed, base, "vwserver_handoff_")
            raise AssertionError(f"{e}; this server's handoff metrics {done}; {loops}") from e


async def test_hold_timeout_ends_a_stuck_hold(bed: Bed) -> None:
    """``a`` may hold a leaving object for 30 s (fake time: the handoff loop's clock is the
    test's). A scan before then leaves the hold; the first scan past it removes ``a``'s
    finalizer and hold; ``b`` then sees ADDED."""
    name = "stuck"
    clock = ManualClock()
    interval = 5.0

    async def scan() -> None:
        """Move the clock to the next scan and wait until that scan is done (the loop sleeps
        again: a sleeper due one interval later)."""
        await clock.advance(interval)
        due = clock.t + interval
        await poll(
            f"the handoff scan at t={clock.t}",
            lambda: _true(due in clock.deadlines),
            within=WAIT,
        )

    async with (
        serving(
            bed,
            regions("a", "b"),
            hold_timeouts={"a": 30.0},
            clock=clock,
            handoff_interval=interval,
        ) as base,
        recording(bed.session, bed.slice_url(base, "a")) as in_a,
        recording(bed.session, bed.slice_url(base, "b")) as in_b,
    ):
        # the server's handoff loop runs on the clock: its first sleep
        await poll("the handoff loop", lambda: _true(interval in clock.deadlines), within=WAIT)
        await bed.create(name, region="a")
        await bed.add_finalizer(base, "a", name)
        moved_rv = await bed.relabel(name, "b")
        await in_a.wait_for(
            "a's cache has the move", lambda: _yes(in_a.reached(moved_rv, name=name)), within=WAIT
        )

        # a's watch showed it the move: that read wakes the loop, which records it at once
        # (t=0), not at its next scan.
        async def recorded() -> dict[str, Any] | None:
            stored = await bed.stored(name)
            return stored if holds(stored)[bed.slice_id("a")].get("leavingSince") else None

        stored = await poll("the move recorded", recorded, within=WAIT)
        since = holds(stored)[bed.slice_id("a")]["leavingSince"]
        assert since == rfc3339(clock.now()) and clock.t == 0, stored
        recorded_rv = int(stored["metadata"]["resourceVersion"])
        await in_a.wait_for(
            "a's cache has the record",
            lambda: _yes(in_a.reached(recorded_rv, name=name)),
            within=WAIT,
        )
        while clock.t + interval < 30:  # scans at t=5 ... 25: within the timeout
            await scan()
        assert (await bed.stored(name))["metadata"].get("finalizers") == [FIN["a"]]
        assert not in_b.of(name)
        await scan()  # t=30: 30 s after the move was seen
        stored = await bed.stored(name)
        assert not stored["metadata"].get("finalizers"), stored
        assert HOLDS not in (stored["metadata"].get("annotations") or {}), stored
        added = await in_b.wait_for(
            "b's ADDED", functools.partial(first_event, in_b, name), within=WAIT
        )
        assert added["type"] == "ADDED"
        assert (
            added["object"]["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
        )
        assert await metric(bed, base, 'vwserver_handoff_holds_ended_total{reason="timeout"}') == 1


def _yes(value: bool) -> bool | None:
    """A probe's answer: True, or None for "not yet"."""
    return True if value else None


async def _true(value: bool) -> bool | None:
    return _yes(value)
