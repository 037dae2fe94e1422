"""Judging a soak run — pure, no I/O: the clients' reports against kcp's own view of the slice.

The reference is a watch of kcp's APIExport virtual workspace *directly*, with the slice's label
selector: kcp's own answer to "what are this slice's changes", each stamped when it arrived.
Every client must have received exactly those changes (same event type, uid and
resourceVersion), each within ``bound`` seconds of kcp's own watch delivering it — a starvation
bound, generous on purpose: it says no client was left behind, not how fast the fan-out is.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.soak.deliveries import ChangeKey

__all__ = ["Verdict", "judge"]

_SHOWN = 5
"""Examples quoted per problem."""


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    """Per change: the last client's arrival minus kcp's own watch's, in seconds."""

    def lag_figures(self) -> str:
        if not self.lags:
            return "no changes"
        lags = sorted(self.lags)
        p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
        return (
            f"last client behind kcp's own watch: median {statistics.median(lags):.3f} s, "
            f"p99 {p99:.3f} s, max {lags[-1]:.3f} s over {len(lags)} changes"
        )


def judge(
    *,
    reference: Mapping[ChangeKey, tuple[str, float]],
    reports: Iterable[Mapping[str, Any]],
    clients: int,
    bound: float,
) -> Verdict:
    """``reference``: kcp's changes of the slice, (type, uid, rv) → (name, arrival time);
    ``reports``: the clients' process's output lines (:mod:`tests.soak.watchers`)."""
    verdict = Verdict()
    by_kind: dict[str, list[Mapping[str, Any]]] = {}
    for line in reports:
        by_kind.setdefault(str(line["kind"]), []).append(line)
    delivered = {
        (str(d["type"]), str(d["uid"]), int(d["rv"])): d for d in by_kind.get("delivery", [])
    }

    missing = [
        (key, name, delivered[key]["clients"] if key in delivered else 0)
        for key, (name, _) in sorted(reference.items(), key=lambda kv: kv[0][2])
        if key not in delivered or delivered[key]["clients"] != clients
    ]
    if missing:
        examples = ", ".join(
            f"{k[0]} {n}@{k[2]} ({got}/{clients})" for k, n, got in missing[:_SHOWN]
        )
        verdict.problems.append(
            f"{len(missing)} of {len(reference)} changes did not reach every client: "
            f"{_head(examples)}"
        )
    extra = [d for key, d in delivered.items() if key not in reference]
    if extra:
        examples = ", ".join(f"{d['type']} {d['name']}@{d['rv']}" for d in extra[:_SHOWN])
        verdict.problems.append(
            f"{len(extra)} changes reached clients that kcp's own watch of the slice never "
            f"delivered: {_head(examples)}"
        )
    summary = next(iter(by_kind.get("summary", [])), {})
    for kind, what in (
        ("anomaly", "anomalies (order: duplicate or out of order; foreign: outside the slice)"),
        ("refused", "watches could not be opened"),
        ("ended", "watches ended during the soak (every watch should have lasted)"),
    ):
        lines = by_kind.get(kind, [])
        # The clients write out only the first anomalies; their summary counts all.
        count = int(summary.get("anomalies", len(lines))) if kind == "anomaly" else len(lines)
        if count:
            verdict.problems.append(f"{count} {what}: {_head(repr(lines[:_SHOWN]))}")
    if not summary:
        verdict.problems.append("the clients' process wrote no summary")

    for key, (_, at) in reference.items():
        if key in delivered and delivered[key]["clients"] == clients:
            verdict.lags.append(float(delivered[key]["last"]) - at)
    late = [lag for lag in verdict.lags if lag > bound]
    if late:
        verdict.problems.append(
            f"{len(late)} changes reached their last client more than {bound:.0f} s after "
            f"kcp's own watch delivered them (worst {max(late):.1f} s): a starved watch"
        )
    return verdict


def _head(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else text[:limit] + " …"
