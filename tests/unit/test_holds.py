"""Holds between slices (vwserver.holds) and the handoff loop's decisions
(vwserver.controller.handoff.decide), as pure functions.

The property test plays random interleavings of what happens to one object — consumers
relabelling it directly in kcp, controllers adding and removing finalizers through slices
(with the proxy's rules: :func:`plan_write`, and on a leaving object only :func:`releasable`
writes), the handoff loop's scans, the operator's release annotation, a real deletion — and
checks after every step:

* two slices with disjoint selectors never both see the object (the destination waits until the
  source let go);
* a slice that holds the object always sees it (a controller never loses sight of an object
  that carries its finalizer);
* a finalizer added through a slice leaves the object while that slice is leaving it only
  through that slice or the escape hatch (while the slice still sees the object as a member,
  any slice that sees it may remove it: tests/security/test_finalizer_rules.py);
* a slice sees the object being deleted exactly while it holds it and no longer matches it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vwserver.controller.handoff import decide, patch_for
from vwserver.errors import HeldFinalizer
from vwserver.holds import (
    HOLDS_ANNOTATION,
    RELEASE_ANNOTATION,
    Member,
    as_leaving,
    effective_holds,
    leaving_since,
    parse_holds,
    plan_write,
    releasable,
    render_holds,
    sees,
)
from vwserver.selector import Selector

SELECTORS = {
    "ws/a": Selector.parse("region=a"),
    "ws/b": Selector.parse("region=b"),
    "ws/c": Selector.parse("region=c"),
    "ws/ab": Selector.parse("region in (a,b)"),
}
DISJOINT = [("ws/a", "ws/b"), ("ws/a", "ws/c"), ("ws/b", "ws/c"), ("ws/ab", "ws/c")]
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def member(sid: str) -> Member:
    return Member(selector=SELECTORS[sid], id=sid, peers=SELECTORS.get)


@dataclass
class Obj:
    labels: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)
    finalizers: list[str] = field(default_factory=list)
    adder: dict[str, str] = field(default_factory=dict)
    """Ground truth: which slice added each finalizer (through the proxy)."""

    def sees(self, sid: str) -> bool:
        return sees(
            member(sid),
            labels=self.labels,
            annotations=self.annotations,
            finalizers=self.finalizers,
        )

    def leaving(self, sid: str) -> str | None:
        return leaving_since(
            member(sid),
            labels=self.labels,
            annotations=self.annotations,
            finalizers=self.finalizers,
        )

    def set_holds(self, value: str | None) -> None:
        if value is None:
            self.annotations.pop(HOLDS_ANNOTATION, None)
        else:
            self.annotations[HOLDS_ANNOTATION] = value


slices = st.sampled_from(sorted(SELECTORS))
finalizer_names = st.sampled_from(["f1", "f2", "f3"])
operations = st.one_of(
    st.tuples(st.just("relabel"), st.sampled_from(["a", "b", "c", "x"])),
    st.tuples(st.just("add"), slices, finalizer_names),
    st.tuples(st.just("remove"), slices, finalizer_names),
    st.tuples(st.just("scan"), st.integers(min_value=0, max_value=3)),
    st.tuples(st.just("release"), st.sampled_from([*sorted(SELECTORS), "*"])),
    st.tuples(st.just("direct-remove"), finalizer_names),
)


def _write_through(obj: Obj, sid: str, new_finalizers: list[str]) -> bool:
    """A controller's write of the finalizers through slice ``sid``, as the proxy takes it;
    whether it was made."""
    if not obj.sees(sid):
        return False  # 404: the slice does not see the object
    if obj.leaving(sid) is not None:
        if not releasable(
            member(sid),
            stored_finalizers=obj.finalizers,
            result_finalizers=new_finalizers,
            annotations=obj.annotations,
        ):
            return False  # 409: the object is leaving the slice
        plan = plan_write(
            member(sid),
            stored_labels=obj.labels,
            stored_annotations=obj.annotations,
            stored_finalizers=obj.finalizers,
            result_labels=obj.labels,
            result_finalizers=new_finalizers,
            record=False,
        )
    else:
        try:
            plan = plan_write(
                member(sid),
                stored_labels=obj.labels,
                stored_annotations=obj.annotations,
                stored_finalizers=obj.finalizers,
                result_labels=obj.labels,
                result_finalizers=new_finalizers,
                record=True,
            )
        except HeldFinalizer:
            return False
    recorded = parse_holds(obj.annotations.get(HOLDS_ANNOTATION))
    for f in obj.finalizers:
        if f not in new_finalizers and f in obj.adder:
            adder = obj.adder[f]
            holder_leaving = bool(recorded[adder].leavingSince) or not SELECTORS[adder].matches(
                obj.labels
            )
            assert adder == sid or not holder_leaving, f"{sid} removed {f} of leaving {adder}"
            del obj.adder[f]
    for f in new_finalizers:
        if f not in obj.finalizers:
            obj.adder[f] = sid
    obj.finalizers = new_finalizers
    obj.set_holds(plan.annotation)
    return True


def _scan(obj: Obj, minutes: int, timeouts: dict[str, float]) -> None:
    decision = decide(
        labels=obj.labels,
        annotations=obj.annotations,
        finalizers=obj.finalizers,
        selector_of=SELECTORS.get,
        timeout_of=timeouts.get,
        now=NOW + timedelta(minutes=minutes),
    )
    if decision is None:
        return
    if decision.finalizers is not None:
        ended = {f for _, fs, _ in decision.ended for f in fs}
        for f in ended:
            obj.adder.pop(f, None)  # the escape hatch (release annotation or timeout)
        obj.finalizers = decision.finalizers
    obj.set_holds(decision.holds)
    if decision.remove_release:
        obj.annotations.pop(RELEASE_ANNOTATION, None)


def _check(obj: Obj) -> None:
    for one, other in DISJOINT:
        assert not (obj.sees(one) and obj.sees(other)), (one, other, obj)
    holds = effective_holds(obj.annotations, obj.finalizers)
    for sid, hold in holds.items():
        assert obj.sees(sid), f"{sid} holds {hold} but does not see the object"
        for f in hold.finalizers:
            assert obj.adder.get(f) == sid
    for sid, selector in SELECTORS.items():
        expected = sid in holds and not selector.matches(obj.labels)
        assert (obj.leaving(sid) is not None) == expected


@settings(max_examples=400, deadline=None)
@given(
    start=st.sampled_from(["a", "b", "c"]),
    ops=st.lists(operations, max_size=30),
    timeout=st.sampled_from([None, 60.0]),
)
def test_random_histories_keep_the_handoff_contract(
    start: str, ops: list[tuple[object, ...]], timeout: float | None
) -> None:
    obj = Obj(labels={"region": start})
    timeouts = {sid: timeout for sid in SELECTORS if timeout is not None}
    _check(obj)
    for op in ops:
        match op:
            case ("relabel", region):
                obj.labels = {"region": str(region)}
            case ("add", sid, f):
                if f not in obj.finalizers:
                    _write_through(obj, str(sid), [*obj.finalizers, str(f)])
            case ("remove", sid, f):
                if f in obj.finalizers:
                    _write_through(obj, str(sid), [x for x in obj.finalizers if x != f])
            case ("scan", minutes):
                assert isinstance(minutes, int)
                _scan(obj, minutes, timeouts)
            case ("release", target):
                obj.annotations[RELEASE_ANNOTATION] = str(target)
                _scan(obj, 0, timeouts)
            case ("direct-remove", f):
                # A consumer (not a slice) removes a finalizer no slice added.
                if f in obj.finalizers and f not in obj.adder:
                    obj.finalizers = [x for x in obj.finalizers if x != f]
        _check(obj)


# --- examples -----------------------------------------------------------------------------------


def test_a_never_held_object_is_a_label_match() -> None:
    for sid, selector in SELECTORS.items():
        assert sees(member(sid), labels={"region": "a"}, annotations={}, finalizers=[]) == (
            selector.matches({"region": "a"})
        )


def test_a_stale_entry_holds_nothing() -> None:
    annotations = {HOLDS_ANNOTATION: json.dumps({"ws/a": {"finalizers": ["gone"]}})}
    assert not sees(member("ws/a"), labels={"region": "b"}, annotations=annotations, finalizers=[])
    assert sees(member("ws/b"), labels={"region": "b"}, annotations=annotations, finalizers=[])


def test_an_unknown_holder_keeps_the_object_from_everyone_else() -> None:
    annotations = {HOLDS_ANNOTATION: json.dumps({"gone/slice": {"finalizers": ["f"]}})}
    assert not sees(
        member("ws/b"), labels={"region": "b"}, annotations=annotations, finalizers=["f"]
    )


def test_a_malformed_annotation_records_nothing() -> None:
    assert parse_holds("not json") == {}
    assert parse_holds('{"ws/a": {"finalizers": 3}}') == {}


def test_render_is_canonical_and_drops_empty_entries() -> None:
    holds = parse_holds('{"ws/b": {"finalizers": ["x"]}, "ws/a": {"finalizers": []}}')
    assert render_holds(holds) == '{"ws/b":{"finalizers":["x"]}}'
    assert render_holds({}) is None


def test_as_leaving_marks_the_deletion_and_keeps_a_real_one() -> None:
    raw = b'{"kind":"Widget","metadata":{"name":"w"}}'
    shown = json.loads(as_leaving(raw, "2026-12-01T12:00:00Z"))
    assert shown["metadata"]["deletionTimestamp"] == "2026-12-01T12:00:00Z"
    assert shown["metadata"]["deletionGracePeriodSeconds"] == 0
    real = b'{"metadata":{"name":"w","deletionTimestamp":"2020-01-01T00:00:00Z"}}'
    assert as_leaving(real, "2026-12-01T12:00:00Z") == real


def test_plan_write_records_only_where_asked_and_refuses_a_leaving_slices_finalizer() -> None:
    plan = plan_write(
        member("ws/a"),
        stored_labels={"region": "a"},
        stored_annotations={},
        stored_finalizers=[],
        result_labels={"region": "a"},
        result_finalizers=["f"],
        record=False,
    )
    assert plan.annotation is None and not plan.changed
    held = {HOLDS_ANNOTATION: json.dumps({"ws/a": {"finalizers": ["f"]}})}
    with pytest.raises(HeldFinalizer, match="ws/a"):
        plan_write(
            member("ws/ab"),
            stored_labels={"region": "b"},
            stored_annotations=held,
            stored_finalizers=["f"],
            result_labels={"region": "b"},
            result_finalizers=[],
            record=True,
        )


def test_decide_records_clears_and_times_out() -> None:
    held = json.dumps({"ws/a": {"finalizers": ["f"]}})
    moved = decide(
        labels={"region": "b"},
        annotations={HOLDS_ANNOTATION: held},
        finalizers=["f"],
        selector_of=SELECTORS.get,
        timeout_of=lambda _sid: 60.0,
        now=NOW,
    )
    assert moved is not None and moved.recorded == ["ws/a"] and moved.finalizers is None
    assert parse_holds(moved.holds)["ws/a"].leavingSince == "2026-12-01T12:00:00Z"
    assert patch_for(moved, resource_version="7", had_holds=True)[0] == {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": "7",
    }
    assert moved.holds is not None
    later = {HOLDS_ANNOTATION: moved.holds}
    assert (
        decide(
            labels={"region": "b"},
            annotations=later,
            finalizers=["f"],
            selector_of=SELECTORS.get,
            timeout_of=lambda _sid: 60.0,
            now=NOW + timedelta(seconds=59),
        )
        is None
    )
    timed_out = decide(
        labels={"region": "b"},
        annotations=later,
        finalizers=["f"],
        selector_of=SELECTORS.get,
        timeout_of=lambda _sid: 60.0,
        now=NOW + timedelta(seconds=60),
    )
    assert timed_out is not None and timed_out.finalizers == [] and timed_out.holds is None
    assert timed_out.ended == [("ws/a", ("f",), "timeout")]
    back = decide(
        labels={"region": "a"},
        annotations=later,
        finalizers=["f"],
        selector_of=SELECTORS.get,
        timeout_of=lambda _sid: None,
        now=NOW,
    )
    assert back is not None and parse_holds(back.holds)["ws/a"].leavingSince == ""
    unknown = decide(
        labels={"region": "b"},
        annotations={HOLDS_ANNOTATION: json.dumps({"other/x": {"finalizers": ["f"]}})},
        finalizers=["f"],
        selector_of=SELECTORS.get,
        timeout_of=lambda _sid: 1.0,
        now=NOW,
    )
    assert unknown is None  # another server's slice: left alone
