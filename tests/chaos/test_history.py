"""The informer check of the chaos tests (:mod:`tests.chaos.history`) on hand-made streams:
it passes the streams Kubernetes allows and fails the ones it does not (no kcp needed)."""

from __future__ import annotations

from typing import Any

from tests.chaos.bed import in_slice
from tests.chaos.history import (
    Expected,
    Observed,
    Verdict,
    Version,
    check_object,
    expected_events,
    read_client,
)

PROD = {"env": "prod"}
DEV = {"env": "dev"}
# created in the slice, leaves it, comes back, changes in it, is removed
VERSIONS = [
    Version(10, PROD),
    Version(12, DEV),
    Version(15, PROD),
    Version(20, {"env": "prod", "region": "eu"}),
    Version(20, {"env": "prod", "region": "eu"}, gone=True),
]


def seen(kind: str, rv: int, epoch: int = 1, *, unknown: bool = False, **labels: str) -> Observed:
    default = {} if kind == "delete" else {10: PROD, 15: PROD, 20: VERSIONS[3].labels}[rv]
    return Observed(kind, rv, labels or default, unknown, epoch)


def check(observed: list[Observed], *, final_epoch: int = 1) -> Verdict:
    return check_object(
        "c|ns/w", VERSIONS, observed, member=in_slice, synced_epoch=1, final_epoch=final_epoch
    )


EXACT = [seen("add", 10), seen("delete", 12), seen("add", 15), seen("update", 20)]


def test_expected_events() -> None:
    assert expected_events(VERSIONS, in_slice) == [
        Expected("add", 10),
        Expected("delete", 12),
        Expected("add", 15),
        Expected("update", 20),
        Expected("delete", None),
    ]


def test_every_event_in_order_passes() -> None:
    verdict = check([*EXACT, seen("delete", 23)])
    assert verdict.problems == []
    assert (verdict.events, verdict.skipped, verdict.replays) == (5, 0, 0)


def test_a_lost_event_fails_unless_a_relist_came_between() -> None:
    lost = [seen("add", 10), seen("add", 15), seen("update", 20), seen("delete", 23)]
    assert "1 event(s) before add at 15 lost" in check(lost).problems[0]
    # after a relist the object is handed over as it is then: an update of what it had
    relisted = [
        seen("add", 10),
        seen("update", 15, 2),
        seen("update", 20, 2),
        seen("delete", 23, 2),
    ]
    verdict = check(relisted, final_epoch=2)
    assert verdict.problems == []
    assert verdict.skipped == 1


def test_out_of_order_and_foreign_states_fail() -> None:
    backwards = [seen("add", 10), seen("update", 20, 2), seen("update", 15, 3)]
    assert "out of order" in check(backwards, final_epoch=3).problems[0]
    phantom = [seen("add", 10, env="prod", region="us")]
    assert "labels" in check(phantom).problems[0]
    outside = [Observed("add", 12, DEV, False, 1)]
    assert "not a state of the object in the slice" in check(outside).problems[0]


def test_a_repeated_state_needs_a_relist() -> None:
    repeated = [seen("add", 10), seen("update", 10)]
    assert "repeated without a relist" in check(repeated).problems[0]
    verdict = check([seen("add", 10), seen("update", 10, 2), *EXACT[1:]], final_epoch=2)
    assert verdict.problems == [] and verdict.replays == 1


def test_deleted_final_state_unknown_is_a_relist_seeing_a_departure() -> None:
    observed = [
        seen("add", 10),
        seen("delete", 10, 2, unknown=True),  # the relist's list no longer had it (rv 12)
        seen("add", 15, 2),
        seen("update", 20, 2),
        seen("delete", 23, 2),
    ]
    assert check(observed, final_epoch=2).problems == []
    # ... which needs the relist
    observed[1] = seen("delete", 10, 1, unknown=True)
    assert "without a relist" in check(observed, final_epoch=2).problems[0]


def test_events_missing_at_the_end_fail_without_a_later_relist() -> None:
    assert "the last 2 event(s) lost" in check(EXACT[:3]).problems[0]
    assert check(EXACT[:3], final_epoch=2).problems == []


def test_read_client_counts_relists_before_each_call() -> None:
    def request(query: str, status: int = 200) -> dict[str, Any]:
        path = "/services/filtered-apiexport/p/prod/clusters/*/apis/example.io/v1alpha1/widgets"
        return {"event": "request", "path": path, "query": query, "status": status}

    def call(event: str, rv: str) -> dict[str, Any]:
        return {"event": event, "namespace": "ns", "key": "c|ns/w", "resourceVersion": rv,
                "labels": PROD}  # fmt: skip

    lines = [
        request("limit=500&resourceVersion=0"),
        {"event": "synced", "count": 0},
        request("allowWatchBookmarks=true&resourceVersion=9&watch=true"),
        call("add", "10"),
        request("limit=500&resourceVersion=10", status=410),
        request("limit=500&resourceVersion="),
        call("update", "10"),
        request("allowWatchBookmarks=true&resourceVersion=1&sendInitialEvents=true&watch=true"),
    ]
    log = read_client(lines, namespace="ns", resource="widgets")
    assert (log.synced_epoch, log.final_epoch, log.relists) == (1, 4, 2)
    assert [o.epoch for o in log.by_key["c|ns/w"]] == [1, 3]
