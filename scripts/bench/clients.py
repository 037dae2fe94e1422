"""Drive the client processes (``watch_client.py``, ``get_client.py``, ``write_client.py``) from
the benchmark."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from harness import HERE, TOKEN, stop

ANSWER_TIMEOUT = 300.0
ANSWER_LIMIT = 1 << 28  # bytes of one answer line (collect: every arrival time)


class WatchClient:
    """One ``watch_client.py`` process: watches opened, recorded and collected on command."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def _ask(self, command: str) -> str:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(command.encode() + b"\n")
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), ANSWER_TIMEOUT)
        if not line:
            raise RuntimeError(f"watch client exited ({await self.proc.wait()}) on {command!r}")
        return line.decode()

    async def open(self, group: str, count: int) -> int:
        """Open *count* more watches of *group*; the group's total once all are established."""
        return int((await self._ask(f"open {group} {count}")).split()[2])

    async def record(self) -> None:
        await self._ask("record")

    async def collect(self) -> dict[str, dict[str, list[float]]]:
        got: dict[str, dict[str, list[float]]] = json.loads(await self._ask("collect"))
        return got


@contextlib.asynccontextmanager
async def watch_client(
    groups: dict[str, str], *, ca: Path | None = None, prefix: str = "fanout-"
) -> AsyncIterator[WatchClient]:
    args = [sys.executable, str(HERE / "watch_client.py"), "--token", TOKEN, "--prefix", prefix]
    args += [f"--group={name}={url}" for name, url in groups.items()]
    args += ["--ca", str(ca)] if ca else []
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        limit=ANSWER_LIMIT,
    )
    try:
        yield WatchClient(proc)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # end of input: the client closes its watches and exits
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)
        await stop(proc)


async def get_load(
    targets: dict[str, str], *, concurrency: tuple[int, ...], requests: int, rounds: int
) -> dict[str, dict[int, list[float]]]:
    """Latencies (seconds) per target and concurrency from one ``get_client.py`` run."""
    args = [sys.executable, str(HERE / "get_client.py"), "--token", TOKEN]
    args += [f"--target={name}={url}" for name, url in targets.items()]
    args += ["--concurrency", ",".join(map(str, concurrency))]
    args += ["--requests", str(requests), "--rounds", str(rounds)]
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 1800)
    finally:
        await stop(proc)
    if proc.returncode != 0:
        raise RuntimeError(f"get client failed ({proc.returncode})")
    raw: dict[str, dict[str, list[float]]] = json.loads(out)
    return {name: {int(c): v for c, v in by_c.items()} for name, by_c in raw.items()}


class WriteClient:
    """One ``write_client.py`` process: runs of one verb against one target, on command."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def _ask(self, command: dict[str, object]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), ANSWER_TIMEOUT)
        if not line:
            raise RuntimeError(f"write client exited ({await self.proc.wait()}) on {command!r}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"write client: {answer['error']} on {command!r}")
        return answer

    async def prepare(self, workers: int) -> None:
        """Every target gets *workers* objects of its own, one per worker."""
        await self._ask({"prepare": workers})

    async def warm(self, target: str, *, concurrency: int) -> None:
        """*concurrency* connections to *target* open and warm (one GET each)."""
        await self._ask({"warm": target, "concurrency": concurrency})

    async def run(
        self, target: str, verb: str, *, concurrency: int, ops: int, prefix: str
    ) -> tuple[list[float], float]:
        """Latencies (seconds) of *ops* operations of *verb*, and the run's wall time."""
        command = {"target": target, "verb": verb, "concurrency": concurrency, "ops": ops}
        got = await self._ask({**command, "prefix": prefix})
        return got["latencies"], got["seconds"]


@contextlib.asynccontextmanager
async def write_client(
    targets: dict[str, str], *, token: str, ca: Path | None
) -> AsyncIterator[WriteClient]:
    from write_client import TOKEN_ENV

    args = [sys.executable, str(HERE / "write_client.py")]
    args += [f"--target={name}={url}" for name, url in targets.items()]
    args += ["--ca", str(ca)] if ca else []
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, TOKEN_ENV: token},
        limit=ANSWER_LIMIT,
    )
    try:
        yield WriteClient(proc)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)
        await stop(proc)
