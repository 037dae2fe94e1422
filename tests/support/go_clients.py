"""``vwclient`` (``clients/go``: stock client-go and controller-runtime clients) as processes the
kcp tests start and read: each prints one JSON line per handler call, per HTTP request and at its
end its whole cache, and :class:`GoClient` collects them in order as they arrive.

Shared by the e2e tests (``tests/e2e/test_go_clients_kcp.py``, ``test_provider_kcp.py``) and the
chaos tests (``tests/chaos``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

RESOURCE = "example.io/v1alpha1/widgets"
STOP_GRACE = 10.0

Key = str  # "<cluster>|<namespace>/<name>", the informer's key
State = tuple[str, dict[str, str]]  # (resourceVersion, labels)


class GoClient:
    """A running ``vwclient``; its stdout JSON lines are collected as they arrive."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, stderr: Path) -> None:
        self.name = name
        self.proc = proc
        self.stderr = stderr
        self.lines: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, binary: Path, name: str, args: Sequence[str], logs: Path) -> GoClient:
        stderr = logs / f"{name}.stderr"
        with stderr.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                str(binary),
                *args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                limit=64 * 1024 * 1024,  # the final cache is one line
            )
        return cls(name, proc, stderr)

    async def _read(self) -> None:
        """Collect stdout, and keep a copy next to the stderr log (for a failure's analysis)."""
        assert self.proc.stdout is not None
        try:
            with self.stderr.with_suffix(".stdout").open("wb") as copy:
                while line := await self.proc.stdout.readline():
                    copy.write(line)
                    self.lines.append(json.loads(line))
                    self._changed.set()
        finally:
            self._changed.set()

    def events(self, *kinds: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["event"] in kinds]

    def synced(self) -> bool:
        return bool(self.events("synced"))

    def holds(self, namespace: str, keys: object) -> bool:
        """Whether :func:`view` of ``namespace`` is ``keys`` (a dict of states or a set of keys)."""
        state = view(self, namespace)
        return (set(state) if isinstance(keys, set) else state) == keys

    def stderr_tail(self, lines: int = 30) -> str:
        text = self.stderr.read_text(errors="replace").splitlines()[-lines:]
        return f"--- last lines of {self.stderr} ---\n" + "\n".join(text)

    async def wait_until(self, what: str, probe: Callable[[], T], *, within: float) -> T:
        """``probe()`` once it is truthy; fails after ``within`` seconds or if the client ends."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            if value := probe():
                return value
            if self._reader.done():
                raise AssertionError(
                    f"{self.name} ended (exit code {self.proc.returncode}) before {what}\n"
                    + self.stderr_tail()
                )
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(
                    f"{self.name}: no {what} within {within:.0f}s\n{self.stderr_tail()}"
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def stop(self) -> int:
        """SIGTERM, SIGKILL after :data:`STOP_GRACE` seconds; the exit code (negative: signal)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), STOP_GRACE)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await asyncio.wait_for(self.proc.wait(), STOP_GRACE)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reader), STOP_GRACE)
        assert self.proc.returncode is not None
        return self.proc.returncode

    def final_cache(self) -> list[dict[str, Any]]:
        caches = self.events("cache")
        assert len(caches) == 1, f"{self.name}: {len(caches)} cache lines\n{self.stderr_tail()}"
        return list(caches[0]["items"])


@contextlib.asynccontextmanager
async def clients() -> AsyncIterator[Callable[[GoClient], GoClient]]:
    """``add(client)`` registers a client to be stopped when the block ends, however it ends."""
    started: list[GoClient] = []

    def add(client: GoClient) -> GoClient:
        started.append(client)
        return client

    try:
        yield add
    finally:
        await asyncio.gather(*(c.stop() for c in started), return_exceptions=True)


def informer_args(server: str, *credentials: str, watch_list: bool) -> list[str]:
    """A cluster-aware informer on ``server`` (credentials: --token=..., --kubeconfig=...)."""
    return [
        "informer",
        f"--server={server}",
        *credentials,
        f"--resource={RESOURCE}",
        "--cluster-aware",
        f"--watch-list={'on' if watch_list else 'off'}",
    ]


def reconciler_args(
    server: str,
    *credentials: str,
    namespace: str,
    finalizer: str,
    phase: str,
    label_selector: str = "",
) -> list[str]:
    """A controller-runtime reconciler on ``server`` (one logical cluster: ``clusters/<id>``)
    for the widgets of ``namespace``: adds ``finalizer``, sets ``status.phase`` to ``phase``,
    removes the finalizer once the object is being deleted; ``label_selector``: its cache's
    own label selector for widgets (controller-runtime ``cache.ByObject``)."""
    return [
        "reconciler",
        f"--server={server}",
        *credentials,
        f"--namespace={namespace}",
        f"--finalizer={finalizer}",
        f"--status-phase={phase}",
        *([f"--label-selector={label_selector}"] if label_selector else []),
    ]


def view(client: GoClient, namespace: str) -> dict[Key, State]:
    """What the informer holds in ``namespace`` according to its handler calls so far."""
    state: dict[Key, State] = {}
    for e in client.events("add", "update", "delete"):
        if e["namespace"] != namespace:
            continue
        if e["event"] == "delete":
            state.pop(e["key"], None)
        else:
            state[e["key"]] = (e["resourceVersion"], e["labels"])
    return state


def widget_requests(client: GoClient) -> list[dict[str, Any]]:
    return [r for r in client.events("request") if r["path"].endswith("/widgets")]


def is_watch(request: Mapping[str, Any]) -> bool:
    return "watch=true" in request["query"].split("&")
