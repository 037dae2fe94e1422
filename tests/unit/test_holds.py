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
* a slice sees the object being deleted exactly while it holds it and (no longer matches it,
  or its leave was recorded): a deletion, once recorded, never goes away while the hold lasts
  (an object moved back before the slice released it is still being deleted there);
* while a holder is leaving the object, no other slice that does not hold it sees it;
* a client's own label selector is matched against a leaving object by the labels it had as
  the slice last saw it, which the slice's selector matches.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.holds_model import HeldObject, slice_members
from vwserver.controller.handoff import decide, patch_for
from vwserver.errors import HeldFinalizer, LeavingSlice
from vwserver.holds import (
    HOLDS_ANNOTATION,
    RELEASE_ANNOTATION,
    Hold,
    Member,
    as_leaving,
    client_labels,
    effective_holds,
    holder_label,
    holder_label_changes,
    holder_labels,
    is_holder_label,
    leaving_since,
    parse_holds,
    plan_write,
    render_holds,
    sees,
)
from vwserver.selector import Selector, label_key_problems

SELECTORS = {
    "ws/a": Selector.parse("region=a"),
    "ws/b": Selector.parse("region=b"),
    "ws/c": Selector.parse("region=c"),
    "ws/ab": Selector.parse("region in (a,b)"),
}
DISJOINT = [("ws/a", "ws/b"), ("ws/a", "ws/c"), ("ws/b", "ws/c"), ("ws/ab", "ws/c")]
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


member = slice_members(SELECTORS)


@dataclass
class Obj(HeldObject):
    selectors: ClassVar[Mapping[str, Selector]] = SELECTORS
    adder: dict[str, str] = field(default_factory=dict)
    """Ground truth: which slice added each finalizer (through the proxy)."""
    history: list[dict[str, str]] = field(default_factory=list)
    """Every set of labels the object had, oldest first (the cache's window of changes)."""

    def labels_before(self, _sid: str, selector: Selector) -> dict[str, str] | None:
        for labels in reversed(self.history):
            if selector.matches(labels):
                return labels
        return None


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
    try:
        plan = obj.plan(sid, new_finalizers)
    except LeavingSlice:
        return False  # 409: the object is leaving the slice
    except HeldFinalizer:
        if obj.leaving(sid):
            raise  # a release is never refused
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
        labels_before=obj.labels_before,
    )
    if decision is not None and decision.finalizers is not None:
        ended = {f for _, fs, _ in decision.ended for f in fs}
        for f in ended:
            obj.adder.pop(f, None)  # the escape hatch (release annotation or timeout)
    obj.apply(decision)


def _check(obj: Obj, recorded: dict[str, str]) -> None:
    """The contract after one step; ``recorded``: each slice's recorded leave as of the last
    step (updated here)."""
    for one, other in DISJOINT:
        assert not (obj.sees(one) and obj.sees(other)), (one, other, obj)
    holds = effective_holds(obj.annotations, obj.finalizers)
    for sid, hold in holds.items():
        assert obj.sees(sid), f"{sid} holds {hold} but does not see the object"
        for f in hold.finalizers:
            assert obj.adder.get(f) == sid
    leavers = {sid for sid, hold in holds.items() if obj.leaving(sid)}
    for sid, selector in SELECTORS.items():
        hold = holds.get(sid)
        expected = hold is not None and (
            bool(hold.leavingSince) or not selector.matches(obj.labels)
        )
        since = obj.leaving_since(sid)
        assert (since is not None) == expected
        # monotonic: a recorded leave stays while the hold lasts, with the same time
        if sid in recorded and hold is not None:
            assert since == recorded[sid], (sid, since, recorded[sid])
        if hold is None or not hold.leavingSince:
            recorded.pop(sid, None)
        else:
            recorded[sid] = hold.leavingSince
        if leavers - {sid} and hold is None:
            assert not obj.sees(sid), f"{sid} sees it while {leavers} let go of it"
        if since is not None:
            shown = client_labels(
                member(sid),
                labels=obj.labels,
                annotations=obj.annotations,
                finalizers=obj.finalizers,
            )
            if hold is not None and hold.leavingLabels is not None:
                assert selector.matches(shown), (sid, shown)


@settings(max_examples=400, deadline=None)
@given(
    start=st.sampled_from(["a", "b", "c"]),
    ops=st.lists(operations, max_size=30),
    timeout=st.sampled_from([None, 60.0]),
)
def test_random_histories_keep_the_handoff_contract(
    start: str, ops: list[tuple[object, ...]], timeout: float | None
) -> None:
    obj = Obj(labels={"region": start}, history=[{"region": start}])
    timeouts = {sid: timeout for sid in SELECTORS if timeout is not None}
    recorded: dict[str, str] = {}
    _check(obj, recorded)
    for op in ops:
        match op:
            case ("relabel", region):
                obj.labels = {"region": str(region)}
                obj.history.append(obj.labels)
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
        _check(obj, recorded)


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


def test_decide_records_and_times_out() -> None:
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
    # the holder label goes with the entry (here repaired: the object had none)
    assert moved.labels == {holder_label("ws/a"): "true"}
    assert patch_for(moved, resource_version="7", had_holds=True)[0] == {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": "7",
    }
    assert moved.holds is not None
    later = {HOLDS_ANNOTATION: moved.holds}
    assert (
        decide(
            labels={"region": "b", **holder_labels(moved.holds)},
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
        labels={"region": "a", **holder_labels(moved.holds)},
        annotations=later,
        finalizers=["f"],
        selector_of=SELECTORS.get,
        timeout_of=lambda _sid: None,
        now=NOW,
    )
    assert back is None  # moved back before the release: the recorded leave stays
    unknown = decide(
        labels={"region": "b"},
        annotations={HOLDS_ANNOTATION: json.dumps({"other/x": {"finalizers": ["f"]}})},
        finalizers=["f"],
        selector_of=SELECTORS.get,
        timeout_of=lambda _sid: 1.0,
        now=NOW,
    )
    # another server's slice: its hold is left alone; only the label that indexes the entry is
    # repaired (the label follows the annotation, whoever serves the slice)
    assert unknown is not None and unknown.labels == {holder_label("other/x"): "true"}
    assert unknown.finalizers is None and not unknown.ended and not unknown.remove_release
    assert unknown.holds == json.dumps({"other/x": {"finalizers": ["f"]}}, separators=(",", ":"))


# --- a leave, once recorded, completes (monotonic deletion) ------------------------------------


def _recorded(holds: dict[str, Hold]) -> dict[str, str]:
    value = render_holds(holds)
    assert value is not None
    return {HOLDS_ANNOTATION: value}


def test_an_object_moved_back_before_the_release_is_still_being_deleted() -> None:
    """A → B → A before A released: A keeps seeing the deletion (Kubernetes never takes a
    deletionTimestamp back), B and every slice that does not hold it see nothing until A's
    hold ends; then A sees the object it matches again, not leaving."""
    held = {HOLDS_ANNOTATION: json.dumps({"ws/a": {"finalizers": ["f"]}})}
    moved = decide(
        labels={"region": "b"},
        annotations=held,
        finalizers=["f"],
        selector_of=SELECTORS.get,
        timeout_of=lambda _sid: None,
        now=NOW,
        labels_before=lambda _sid, _sel: {"region": "a", "app": "w"},
    )
    assert moved is not None and moved.holds is not None
    leaving = {HOLDS_ANNOTATION: moved.holds}
    hold = parse_holds(moved.holds)["ws/a"]
    assert hold.leavingLabels == {"region": "a", "app": "w"}
    back = {"region": "a", **holder_labels(moved.holds)}
    for labels in ({"region": "b", **holder_labels(moved.holds)}, back):
        kw = {"labels": labels, "annotations": leaving, "finalizers": ["f"]}
        assert sees(member("ws/a"), **kw)
        assert leaving_since(member("ws/a"), **kw) == "2026-12-01T12:00:00Z"
        assert not sees(member("ws/b"), **kw)
        assert not sees(member("ws/ab"), **kw)  # matches, but its holder is letting go
        assert client_labels(member("ws/a"), **kw) == {"region": "a", "app": "w"}
        # the loop leaves the recorded leave alone, whatever the labels
        assert (
            decide(
                labels=labels,
                annotations=leaving,
                finalizers=["f"],
                selector_of=SELECTORS.get,
                timeout_of=lambda _sid: None,
                now=NOW + timedelta(hours=1),
            )
            is None
        )
    # the hold times out even when the object matches again
    timed_out = decide(
        labels=back,
        annotations=leaving,
        finalizers=["f"],
        selector_of=SELECTORS.get,
        timeout_of=lambda _sid: 60.0,
        now=NOW + timedelta(seconds=60),
    )
    assert timed_out is not None and timed_out.ended == [("ws/a", ("f",), "timeout")]
    # A released (its finalizer and entry gone): the object is A's again, not leaving
    released = plan_write(
        member("ws/a"),
        stored_labels=back,
        stored_annotations=leaving,
        stored_finalizers=["f"],
        result_labels=back,
        result_finalizers=[],
        record=False,
    )
    assert released.annotation is None
    after = {"labels": back, "annotations": {}, "finalizers": []}
    assert sees(member("ws/a"), **after) and leaving_since(member("ws/a"), **after) is None
    assert sees(member("ws/ab"), **after) and not sees(member("ws/b"), **after)


def test_a_move_is_recorded_with_the_labels_the_slice_last_saw() -> None:
    held = {HOLDS_ANNOTATION: json.dumps({"ws/a": {"finalizers": ["f"]}})}
    kw = {
        "annotations": held,
        "finalizers": ["f"],
        "selector_of": SELECTORS.get,
        "timeout_of": lambda _sid: None,
        "now": NOW,
    }
    # the window no longer has a version that matched: the labels the selector implies
    guessed = decide(labels={"region": "b", "app": "w"}, **kw)  # type: ignore[arg-type]
    assert guessed is not None and guessed.holds is not None
    assert parse_holds(guessed.holds)["ws/a"].leavingLabels == {"region": "a", "app": "w"}


def test_leaving_labels_survive_every_rewrite_of_the_annotation() -> None:
    hold = Hold(finalizers=("f", "g"), leavingSince="t", leavingLabels={"region": "a"})
    annotations = _recorded({"ws/a": hold})
    assert effective_holds(annotations, ["f"])["ws/a"].leavingLabels == {"region": "a"}
    plan = plan_write(
        member("ws/a"),
        stored_labels={"region": "b"},
        stored_annotations=annotations,
        stored_finalizers=["f", "g"],
        result_labels={"region": "b"},
        result_finalizers=["f"],
        record=False,
    )
    assert plan.annotation is not None
    assert parse_holds(plan.annotation)["ws/a"] == Hold(
        finalizers=("f",), leavingSince="t", leavingLabels={"region": "a"}
    )


def test_a_client_selector_matches_a_leaving_object_by_its_labels_before() -> None:
    """A client selecting by the slice's own label (controller-runtime ByObject) sees the
    leaving object; an annotation recorded without leavingLabels falls back to the labels the
    slice's selector implies; an object not leaving is matched by its labels."""
    prod = Member(selector=Selector.parse("env=prod,tier notin (x)"), id="ws/p")
    legacy = {HOLDS_ANNOTATION: json.dumps({"ws/p": {"finalizers": ["f"], "leavingSince": "t"}})}
    shown = client_labels(
        prod, labels={"env": "dev", "tier": "x", "app": "w"}, annotations=legacy, finalizers=["f"]
    )
    assert shown == {"env": "prod", "app": "w"}
    assert Selector.parse("env=prod").matches(shown)
    # not recorded yet (unrecorded leave): implied as well
    fresh = {HOLDS_ANNOTATION: json.dumps({"ws/p": {"finalizers": ["f"]}})}
    assert client_labels(prod, labels={"env": "dev"}, annotations=fresh, finalizers=["f"]) == {
        "env": "prod"
    }
    # held and matching: its own labels
    assert client_labels(
        prod, labels={"env": "prod", "app": "v"}, annotations=fresh, finalizers=["f"]
    ) == {"env": "prod", "app": "v"}


def test_as_leaving_shows_an_unrecorded_move_being_deleted_at_once() -> None:
    raw = b'{"kind":"Widget","metadata":{"name":"w"}}'
    shown = json.loads(as_leaving(raw, "", now=lambda: "2026-12-01T12:00:01Z"))
    assert shown["metadata"]["deletionTimestamp"] == "2026-12-01T12:00:01Z"
    assert json.loads(as_leaving(raw, ""))["metadata"]["deletionTimestamp"].endswith("Z")


# --- the holder labels --------------------------------------------------------------------------


@given(st.text(min_size=1, max_size=300))
def test_a_holder_label_is_a_valid_label_key_per_slice(sid: str) -> None:
    """One label key per slice id, within Kubernetes' label syntax (a DNS-subdomain prefix, a
    name of at most 63 characters), that a label selector can ask for by its existence."""
    key = holder_label(sid)
    assert is_holder_label(key) and not label_key_problems(key), key
    assert Selector.parse(key).matches({key: "true"})
    assert not Selector.parse(key).matches({})
    assert holder_label(sid + "x") != key


def test_the_holder_labels_follow_the_entries_of_the_annotation() -> None:
    two = render_holds({"ws/a": Hold(finalizers=("f",)), "ws/b": Hold(finalizers=("g",))})
    one = render_holds({"ws/b": Hold(finalizers=("g",))})
    a, b = holder_label("ws/a"), holder_label("ws/b")
    assert holder_labels(two) == {a: "true", b: "true"}
    # set what is missing, remove what names no entry, leave the client's labels alone
    assert holder_label_changes({"x": "1"}, two) == {a: "true", b: "true"}
    assert holder_label_changes({"x": "1", a: "true", b: "true"}, one) == {a: None}
    assert holder_label_changes({"x": "1", b: "true"}, one) == {}
    assert holder_label_changes({b: "forged"}, one) == {b: "true"}
    assert holder_label_changes({a: "true"}, None) == {a: None}


def test_a_write_that_records_or_ends_a_hold_changes_its_label_in_the_same_plan() -> None:
    added = plan_write(
        member("ws/a"),
        stored_labels={"region": "a"},
        stored_annotations={},
        stored_finalizers=[],
        result_labels={"region": "a"},
        result_finalizers=["f"],
        record=True,
    )
    assert added.changes and added.labels == {holder_label("ws/a"): "true"}
    assert added.annotation is not None
    stored = {"region": "a", holder_label("ws/a"): "true"}
    ended = plan_write(
        member("ws/a"),
        stored_labels=stored,
        stored_annotations={HOLDS_ANNOTATION: added.annotation},
        stored_finalizers=["f"],
        result_labels=stored,
        result_finalizers=[],
        record=True,
    )
    assert ended.annotation is None and ended.labels == {holder_label("ws/a"): None}
    kept = plan_write(
        member("ws/a"),
        stored_labels=stored,
        stored_annotations={HOLDS_ANNOTATION: added.annotation},
        stored_finalizers=["f"],
        result_labels=stored,
        result_finalizers=["f"],
        record=True,
    )
    assert not kept.changes
