"""The soak's moving parts around vwserver: the writer, kcp's reference watch, the clients'
process, and what vwserver and kcp say about their watches.

* :class:`Writer` — changes objects in kcp directly (the consumer workspaces, as kcp-admin), at
  a steady rate, following :func:`tests.soak.plan.writes`.
* :class:`ReferenceWatch` — kcp's own APIExport virtual workspace, watched directly with the
  slice's label selector: the changes the slice must show, each stamped on arrival.
* :class:`WatchersProcess` — ``python -m tests.soak.watchers`` (the thousand TLS watches through
  vwserver) and its reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import ssl
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Final

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from devenv.bootstrap import Bootstrap, Workspace
from devenv.kcp import REPO_ROOT, KcpInstance
from tests.soak.deliveries import ChangeKey, decode_event
from tests.soak.plan import LABEL, Write, writes
from tests.support.rest import MERGE_PATCH
from tests.support.vwserver_process import Reaper

__all__ = [
    "ReferenceWatch",
    "WatchersProcess",
    "Writer",
    "https_session",
    "kcp_open_watches",
    "metric_samples",
    "watchers_process",
]


WATCH_TIMEOUT: Final = aiohttp.ClientTimeout(total=None, sock_connect=30)
"""A watch lasts as long as the soak (which cancels it); its connection is bounded."""


def https_session(*, ssl_context: ssl.SSLContext, token: str) -> aiohttp.ClientSession:
    """A session whose requests take at most 30 s (a watch passes :data:`WATCH_TIMEOUT`)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=ssl_context),
        headers={"Authorization": f"Bearer {token}"},
        timeout=aiohttp.ClientTimeout(total=30),
    )


# --------------------------------------------------------------------------------------------
# The writer


class Writer:
    """Writes ``run``'s objects into the consumer workspaces of ``world`` through ``session``
    (authenticated to kcp)."""

    def __init__(self, session: aiohttp.ClientSession, world: Bootstrap, *, run: str) -> None:
        self.session = session
        self.world = world
        self.run = run
        self.workspaces: Sequence[Workspace] = sorted(world.consumers, key=lambda ws: ws.name)
        self.done: list[Write] = []

    def _collection(self, ws: Workspace) -> str:
        return f"{ws.url}/{self.world.api_path}/namespaces/default/{self.world.resource}"

    async def write_for(self, seconds: float, *, rate: float) -> list[Write]:
        """Writes at ``rate`` per second for ``seconds``, on a fixed schedule (a slow answer
        delays the next write, never skips it); the writes done."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        plan = writes(self.run, workspaces=len(self.workspaces))
        for n in itertools.count():
            at = start + n / rate
            if at >= start + seconds:
                break
            await asyncio.sleep(max(0.0, at - loop.time()))
            write = next(plan)
            await self.apply(write)
            self.done.append(write)
        return self.done

    async def apply(self, write: Write) -> None:
        collection = self._collection(self.workspaces[write.workspace])
        body: dict[str, Any] | None
        if write.op == "create":
            method, url = "POST", collection
            ctype = "application/json"
            body = {
                "apiVersion": f"{self.world.group}/{self.world.version}",
                "kind": "Widget",
                "metadata": {"name": write.name, "labels": {LABEL: write.label}},
                "spec": {"size": write.size, "color": "red"},
            }
        elif write.op == "patch":
            method, url, ctype = "PATCH", f"{collection}/{write.name}", MERGE_PATCH
            body = {"metadata": {"labels": {LABEL: write.label}}, "spec": {"size": write.size}}
        else:
            method, url, ctype, body = "DELETE", f"{collection}/{write.name}", "", None
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": ctype} if body is not None else {}
        async with self.session.request(method, url, data=data, headers=headers) as r:
            if r.status not in (200, 201):
                raise AssertionError(f"{method} {write.name}: {r.status} {await r.text()}")

    async def remove_all(self) -> None:
        """Delete every object of this run, in or out of the slice (best effort)."""
        values = ",".join((self.run, f"{self.run}-away", f"{self.run}-out"))
        for ws in self.workspaces:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self.session.delete(
                    self._collection(ws), params={"labelSelector": f"{LABEL} in ({values})"}
                ):
                    pass


# --------------------------------------------------------------------------------------------
# kcp's own view of the slice


class ReferenceWatch:
    """kcp's APIExport virtual workspace listed and then watched with ``selector``: every
    change (type, uid, resourceVersion) → (name, arrival time). Re-watches if kcp ends the
    watch."""

    def __init__(self, session: aiohttp.ClientSession, url: str, *, selector: str):
        self.session = session
        self.url = url
        self.selector = selector
        self.rv = ""
        self.changes: dict[ChangeKey, tuple[str, float]] = {}
        self.grown = asyncio.Event()
        self.opened = asyncio.Event()

    async def run(self) -> None:
        params = {"labelSelector": self.selector}
        async with self.session.get(self.url, params=params) as r:
            assert r.status == 200, f"kcp's LIST of the slice: {r.status} {await r.text()}"
            self.rv = str((await r.json())["metadata"]["resourceVersion"])
        while True:
            params = {
                "watch": "1",
                "labelSelector": self.selector,
                "resourceVersion": self.rv,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": "3600",
            }
            with contextlib.suppress(aiohttp.ClientError):
                async with self.session.get(self.url, params=params, timeout=WATCH_TIMEOUT) as r:
                    if r.status != 200:
                        raise AssertionError(f"kcp refused the reference watch: {r.status}")
                    self.opened.set()
                    async for line in r.content:
                        self._received(line)
            await asyncio.sleep(1)  # kcp ended the watch: resume from the last rv

    def _received(self, line: bytes) -> None:
        if not line.strip():
            return
        event = decode_event(line)
        meta = event.object.metadata
        if event.type == "ERROR":
            raise AssertionError(f"kcp's reference watch failed: {event.object.message}")
        self.rv = meta.resource_version or self.rv
        if event.type != "BOOKMARK":
            key = (event.type, meta.uid, int(meta.resource_version))
            self.changes[key] = (meta.name, time.monotonic())
            self.grown.set()

    async def wait_open(self, *, within: float) -> None:
        async with asyncio.timeout(within):
            await self.opened.wait()

    async def wait_for(self, count: int, *, within: float) -> bool:
        """Whether ``count`` changes arrived within ``within`` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                while len(self.changes) < count:
                    self.grown.clear()
                    await self.grown.wait()
        return len(self.changes) >= count


# --------------------------------------------------------------------------------------------
# The clients


class WatchersProcess:
    """The clients' process (:mod:`tests.soak.watchers`) and everything it reported."""

    def __init__(
        self, process: asyncio.subprocess.Process, *, clients: int, log_file: Path
    ) -> None:
        self.process = process
        self.clients = clients
        self.log_file = log_file
        self.lines: list[dict[str, Any]] = []
        self.complete: set[ChangeKey] = set()
        self.ready: dict[str, Any] | None = None
        self._news = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while raw := await self.process.stdout.readline():
            line = json.loads(raw)
            self.lines.append(line)
            if line["kind"] == "ready":
                self.ready = line
            elif line["kind"] == "delivery" and line["clients"] == self.clients:
                self.complete.add((line["type"], line["uid"], line["rv"]))
            self._news.set()
        self._news.set()

    async def _until(self, done: Callable[[], bool], *, within: float) -> bool:
        """Whether ``done()`` came true within ``within`` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                while not done():
                    if self._reader.done():
                        raise AssertionError("the clients' process ended early")
                    self._news.clear()
                    await self._news.wait()
        return done()

    def refused(self) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["kind"] == "refused"]

    async def wait_ready(self, *, within: float) -> dict[str, Any]:
        """Until every watch answered 200; fails at once on a refused one."""

        def done() -> bool:
            if refused := self.refused():
                raise AssertionError(f"{len(refused)} watches refused, e.g. {refused[:3]}")
            return self.ready is not None

        if not await self._until(done, within=within):
            raise AssertionError(
                f"the {self.clients} watches were not all open within {within:.0f} s "
                f"(clients' log: {self.log_file})"
            )
        assert self.ready is not None
        return self.ready

    async def wait_complete(self, changes: set[ChangeKey], *, within: float) -> bool:
        """Whether every client received every one of ``changes`` within ``within`` s."""
        return await self._until(lambda: changes <= self.complete, within=within)

    async def finish(self, *, within: float) -> list[dict[str, Any]]:
        """End of input: the clients report the rest and exit; every line reported."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        async with asyncio.timeout(within):
            await self._reader
            code = await self.process.wait()
        if code != 0:
            raise AssertionError(f"the clients' process exited with {code}")
        return self.lines


@contextlib.asynccontextmanager
async def watchers_process(
    *,
    url: str,
    ca_file: Path,
    token: str,
    clients: int,
    label: str,
    timeout_seconds: int,
    workdir: Path,
    reaper: Reaper,
) -> AsyncIterator[WatchersProcess]:
    """The clients' process, killed (if still running) when the block ends."""
    token_file = workdir / "token"
    token_file.touch(mode=0o600)
    token_file.write_text(token)
    log_file = workdir / "watchers.log"
    args = ["--url", url, "--ca", str(ca_file), "--token-file", str(token_file)]
    args += ["--clients", str(clients), "--label", label]
    args += ["--timeout-seconds", str(timeout_seconds)]
    with log_file.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "tests.soak.watchers", *args],
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            cwd=REPO_ROOT,
            limit=2**20,  # one report line may be long (an anomaly quoting labels)
        )
    reaper.add(process)
    watchers = WatchersProcess(process, clients=clients, log_file=log_file)
    try:
        yield watchers
    finally:
        if process.returncode is None:
            process.kill()
            await asyncio.wait_for(process.wait(), 10)
        watchers._reader.cancel()
        await asyncio.gather(watchers._reader, return_exceptions=True)


# --------------------------------------------------------------------------------------------
# What the servers say


async def metric_samples(session: aiohttp.ClientSession, url: str) -> list[Any]:
    """Every sample of the Prometheus text at ``url``."""
    async with session.get(url) as r:
        assert r.status == 200, f"GET {url}: {r.status}"
        text = await r.text()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


async def kcp_open_watches(kcp: KcpInstance, *, resource: str) -> int:
    """WATCH requests on ``resource`` open in kcp now (its apiserver's long-running gauge)."""
    async with kcp.http_session(timeout=10) as session:
        samples = await metric_samples(session, f"{kcp.url}/metrics")
    return int(
        sum(
            s.value
            for s in samples
            if s.name == "apiserver_longrunning_requests"
            and s.labels.get("resource") == resource
            and s.labels.get("verb") == "WATCH"
        )
    )
