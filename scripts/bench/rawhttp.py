"""Just enough HTTP/1.1 for the benchmark's client processes.

The measuring clients are raw sockets rather than aiohttp because their own cost per response
lands in every latency they report: a request is one prepared ``bytes``, a response head is
split once, and a body is read by ``Content-Length`` or chunk sizes without further parsing.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


def address(url: str) -> tuple[str, int, bool]:
    """Host, port and whether the URL wants TLS."""
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    return parts.hostname or "127.0.0.1", parts.port or (443 if tls else 80), tls


def get_request(url: str, *, token: str) -> bytes:
    """A keep-alive GET of *url* with a bearer token."""
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    return (
        f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {token}\r\n"
        "Accept: application/json\r\n\r\n"
    ).encode()


def status_of(head: bytes) -> int:
    """The status code of a response head (``HTTP/1.1 200 OK``)."""
    return int(head.split(b" ", 2)[1])


def header(head: bytes, name: bytes) -> bytes | None:
    wanted = name.lower() + b":"
    for line in head.split(b"\r\n")[1:]:
        if line.lower().startswith(wanted):
            return line[len(wanted) :].strip()
    return None


async def read_response(reader: asyncio.StreamReader) -> tuple[int, int]:
    """Status and body length of the next response on a keep-alive connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = header(head, b"content-length")
    if length is not None:
        body = await reader.readexactly(int(length))
        return status_of(head), len(body)
    if (header(head, b"transfer-encoding") or b"").lower() != b"chunked":
        raise ValueError(f"response without length or chunks: {head!r}")
    size = 0
    while True:
        chunk = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        await reader.readexactly(chunk + 2)  # the chunk and its CRLF
        size += chunk
        if chunk == 0:
            return status_of(head), size
