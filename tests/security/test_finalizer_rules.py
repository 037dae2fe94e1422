"""Whose finalizer is it, over random histories (issue 22, finding 5 and its class).

Overlapping slices share an object; a user of one may add any finalizer name through it —
including the name another slice's controller uses (squatting), before or after that
controller added it. The rules of :mod:`vwserver.holds` (a pure model: the proxy's writes are
:func:`plan_write` and, on an object leaving the writer's slice, :func:`releasable`; the
handoff loop is :func:`decide`) must keep, after every step of any history of relabels
(directly in kcp), finalizer writes through any slice (squatting names too, and writes that
relabel while removing), scans with hold timeouts, the escape hatch and a real deletion:

1. a slice that sees the object and is not leaving it can remove every finalizer on it except
   one held by a slice the object is leaving — and then no entry records that finalizer any
   more;
2. a finalizer held by a slice the object is leaving can be removed through no other slice
   (only through that slice, by the escape hatch or by the hold timeout), and that slice can
   always release it;
3. a deletion always completes: once deleted, if every slice's controller finishes what it
   can (each seeing slice removes every finalizer it may) and kcp's garbage collector its
   own, the object ends with no finalizers — within the default hold bound at the latest;
4. kcp's garbage-collector finalizers (``orphan``, ``foregroundDeletion``; set by a DELETE's
   propagation, removed by kcp's collector — also steps of the history) are added and removed
   through no slice, and no hold records them (issue 22, finding 12).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import ClassVar

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.holds_model import HeldObject, slice_members
from vwserver.controller.handoff import decide
from vwserver.errors import GCFinalizer, HeldFinalizer, Invalid, LeavingSlice
from vwserver.holds import (
    DEFAULT_HOLD_TIMEOUT_SECONDS,
    FOREGROUND_FINALIZER,
    GC_FINALIZERS,
    HOLDS_ANNOTATION,
    ORPHAN_FINALIZER,
    RELEASE_ANNOTATION,
    effective_holds,
    hidden_by_relabel,
    parse_holds,
)
from vwserver.selector import Selector

SELECTORS = {
    "ws/a": Selector.parse("region=a"),
    "ws/b": Selector.parse("region=b"),
    "ws/ab": Selector.parse("region in (a,b)"),
    "ws/gold": Selector.parse("tier=gold"),  # overlaps every other slice
}
# Each slice's controller uses its own finalizer name; any slice may write any of them.
NAMES = [f"{sid.removeprefix('ws/')}.example/cleanup" for sid in SELECTORS] + ["x.example/f"]
# ... and kcp's garbage collector's, which a client may try to write too.
WRITTEN = [*NAMES, *GC_FINALIZERS]
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


member = slice_members(SELECTORS)


@dataclass
class Obj(HeldObject):
    selectors: ClassVar[Mapping[str, Selector]] = SELECTORS
    deleted: bool = False
    minutes: int = 0

    def leaving_holders(self) -> dict[str, tuple[str, ...]]:
        """Ground truth of rule 2: the holders the object is leaving (their selector no longer
        matches, or their leave is recorded), with the finalizers they hold."""
        recorded = parse_holds(self.annotations.get(HOLDS_ANNOTATION))
        out: dict[str, tuple[str, ...]] = {}
        for sid, hold in effective_holds(self.annotations, self.finalizers).items():
            if recorded[sid].leavingSince or not SELECTORS[sid].matches(self.labels):
                out[sid] = hold.finalizers
        return out


def attempt(
    obj: Obj, sid: str, after: list[str], *, labels: dict[str, str] | None = None
) -> str | Invalid | None:
    """A write through ``sid`` of the finalizers (and labels), as the proxy takes it: the
    holds annotation it writes, or the 422 / 409 (as HeldFinalizer; GCFinalizer for kcp's
    garbage-collector finalizers) refusing it — also the 422 for a write that would hide the
    object from ``sid`` by its relabel. Nothing is changed."""
    assert obj.sees(sid)
    result_labels = labels if labels is not None else obj.labels
    try:
        value = obj.plan(sid, after, labels=labels).annotation
    except LeavingSlice:
        return HeldFinalizer("409: the object is leaving the slice")
    except (HeldFinalizer, GCFinalizer) as e:
        return e
    annotations = {**obj.annotations}
    annotations.pop(HOLDS_ANNOTATION, None)
    if value is not None:
        annotations[HOLDS_ANNOTATION] = value
    if hidden_by_relabel(
        member(sid),
        stored_labels=obj.labels,
        labels=result_labels,
        annotations=annotations,
        finalizers=after,
    ):
        return HeldFinalizer("422: the relabel would hide the object from the slice")
    return value


def write(obj: Obj, sid: str, after: list[str], *, labels: dict[str, str] | None = None) -> None:
    if not obj.sees(sid):
        return  # 404
    if labels is not None and not SELECTORS[sid].matches(labels):
        return  # no write may move an object out of the writer's slice (422)
    if obj.deleted and any(f not in obj.finalizers for f in after):
        return  # the apiserver: no new finalizers on an object being deleted
    result = attempt(obj, sid, after, labels=labels)
    if isinstance(result, Invalid):
        return
    obj.finalizers = after
    if labels is not None:
        obj.labels = labels
    obj.set_holds(result)


def delete(obj: Obj, policy: str | None) -> None:
    """A DELETE in kcp with ``policy``: the apiserver's deletionFinalizersForGarbageCollection
    (store.go) — its GC finalizers replaced by the one of the propagation (none named: the one
    of a deletion in progress; else Background, the default of custom resources)."""
    if policy is None:
        policy = next(
            (
                {ORPHAN_FINALIZER: "Orphan", FOREGROUND_FINALIZER: "Foreground"}[f]
                for f in obj.finalizers
                if f in GC_FINALIZERS
            ),
            "Background",
        )
    kept = [f for f in obj.finalizers if f not in GC_FINALIZERS]
    wanted = {"Orphan": [ORPHAN_FINALIZER], "Foreground": [FOREGROUND_FINALIZER]}.get(policy, [])
    obj.finalizers = [*kept, *wanted]
    obj.deleted = True


def collect(obj: Obj) -> None:
    """kcp's garbage collector has orphaned (deleted) the dependents of an object being
    deleted, and removes its finalizers (directly in kcp); it leaves a live object's alone."""
    if obj.deleted:
        obj.finalizers = [f for f in obj.finalizers if f not in GC_FINALIZERS]


def scan(obj: Obj, minutes: int) -> None:
    obj.minutes += minutes
    decision = decide(
        labels=obj.labels,
        annotations=obj.annotations,
        finalizers=obj.finalizers,
        selector_of=SELECTORS.get,
        timeout_of=lambda _sid: DEFAULT_HOLD_TIMEOUT_SECONDS,
        now=NOW + timedelta(minutes=obj.minutes),
    )
    obj.apply(decision)


def check(obj: Obj) -> None:
    leaving = obj.leaving_holders()
    for hold in parse_holds(obj.annotations.get(HOLDS_ANNOTATION)).values():
        assert not set(hold.finalizers) & set(GC_FINALIZERS), obj  # rule 4: nobody's hold
    for sid in SELECTORS:
        if not obj.sees(sid):
            continue
        for g in GC_FINALIZERS:
            if g not in obj.finalizers:  # rule 4: no slice adds one
                assert isinstance(attempt(obj, sid, [*obj.finalizers, g]), Invalid), (sid, g)
        for f in obj.finalizers:
            guarded_by = [h for h, fs in leaving.items() if f in fs and h != sid]
            result = attempt(obj, sid, [x for x in obj.finalizers if x != f])
            if f in GC_FINALIZERS:
                # Rule 4: no slice removes one (a leaving slice's write is its 409).
                assert isinstance(result, Invalid), (sid, f, result, obj)
                if not obj.leaving(sid):
                    assert isinstance(result, GCFinalizer), (sid, f, result, obj)
            elif obj.leaving(sid):
                # Rule 2, the release: a leaving slice removes exactly its own.
                own = f in effective_holds(obj.annotations, obj.finalizers)[sid].finalizers
                assert isinstance(result, HeldFinalizer) != own, (sid, f, obj)
            elif guarded_by:
                assert isinstance(result, HeldFinalizer), (sid, f, guarded_by, obj)  # rule 2
                assert guarded_by[0] in str(result)
            else:
                assert not isinstance(result, HeldFinalizer), (sid, f, result, obj)  # rule 1
                assert all(f not in h.finalizers for h in parse_holds(result).values())


def drain(obj: Obj) -> None:
    """Rule 3: a real deletion, every controller finishing what it can, time passing."""
    obj.deleted = True
    for _ in range(len(SELECTORS) + 2):
        for sid in SELECTORS:
            if not obj.sees(sid):
                continue
            mine = effective_holds(obj.annotations, obj.finalizers).get(sid)
            if obj.leaving(sid):
                if mine is not None:
                    write(obj, sid, [f for f in obj.finalizers if f not in mine.finalizers])
                continue
            for f in list(obj.finalizers):
                write(obj, sid, [x for x in obj.finalizers if x != f])
        collect(obj)
        if not obj.finalizers:
            return
        scan(obj, 1)
    scan(obj, int(DEFAULT_HOLD_TIMEOUT_SECONDS // 60) + 1)  # the bound ends what is left
    assert not obj.finalizers, obj


regions = st.sampled_from(["a", "b", "x"])
slices = st.sampled_from(sorted(SELECTORS))
names = st.sampled_from(WRITTEN)
policies = st.sampled_from([None, "Orphan", "Foreground", "Background"])
operations = st.one_of(
    st.tuples(st.just("relabel"), regions, st.booleans()),
    st.tuples(st.just("add"), slices, names),
    st.tuples(st.just("remove"), slices, names),
    st.tuples(st.just("relabel-remove"), slices, regions, names),
    st.tuples(st.just("scan"), st.integers(min_value=0, max_value=90)),
    st.tuples(st.just("release"), st.sampled_from([*sorted(SELECTORS), "*"])),
    st.tuples(st.just("delete"), policies),
    st.tuples(st.just("collect")),
)


@settings(max_examples=500, deadline=None)
@given(
    start=regions,
    gold=st.booleans(),
    ops=st.lists(operations, max_size=30),
)
def test_finalizers_are_finished_by_whoever_sees_the_object_and_kept_for_a_leaving_slice(
    start: str, gold: bool, ops: list[tuple[object, ...]]
) -> None:
    obj = Obj(labels={"region": start, **({"tier": "gold"} if gold else {})})
    check(obj)
    for op in ops:
        match op:
            case ("relabel", region, tier):
                obj.labels = {"region": str(region), **({"tier": "gold"} if tier else {})}
            case ("add", sid, f):
                if f not in obj.finalizers:
                    write(obj, str(sid), [*obj.finalizers, str(f)])
            case ("remove", sid, f):
                if f in obj.finalizers:
                    write(obj, str(sid), [x for x in obj.finalizers if x != f])
            case ("relabel-remove", sid, region, f):
                labels = {**obj.labels, "region": str(region)}
                write(obj, str(sid), [x for x in obj.finalizers if x != f], labels=labels)
            case ("scan", minutes):
                assert isinstance(minutes, int)
                scan(obj, minutes)
            case ("release", target):
                obj.annotations[RELEASE_ANNOTATION] = str(target)
                scan(obj, 0)
            case ("delete", policy):
                delete(obj, None if policy is None else str(policy))
            case ("collect",):
                collect(obj)
        check(obj)
    drain(obj)


def test_a_squatted_name_is_finished_by_its_controller() -> None:
    """The finding itself: B (gold) adds prod's name (a's) first; the object is deleted; a's
    controller removes its finalizer through a."""
    obj = Obj(labels={"region": "a", "tier": "gold"})
    write(obj, "ws/gold", ["a.example/cleanup"])
    assert json.loads(obj.annotations[HOLDS_ANNOTATION]) == {
        "ws/gold": {"finalizers": ["a.example/cleanup"]}
    }
    obj.deleted = True
    write(obj, "ws/a", [])
    assert obj.finalizers == [] and HOLDS_ANNOTATION not in obj.annotations
