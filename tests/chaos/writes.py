"""Writes that survive chaos, and the record of what each one did.

A write in flight when kcp or vwserver is killed has an unknown outcome: the request may have
been applied before the connection died. :class:`Writer` finds out instead of guessing, so the
record of every object's versions (:class:`~tests.chaos.history.Version`, the input of the
informer checks) stays exact:

* merge and JSON patches that set values are idempotent: sent again, an applied one changes
  nothing and kcp answers the object as it is (same resourceVersion);
* a create sent again answers ``409 AlreadyExists``: the object is read back;
* a delete sent again answers ``404``: it was applied;
* an update (PUT) sent again answers ``409 Conflict`` when the first one was applied: the object
  is read back, and if it already carries the update's values, that was it.

A failure that says nothing about the write (no connection, a reset, a 5xx, a 429, a 404 of
the resource itself while kcp is still loading its APIs) is retried once ``gate`` is set
(while kcp or vwserver is down the test clears it), for at most ``within`` seconds. Anything
else fails the test with the answer.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.chaos.history import Version

API = "apis/example.io/v1alpha1"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
SEQ = "chaos.example.io/seq"
"""The annotation in which a write names itself: which write left an object as it is."""


@dataclass(frozen=True, slots=True)
class Op:
    kind: str
    """create | merge | json | put | delete | refused (a write the slice must refuse)."""
    body: Mapping[str, Any] = field(default_factory=dict)
    """create: the labels; merge, put, refused: a merge patch; json: the values to set
    (``/``-separated paths, ``~1`` for a ``/`` in a key)."""


@dataclass
class Planned:
    """One object, the writes planned for it, and what they did."""

    cluster: str
    namespace: str
    name: str
    ops: list[Op]
    versions: list[Version] = field(default_factory=list)
    refused: int = 0
    """Writes the slice refused (as it must)."""

    @property
    def key(self) -> str:
        """The Go informer's key."""
        return f"{self.cluster}|{self.namespace}/{self.name}"

    @property
    def deleted(self) -> bool:
        return bool(self.versions) and self.versions[-1].gone


class WriteFailed(AssertionError):
    pass


class _Transient(Exception):
    """A failure that says nothing about whether the write was applied."""


@dataclass
class Writer:
    """Performs planned writes against ``collection(obj)`` with ``session`` (see the module
    docstring)."""

    session: aiohttp.ClientSession
    collection: Callable[[Planned], str]
    gate: asyncio.Event
    within: float = 180.0
    done: int = 0
    """Writes answered (applied or refused)."""
    retries: int = 0
    """Attempts that failed transiently and were sent again."""
    _progress: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def run(
        self, plan: Sequence[Planned], *, concurrency: int, pause: float, seed: int
    ) -> None:
        """Every object's ops in order, objects interleaved, at most ``concurrency`` requests
        at a time, up to ``pause`` seconds between one object's writes."""
        gate = asyncio.Semaphore(concurrency)
        rng = random.Random(seed)

        async def one(obj: Planned) -> None:
            for op in obj.ops:
                async with gate:
                    await self.apply(obj, op)
                await asyncio.sleep(rng.uniform(0, pause))

        await asyncio.gather(*(one(obj) for obj in plan))

    async def reached(self, count: int, *, running: asyncio.Task[None]) -> None:
        """Until ``count`` writes are answered; raises the failure of ``running`` (the task of
        :meth:`run`) if it ends first."""

        async def counted() -> None:
            async with self._progress:
                await self._progress.wait_for(lambda: self.done >= count)

        waiter = asyncio.ensure_future(counted())
        try:
            await asyncio.wait([waiter, running], return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                running.result()  # the writer's failure
                raise AssertionError(f"the writes ended before {count} were answered")
        finally:
            waiter.cancel()

    async def apply(self, obj: Planned, op: Op) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.within
        last = ""
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise WriteFailed(
                    f"{op.kind} of {obj.key}: no answer within {self.within}s: {last}"
                )
            try:
                async with asyncio.timeout(remaining):
                    await self.gate.wait()
            except TimeoutError:
                continue
            try:
                version = await self._once(obj, op)
                break
            except _Transient as e:
                last = str(e)
                self.retries += 1
                await asyncio.sleep(0.2)
        if version is None:
            obj.refused += 1
        else:
            obj.versions.append(version)
        async with self._progress:
            self.done += 1
            self._progress.notify_all()

    # --- one attempt -------------------------------------------------------------------------

    async def _once(self, obj: Planned, op: Op) -> Version | None:
        collection = self.collection(obj)
        url = f"{collection}/{obj.name}"
        if op.kind == "create":
            body = {
                "apiVersion": "example.io/v1alpha1",
                "kind": "Widget",
                "metadata": {
                    "name": obj.name,
                    "namespace": obj.namespace,
                    "labels": dict(op.body),
                    "annotations": {SEQ: "0"},
                },
                "spec": {"size": 0, "color": "red"},
            }
            status, answer = await self._call("POST", collection, body)
            if status == 409 and answer.get("reason") == "AlreadyExists":
                status, answer = await self._call("GET", url)  # an earlier attempt created it
            return self._version(obj, op, status, answer, ok=(200, 201))
        if op.kind == "delete":
            status, answer = await self._call("DELETE", url)
            if status == 404 and _names(answer, obj.name):
                status = 200  # an earlier attempt deleted it
            if status not in (200, 202):
                raise WriteFailed(f"delete of {obj.key}: {status} {answer}")
            last = obj.versions[-1]
            return Version(rv=last.rv, labels=last.labels, gone=True)
        if op.kind == "refused":
            status, answer = await self._call("PATCH", url, op.body, ctype=MERGE_PATCH)
            if status != 422:
                raise WriteFailed(f"a write out of the slice on {obj.key}: {status} {answer}")
            return None
        if op.kind == "merge":
            status, answer = await self._call("PATCH", url, op.body, ctype=MERGE_PATCH)
        elif op.kind == "json":
            patch = [
                {"op": "add", "path": "/" + path, "value": value} for path, value in op.body.items()
            ]
            status, answer = await self._call("PATCH", url, patch, ctype=JSON_PATCH)
        elif op.kind == "put":
            status, answer = await self._put(url, op.body)
        else:
            raise ValueError(f"unknown op {op.kind}")
        return self._version(obj, op, status, answer, ok=(200,))

    async def _put(self, url: str, patch: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        status, current = await self._call("GET", url)
        if status != 200:
            return status, current
        wanted = _merge(copy.deepcopy(current), patch)
        if wanted == current:
            return status, current  # an earlier attempt was applied
        return await self._call("PUT", url, wanted)

    async def _call(
        self, method: str, url: str, body: Any = None, *, ctype: str = "application/json"
    ) -> tuple[int, dict[str, Any]]:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": ctype} if body is not None else {}
        try:
            async with self.session.request(method, url, data=data, headers=headers) as resp:
                text = await resp.text()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as e:
            raise _Transient(f"{method} {url}: {e!r}") from e
        try:
            answer = json.loads(text)
        except json.JSONDecodeError:
            answer = {"text": text}
        if status >= 500 or status == 429:
            raise _Transient(f"{method} {url}: {status} {text[:300]}")
        if status == 404 and not _names(answer, url.rsplit("/", 1)[-1]):
            # The resource itself is not served (yet): kcp loading its APIs after a start, a
            # slice vwserver does not serve yet. Not an answer about the object.
            raise _Transient(f"{method} {url}: {status} {text[:300]}")
        if status == 409 and answer.get("reason") == "Conflict" and method != "POST":
            raise _Transient(f"{method} {url}: {status} {text[:300]}")
        return status, answer

    def _version(
        self, obj: Planned, op: Op, status: int, answer: Mapping[str, Any], *, ok: tuple[int, ...]
    ) -> Version:
        if status not in ok:
            raise WriteFailed(f"{op.kind} of {obj.key}: {status} {answer}")
        meta = answer["metadata"]
        return Version(rv=int(meta["resourceVersion"]), labels=meta.get("labels") or {})


def _names(answer: Mapping[str, Any], name: str) -> bool:
    """A Status about the object ``name`` (not about its resource)."""
    details = answer.get("details") or {}
    return answer.get("kind") == "Status" and details.get("name") == name


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = _merge(target.get(key), value)
    return target


# --------------------------------------------------------------------------------------------
# Plans


def relabel_plan(
    clusters: Sequence[str], namespace: str, *, writes: int, seed: int
) -> list[Planned]:
    """About ``writes`` writes on objects spread over ``clusters``: creates, relabels in and out
    of env=prod (and env removed), region relabels, spec updates, deletes of some — every
    kind of change a slice's watch turns into ADDED, MODIFIED or DELETED."""
    rng = random.Random(seed)
    plan: list[Planned] = []
    total = 0
    while total < writes:
        index = len(plan)
        env = rng.choice(["prod", "prod", "dev", None])
        labels = {"region": rng.choice(["eu", "us"])} | ({"env": env} if env else {})
        ops = [Op("create", labels)]
        for _ in range(rng.randint(3, 9)):
            r = rng.random()
            if r < 0.4:
                env = rng.choice([e for e in ("prod", "dev", None) if e != env])
                ops.append(Op("merge", {"metadata": {"labels": {"env": env}}}))
            elif r < 0.55:
                ops.append(
                    Op("merge", {"metadata": {"labels": {"region": rng.choice(["eu", "us"])}}})
                )
            else:
                ops.append(Op("merge", {"spec": {"size": rng.randint(1, 10_000)}}))
        if rng.random() < 0.3:
            ops.append(Op("delete"))
        cluster = clusters[index % len(clusters)]
        plan.append(Planned(cluster, namespace, f"w-{index:04d}", ops))
        total += len(ops)
    return plan


COLORS = ("red", "green", "blue", "yellow")
REGIONS = ("eu", "us", "ap")


def setting(seq: int) -> dict[str, Any]:
    """What write number ``seq`` sets, all at once: a whole write leaves these four values
    together, so an object showing a mix was half written."""
    return {
        "metadata": {
            "labels": {"region": REGIONS[seq % len(REGIONS)]},
            "annotations": {SEQ: str(seq)},
        },
        "spec": {"size": seq, "color": COLORS[seq % len(COLORS)]},
    }


def written_by(obj: Mapping[str, Any]) -> int | None:
    """Which write left ``obj`` as it is (:func:`setting`), or None if it shows a mix."""
    meta = obj.get("metadata") or {}
    seq = int((meta.get("annotations") or {}).get(SEQ, "-1"))
    if seq == 0:
        return 0  # as created
    want = setting(seq)
    spec = obj.get("spec") or {}
    fits = (
        seq > 0
        and (meta.get("labels") or {}).get("region") == want["metadata"]["labels"]["region"]
        and spec.get("size") == seq
        and spec.get("color") == want["spec"]["color"]
    )
    return seq if fits else None


def settings_plan(
    clusters: Sequence[str], namespace: str, *, writes: int, seed: int
) -> list[Planned]:
    """About ``writes`` writes through a slice (env=prod): creates (the slice adds env=prod),
    numbered settings by merge patch, JSON patch and update, a write that would take the
    object out of the slice (refused: 422), deletes of some."""
    rng = random.Random(seed)
    plan: list[Planned] = []
    total, seq = 0, 0
    while total < writes:
        index = len(plan)
        ops = [Op("create", {"region": "eu"})]
        for _ in range(rng.randint(4, 10)):
            seq += 1
            kind = rng.choice(["merge", "merge", "json", "put"])
            values = setting(seq)
            if kind == "json":
                body: dict[str, Any] = {
                    "metadata/labels/region": values["metadata"]["labels"]["region"],
                    "metadata/annotations/" + SEQ.replace("/", "~1"): str(seq),
                    "spec/size": seq,
                    "spec/color": values["spec"]["color"],
                }
            else:
                body = values
            ops.append(Op(kind, body))
            if rng.random() < 0.08:
                ops.append(
                    Op(
                        "refused",
                        {"metadata": {"labels": {"env": "dev"}}, "spec": {"size": 999_999}},
                    )
                )
        if rng.random() < 0.25:
            ops.append(Op("delete"))
        cluster = clusters[index % len(clusters)]
        plan.append(Planned(cluster, namespace, f"s-{index:04d}", ops))
        total += len(ops)
    return plan


def planned_seq(op: Op) -> int | None:
    """The number of the setting ``op`` writes (:func:`setting`), if it writes one."""
    if op.kind in ("merge", "put"):
        annotations = (op.body.get("metadata") or {}).get("annotations") or {}
        return int(annotations[SEQ]) if SEQ in annotations else None
    if op.kind == "json":
        value = op.body.get("metadata/annotations/" + SEQ.replace("/", "~1"))
        return None if value is None else int(value)
    return None
