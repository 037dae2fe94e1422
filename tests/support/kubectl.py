"""Read ``kubectl get -w`` output in tests: event by event with ``-o json --output-watch-events``,
or line by line as kubectl prints its table.

kubectl prints each watch event as an indented JSON document, not one per line, so the stream
is split with an incremental JSON decoder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Coroutine
from typing import Any

from devenv.kcp import KcpInstance


class JsonStream:
    """Consecutive JSON documents from a process's stdout."""

    def __init__(self, stdout: asyncio.StreamReader) -> None:
        self._stdout = stdout
        self._decoder = json.JSONDecoder()
        self._buffer = ""

    async def next(self, *, within: float) -> dict[str, Any]:
        """The next document; fails if none arrives within ``within`` seconds."""
        async with asyncio.timeout(within):
            while True:
                stripped = self._buffer.lstrip()
                if stripped:
                    try:
                        doc, end = self._decoder.raw_decode(stripped)
                        self._buffer = stripped[end:]
                        return dict(doc)
                    except json.JSONDecodeError:
                        pass  # an incomplete document: read more
                chunk = await self._stdout.read(65536)
                if not chunk:
                    raise AssertionError("the stream ended")
                self._buffer += chunk.decode()


async def watch_lines(
    kcp: KcpInstance,
    *args: str,
    server: str,
    until: str,
    within: float,
    then: Coroutine[Any, Any, None] | None = None,
) -> list[str]:
    """Run ``kubectl <args>`` (a ``get -w``, as kcp's admin, against ``server``) and return its
    output lines up to the first that contains ``until``; ``then`` runs once kubectl printed its
    first line (it has listed, and watches from the list's resourceVersion). Fails if that line
    does not come within ``within`` seconds; kubectl is stopped either way."""
    argv = [
        f"--kubeconfig={kcp.kubeconfig}",
        f"--context={kcp.admin_context}",
        f"--server={server}",
        *args,
    ]
    proc = await asyncio.create_subprocess_exec(
        kcp.kubectl_binary,
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    lines: list[str] = []
    started: asyncio.Task[None] | None = None
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(within):
            async for raw in proc.stdout:
                lines.append(raw.decode().rstrip())
                if then is not None and started is None:
                    started = asyncio.ensure_future(then)
                if until in lines[-1]:
                    return lines
        raise AssertionError(f"kubectl {' '.join(args)} ended before {until}: {lines}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        if started is not None:
            await started
        elif then is not None:
            then.close()
