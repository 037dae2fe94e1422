"""``vwserver serve --workers N``: N processes of one server on one listening port.

One vwserver process is one core: the proxy is Python on one event loop. ``workers: N`` (or
``--workers N``) makes ``serve`` a small parent that starts N worker processes — each a whole
``serve`` (:func:`vwserver.server.serve` with a :class:`~vwserver.server.WorkerRole`) — and
supervises them. Default 1: one process, no parent, exactly as without the option.

**One port, SO_REUSEPORT.** Every worker binds ``listen.host:port`` itself with
``SO_REUSEPORT``; the kernel hashes each new connection (its addresses and ports) to one of the
listening sockets, so connections spread evenly with no accept lock and no hand-off between
processes. A configured port 0 is resolved by the parent, which binds it first (with
``SO_REUSEPORT``, never listening: it only keeps the port) and gives the number to the workers.
Only processes of the same user can join the group (Linux). A worker listens only once its
controller has listed the slices, so no connection finds a slice missing that its siblings
serve. TLS: every worker loads the same ``tls`` files and follows their changes itself (each
polls them, :mod:`vwserver.auth.tls`): a rotation reaches every worker within the poll interval.

**What each process has of its own** — each worker is, towards kcp, what a replica is:

* *The shared watch cache*: one per worker. N workers that all serve a resource run N upstream
  list+watches of it, and hold N copies of its objects (the per-object cost is in the docs'
  cache page; ``scripts/bench/run.py --only fanout --workers 1,2`` prints the RSS of each
  worker: 49 MiB with 1,000 small objects, as one process). That is the price of sharing
  nothing between processes, and it is acceptable: a cache shared across processes would have
  to copy every change into each worker anyway to fan it out, so it would save the kcp watch and
  the memory, but not the work, and it would add a single point of failure inside the pod. More
  replicas cost the same per process.
* *The slice controller*: every worker runs it, so each keeps its own route table from its own
  watch of the slices and re-checks consent and exports itself (a revoked grant ends the slice
  in every worker within ``resyncSeconds``, fail-closed, as in every replica — nothing to trust
  from another process). Only **worker 0 writes slice status** and stands for the Lease
  (``controller.lease``, between replicas); the others write nothing
  (``vwserver_controller_status_writes_total`` counts the writes). So N workers cost kcp what N
  replicas cost in controller reads, and one replica's status writes.
* *The handoff loop*: **worker 0 alone** records moves and ends holds (one writer per server, not
  N racing conditional writes). Its loop can scan only what its own cache runs, so every other
  worker tells it every 2 s which resources it runs, and at once when a read finds an unrecorded
  move (:class:`~vwserver.controller.handoff.HandoffRelay`, over worker 0's Unix socket);
  worker 0 keeps those resources running as if read. ``vwserver_handoff_writes_total`` counts
  its writes.

**Health and metrics.** Each worker serves its health endpoints, metrics and ``/debug/cache``
on a Unix socket in a directory of the parent's (mode 0700). The parent serves the health
listener (``health``): ``/healthz`` and ``/livez`` while it runs; ``/readyz`` ``200`` only when
every worker answers ``200`` (their notes merged), ``503`` naming the worker that is not, and
``503`` at once on SIGTERM; the metrics of every worker in one exposition, each series with a
``worker`` label (sum over it for the server); ``/debug/cache`` (loopback only) with every
worker's rows. The slice listener's own ``/readyz`` and ``/metrics`` are answered by whichever
worker took the connection — readiness is the same for all, but scrape the health listener.

**Stopping.** SIGTERM (or SIGINT) to the parent: ``/readyz`` answers 503, each worker gets
SIGTERM and drains as one process does (``shutdownDelaySeconds``, then its listener closes, its
watches end, requests get ``shutdownGracePeriodSeconds``); the parent waits for all, kills what
is still running after that plus :data:`KILL_MARGIN`, and exits 0. Workers run in a session of
their own (a terminal's Ctrl-C reaches the parent, which stops them in order), and each watches
a pipe from the parent: when the parent is gone (even killed), the worker drains and exits —
no orphan keeps the port.

**A crashed worker stops the server.** A worker that exits while the parent does not stop
(a crash, the kernel's OOM killer) makes the parent stop the others the same graceful way and
exit non-zero (the worker's code, else 1). One process is one failure domain, as with one
worker: a restart belongs to the kubelet (with its back-off and its restart count), and a
server never runs on with part of itself missing — worker 0 is its one status and handoff
writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from vwserver.config import Config
from vwserver.errors import ConfigError
from vwserver.listener import listening
from vwserver.metrics import CONTENT_TYPE
from vwserver.server import DEBUG_CACHE_PATH, WorkerRole, connection_limits, is_loopback

log = logging.getLogger(__name__)

KILL_MARGIN = 10.0
"""Seconds beyond a worker's own delay + grace period before the parent kills it."""
ASK_TIMEOUT = 2.0
"""How long the parent waits for a worker's health endpoints or metrics."""

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


# --- pure parts: the parent's answers from its workers' ----------------------------------------


def merge_metrics(texts: Mapping[int, str]) -> str:
    """One Prometheus text exposition of every worker's (``texts``: by worker index): each
    family once, with its ``HELP`` and ``TYPE`` from the first worker that has it, and every
    sample of every worker with a ``worker`` label first."""
    order: list[str] = []
    heads: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for index in sorted(texts):
        family = ""
        for line in texts[index].splitlines():
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split(" ", 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = parts[2]
                    if family not in heads:
                        order.append(family)
                        heads[family] = []
                        samples[family] = []
                    if not any(h.startswith(f"# {parts[1]} ") for h in heads[family]):
                        heads[family].append(line)
                continue
            if family not in samples:  # a sample before any HELP/TYPE: a family of its own
                order.append(family)
                heads[family] = []
                samples[family] = []
            samples[family].append(with_worker_label(line, index))
    out: list[str] = []
    for family in order:
        out += heads[family]
        out += samples[family]
    return "".join(f"{line}\n" for line in out)


def with_worker_label(sample: str, index: int) -> str:
    """A sample line of the text format with ``worker="<index>"`` as its first label."""
    match = _NAME.match(sample)
    if match is None:
        return sample
    name, rest = match.group(), sample[match.end() :]
    label = f'worker="{index}"'
    if rest.startswith("{}"):
        return f"{name}{{{label}}}{rest[2:]}"
    if rest.startswith("{"):
        return f"{name}{{{label},{rest[1:]}"
    return f"{name}{{{label}}}{rest}"


Answer = tuple[int, str] | None
"""A worker's ``/readyz`` answer (status, body); None: it did not answer."""


def readiness(answers: Mapping[int, Answer], *, draining: bool) -> tuple[int, str]:
    """The parent's ``/readyz`` (status, body) from every worker's."""
    if draining:
        return 503, "not ready: shutting down\n"
    problems: list[str] = []
    notes: list[str] = []
    for index in sorted(answers):
        answer = answers[index]
        if answer is None:
            problems.append(f"worker {index}: not answering")
            continue
        status, body = answer
        lines = [line for line in body.splitlines() if line]
        if status != 200:
            found = [line.removeprefix("not ready: ") for line in lines] or [f"HTTP {status}"]
            problems += [f"worker {index}: {p}" for p in found]
            continue
        for note in lines[1:]:  # after "ok"
            if note not in notes:
                notes.append(note)
    if problems:
        return 503, "".join(f"not ready: {p}\n" for p in problems)
    return 200, "".join(["ok", *(f"\n{n}" for n in notes)])


# --- the parent ---------------------------------------------------------------------------------


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT`` and never listening: it keeps the
    port (the one the OS chose for port 0) for the workers, and takes no connection."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass(slots=True)
class _Worker:
    index: int
    process: asyncio.subprocess.Process
    session: aiohttp.ClientSession

    async def ask(self, path: str) -> tuple[int, str] | None:
        try:
            async with self.session.get(f"http://worker-{self.index}{path}") as r:
                return r.status, await r.text()
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None


class Supervisor:
    """The parent of ``count`` workers (module doc)."""

    def __init__(self, config: Config, *, config_path: Path, count: int) -> None:
        self._config = config
        self._config_path = config_path
        self._count = count
        self._workers: list[_Worker] = []
        self._draining = False

    async def run(self, stop: asyncio.Event) -> int:
        """Start the workers, serve the health listener, and stop them all when ``stop`` is
        set or one exits; the exit code."""
        config = self._config
        try:
            reserved = reserve_port(config.listen.host, config.listen.port)
        except OSError as e:
            where = f"{config.listen.host}:{config.listen.port}"
            raise ConfigError("$.listen", f"cannot listen on {where}: {e.strerror or e}") from e
        sockets = Path(tempfile.mkdtemp(prefix="vwserver-workers-"))
        try:
            port = int(reserved.getsockname()[1])
            async with contextlib.AsyncExitStack() as stack:
                stack.push_async_callback(self._stop_all)
                for index in range(self._count):
                    role = WorkerRole(index=index, count=self._count, port=port, sockets=sockets)
                    self._workers.append(await self._start(role, stack))
                log.info(
                    "started %d workers on %s:%d (pids %s)",
                    self._count,
                    config.listen.host,
                    port,
                    ", ".join(str(w.process.pid) for w in self._workers),
                )
                await stack.enter_async_context(self._health_listener())
                crashed = await self._wait(stop)
            if crashed is not None:
                return crashed
            codes = [w.process.returncode for w in self._workers]
            # A worker still starting (no signal handler yet) ends by the SIGTERM it was sent.
            if any(code not in (0, -signal.SIGTERM) for code in codes):
                log.error("workers exited with codes %s", codes)
                return 1
            return 0
        finally:
            reserved.close()
            shutil.rmtree(sockets, ignore_errors=True)

    async def _start(self, role: WorkerRole, stack: contextlib.AsyncExitStack) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "vwserver.cli",
            "serve",
            "--config",
            str(self._config_path),
            "--worker-role",
            role.encode(),
            stdin=asyncio.subprocess.PIPE,  # its end closes with this process: the worker stops
            start_new_session=True,
        )
        session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=str(role.socket_path(role.index))),
            timeout=aiohttp.ClientTimeout(total=ASK_TIMEOUT),
        )
        stack.push_async_callback(session.close)
        return _Worker(index=role.index, process=process, session=session)

    async def _wait(self, stop: asyncio.Event) -> int | None:
        """Until ``stop`` is set (None) or a worker exits (the exit code to end with)."""
        waits = {asyncio.ensure_future(w.process.wait()): w for w in self._workers}
        stopped = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait([stopped, *waits], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in [stopped, *waits]:
                task.cancel()
        if stopped in done:
            log.info("stopping %d workers", len(self._workers))
            return None
        worker = next(waits[t] for t in done if t in waits)
        code = worker.process.returncode
        log.error(
            "worker %d (pid %d) exited with code %s; stopping the server",
            worker.index,
            worker.process.pid,
            code,
        )
        return code if code is not None and code > 0 else 1  # (killed by a signal: < 0)

    async def _stop_all(self) -> None:
        """SIGTERM to every worker still running; wait for them, kill what outlives its grace
        period."""
        self._draining = True
        running = [w for w in self._workers if w.process.returncode is None]
        for worker in running:
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(signal.SIGTERM)
        budget = (
            self._config.shutdown_delay_seconds
            + self._config.shutdown_grace_period_seconds
            + KILL_MARGIN
        )
        waiting = [asyncio.ensure_future(w.process.wait()) for w in running]
        if waiting:
            _, late = await asyncio.wait(waiting, timeout=budget)
            for worker in running:
                if worker.process.returncode is None:
                    log.error("worker %d did not stop in %.0fs: killed", worker.index, budget)
                    with contextlib.suppress(ProcessLookupError):
                        worker.process.kill()
            if late:
                await asyncio.gather(*late, return_exceptions=True)
        for worker in self._workers:
            if worker.process.stdin is not None:
                worker.process.stdin.close()

    # --- the health listener ----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _health_listener(self) -> AsyncIterator[None]:
        health = self._config.health
        if health is None:
            yield
            return
        debug = is_loopback(health.host)
        async with listening(
            self._health_app(debug_cache=debug),
            health.host,
            health.port,
            limits=connection_limits(self._config),
            shutdown_timeout=1.0,
        ) as site:
            log.info("health and metrics of every worker on %s", site.name)
            yield

    def _health_app(self, *, debug_cache: bool) -> web.Application:
        app = web.Application()
        app.router.add_get("/healthz", _ok)
        app.router.add_get("/livez", _ok)
        app.router.add_get("/readyz", self._readyz)
        metrics = self._config.metrics
        if metrics.enabled:
            app.router.add_get(metrics.path, self._metrics(metrics.path))
        if debug_cache:
            app.router.add_get(DEBUG_CACHE_PATH, self._debug_cache)
        return app

    async def _each(self, path: str) -> dict[int, Answer]:
        answers = await asyncio.gather(*(w.ask(path) for w in self._workers))
        return {w.index: a for w, a in zip(self._workers, answers, strict=True)}

    async def _readyz(self, _: web.Request) -> web.Response:
        answers = {} if self._draining else await self._each("/readyz")
        status, body = readiness(answers, draining=self._draining)
        return web.Response(status=status, text=body)

    def _metrics(self, path: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def metrics(_: web.Request) -> web.Response:
            answers = await self._each(path)
            texts = {i: a[1] for i, a in answers.items() if a is not None and a[0] == 200}
            return web.Response(
                body=merge_metrics(texts).encode(), headers={"Content-Type": CONTENT_TYPE}
            )

        return metrics

    async def _debug_cache(self, _: web.Request) -> web.Response:
        rows: list[dict[str, Any]] = []
        for index, answer in sorted((await self._each(DEBUG_CACHE_PATH)).items()):
            if answer is None or answer[0] != 200:
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError):
                rows += [{"worker": index, **row} for row in json.loads(answer[1])["resources"]]
        return web.json_response({"resources": rows})


async def _ok(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def supervise(config: Config, *, config_path: Path, count: int, stop: asyncio.Event) -> int:
    """Run ``count`` workers of the server ``config`` (read from ``config_path``) until ``stop``
    is set or one exits; the process's exit code."""
    return await Supervisor(config, config_path=config_path, count=count).run(stop)


async def watch_parent(stop: asyncio.Event) -> None:
    """In a worker: set ``stop`` when the parent's end of stdin closes (the parent is gone)."""

    class _Gone(asyncio.Protocol):
        def connection_lost(self, exc: Exception | None) -> None:
            stop.set()

    await asyncio.get_running_loop().connect_read_pipe(_Gone, sys.stdin)
