"""One object as kcp stores it, seen through overlapping slices: the pure model on which the
property tests of :mod:`vwserver.holds` play their histories (tests/unit/test_holds.py,
tests/security/test_finalizer_rules.py) — kcp keeps only the labels, annotations and
finalizers, and every slice's view and the handoff loop's decision are computed from them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from vwserver.controller.handoff import Decision
from vwserver.errors import LeavingSlice
from vwserver.holds import (
    HOLDS_ANNOTATION,
    RELEASE_ANNOTATION,
    Member,
    WritePlan,
    leaving_since,
    plan_write,
    releasable,
    sees,
)
from vwserver.selector import Selector


def slice_members(selectors: Mapping[str, Selector]) -> Callable[[str], Member]:
    """``member(sid)``: slice ``sid`` of ``selectors``, whose peers are the others."""

    def member(sid: str) -> Member:
        return Member(selector=selectors[sid], id=sid, peers=selectors.get)

    return member


@dataclass
class HeldObject:
    """The object; a test's subclass names its slices (``selectors``) and adds its ground
    truth."""

    selectors: ClassVar[Mapping[str, Selector]]

    labels: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)
    finalizers: list[str] = field(default_factory=list)

    def member(self, sid: str) -> Member:
        return slice_members(self.selectors)(sid)

    def sees(self, sid: str) -> bool:
        return sees(
            self.member(sid),
            labels=self.labels,
            annotations=self.annotations,
            finalizers=self.finalizers,
        )

    def leaving_since(self, sid: str) -> str | None:
        return leaving_since(
            self.member(sid),
            labels=self.labels,
            annotations=self.annotations,
            finalizers=self.finalizers,
        )

    def leaving(self, sid: str) -> bool:
        return self.leaving_since(sid) is not None

    def set_holds(self, value: str | None) -> None:
        if value is None:
            self.annotations.pop(HOLDS_ANNOTATION, None)
        else:
            self.annotations[HOLDS_ANNOTATION] = value

    def plan(
        self, sid: str, after: list[str], *, labels: dict[str, str] | None = None
    ) -> WritePlan:
        """The proxy's plan for a write through ``sid`` of the finalizers ``after`` (and of
        ``labels``; None: unchanged). On an object leaving ``sid`` only a release is let through
        (:func:`releasable`, no relabel; else :class:`LeavingSlice`, the 409), and it records
        nothing; otherwise :func:`plan_write` decides (its refusal raised), recording what the
        write adds. Nothing is changed."""
        leaving = self.leaving(sid)
        if leaving and (
            labels is not None
            or not releasable(
                self.member(sid),
                stored_finalizers=self.finalizers,
                result_finalizers=after,
                annotations=self.annotations,
            )
        ):
            raise LeavingSlice(f"the object is leaving the slice {sid}")
        return plan_write(
            self.member(sid),
            stored_labels=self.labels,
            stored_annotations=self.annotations,
            stored_finalizers=self.finalizers,
            result_labels=labels if labels is not None else self.labels,
            result_finalizers=after,
            record=not leaving,
        )

    def apply(self, decision: Decision | None) -> None:
        """The handoff loop's write of its ``decision`` (None: nothing to write)."""
        if decision is None:
            return
        if decision.finalizers is not None:
            self.finalizers = decision.finalizers
        self.set_holds(decision.holds)
        if decision.remove_release:
            self.annotations.pop(RELEASE_ANNOTATION, None)
