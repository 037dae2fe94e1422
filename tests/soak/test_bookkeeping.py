"""The soak's pure parts, without kcp: the writer's plan, the clients' bookkeeping, the verdict.

The soak itself can only be as good as these: a plan whose expected events were wrong, or a
bookkeeping that counted a duplicate as a second client, would pass a broken server.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from tests.soak.deliveries import Deliveries, decode_event
from tests.soak.plan import slice_event, writes
from tests.soak.verdict import judge


def event(kind: str, name: str, rv: int, *, soak: str = "r1", uid: str = "") -> Any:
    doc = {
        "type": kind,
        "object": {
            "metadata": {
                "name": name,
                "uid": uid or f"uid-{name}",
                "resourceVersion": str(rv),
                "labels": {"soak": soak},
            }
        },
    }
    return decode_event(json.dumps(doc).encode())


def test_an_object_inside_the_slice_shows_every_kind_of_event() -> None:
    plan = list(itertools.islice(writes("r1", lanes=1, workspaces=2), 26))
    inside = [w for w in plan if w.name == "soak-r1-in-0"]
    assert [w.op for w in inside] == ["create"] + ["patch"] * 6 + ["delete"]
    assert [slice_event(w) for w in inside] == [
        "ADDED", "MODIFIED", "MODIFIED", "DELETED", None, "ADDED", "MODIFIED", "DELETED",
    ]  # fmt: skip
    assert [w.label for w in inside][3:6] == ["r1-away", "r1-away", "r1"]
    # every other write is outside the slice, and shows nothing
    outside = plan[1::2]
    assert all(w.label in ("r1-out", None) and slice_event(w) is None for w in outside)
    # lifetimes follow each other with new names, alternating between the workspaces
    assert plan[16].name == "soak-r1-in-1"
    assert {w.workspace for w in plan if w.name == "soak-r1-in-1"} == {1}


def test_a_change_is_reported_once_every_client_has_it() -> None:
    d = Deliveries(clients=2, label=("soak", "r1"))
    assert d.received(0, event("ADDED", "a", 10), at=1.0) == []
    (line,) = d.received(1, event("ADDED", "a", 10), at=1.5)
    assert line | {"uid": None} == {
        "kind": "delivery", "type": "ADDED", "uid": None, "rv": 10, "name": "a",
        "clients": 2, "first": 1.0, "last": 1.5,
    }  # fmt: skip
    assert d.final()[-1]["events"] == 2


def test_a_duplicate_is_an_anomaly_not_a_second_client() -> None:
    d = Deliveries(clients=2, label=("soak", "r1"))
    d.received(0, event("ADDED", "a", 10), at=1.0)
    (anomaly,) = d.received(0, event("ADDED", "a", 10), at=1.1)
    assert (anomaly["what"], anomaly["client"]) == ("order", 0)
    (anomaly,) = d.received(0, event("MODIFIED", "a", 9), at=1.2)
    assert anomaly["what"] == "order"
    *partial, summary = d.final()
    assert [p["clients"] for p in partial] == [1]
    assert summary["clients"] == 2


def test_an_object_outside_the_slice_is_foreign() -> None:
    d = Deliveries(clients=1, label=("soak", "r1"))
    lines = d.received(0, event("MODIFIED", "b", 11, soak="r1-out"), at=1.0)
    assert [line["kind"] for line in lines] == ["anomaly", "delivery"]
    assert lines[0]["what"] == "foreign"


def test_bookmarks_and_ends_set_where_a_client_resumes() -> None:
    d = Deliveries(clients=1, label=("soak", "r1"))
    d.received(0, event("ADDED", "a", 10), at=1.0)
    bookmark = decode_event(b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"15"}}}')
    assert d.received(0, bookmark, at=2.0) == []
    assert d.resume_rv(0) == "15"
    assert d.ended(0, "end of stream", at=3.0)[0]["kind"] == "ended"
    assert d.final()[-1]["ends"] == 1


def reports(*deliveries: dict[str, Any], **summary: Any) -> list[dict[str, Any]]:
    return [*deliveries, {"kind": "summary", "anomalies": 0, **summary}]


def delivered(kind: str, uid: str, rv: int, *, clients: int, last: float) -> dict[str, Any]:
    return {
        "kind": "delivery", "type": kind, "uid": uid, "rv": rv, "name": uid,
        "clients": clients, "first": last, "last": last,
    }  # fmt: skip


def test_the_verdict_on_a_perfect_run_is_clean() -> None:
    reference = {("ADDED", "u1", 10): ("u1", 5.0), ("DELETED", "u1", 12): ("u1", 6.0)}
    verdict = judge(
        reference=reference,
        reports=reports(
            delivered("ADDED", "u1", 10, clients=3, last=5.2),
            delivered("DELETED", "u1", 12, clients=3, last=6.1),
        ),
        clients=3,
        bound=30,
    )
    assert verdict.problems == []
    assert [round(lag, 3) for lag in verdict.lags] == [0.2, 0.1]


def test_the_verdict_names_missing_extra_late_and_ended() -> None:
    reference = {
        ("ADDED", "u1", 10): ("u1", 5.0),  # one client never got it
        ("MODIFIED", "u1", 11): ("u1", 5.0),  # late
        ("DELETED", "u1", 12): ("u1", 6.0),  # nobody got it
    }
    verdict = judge(
        reference=reference,
        reports=[
            delivered("ADDED", "u1", 10, clients=2, last=5.2),
            delivered("MODIFIED", "u1", 11, clients=3, last=40.0),
            delivered("MODIFIED", "u2", 13, clients=3, last=7.0),  # kcp never showed it
            {"kind": "ended", "client": 1, "reason": "end of stream", "at": 6.0},
            {"kind": "summary", "anomalies": 4},
        ],
        clients=3,
        bound=30,
    )
    problems = "\n".join(verdict.problems)
    assert "2 of 3 changes did not reach every client" in problems
    assert "ADDED u1@10 (2/3)" in problems and "DELETED u1@12 (0/3)" in problems
    assert "1 changes reached clients that kcp's own watch" in problems
    assert "4 anomalies" in problems
    assert "1 watches ended" in problems
    assert "more than 30 s" in problems
