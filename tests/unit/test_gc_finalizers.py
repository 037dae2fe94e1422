"""kcp's garbage-collector finalizers are kcp's (issue 22, finding 12, its residual).

``orphan`` and ``foregroundDeletion`` record a deletion in progress: the apiserver sets them for
a DELETE, kcp's garbage collector removes them once it has orphaned (deleted) the dependents.
A write through a slice that removed ``orphan`` first let the owner go, and the collector then
deleted its dependents — those outside the slice too. No write through a slice adds or removes
either (:func:`vwserver.holds.check_gc_finalizers`, applied by :func:`plan_write`, which every
write path asks: create, update, merge/JSON/strategic patch, apply, the leaving-slice release),
and no hold records one. The real-kcp proof is in tests/security/test_write_options_kcp.py.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from vwserver.controller.handoff import decide
from vwserver.errors import GCFinalizer
from vwserver.holds import (
    GC_FINALIZERS,
    HOLDS_ANNOTATION,
    RELEASE_ANNOTATION,
    Member,
    check_gc_finalizers,
    effective_holds,
    parse_holds,
    plan_write,
    releasable,
    sees,
)
from vwserver.selector import Selector

PROD = Selector.parse("env=prod")
MINE = "prod.example/cleanup"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def member() -> Member:
    return Member(selector=PROD, id="ws/prod", peers={"ws/prod": PROD}.get)


@pytest.mark.parametrize(
    ("before", "after", "refused"),
    [
        # removing: the owner would go before kcp's collector has done its work
        (["orphan"], [], "removes 'orphan'"),
        (["orphan", MINE], ["orphan"], None),  # a controller finishes its own: fine
        (["orphan", MINE], [MINE], "removes 'orphan'"),
        (["foregroundDeletion"], [], "removes 'foregroundDeletion'"),
        (["foregroundDeletion", MINE], [MINE], "removes 'foregroundDeletion'"),
        # adding: decides what a later DELETE that names no propagation does
        ([], ["orphan"], "adds 'orphan'"),
        ([MINE], [MINE, "foregroundDeletion"], "adds 'foregroundDeletion'"),
        (None, ["orphan", "foregroundDeletion"], "adds 'foregroundDeletion' and adds 'orphan'"),
        # swapping one for the other is both
        (["orphan"], ["foregroundDeletion"], "adds 'foregroundDeletion' and removes 'orphan'"),
        # order and duplicates are no change (finalizers are a set to the apiserver)
        (["orphan", MINE], [MINE, "orphan"], None),
        (["orphan"], ["orphan", "orphan"], None),
        ([], [MINE], None),
        ([MINE], [], None),
        (None, None, None),
        # a similar name is nobody's business but the writer's
        (["orphan-x"], [], None),
        ([], ["kubernetes.io/orphan"], None),
    ],
)
def test_check_gc_finalizers(
    before: list[str] | None, after: list[str] | None, refused: str | None
) -> None:
    if refused is None:
        check_gc_finalizers(before, after)
        return
    with pytest.raises(GCFinalizer) as e:
        check_gc_finalizers(before, after)
    assert e.value.code == 422
    assert refused in str(e.value)
    assert "garbage collector" in str(e.value)
    assert e.value.details["causes"][0]["field"] == "metadata.finalizers"


@pytest.mark.parametrize("record", [True, False])
@pytest.mark.parametrize(
    ("stored", "result"),
    [
        (["orphan"], []),
        (None, ["orphan"]),  # a create (or an apply that creates)
        ([MINE], [MINE, "foregroundDeletion"]),
        (["foregroundDeletion", MINE], [MINE]),
    ],
)
def test_plan_write_refuses_every_gc_finalizer_change(
    stored: list[str] | None, result: list[str], record: bool
) -> None:
    with pytest.raises(GCFinalizer):
        plan_write(
            member(),
            stored_labels={"env": "prod"} if stored is not None else None,
            stored_annotations=None,
            stored_finalizers=stored,
            result_labels={"env": "prod"},
            result_finalizers=result,
            record=record,
        )


def test_plan_write_lets_a_controller_finish_its_own_beside_orphan() -> None:
    annotations = {HOLDS_ANNOTATION: json.dumps({"ws/prod": {"finalizers": [MINE]}})}
    plan = plan_write(
        member(),
        stored_labels={"env": "prod"},
        stored_annotations=annotations,
        stored_finalizers=["orphan", MINE],
        result_labels={"env": "prod"},
        result_finalizers=["orphan"],
        record=True,
    )
    assert plan.annotation is None and plan.changed


# An entry naming a GC finalizer can only come from an edit in kcp (or a write before the rule):
# it holds nothing, and the end of a hold never removes it.
EDITED = {
    HOLDS_ANNOTATION: json.dumps(
        {"ws/prod": {"finalizers": ["orphan", MINE], "leavingSince": "2026-12-01T10:00:00Z"}}
    )
}


def test_no_hold_records_a_gc_finalizer() -> None:
    recorded = parse_holds(EDITED[HOLDS_ANNOTATION])
    assert recorded["ws/prod"].finalizers == (MINE,)
    only_gc = json.dumps({"ws/prod": {"finalizers": list(GC_FINALIZERS)}})
    assert effective_holds({HOLDS_ANNOTATION: only_gc}, GC_FINALIZERS) == {}
    # so an object whose only "hold" is kcp's finalizer is not held: labels decide
    assert not sees(
        member(),
        labels={"env": "dev"},
        annotations={HOLDS_ANNOTATION: only_gc},
        finalizers=["orphan"],
    )


def test_a_leaving_slice_cannot_release_a_gc_finalizer() -> None:
    """The one write a leaving slice may make removes its own holds — never kcp's finalizer,
    even where an edited entry names it."""
    assert not releasable(
        member(),
        stored_finalizers=["orphan", MINE],
        result_finalizers=[MINE],
        annotations=EDITED,
    )
    assert releasable(
        member(),
        stored_finalizers=["orphan", MINE],
        result_finalizers=["orphan"],
        annotations=EDITED,
    )
    with pytest.raises(GCFinalizer):  # and plan_write refuses it whatever releasable says
        plan_write(
            member(),
            stored_labels={"env": "dev"},
            stored_annotations=EDITED,
            stored_finalizers=["orphan", MINE],
            result_labels={"env": "dev"},
            result_finalizers=[],
            record=False,
        )


@pytest.mark.parametrize("how", ["timeout", "release"])
def test_the_end_of_a_hold_leaves_gc_finalizers_to_kcp(how: str) -> None:
    annotations = dict(EDITED)
    if how == "release":
        annotations[RELEASE_ANNOTATION] = "*"
    decision = decide(
        labels={"env": "dev"},
        annotations=annotations,
        finalizers=["orphan", MINE],
        selector_of={"ws/prod": PROD}.get,
        timeout_of=lambda _sid: 60.0,
        now=NOW + timedelta(days=1),
    )
    assert decision is not None
    assert decision.finalizers == ["orphan"]
