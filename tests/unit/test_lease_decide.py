"""Leader election's pure core (vwserver.k8s.lease.decide): client-go's rules for taking,
keeping and renewing a Lease."""

from __future__ import annotations

from vwserver.k8s.lease import Observed, decide

WALL = "2026-01-01T00:00:00.000000Z"


def test_free_or_missing_lease_is_taken() -> None:
    spec = decide(None, identity="a", observed=None, now_mono=0, now_wall=WALL, lease_duration=15)
    assert spec is not None and spec["holderIdentity"] == "a"
    assert spec["leaseTransitions"] == 0
    released = {"holderIdentity": "", "leaseDurationSeconds": 1, "leaseTransitions": 3}
    spec = decide(
        released, identity="b", observed=Observed(released, 100), now_mono=100, now_wall=WALL,
        lease_duration=15,
    )  # fmt: skip
    assert spec is not None and spec["holderIdentity"] == "b"
    assert spec["leaseTransitions"] == 4


def test_held_lease_is_taken_only_after_it_stood_still_for_its_duration_on_our_clock() -> None:
    held = {"holderIdentity": "a", "leaseDurationSeconds": 15, "renewTime": "1999-01-01T00:00:00Z"}
    seen = Observed(held, at=100.0)
    # renewTime is ancient by the holder's clock: irrelevant, only our observation counts
    assert (
        decide(held, identity="b", observed=seen, now_mono=114.9, now_wall=WALL, lease_duration=15)
        is None
    )
    taken = decide(
        held, identity="b", observed=seen, now_mono=115.0, now_wall=WALL, lease_duration=15
    )
    assert taken is not None and taken["holderIdentity"] == "b" and taken["acquireTime"] == WALL


def test_holder_renews_and_keeps_acquire_time() -> None:
    mine = {"holderIdentity": "a", "acquireTime": "T0", "leaseTransitions": 2}
    spec = decide(
        mine, identity="a", observed=Observed(mine, 0), now_mono=1, now_wall=WALL, lease_duration=15
    )
    assert spec is not None
    assert (spec["acquireTime"], spec["renewTime"], spec["leaseTransitions"]) == ("T0", WALL, 2)
