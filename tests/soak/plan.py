"""What the soak's writer does to kcp — pure, no I/O: an endless, steady sequence of writes.

Every other write concerns an object *inside* the slice (its ``soak`` label equals the run's),
the others objects *outside* it (``soak=<run>-out``), which must never reach a client. Objects
are created and deleted all along, so the number of live objects stays small and constant (a
soak that only modified a fixed set would not see what deleted objects leave behind), and the
objects inside the slice also leave it and come back by relabelling, so that the watches carry
every kind of event (ADDED, MODIFIED, DELETED for a deletion and for a departure) and a write
inside the slice that the clients must *not* see (a change while the object is away).

An object inside the slice lives through (label after each write; event the slice shows):

    create in        ADDED          patch (away)       —
    patch            MODIFIED       relabel in         ADDED
    patch            MODIFIED       patch              MODIFIED
    relabel away     DELETED        delete             DELETED

An object outside: create, three patches, delete — nothing. Objects alternate between the
consumer workspaces and are worked on a few at a time (``lanes``), interleaved.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

__all__ = ["LABEL", "Write", "slice_event", "writes"]

LABEL = "soak"
"""The label key of the slice's selector (``soak=<run>``)."""

Op = Literal["create", "patch", "delete"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Write:
    """One write to kcp: ``op`` on object ``name`` in consumer workspace number ``workspace``,
    leaving it labelled ``label`` (None after a delete) with ``spec.size`` = ``size``."""

    op: Op
    workspace: int
    name: str
    label: str | None
    size: int
    in_before: bool
    """The object was in the slice before the write."""
    in_after: bool


def slice_event(write: Write) -> str | None:
    """The event a watch of the slice carries for ``write`` (None: nothing)."""
    if write.in_after:
        return "MODIFIED" if write.in_before else "ADDED"
    return "DELETED" if write.in_before else None


def _lifetime(
    run: str, name: str, workspace: int, steps: list[tuple[Op, str | None]]
) -> Iterator[Write]:
    """One object's writes: each step an operation and the label it leaves (None: deleted)."""
    before: str | None = None
    for size, (op, label) in enumerate(steps, start=1):
        yield Write(
            op=op,
            workspace=workspace,
            name=name,
            label=label,
            size=size,
            in_before=before == run,
            in_after=label == run,
        )
        before = label


def _inside(run: str, name: str, workspace: int) -> Iterator[Write]:
    away = f"{run}-away"
    steps: list[tuple[Op, str | None]] = [("create", run), ("patch", run), ("patch", run)]
    steps += [("patch", away), ("patch", away), ("patch", run), ("patch", run), ("delete", None)]
    return _lifetime(run, name, workspace, steps)


def _outside(run: str, name: str, workspace: int) -> Iterator[Write]:
    out = f"{run}-out"
    steps: list[tuple[Op, str | None]] = [("create", out), ("patch", out), ("patch", out)]
    steps += [("patch", out), ("delete", None)]
    return _lifetime(run, name, workspace, steps)


def _lanes(run: str, kind: Literal["in", "out"], lanes: int, workspaces: int) -> Iterator[Write]:
    """Objects of one kind, ``lanes`` at a time, one write per lane in turn, forever."""
    life = _inside if kind == "in" else _outside
    serial = itertools.count()

    def lifetime() -> Iterator[Write]:
        n = next(serial)
        return life(run, f"soak-{run}-{kind}-{n}", n % workspaces)

    current = [lifetime() for _ in range(lanes)]
    while True:
        for lane, steps in enumerate(current):
            write = next(steps, None)
            if write is None:
                current[lane] = steps = lifetime()
                write = next(steps)
            yield write


def writes(run: str, *, lanes: int = 3, workspaces: int = 2) -> Iterator[Write]:
    """The writer's endless sequence for run ``run``: inside and outside alternately."""
    inside = _lanes(run, "in", lanes, workspaces)
    outside = _lanes(run, "out", lanes, workspaces)
    while True:
        yield next(inside)
        yield next(outside)
