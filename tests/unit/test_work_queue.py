"""The control loops' work queue (vwserver.k8s.queue): dedupe, per-key serialization, delayed
adds, per-key backoff and the overall rate limit, on a clock the test moves."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.clock import ManualClock, settle
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.queue import QueueShutDown, TokenBucket, WorkQueue

NO_JITTER = Backoff(initial=0.01, maximum=0.04, jitter=0.0)


def queued(queue: WorkQueue[str]) -> list[str]:
    """What ``get`` would hand out now, in order (taken without processing)."""
    out = []
    while (key := queue._pop(None)) is not None:
        queue.done(key)
        out.append(key)
    return out


async def test_keys_coalesce_and_are_never_processed_twice_at_once() -> None:
    queue: WorkQueue[str] = WorkQueue(clock=ManualClock())
    queue.add("a")
    queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    assert await queue.get() == "a"
    queue.add("a")  # while being processed: not handed out again ...
    queue.add("a")
    assert await queue.get() == "b"
    assert len(queue) == 0
    queue.done("a")  # ... until done, and then once
    assert await queue.get() == "a"
    assert len(queue) == 0
    queue.done("a")
    queue.done("b")
    queue.shutdown()
    with pytest.raises(QueueShutDown):
        await asyncio.wait_for(queue.get(), 1)


async def test_a_waiting_worker_is_woken_by_an_add() -> None:
    queue: WorkQueue[str] = WorkQueue(clock=ManualClock())
    worker = asyncio.create_task(queue.get())
    await settle()
    assert not worker.done()
    queue.add("k")
    assert await asyncio.wait_for(worker, 1) == "k"
    queue.shutdown()


async def test_delayed_adds_arrive_on_time_in_order_and_the_earlier_delay_wins() -> None:
    clock = ManualClock()
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    queue.add_after("late", 10)
    await settle()
    assert clock.deadlines == [10]  # the queue's timer sleeps until then ...
    queue.add_after("late", 20)  # later than pending: ignored
    queue.add_after("early", 5)  # ... and is woken for an earlier one
    queue.add_after("moved", 30)
    queue.add_after("moved", 3)  # earlier: wins
    await settle()
    assert clock.deadlines == [3]
    await clock.advance(2.9)
    assert queued(queue) == []
    await clock.advance(0.1)
    assert queued(queue) == ["moved"]
    await clock.advance(2)
    assert queued(queue) == ["early"]
    await clock.advance(4.9)
    assert queued(queue) == []
    await clock.advance(0.1)
    assert queued(queue) == ["late"]
    await clock.advance(100)
    assert queued(queue) == []  # the superseded delays fire nothing
    queue.add_after("now", 0)
    assert queued(queue) == ["now"]
    queue.shutdown()


async def test_failures_back_off_per_key_and_forget_resets() -> None:
    clock = ManualClock()
    queue: WorkQueue[str] = WorkQueue(clock=clock, backoff=NO_JITTER)
    assert [queue.add_rate_limited("a") for _ in range(4)] == [0.01, 0.02, 0.04, 0.04]
    assert queue.add_rate_limited("b") == 0.01  # every key has its own count
    assert (queue.failures("a"), queue.failures("b")) == (4, 1)
    await clock.advance(0.01)
    assert sorted(queued(queue)) == ["a", "b"]  # a's earliest pending retry won
    queue.forget("a")
    assert queue.failures("a") == 0
    assert queue.add_rate_limited("a") == 0.01
    queue.shutdown()


async def test_jittered_backoff_stays_within_half_and_whole_ceiling() -> None:
    queue: WorkQueue[str] = WorkQueue(
        clock=ManualClock(), backoff=Backoff(initial=1, maximum=8, rand=lambda: 0.5)
    )
    assert [queue.add_rate_limited("k") for _ in range(5)] == [0.75, 1.5, 3, 6, 6]
    queue.shutdown()


async def test_retries_share_one_rate_limit() -> None:
    clock = ManualClock()
    queue: WorkQueue[str] = WorkQueue(
        clock=clock, backoff=Backoff(initial=0.001, maximum=0.001, jitter=0), rate=2, burst=2
    )
    # two retries may go at once (the burst), the rest are spread at 2 a second
    delays = [queue.add_rate_limited(k) for k in "abcde"]
    assert delays == [0.001, 0.001, 0.5, 1.0, 1.5]
    await clock.advance(0.4)
    assert sorted(queued(queue)) == ["a", "b"]
    await clock.advance(0.6)
    assert sorted(queued(queue)) == ["c", "d"]
    await clock.advance(0.5)
    assert queued(queue) == ["e"]
    # time passed: the bucket is full again
    await clock.advance(10)
    assert [queue.add_rate_limited(k) for k in "fg"] == [0.001, 0.001]
    queue.shutdown()


def test_token_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    clock = ManualClock()
    bucket = TokenBucket(rate=10, burst=3, clock=clock)
    assert [bucket.reserve() for _ in range(4)] == [0, 0, 0, pytest.approx(0.1)]
    clock.t += 0.2  # pays the debt and earns one more
    assert bucket.reserve() == 0
    assert bucket.reserve() == pytest.approx(0.1)
    clock.t += 100
    assert [bucket.reserve() for _ in range(4)] == [0, 0, 0, pytest.approx(0.1)]


async def test_shutdown_drops_pending_delays_and_ignores_adds() -> None:
    clock = ManualClock()
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    queue.add_after("later", 5)
    queue.add("now")
    queue.shutdown()
    queue.add("after")
    queue.add_after("after", 1)
    await clock.advance(10)
    assert await queue.get() == "now"  # what was queued is still handed out
    with pytest.raises(QueueShutDown):
        await queue.get()
    assert clock.deadlines == []  # the timer is gone


async def test_workers_never_handle_one_key_at_once_and_stop_at_shutdown() -> None:
    queue: WorkQueue[str] = WorkQueue(clock=ManualClock())
    running: set[str] = set()
    handled: list[str] = []
    release = asyncio.Event()

    async def handle(key: str) -> None:
        assert key not in running, f"{key} handled twice at once"
        running.add(key)
        await release.wait()
        running.discard(key)
        handled.append(key)

    workers = [asyncio.create_task(queue.work(handle)) for _ in range(3)]
    queue.add("a")
    await settle()
    queue.add("a")  # while a worker holds it: another worker must not take it
    queue.add("b")
    await settle()
    assert running == {"a", "b"}
    release.set()
    await settle()
    assert sorted(handled) == ["a", "a", "b"]
    queue.shutdown()
    await asyncio.wait_for(asyncio.gather(*workers), 1)  # each worker returns


# --- fairness across groups (the slice controller's tenants, issue #22) --------------------


def tenant(key: str) -> str:
    """Keys are "<group>/<name>"."""
    return key.partition("/")[0]


async def test_groups_take_turns_so_a_thousand_keys_do_not_delay_another_groups_key() -> None:
    queue: WorkQueue[str] = WorkQueue(clock=ManualClock(), group=tenant)
    for i in range(1000):
        queue.add(f"hostile/{i}")
    queue.add("provider/new")
    order = [await queue.get() for _ in range(4)]
    assert order == ["hostile/0", "provider/new", "hostile/1", "hostile/2"]
    assert len(queue) == 997
    assert queue.queued("hostile") == 997
    queue.shutdown()


async def test_at_most_n_keys_of_one_group_are_processed_at_once() -> None:
    queue: WorkQueue[str] = WorkQueue(clock=ManualClock(), group=tenant, max_active_per_group=1)
    for key in ("a/1", "a/2", "b/1"):
        queue.add(key)
    assert await queue.get() == "a/1"
    assert await queue.get() == "b/1"  # a/2 waits for a/1, b is served meanwhile
    waiting = asyncio.create_task(queue.get())
    await settle()
    assert not waiting.done()
    queue.done("a/1")
    assert await asyncio.wait_for(waiting, 1) == "a/2"
    queue.shutdown()


async def test_a_reserved_worker_takes_only_the_groups_it_accepts() -> None:
    queue: WorkQueue[str] = WorkQueue(clock=ManualClock(), group=tenant)
    queue.add("hostile/1")
    reserved = asyncio.create_task(queue.get(accept=lambda g: g == "provider"))
    await settle()
    assert not reserved.done()
    queue.add("provider/1")
    assert await asyncio.wait_for(reserved, 1) == "provider/1"
    assert await queue.get() == "hostile/1"
    queue.shutdown()
    with pytest.raises(QueueShutDown):
        await queue.get(accept=lambda g: g == "provider")


async def test_each_group_retries_on_its_own_budget() -> None:
    queue: WorkQueue[str] = WorkQueue(
        clock=ManualClock(),
        backoff=Backoff(initial=0.001, maximum=0.001, jitter=0),
        rate=1,
        burst=2,
        group=tenant,
    )
    hostile = [queue.add_rate_limited(f"hostile/{i}") for i in range(100)]
    assert hostile[-1] == pytest.approx(98)  # the hostile group is in debt...
    assert queue.add_rate_limited("provider/1") == 0.001  # ...the provider's is not
    queue.shutdown()


def test_token_bucket_take_never_goes_into_debt() -> None:
    clock = ManualClock()
    bucket = TokenBucket(rate=10, burst=2, clock=clock)
    assert [bucket.take() for _ in range(2)] == [0, 0]
    assert bucket.take() == pytest.approx(0.1)
    assert bucket.take() == pytest.approx(0.1)  # asking again costs nothing
    clock.t += 0.1
    assert bucket.take() == 0
