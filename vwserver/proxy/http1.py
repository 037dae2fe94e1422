"""Just enough HTTP/1.1 (RFC 9112) to GET one object from the upstream — pure, no I/O.

Why not aiohttp's client for this one request: a GET of one object is the proxy's most frequent
upstream exchange and its answer is read whole anyway, and aiohttp's general client (request and
response objects, stream readers, timers, cookie and trace hooks) costs several times what the
proxy's own checks of the request cost (:mod:`vwserver.proxy.connections` does the I/O).

One keep-alive connection carries the requests of many callers one after another, so a response
is read strictly: a head or a body framing this module does not understand is a
:class:`MalformedResponse` and ends the connection, rather than being guessed at — a guess could
take the rest of one response for the start of the next caller's. Only ``Transfer-Encoding:
chunked``, one ``Content-Length``, or a body up to the end of the connection are understood (RFC
9112 §6.3); a response with both a length and chunking is refused, as §6.3 advises, and so is a
content coding other than identity (the proxy asks for identity only).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Final

from multidict import CIMultiDict, CIMultiDictProxy

MAX_HEAD: Final = 64 * 1024
"""Largest response head (status line and fields), and largest chunked trailer section."""
_MAX_CHUNK_LINE: Final = 4096
"""Largest chunk-size line (the size and any chunk extensions)."""

# RFC 9110 §5.6.2 token (field names), and field values: visible characters, spaces, tabs and
# obs-text, no control characters (CR, LF, NUL, ...), no whitespace around them (§5.5). Heads are
# matched as latin-1 text, one byte per character; the received ones with possessive quantifiers,
# which never backtrack: a 64 KiB head costs linear time even when it does not match.
_NAME: Final = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]++"
_VCHAR: Final = r"[\x21-\x7e\x80-\xff]"
_VALUE: Final = rf"(?:{_VCHAR}++(?:[ \t]++{_VCHAR}++)*+)?+"
# One field line as sent (the value as is, its own whitespace included) ...
_FIELD_OUT: Final = re.compile(rf"{_NAME}: [\t\x20-\x7e\x80-\xff]*\r\n")
_FIELDS_OUT: Final = re.compile(rf"(?:{_NAME}: [\t\x20-\x7e\x80-\xff]*\r\n)*")
# ... and as received, after the status line: optional whitespace around the value.
_FIELD_IN: Final = re.compile(rf"\r\n({_NAME}):[ \t]*+({_VALUE})[ \t]*+")
_FIELDS_IN: Final = re.compile(rf"(?:\r\n{_NAME}:[ \t]*+{_VALUE}[ \t]*+)*+")
_REQUEST_TARGET: Final = re.compile(r"/[\x21-\x7e]*")
_STATUS_LINE: Final = re.compile(r"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: [\t\x20-\x7e\x80-\xff]*)?")
_CHUNK_SIZE: Final = re.compile(rb"([0-9A-Fa-f]{1,15})[\t ]*(?:;[^\r\n]*)?")


class InvalidField(ValueError):
    """A request header that cannot be sent as one line (a control character in its value, or a
    name that is not a token)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"invalid header field {name!r}")
        self.name = name


class MalformedResponse(ValueError):
    """Upstream bytes that are not an HTTP/1.1 response this module reads."""


class Framing(Enum):
    """Where a response body ends (RFC 9112 §6.3)."""

    NONE = "none"  # 1xx, 204, 304: no body at all
    LENGTH = "length"  # Content-Length bytes
    CHUNKED = "chunked"  # Transfer-Encoding: chunked
    CLOSE = "close"  # at the end of the connection


@dataclass(slots=True)
class ResponseHead:
    status: int
    headers: CIMultiDictProxy[str]
    framing: Framing
    length: int = 0
    """The body's length for :attr:`Framing.LENGTH`."""
    keep_alive: bool = True
    """Whether the connection may carry another request after this response."""


def request_head(*, target: str, host: str, fields: Iterable[tuple[str, str]]) -> bytes:
    """``GET target HTTP/1.1`` with ``Host`` and ``fields``. A target that is not one token on
    the wire raises ValueError, a field that is not one line :class:`InvalidField` (CR, LF and
    other control characters): such a request must not be sent at all, as it would say
    something else than was checked."""
    if not _REQUEST_TARGET.fullmatch(target):
        raise ValueError(f"invalid request target {target!r}")
    every = [("Host", host), *fields]
    lines = "".join([f"{name}: {value}\r\n" for name, value in every])
    # One match for all lines, and one LF per field: a value with CRLF in it would otherwise
    # read as two valid lines (a header of the client's choosing).
    if lines.count("\n") != len(every) or not _FIELDS_OUT.fullmatch(lines):
        for name, value in every:  # which one
            if not _FIELD_OUT.fullmatch(f"{name}: {value}\r\n"):
                raise InvalidField(name)
    return f"GET {target} HTTP/1.1\r\n{lines}\r\n".encode("latin-1")


def parse_head(raw: bytes) -> ResponseHead:
    """The response head ``raw`` (status line and fields, without the empty line that ends
    them) of a response to a GET."""
    text = raw.decode("latin-1")
    status_end = text.find("\r\n")
    if status_end < 0:
        status_end = len(text)
    status_line = _STATUS_LINE.fullmatch(text, 0, status_end)
    if status_line is None:
        raise MalformedResponse("not an HTTP/1.x status line")
    # Every line a field: no obs-fold (a line starting with whitespace), no whitespace before
    # the colon, no bare CR or LF inside a line (RFC 9112 §5.1, §5.2).
    if not _FIELDS_IN.fullmatch(text, status_end):
        raise MalformedResponse("malformed header field")
    headers = CIMultiDictProxy(CIMultiDict(_FIELD_IN.findall(text, status_end)))
    http11 = status_line[1] == "1"
    status = int(status_line[2])
    keep_alive = http11 and (
        "Connection" not in headers or "close" not in _tokens(headers.getall("Connection"))
    )
    if status == 101:
        raise MalformedResponse("switching protocols, which was not asked for")
    if status < 200 or status in (204, 304):
        return ResponseHead(status, headers, Framing.NONE, 0, keep_alive)
    if "Content-Encoding" in headers:
        codings = _tokens(headers.getall("Content-Encoding"))
        if codings - {"identity"}:
            # The proxy asks for identity only (Accept-Encoding) and reads what it forwards.
            raise MalformedResponse(f"content coding {sorted(codings)} was not asked for")
    if "Transfer-Encoding" in headers:
        if "Content-Length" in headers:
            raise MalformedResponse("both Transfer-Encoding and Content-Length")
        transfer = ",".join(headers.getall("Transfer-Encoding"))
        if [t.strip(" \t").lower() for t in transfer.split(",")] != ["chunked"]:
            raise MalformedResponse("a transfer coding other than chunked")
        return ResponseHead(status, headers, Framing.CHUNKED, 0, keep_alive)
    if "Content-Length" in headers:
        # A list of one repeated value is one value (RFC 9110 §8.6).
        lengths = ",".join(headers.getall("Content-Length")).split(",")
        length_text = lengths[0].strip(" \t")
        if any(v.strip(" \t") != length_text for v in lengths[1:]):
            raise MalformedResponse("conflicting Content-Length values")
        if not length_text.isascii() or not length_text.isdigit() or len(length_text) > 18:
            raise MalformedResponse("invalid Content-Length")
        return ResponseHead(status, headers, Framing.LENGTH, int(length_text), keep_alive)
    # Neither: the body is what arrives until the upstream closes the connection.
    return ResponseHead(status, headers, Framing.CLOSE, 0, False)


def _tokens(values: Iterable[str]) -> set[str]:
    return {t.strip(" \t").lower() for v in values for t in v.split(",")} - {""}


class BodyTooLarge(ValueError):
    """A body longer than the reader's limit."""


class ChunkedReader:
    """A chunked body (RFC 9112 §7.1) decoded from a buffer as it fills.

    :meth:`advance` is called with the connection's whole buffer each time more arrived; it
    decodes what it can and says whether the body is complete. :attr:`consumed` is how many
    bytes of the buffer the body took (the rest belongs to no response).
    """

    def __init__(self, *, limit: int) -> None:
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        self.consumed = 0
        self._data_left = -1  # bytes of the current chunk still to read; -1: a size line next
        self._in_trailers = False
        self._trailers_start = 0

    @property
    def body(self) -> bytes:
        return b"".join(self._chunks)

    def compact(self, buffer: bytearray) -> None:
        """Drop the bytes decoded so far from the front of ``buffer``."""
        del buffer[: self.consumed]
        self.consumed = 0

    def advance(self, buffer: bytes | bytearray) -> bool:
        """Decode ``buffer[consumed:]`` as far as it goes; True once the body is complete.
        Raises :class:`MalformedResponse` or :class:`BodyTooLarge`."""
        pos = self.consumed
        end = len(buffer)
        try:
            while True:
                if self._in_trailers:
                    # Trailer fields are not used: each line is skipped, an empty one ends them.
                    line_end = buffer.find(b"\r\n", pos, self._trailers_start + MAX_HEAD)
                    if line_end < 0:
                        if end - self._trailers_start >= MAX_HEAD:
                            raise MalformedResponse("chunked trailer section too large")
                        return False
                    done = line_end == pos
                    pos = line_end + 2
                    if done:
                        return True
                    continue
                if self._data_left < 0:
                    line_end = buffer.find(b"\r\n", pos, pos + _MAX_CHUNK_LINE)
                    if line_end < 0:
                        if end - pos >= _MAX_CHUNK_LINE:
                            raise MalformedResponse("chunk-size line too long")
                        return False
                    size_line = _CHUNK_SIZE.fullmatch(buffer, pos, line_end)
                    if size_line is None:
                        raise MalformedResponse("malformed chunk-size line")
                    size = int(size_line[1], 16)
                    pos = line_end + 2
                    if size == 0:
                        self._in_trailers = True
                        self._trailers_start = pos
                        continue
                    self._size += size
                    if self._size > self._limit:
                        raise BodyTooLarge(f"body larger than {self._limit} bytes")
                    self._data_left = size
                if end - pos < self._data_left + 2:
                    return False
                data_end = pos + self._data_left
                if buffer[data_end : data_end + 2] != b"\r\n":
                    raise MalformedResponse("chunk data not followed by CRLF")
                self._chunks.append(bytes(buffer[pos:data_end]))
                pos = data_end + 2
                self._data_left = -1
        finally:
            self.consumed = pos
