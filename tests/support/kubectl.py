"""Read ``kubectl get -w -o json --output-watch-events`` output event by event in tests.

kubectl prints each watch event as an indented JSON document, not one per line, so the stream
is split with an incremental JSON decoder.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any


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
