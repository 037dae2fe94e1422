"""Whose finalizer is it (issue 22, finding 5): the write guards of :mod:`vwserver.holds`.

A finalizer added through a slice is that slice's *hold*. The guard protects a hold only while
the object is leaving its slice (``leavingSince`` recorded, or the slice's selector no longer
matching the object before or after the write): then nothing but the slice's own release (or
the hold's end) may remove it. While the holder still sees the object as a member, any slice
that sees the object may remove any finalizer, and the holder's entry loses it in the same
write — so a name recorded by squatting never keeps a controller from finishing its own
finalizer. Table tests of :func:`plan_write` and :func:`releasable`; the property over random
histories is in tests/security/test_finalizer_rules.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.holds_model import slice_members
from vwserver.errors import HeldFinalizer
from vwserver.holds import (
    HOLDS_ANNOTATION,
    hidden_by_relabel,
    parse_holds,
    plan_write,
    releasable,
)
from vwserver.selector import Selector

# prod and B overlap (an object labelled env=prod,region=eu is in both).
SELECTORS = {
    "ws/prod": Selector.parse("env=prod"),
    "ws/b": Selector.parse("region=eu"),
}
BOTH = {"env": "prod", "region": "eu"}
ONLY_B = {"env": "dev", "region": "eu"}
ONLY_PROD = {"env": "prod", "region": "us"}
PROD_FIN = "prod.example/cleanup"
B_FIN = "b.example/cleanup"
SINCE = "2026-12-01T12:00:00Z"


member = slice_members(SELECTORS)


def holds(**entries: Any) -> dict[str, str]:
    """The holds annotation; keyword ``prod``/``b``/``gone`` → finalizers, or (finalizers,
    leavingSince)."""
    value: dict[str, Any] = {}
    for name, spec in entries.items():
        finalizers, since = spec if isinstance(spec, tuple) else (spec, "")
        entry: dict[str, Any] = {"finalizers": finalizers}
        if since:
            entry["leavingSince"] = since
        value[f"ws/{name}"] = entry
    return {HOLDS_ANNOTATION: json.dumps(value)}


@dataclass(frozen=True)
class Case:
    id: str
    writer: str
    stored_labels: dict[str, str] | None
    annotations: dict[str, str]
    before: list[str] | None
    after: list[str]
    result_labels: dict[str, str] | None = None
    held_by: str | None = None
    """The holder named in the 422 (None: the write is allowed)."""
    expect: dict[str, list[str]] | None = None
    """The holds after the write (slice id → finalizers), when allowed."""


CASES = [
    Case(
        "squatted-before: prod removes its own name that B recorded first",
        writer="ws/prod",
        stored_labels=BOTH,
        annotations=holds(b=[PROD_FIN]),
        before=[PROD_FIN],
        after=[],
        expect={},
    ),
    Case(
        "squatted-before, during a real deletion, other finalizers stay B's",
        writer="ws/prod",
        stored_labels=BOTH,
        annotations=holds(b=[PROD_FIN, B_FIN]),
        before=[PROD_FIN, B_FIN],
        after=[B_FIN],
        expect={"ws/b": [B_FIN]},
    ),
    Case(
        "squatting after: B 'adding' a name already on the object records nothing",
        writer="ws/b",
        stored_labels=BOTH,
        annotations=holds(prod=[PROD_FIN]),
        before=[PROD_FIN],
        after=[PROD_FIN],
        expect={"ws/prod": [PROD_FIN]},
    ),
    Case(
        "B removes prod's finalizer while prod sees the object: allowed, prod's entry loses it",
        writer="ws/b",
        stored_labels=BOTH,
        annotations=holds(prod=[PROD_FIN, "prod.example/second"]),
        before=[PROD_FIN, "prod.example/second"],
        after=["prod.example/second"],
        expect={"ws/prod": ["prod.example/second"]},
    ),
    Case(
        "B removes and re-adds prod's name in one write: still prod's (never removed)",
        writer="ws/b",
        stored_labels=BOTH,
        annotations=holds(prod=[PROD_FIN]),
        before=[PROD_FIN],
        after=[PROD_FIN, B_FIN],
        expect={"ws/prod": [PROD_FIN], "ws/b": [B_FIN]},
    ),
    Case(
        "a finalizer on the object before any hold is nobody's",
        writer="ws/b",
        stored_labels=BOTH,
        annotations={},
        before=["kcp.example/other"],
        after=[],
        expect={},
    ),
    Case(
        "a create records what it adds",
        writer="ws/b",
        stored_labels=None,
        annotations={},
        before=None,
        after=[PROD_FIN],
        result_labels=BOTH,
        expect={"ws/b": [PROD_FIN]},
    ),
    Case(
        "prod is leaving (its selector no longer matches): B, a holder too, cannot take it",
        writer="ws/b",
        stored_labels=ONLY_B,
        annotations=holds(prod=[PROD_FIN], b=[B_FIN]),
        before=[PROD_FIN, B_FIN],
        after=[B_FIN],
        held_by="ws/prod",
    ),
    Case(
        "prod's leave is recorded (sticky while labels match again): still guarded",
        writer="ws/b",
        stored_labels=BOTH,
        annotations=holds(prod=([PROD_FIN], SINCE), b=[B_FIN]),
        before=[PROD_FIN, B_FIN],
        after=[B_FIN],
        held_by="ws/prod",
    ),
    Case(
        "a write that moves the object out of prod cannot take prod's finalizer with it",
        writer="ws/b",
        stored_labels=BOTH,
        annotations=holds(prod=[PROD_FIN]),
        before=[PROD_FIN],
        after=[],
        result_labels=ONLY_B,
        held_by="ws/prod",
    ),
    Case(
        "reverse: prod cannot take B's finalizer while B is leaving",
        writer="ws/prod",
        stored_labels=ONLY_PROD,
        annotations=holds(b=[B_FIN], prod=[PROD_FIN]),
        before=[PROD_FIN, B_FIN],
        after=[PROD_FIN],
        held_by="ws/b",
    ),
    Case(
        "reverse: prod still removes its own while B is leaving",
        writer="ws/prod",
        stored_labels=ONLY_PROD,
        annotations=holds(b=([B_FIN], SINCE), prod=[PROD_FIN]),
        before=[PROD_FIN, B_FIN],
        after=[B_FIN],
        expect={"ws/b": [B_FIN]},
    ),
    Case(
        "reverse: prod 'adding' B's name while B is leaving records nothing (B's stays B's)",
        writer="ws/prod",
        stored_labels=ONLY_PROD,
        annotations=holds(b=([B_FIN], SINCE), prod=[PROD_FIN]),
        before=[PROD_FIN, B_FIN],
        after=[PROD_FIN, B_FIN],
        expect={"ws/b": [B_FIN], "ws/prod": [PROD_FIN]},
    ),
    Case(
        "a slice this server does not know matches nothing: its hold is guarded",
        writer="ws/b",
        stored_labels=BOTH,
        annotations=holds(gone=[PROD_FIN]),
        before=[PROD_FIN],
        after=[],
        held_by="ws/gone",
    ),
    Case(
        "a stale entry (its finalizer gone) guards nothing and is dropped",
        writer="ws/b",
        stored_labels=ONLY_B,
        annotations=holds(prod=([PROD_FIN], SINCE)),
        before=[B_FIN],
        after=[],
        expect={},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan_write_guards_only_a_leaving_slices_finalizers(case: Case) -> None:
    def plan() -> str | None:
        return plan_write(
            member(case.writer),
            stored_labels=case.stored_labels,
            stored_annotations=case.annotations,
            stored_finalizers=case.before,
            result_labels=case.result_labels or case.stored_labels,
            result_finalizers=case.after,
            record=True,
        ).annotation

    if case.held_by is not None:
        with pytest.raises(HeldFinalizer) as info:
            plan()
        assert info.value.code == 422
        assert case.held_by in str(info.value) and "leaving" in str(info.value)
        return
    got = {sid: list(h.finalizers) for sid, h in parse_holds(plan()).items()}
    assert got == case.expect


@pytest.mark.parametrize(
    ("before", "after", "ok"),
    [
        ([PROD_FIN, B_FIN], [PROD_FIN], True),  # B releases its own
        ([PROD_FIN, B_FIN], [B_FIN], False),  # not prod's, whatever prod's state
        ([PROD_FIN, B_FIN], [], False),  # nor its own together with prod's
        ([PROD_FIN, B_FIN], [PROD_FIN, B_FIN], False),  # a release removes something
        ([PROD_FIN, B_FIN], [PROD_FIN, "x"], False),  # and adds nothing
    ],
)
def test_a_leaving_slice_may_only_release_its_own(
    before: list[str], after: list[str], ok: bool
) -> None:
    # B is leaving (labels only prod's); prod holds PROD_FIN, B holds B_FIN.
    annotations = holds(b=([B_FIN], SINCE), prod=[PROD_FIN])
    assert (
        releasable(
            member("ws/b"),
            stored_finalizers=before,
            result_finalizers=after,
            annotations=annotations,
        )
        == ok
    )


def test_a_slice_may_drop_its_own_last_hold_while_another_is_leaving() -> None:
    """B holds the object only as a holder (prod is leaving): B removing its own last
    finalizer hides the object from B — allowed (B lets go; it sees the object again once prod
    let go). A relabel through B that makes prod stop matching is refused (it would hide the
    object by the relabel)."""
    leaving = holds(prod=([PROD_FIN], SINCE))
    assert not hidden_by_relabel(
        member("ws/b"),
        stored_labels=ONLY_B,
        labels=ONLY_B,
        annotations=leaving,
        finalizers=[PROD_FIN],
    )
    assert hidden_by_relabel(
        member("ws/b"),
        stored_labels=BOTH,
        labels=ONLY_B,
        annotations=holds(prod=[PROD_FIN]),
        finalizers=[PROD_FIN],
    )
    assert not hidden_by_relabel(
        member("ws/b"),
        stored_labels=BOTH,
        labels={**BOTH, "other": "x"},
        annotations=holds(prod=[PROD_FIN]),
        finalizers=[PROD_FIN],
    )
