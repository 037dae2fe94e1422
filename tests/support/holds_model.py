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
from vwserver.holds import HOLDS_ANNOTATION, RELEASE_ANNOTATION, Member, leaving_since, sees
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

    def apply(self, decision: Decision | None) -> None:
        """The handoff loop's write of its ``decision`` (None: nothing to write)."""
        if decision is None:
            return
        if decision.finalizers is not None:
            self.finalizers = decision.finalizers
        self.set_holds(decision.holds)
        if decision.remove_release:
            self.annotations.pop(RELEASE_ANNOTATION, None)
