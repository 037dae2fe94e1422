"""Run the lines a development story printed (``make run``, ``make run-sync``) exactly as
printed: ``bash -c`` from the directory they were rendered for, in their own process group."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class _Line(Protocol):
    command: str


class PrintedLines(Protocol):
    """What a story printed: its lines by key, and where and with what environment to run them."""

    @property
    def lines(self) -> Mapping[str, _Line]: ...

    @property
    def cwd(self) -> Path: ...

    @property
    def env(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


async def kill(proc: asyncio.subprocess.Process) -> None:
    """Kill the command's whole process group (bash and what it started) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), 10)


async def spawn(printed: PrintedLines, key: str) -> asyncio.subprocess.Process:
    """Start the printed line ``key`` (e.g. a watch that runs until killed)."""
    return await asyncio.create_subprocess_exec(
        "bash", "-c", printed.lines[key].command,
        cwd=printed.cwd, env=dict(printed.env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip


async def run_line(printed: PrintedLines, key: str, *, timeout: float) -> Ran:
    """Run the printed line ``key`` to its end (killed after ``timeout`` seconds)."""
    proc = await spawn(printed, key)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        await kill(proc)
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())
