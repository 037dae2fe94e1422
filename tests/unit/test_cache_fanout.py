"""The fan-out rules of a shared resource (vwserver.cache.shared), driven through its reflector
handler methods directly — no upstream, no timing: what a subscription receives and when it is
ended. tests/integration/test_cache_shared.py runs the same resource against the fake upstream.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.clock import FakeClock
from tests.unit.test_cache_store import KEYS, make
from vwserver.cache.entries import Change
from vwserver.cache.shared import Bookmark, SharedResource, Subscription
from vwserver.cache.store import Expired
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth


def resource() -> SharedResource:
    r = SharedResource(
        client=KubeClient(auth=ClientAuth(server="http://unused.invalid")),
        clock=FakeClock(),
        upstream="http://unused.invalid/services/apiexport/e/x",
        api_path="/apis/example.io/v1alpha1/widgets",
        window=3,
    )
    r.on_list([make(KEYS[0], {}, 5)], "10")
    return r


async def collect(subscription: Subscription) -> list[object]:
    """What the subscription yields without anything new happening (a few loop turns)."""
    items: list[object] = []
    while True:
        task = asyncio.ensure_future(anext(subscription))
        for _ in range(5):
            await asyncio.sleep(0)
        if not task.done():
            task.cancel()
            return items
        try:
            items.append(task.result())
        except StopAsyncIteration:
            return items


def rvs(items: list[object]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for item in items:
        assert isinstance(item, Bookmark | Change)
        out.append(("bookmark", item.rv) if isinstance(item, Bookmark) else (item.type, item.rv))
    return out


async def test_backlog_then_live_changes_then_bookmarks_in_order() -> None:
    r = resource()
    r.on_event("ADDED", make(KEYS[1], {}, 11))
    subscription = r.subscribe(from_rv=10, queue_size=5)
    r.on_event("MODIFIED", make(KEYS[1], {"env": "dev"}, 12))
    r.on_bookmark("15")
    r.on_bookmark("17")  # replaces the queued bookmark
    r.on_bookmark("16")  # older than the store: nothing
    assert rvs(await collect(subscription)) == [("ADDED", 11), ("MODIFIED", 12), ("bookmark", 17)]
    assert r.store.rv == 17 and subscription.ended is None


async def test_a_subscription_from_a_future_version_skips_what_is_older() -> None:
    r = resource()
    subscription = r.subscribe(from_rv=13, queue_size=5)
    r.on_event("ADDED", make(KEYS[1], {}, 12))
    r.on_bookmark("13")
    r.on_event("ADDED", make(KEYS[2], {}, 14))
    assert rvs(await collect(subscription)) == [("ADDED", 14)]


async def test_a_full_queue_ends_the_subscription_not_the_others() -> None:
    r = resource()
    slow = r.subscribe(from_rv=10, queue_size=2)
    fast = r.subscribe(from_rv=10, queue_size=2)
    r.on_event("ADDED", make(KEYS[1], {}, 11))
    r.on_event("ADDED", make(KEYS[2], {}, 12))
    r.on_bookmark("13")  # a full queue skips a bookmark: not an overflow
    assert slow.ended is None and slow.depth == 2
    assert rvs(await collect(fast)) == [("ADDED", 11), ("ADDED", 12)]
    r.on_event("ADDED", make(KEYS[3], {}, 14))
    assert slow.overflowed and await collect(slow) == []  # ended: nothing more, at once
    assert fast.ended is None and rvs(await collect(fast)) == [("ADDED", 14)]
    assert r.subscribers == 1


async def test_a_relist_ends_every_subscription() -> None:
    r = resource()
    subscriptions = [r.subscribe(from_rv=10, queue_size=5) for _ in range(3)]
    r.on_list([], "20")
    assert all(s.relisted for s in subscriptions) and r.subscribers == 0
    with pytest.raises(Expired):
        r.subscribe(from_rv=10, queue_size=5)
    assert r.subscribers == 0  # a refused subscription is not registered


async def test_the_last_subscription_ending_makes_the_resource_idle() -> None:
    r = resource()
    idle: list[SharedResource] = []
    r.on_idle = idle.append
    r.users = 1
    subscription = r.subscribe(from_rv=10, queue_size=5)
    r.users = 0

    def is_idle() -> bool:
        return r.idle

    assert not is_idle()
    subscription.close()
    assert is_idle() and idle == [r]
    subscription.close()  # idempotent
    assert idle == [r] and subscription.ended == "closed"


async def test_waiting_for_a_resource_version() -> None:
    r = resource()
    waiting = asyncio.create_task(r.wait_for(12, timeout=5))
    await asyncio.sleep(0)
    r.on_bookmark("11")
    await asyncio.sleep(0)
    assert not waiting.done()
    r.on_event("ADDED", make(KEYS[1], {}, 12))
    assert await waiting
    assert await r.wait_for(12, timeout=0)
    assert await r.wait_synced(0)


async def test_stopping_ends_subscriptions_and_waiters() -> None:
    r = resource()
    subscription = r.subscribe(from_rv=10, queue_size=5)
    waiting = asyncio.create_task(r.wait_for(99, timeout=5))
    await asyncio.sleep(0)
    await r.stop()
    assert subscription.stopped and not await waiting
    late = r.subscribe(from_rv=10, queue_size=5)
    assert late.stopped and r.subscribers == 0


# --- writing from the fan-out (a consumer's DirectWriter) ---------------------------------------


class Writer:
    """A DirectWriter that records what it was handed and when it was flushed."""

    def __init__(self, *, accept: bool = True) -> None:
        self.accept = accept
        self.taken: list[Change | Bookmark] = []
        self.written: list[list[tuple[str, int]]] = []
        self.ends = 0
        self.fail = False

    def take(self, item: Change | Bookmark) -> bool:
        if self.fail:
            raise RuntimeError("broken connection")
        if self.accept:
            self.taken.append(item)
        return self.accept

    def flush(self) -> None:
        if self.taken:
            self.written.append(rvs(list(self.taken)))
            self.taken.clear()

    def ended(self) -> None:
        self.ends += 1


async def waiting(subscription: Subscription) -> asyncio.Task[Change | Bookmark]:
    """The consumer, waiting in ``__anext__`` with nothing to read."""
    task = asyncio.ensure_future(anext(subscription))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not task.done()
    return task


async def test_a_waiting_consumer_is_not_woken_its_writer_takes_a_turn_in_one_flush() -> None:
    r = resource()
    subscription = r.subscribe(from_rv=10, queue_size=5)
    writer = Writer()
    subscription.attach(writer)
    consumer = await waiting(subscription)
    r.on_event("ADDED", make(KEYS[1], {}, 11))
    r.on_event("ADDED", make(KEYS[2], {}, 12))
    r.on_bookmark("13")
    assert writer.written == [] and subscription.depth == 0  # flushed at the end of the turn
    await asyncio.sleep(0)
    assert writer.written == [[("ADDED", 11), ("ADDED", 12), ("bookmark", 13)]]
    assert not consumer.done()  # never woken
    r.on_event("ADDED", make(KEYS[3], {}, 14))
    await asyncio.sleep(0)
    assert writer.written[1:] == [[("ADDED", 14)]] and not consumer.done()
    consumer.cancel()


async def test_once_a_change_is_queued_every_later_one_is_until_the_consumer_waits_again() -> None:
    r = resource()
    subscription = r.subscribe(from_rv=10, queue_size=5)
    writer = Writer(accept=False)  # e.g. the client's connection has unsent bytes
    subscription.attach(writer)
    consumer = await waiting(subscription)
    r.on_event("ADDED", make(KEYS[1], {}, 11))
    writer.accept = True  # the connection drained meanwhile: still the queue, for the order
    r.on_event("ADDED", make(KEYS[2], {}, 12))
    assert writer.taken == [] and subscription.depth == 2
    assert rvs([await consumer]) == [("ADDED", 11)]
    assert rvs(await collect(subscription)) == [("ADDED", 12)]
    consumer = await waiting(subscription)  # waiting again with nothing queued ...
    r.on_event("ADDED", make(KEYS[3], {}, 13))
    await asyncio.sleep(0)
    assert writer.written == [[("ADDED", 13)]]  # ... so the writer takes the next one
    consumer.cancel()


async def test_the_window_backlog_is_read_before_a_writer_takes_anything() -> None:
    r = resource()
    r.on_event("ADDED", make(KEYS[1], {}, 11))
    subscription = r.subscribe(from_rv=10, queue_size=5)
    writer = Writer()
    subscription.attach(writer)
    r.on_event("ADDED", make(KEYS[2], {}, 12))  # the consumer has not read its backlog yet
    assert writer.taken == [] and subscription.depth == 1
    assert rvs(await collect(subscription)) == [("ADDED", 11), ("ADDED", 12)]


async def test_a_failing_writer_falls_back_to_its_queue_and_spares_the_others() -> None:
    r = resource()
    broken, fine = (r.subscribe(from_rv=10, queue_size=5) for _ in range(2))
    bad, good = Writer(), Writer()
    bad.fail = True
    broken.attach(bad)
    fine.attach(good)
    waiters = [await waiting(s) for s in (broken, fine)]
    r.on_event("ADDED", make(KEYS[1], {}, 11))
    await asyncio.sleep(0)
    assert good.written == [[("ADDED", 11)]]
    assert rvs([await waiters[0]]) == [("ADDED", 11)]  # through the queue instead
    bad.fail = False
    r.on_event("ADDED", make(KEYS[2], {}, 12))
    assert bad.taken == [] and broken.depth == 1  # detached from the failed writer
    waiters[1].cancel()


async def test_a_writer_hears_of_an_end_only_while_its_consumer_is_busy() -> None:
    r = resource()
    idle, busy = (r.subscribe(from_rv=10, queue_size=1) for _ in range(2))
    idle_writer, busy_writer = Writer(), Writer(accept=False)
    idle.attach(idle_writer)
    busy.attach(busy_writer)
    consumer = await waiting(idle)
    r.on_event("ADDED", make(KEYS[1], {}, 11))  # busy queues it: its consumer is not reading
    r.on_event("ADDED", make(KEYS[2], {}, 12))  # and overflows
    assert busy.overflowed and busy_writer.ends == 1
    idle.close()
    assert idle_writer.ends == 0  # its consumer wakes up and finishes by itself
    with pytest.raises(StopAsyncIteration):
        await consumer


async def test_one_bookmark_object_for_every_subscription_newer_than_theirs() -> None:
    r = resource()
    early, late = r.subscribe(from_rv=10, queue_size=5), r.subscribe(from_rv=20, queue_size=5)
    r.on_bookmark("15")  # not for late: it asked for what comes after 20
    assert (early.depth, late.depth) == (1, 0)
    r.on_bookmark("25")  # replaces the one still queued
    (mine,), (theirs,) = await collect(early), await collect(late)
    assert mine == Bookmark(25) and mine is theirs


def test_a_write_s_answer_is_the_latest_version_until_the_stream_delivers_it() -> None:
    """Read your own writes (SharedResource.wrote/latest): a write's answer the stream has not
    delivered is newer than the store's version, and is forgotten once the stream is there —
    with the object's next event, or a later one of anything (the store then says, also that
    the object was deleted since)."""
    r = resource()
    key = KEYS[0]
    assert r.latest(key) == r.store.get(key)
    answer = make(key, {"a": "1"}, 12)
    r.wrote(answer.raw)
    assert r.latest(key) == answer  # the store still has version 5
    r.wrote(make(key, {}, 9).raw)  # older than the stream (rv 10): not kept
    assert r.latest(key) == answer
    r.on_event("MODIFIED", answer)  # the stream delivers it
    assert r.latest(key) == r.store.get(key) == answer
    # Deleted after the write: once the stream passed the write, the store's "missing" holds.
    r.wrote(make(key, {"a": "2"}, 14).raw)
    r.on_event("DELETED", make(key, {"a": "2"}, 15))
    assert r.latest(key) is None
    # A write of an object the stream has not shown at all (a create).
    other = make(KEYS[1], {}, 20)
    r.wrote(other.raw)
    assert r.latest(KEYS[1]) == other
    r.on_bookmark("20")
    assert r.latest(KEYS[1]) is None  # the stream is at 20 and has no such object
