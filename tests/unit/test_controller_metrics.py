"""The slice controller counts its reconciles by result and exposes its queue depth (issue #7).

The reconcile itself is replaced (its outcomes are tested in test_reconcile and the kcp e2e
tests); what is checked here is that the worker loop reports every outcome, once.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from vwserver.controller.controller import ControllerSettings, Key, SliceController
from vwserver.controller.informer import Backoff
from vwserver.k8s.client import ApiError, KubeClient
from vwserver.metrics import ServerMetrics
from vwserver.routes import Routes

TIMEOUT = 5.0


async def test_reconciles_are_counted_by_result_and_the_queue_depth_is_read_at_scrape() -> None:
    metrics = ServerMetrics()
    controller = SliceController(
        client=cast(KubeClient, None),  # never used: reconcile is replaced below
        routes=Routes(),
        # requeues (resync, retry) far in the future: every key is reconciled exactly once
        settings=ControllerSettings(
            export_path="root",
            external_url="https://vwserver.example",
            resync=3600,
            retry=Backoff(initial=3600, maximum=3600),
        ),
        metrics=metrics,
    )
    outcomes: dict[Key, Any] = {
        ("c", "ready"): True,
        ("c", "waiting"): False,
        ("c", "gone"): None,
        ("c", "failing"): ApiError(code=500, body=b"{}", url="https://kcp"),
    }
    done = asyncio.Event()

    async def reconcile(key: Key) -> bool | None:
        outcome = outcomes.pop(key)
        if not outcomes:
            done.set()
        if isinstance(outcome, Exception):
            raise outcome
        return cast(bool | None, outcome)

    controller.reconcile = reconcile  # type: ignore[method-assign]
    for key in list(outcomes):
        controller._enqueue(key)

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert sample("vwserver_controller_queue_depth") == 4
    worker = asyncio.create_task(controller._worker())
    try:
        # the worker records an outcome before it awaits the queue again, i.e. before this runs
        await asyncio.wait_for(done.wait(), TIMEOUT)
        assert sample("vwserver_controller_queue_depth") == 0
        for result in ("ready", "not_ready", "deleted", "error"):
            assert sample("vwserver_controller_reconciles_total", result=result) == 1, result
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        await controller.aclose()
