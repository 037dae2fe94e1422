"""An object that can never sync is not re-sent forever, and what the consumer reads about the
failure names no address — the controller on fake servers, over fake time (issue #25, §3).

A downstream apply refused as Invalid (422) is a *permanent* error: retried on the long backoff
(30 s doubling to an hour), and the periodic resync leaves a key that waits for its retry
waiting. Before, the resync queued every key every ``resyncSeconds`` and the queue's backoff was
capped at 60 s: a 1 MiB apply a minute for as long as the object lived.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.clock import ManualClock, settle
from tests.support.syncer_fakes import (
    DOWNSTREAM,
    ControllerBed,
    controller_bed,
    known_namespace,
    thing,
)
from vwserver.errors import ApiError, ApiInvalid, api_error
from vwserver.syncer.naming import finalizer
from vwserver.syncer.sync_loop import error_message

WEBHOOK = 'admission webhook "v.mongodb.com" denied: Post "https://10.0.0.7:443/v?timeout=10s"'


def refused(url: str) -> ApiError:
    return api_error(
        422,
        {"reason": "Invalid", "message": f"spec.size: too big; {WEBHOOK}"},
        url=f"{url}?fieldManager=x",
    )


async def run_queued(bed: ControllerBed) -> int:
    """Process every key queued now; how many."""
    queue, done = bed.controller.queue, 0
    while len(queue):
        key = await queue.get()
        try:
            await bed.controller._process(key)
        finally:
            queue.done(key)
        done += 1
    return done


async def test_a_permanent_error_backs_off_to_an_hour_and_the_resync_respects_it(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    bed = controller_bed(tmp_path, clock=clock, resyncSeconds=300)
    bed.downstream.apply_error = refused
    (key,) = bed.list_upstream(thing("db", finalizers=(finalizer("eu"),), size=1))
    known_namespace(bed, key)
    assert await run_queued(bed) == 1
    assert bed.downstream.count("apply") == 1
    queue = bed.controller.queue
    assert queue.backing_off(key)
    # resyncs during the first retry's 30 s (±10 %) do not cut it short
    for _ in range(5):
        bed.controller.resync()
        assert len(queue) == 0
        await clock.advance(5)
    # a day of resyncs every 300 s: retries at 30, 60, ... s, then at most one an hour
    for _ in range(24 * 12):
        bed.controller.resync()
        await run_queued(bed)
        await clock.advance(300)
        await settle()
        await run_queued(bed)
    applies = bed.downstream.count("apply")
    assert applies <= 7 + 24, applies  # the doubling up to an hour, then one an hour
    assert applies >= 10  # it is still retried
    assert bed.controller.queue.failures(key) == applies
    queue.shutdown()


async def test_the_condition_names_the_failure_not_the_downstream_address(tmp_path: Path) -> None:
    clock = ManualClock()
    bed = controller_bed(tmp_path, clock=clock)
    bed.downstream.apply_error = refused
    (key,) = bed.list_upstream(thing("db", finalizers=(finalizer("eu"),), size=1))
    known_namespace(bed, key)
    await run_queued(bed)
    patches = [p for m, u, p in bed.upstream.calls if m == "merge_patch" and u.endswith("/status")]
    (patch,) = patches
    (condition,) = patch["status"]["conditions"]
    assert condition["status"] == "False" and condition["reason"] == "Invalid"
    message = condition["message"]
    assert message.startswith("the downstream cluster answered 422 Invalid: spec.size: too big")
    for secret in ("downstream.example", "7443", "10.0.0.7", "fieldManager", "https://", "/apis/"):
        assert secret not in message, message
    bed.controller.queue.shutdown()


def test_error_messages_never_carry_an_address() -> None:
    from vwserver.errors import UpstreamUnavailable

    down = f"{DOWNSTREAM}/apis/g.io/v1/namespaces/n/things/db"
    cases = [
        (ApiInvalid(code=422, reason="Invalid", message="bad", url=down), "the downstream cluster"),
        (
            api_error(500, {"message": f"etcd at [fd00::1]:2379 and {DOWNSTREAM}"}, url=down),
            "the downstream cluster",
        ),
        (UpstreamUnavailable("downstream.example:7443 unreachable: refused"), "the downstream"),
        (UpstreamUnavailable("vw.example:6443 unreachable: refused"), "kcp is unreachable"),
        (
            api_error(
                403, {"reason": "Forbidden", "message": "no"}, url="https://vw.example:6443/x"
            ),
            "kcp answered 403",
        ),
        (RuntimeError(f"bug with {DOWNSTREAM}"), "internal error (RuntimeError)"),
    ]
    for error, start in cases:
        message = error_message(error, downstream_base=DOWNSTREAM, hide=["vw.example:6443"])
        assert message.startswith(start), message
        for secret in ("downstream.example", "vw.example", "fd00::1", "https://"):
            assert secret not in message, message
