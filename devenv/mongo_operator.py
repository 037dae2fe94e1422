"""A stand-in for the MongoDB Community operator in the downstream "cluster" of ``make run-sync``.

The syncer's reference use case ends with an operator acting on each downstream copy and writing
its status, which the syncer carries back into the consumer's kcp workspace. The real operator
needs pods and a cluster; this one writes only what it would report: phase ``Pending`` when it
first sees a database, ``Running`` ``ready_after`` seconds later, the spec's version and member
count, ``observedGeneration``, and the internal ``mongoUri`` (the story's syncer config lists it
in ``statusExclude``, so it stays downstream).

It follows the collection with vwserver's own list+watch loop (:class:`~vwserver.k8s.reflector.
Reflector` into a :class:`~vwserver.k8s.cache.Cache`), as a controller would with an informer,
and writes a status only when it differs from the one it wants. It adds no finalizer: deleting a
copy removes it at once, so deletion in kcp waits only for the syncer. No kopf: it is not a
dependency of this repository, and the loop is short.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from vwserver.clock import Clock, SystemClock
from vwserver.errors import ApiError, UpstreamUnavailable
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.cache import Cache
from vwserver.k8s.client import JSON, KubeClient
from vwserver.k8s.reflector import Reflector

log = logging.getLogger(__name__)

#: The downstream CRD's API (config/syncer/downstream-crd.yaml), after the cluster URL.
API = "apis/mongodbcommunity.mongodb.com/v1"
PLURAL = "mongodbcommunity"

Key = tuple[str, str]  # namespace, name


def mongo_uri(namespace: str, name: str) -> str:
    """The connection string the operator reports (the Service it would create)."""
    return f"mongodb://{name}-svc.{namespace}.svc.cluster.local:27017"


def desired_status(obj: JSON, *, running: bool) -> dict[str, Any]:
    """The status the operator writes on ``obj``: Pending (no member ready) or Running."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    status = {
        "phase": "Running" if running else "Pending",
        "version": spec.get("version"),
        "currentMongoDBMembers": spec.get("members") if running else 0,
        "observedGeneration": meta.get("generation"),
        "mongoUri": mongo_uri(meta.get("namespace", ""), meta.get("name", "")),
    }
    return {k: v for k, v in status.items() if v is not None}


def _key(obj: JSON) -> Key | None:
    meta = obj.get("metadata") or {}
    if not meta.get("namespace") or not meta.get("name"):
        return None
    return str(meta["namespace"]), str(meta["name"])


class MongoOperator:
    """Writes :func:`desired_status` on every MongoDBCommunity of ``cluster_url`` (a cluster's or
    a kcp workspace's URL) until :meth:`run` is cancelled.

    ``say``: where a line per status write goes (the story prints them); ``writes`` counts them.
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        cluster_url: str,
        ready_after: float = 3.0,
        say: Callable[[str], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._client = client
        self._api = f"{cluster_url.rstrip('/')}/{API}"
        self._ready_after = ready_after
        self._say = say or (lambda line: log.info("%s", line))
        self._clock = clock or SystemClock()
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._first_seen: dict[Key, float] = {}
        self._timers: set[asyncio.TimerHandle] = set()
        self.writes = 0
        self.cache: Cache[Key] = Cache(key=_key, handler=self)
        self.reflector: Reflector[Cache[Key]] = Reflector(
            name="mongodb operator",
            client=client,
            url=f"{self._api}/{PLURAL}",
            handler=self.cache,
            clock=self._clock,
            watch_timeout=60,
            backoff=Backoff(initial=0.5, maximum=5.0),
        )

    # --- CacheHandler ---------------------------------------------------------------------------

    def on_upsert(self, obj: JSON) -> None:
        key = _key(obj)
        if key is not None:
            self._queue.put_nowait(key)

    def on_delete(self, obj: JSON) -> None:
        key = _key(obj)
        if key is not None:
            self._first_seen.pop(key, None)

    # --- the loop -------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self.reflector.run(), name="mongodb operator reflector")
                group.create_task(self._work(), name="mongodb operator worker")
        finally:
            for timer in self._timers:
                timer.cancel()

    def _later(self, delay: float, key: Key) -> None:
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._timers.discard(timer)
            self._queue.put_nowait(key)

        timer = loop.call_later(delay, fire)
        self._timers.add(timer)

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            obj = self.cache.get(key)
            if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
                continue
            now = self._clock.monotonic()
            left = self._ready_after - (now - self._first_seen.setdefault(key, now))
            if left > 0:
                self._later(left, key)
            want = desired_status(obj, running=left <= 0)
            have = obj.get("status") or {}
            if all(have.get(field) == value for field, value in want.items()):
                continue
            namespace, name = key
            url = f"{self._api}/namespaces/{namespace}/{PLURAL}/{name}/status"
            try:
                await self._client.merge_patch(url, {"status": want})
            except (ApiError, UpstreamUnavailable) as e:
                log.warning("operator: status of %s/%s not written: %s", namespace, name, e)
                self._later(1.0, key)
                continue
            self.writes += 1
            self._say(f"operator: {namespace}/{name} is {want['phase']}")
