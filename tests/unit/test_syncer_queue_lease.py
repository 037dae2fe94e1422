"""The syncer's work queue (per-key serialization, retry backoff) and leader-election core."""

from __future__ import annotations

import asyncio

from vwserver.k8s.lease import Observed, decide
from vwserver.syncer.queue import QueueShutDown, WorkQueue, retry_delay


async def test_keys_coalesce_and_are_never_processed_twice_at_once() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    key = await queue.get()
    assert key == "a"
    queue.add("a")  # while being processed: not handed out again ...
    assert await queue.get() == "b"
    assert len(queue) == 0
    queue.done("a")  # ... until done
    assert await queue.get() == "a"
    queue.done("a")
    queue.done("b")
    queue.shutdown()
    try:
        await asyncio.wait_for(queue.get(), 1)
    except QueueShutDown:
        pass
    else:
        raise AssertionError("get() after shutdown must raise QueueShutDown")


async def test_rate_limited_retries_back_off_per_key_and_forget_resets() -> None:
    queue: WorkQueue[str] = WorkQueue(retry_base=0.01, retry_max=0.04)
    delays = [queue.add_rate_limited("k") for _ in range(4)]
    assert delays == [0.01, 0.02, 0.04, 0.04]
    assert await asyncio.wait_for(queue.get(), 1) == "k"  # the earliest timer fired
    queue.done("k")
    queue.forget("k")
    assert queue.failures("k") == 0
    queue.shutdown()


def test_retry_delay() -> None:
    assert [retry_delay(n, base=0.5, maximum=3) for n in (1, 2, 3, 4)] == [0.5, 1, 2, 3]


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
