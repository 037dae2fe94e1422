"""HTTP/1.1 over raw sockets, for tests that must see every byte a server sends (or send bytes
no HTTP client would): headers as written — a ``Server`` header, a malformed field — and an
answer written before any handler ran.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import dataclass
from typing import Any


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def status_doc(self) -> dict[str, Any]:
        assert self.headers.get("content-type", "").startswith("application/json"), self
        doc: dict[str, Any] = json.loads(self.body)
        assert (doc["kind"], doc["status"], doc["code"]) == ("Status", "Failure", self.status)
        return doc


async def read_answer(reader: asyncio.StreamReader) -> Answer | None:
    """One HTTP/1.1 response, or None if the server closed the connection without one."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    headers = {
        k.strip().lower(): v.strip()
        for k, _, v in (line.partition(":") for line in lines[1:] if line)
    }
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Answer(int(lines[0].split()[1]), headers, body)


async def answer_to(
    host: str, port: int, raw: bytes, *, timeout: float, tls: ssl.SSLContext | None = None
) -> Answer:
    """``raw`` sent on a connection of its own (over TLS with ``tls``, checking ``host``'s
    name): the response, which must come within ``timeout``."""
    reader, writer = await asyncio.open_connection(
        host, port, ssl=tls, server_hostname=host if tls is not None else None
    )
    try:
        writer.write(raw)
        await writer.drain()
        answer = await asyncio.wait_for(read_answer(reader), timeout)
    finally:
        writer.close()
    assert answer is not None, f"no answer to {raw!r}"
    return answer
