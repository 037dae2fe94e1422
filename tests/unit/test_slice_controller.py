"""The slice controller's worker loop: it counts its reconciles by result and exposes its queue
depth (issue #7), and it re-checks slices on its clock — resync and retry timing, with fake time.

The reconcile itself is replaced (its outcomes are tested in test_slice_status and the kcp e2e
tests); what is checked here is what the loop does with each outcome.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from tests.support.clock import ManualClock
from vwserver.controller.slices import ControllerSettings, Key, SliceController
from vwserver.errors import api_error
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.client import KubeClient
from vwserver.metrics import ServerMetrics
from vwserver.routes import Routes

TIMEOUT = 5.0


def controller(*, resync: float, retry: Backoff, **options: Any) -> SliceController:
    """A controller without kcp: its reconcile is replaced by each test."""
    return SliceController(
        client=cast(KubeClient, None),
        routes=Routes(),
        settings=ControllerSettings(
            export_path="root", external_url="https://vwserver.example", resync=resync, retry=retry
        ),
        **options,
    )


async def test_reconciles_are_counted_by_result_and_the_queue_depth_is_read_at_scrape() -> None:
    metrics = ServerMetrics()
    # requeues (resync, retry) far in the future: every key is reconciled exactly once
    ctl = controller(resync=3600, retry=Backoff(initial=3600, maximum=3600), metrics=metrics)
    outcomes: dict[Key, Any] = {
        ("c", "ready"): True,
        ("c", "waiting"): False,
        ("c", "gone"): None,
        ("c", "failing"): api_error(500, url="https://kcp"),
    }
    done = asyncio.Event()

    async def reconcile(key: Key) -> bool | None:
        outcome = outcomes.pop(key)
        if not outcomes:
            done.set()
        if isinstance(outcome, Exception):
            raise outcome
        return cast(bool | None, outcome)

    ctl.reconcile = reconcile  # type: ignore[method-assign]
    for key in list(outcomes):
        ctl.queue.add(key)

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert sample("vwserver_controller_queue_depth") == 4
    worker = asyncio.create_task(ctl._worker())
    try:
        # the worker records an outcome before it awaits the queue again, i.e. before this runs
        await asyncio.wait_for(done.wait(), TIMEOUT)
        assert sample("vwserver_controller_queue_depth") == 0
        for result in ("ready", "not_ready", "deleted", "error"):
            assert sample("vwserver_controller_reconciles_total", result=result) == 1, result
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        await ctl.aclose()


async def test_ready_slices_are_resynced_and_failing_ones_retried_on_the_controllers_clock() -> (
    None
):
    clock = ManualClock()
    ctl = controller(resync=30, retry=Backoff(initial=1, maximum=4, jitter=0), clock=clock)
    ready, failing = ("c", "ready"), ("c", "failing")
    seen: dict[Key, list[float]] = {ready: [], failing: []}

    async def reconcile(key: Key) -> bool | None:
        seen[key].append(clock.monotonic())
        if key == failing:
            raise api_error(503, url="https://kcp")
        return True

    ctl.reconcile = reconcile  # type: ignore[method-assign]
    workers = [asyncio.create_task(ctl._worker()) for _ in range(2)]
    try:
        ctl.queue.add(ready)
        ctl.queue.add(failing)
        await clock.advance(29.9)
        assert seen[ready] == [0]  # a ready slice waits its resync ...
        assert seen[failing] == [0, 1, 3, 7, 11, 15, 19, 23, 27]  # backoff 1, 2, 4, 4, ...
        await clock.advance(0.1)
        assert seen[ready] == [0, 30]  # ... and not a moment longer
        await clock.advance(60)
        assert seen[ready] == [0, 30, 60, 90]
    finally:
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await ctl.aclose()
