"""Just enough HTTP/1.1 (RFC 9112) to GET one object from the upstream — pure, no I/O.

Why not aiohttp's client for this one request: a GET of one object is the proxy's most frequent
upstream exchange and its answer is read whole anyway, and aiohttp's general client (request and
response objects, stream readers, timers, cookie and trace hooks) costs several times what the
proxy's own checks of the request cost (:mod:`vwserver.proxy.connections` does the I/O).

Responses are read by llhttp (Node.js's HTTP parser, through ``httptools``, as uvicorn does) in
its strict mode, fed with the connection's bytes as they arrive (:class:`ResponseReader`). One
keep-alive connection carries the requests of many callers one after another, so a response is
read strictly: a head or a body framing this module does not understand is a
:class:`MalformedResponse` and ends the connection, rather than being guessed at — a guess could
take the rest of one response for the start of the next caller's. Only ``Transfer-Encoding:
chunked``, one ``Content-Length``, or a body up to the end of the connection are understood (RFC
9112 §6.3); a response with both a length and chunking is refused, as §6.3 advises, and so is a
content coding other than identity (the proxy asks for identity only). llhttp refuses (strict,
no leniency switched on) obs-fold, whitespace before a field's colon, bare CR or LF, control
characters in names and values, a repeated or non-decimal ``Content-Length``, and malformed
chunk-size lines; this module adds the rest (HTTP/1.0 or 1.1 only, status 100 to 599, no 101, no
other transfer or content coding, the sizes below) and says where the response ended.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

MAX_HEAD: Final = 64 * 1024
"""Largest response head (status line and fields), and largest chunked trailer section."""
_MAX_CHUNK_LINE: Final = 4096
"""Bytes of framing allowed per chunk (its size line with any extensions, and CRLFs)."""
MAX_INTERIM: Final = 8
"""1xx responses skipped before the final one (RFC 9110 §15.2) — a bound, not an expectation."""

# RFC 9110 §5.6.2 token (field names), and field values as sent: visible characters, spaces,
# tabs and obs-text, no control characters (CR, LF, NUL, ...).
_NAME: Final = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]++"
_FIELD_OUT: Final = re.compile(rf"{_NAME}: [\t\x20-\x7e\x80-\xff]*\r\n")
_FIELDS_OUT: Final = re.compile(rf"(?:{_NAME}: [\t\x20-\x7e\x80-\xff]*\r\n)*")
_REQUEST_TARGET: Final = re.compile(r"/[\x21-\x7e]*")
_OWS: Final = " \t"


class InvalidField(ValueError):
    """A request header that cannot be sent as one line (a control character in its value, or a
    name that is not a token)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"invalid header field {name!r}")
        self.name = name


class MalformedResponse(ValueError):
    """Upstream bytes that are not an HTTP/1.1 response this module reads."""


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


class BodyTooLarge(ValueError):
    """A body longer than the reader's limit."""


class _Trailing(Exception):
    """Bytes after the end of the final response (raised to stop llhttp there)."""


class ResponseReader:
    """The response to one GET, read from its connection's bytes as they arrive.

    :meth:`feed` is called with every piece received and says when the final response is
    complete (1xx responses are skipped); :meth:`at_eof` when the connection ended. Then
    :attr:`status`, :attr:`headers` and :attr:`body` are the response's, :attr:`keep_alive`
    whether the connection may carry another request, and :attr:`trailing` whether bytes
    followed the response (the connection must then not be reused: they belong to no request).

    Sizes are bounded while the bytes arrive: a head's fields at most :data:`MAX_HEAD` (and so
    the trailer section), the body at most ``limit`` (a ``Content-Length`` over it is refused
    before the body arrives), and the bytes that are no body at all — heads, chunk framing,
    trailers — at most :data:`MAX_HEAD` per head seen, one more for the trailers, and
    ``_MAX_CHUNK_LINE`` per chunk: an upstream cannot keep the reader busy without a body.
    """

    __slots__ = (
        "_body",
        "_chunks",
        "_fed",
        "_fields",
        "_framed",
        "_head_bytes",
        "_interim",
        "_limit",
        "_parser",
        "_size",
        "complete",
        "headers",
        "keep_alive",
        "status",
        "trailing",
    )

    def __init__(self, *, limit: int) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._limit = limit
        self._fields: list[tuple[str, str]] = []
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._size = 0
        self._fed = 0
        self._chunks = 0
        self._interim = 0
        self._framed: bool | None = None
        """Whether the body's end is framed (length, chunks, none); False: at the close."""
        self.status = 0
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())
        self.keep_alive = False
        self.complete = False
        self.trailing = False

    @property
    def started(self) -> bool:
        """Whether any byte of an answer arrived."""
        return self._fed > 0

    @property
    def body(self) -> bytes:
        return b"".join(self._body)

    def feed(self, data: bytes) -> bool:
        """Read ``data``, the next bytes of the connection; True once the final response is
        complete. Raises :class:`MalformedResponse` or :class:`BodyTooLarge`."""
        if self.complete:
            self.trailing = True
            return True
        if not self._fed and not data.startswith(b"HTTP/1."[: len(data)]):
            raise MalformedResponse("not an HTTP/1.x status line")
        self._fed += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:
            cause = e.__context__
            if isinstance(cause, _Trailing):
                self.trailing = True
            elif isinstance(cause, MalformedResponse | BodyTooLarge):
                raise cause from None
            else:
                raise MalformedResponse(str(e)) from e
        except httptools.HttpParserUpgrade as e:
            raise MalformedResponse("switching protocols, which was not asked for") from e
        except httptools.HttpParserError as e:
            if not self._ended():
                raise MalformedResponse(str(e)) from e
            self.trailing = True  # e.g. data after a response that closes the connection
        if not self._ended():
            heads = self._interim + (2 if self._framed is not None else 1)
            if self._fed - self._size > MAX_HEAD * heads + _MAX_CHUNK_LINE * self._chunks:
                raise MalformedResponse(
                    "response head too large" if self._framed is None else "too much framing"
                )
        return self._ended()

    def _ended(self) -> bool:
        """:attr:`complete`, as llhttp's callbacks may just have set it."""
        return self.complete

    def at_eof(self) -> bool:
        """The connection ended in good order: whether that completes the response (a body
        that ends at the close)."""
        if not self.complete and self._framed is False:
            self.complete = True
        return self.complete

    # llhttp's callbacks (httptools calls them by name) -----------------------------------

    def on_message_begin(self) -> None:
        if self.complete:
            raise _Trailing()

    def on_header(self, name: bytes, value: bytes) -> None:
        # Field values lose their surrounding whitespace (RFC 9112 §5.1); llhttp drops the
        # leading part. Fields of a chunked body's trailer section are counted, not kept.
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > MAX_HEAD:
            raise MalformedResponse(
                "response head too large" if self._framed is None else "trailer section too large"
            )
        if self._framed is None:
            self._fields.append((name.decode("latin-1"), value.decode("latin-1").rstrip(_OWS)))

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        if parser.get_http_version() not in ("1.0", "1.1") or not 100 <= status <= 599:
            raise MalformedResponse("not an HTTP/1.x status line")
        if status == 101:
            raise MalformedResponse("switching protocols, which was not asked for")
        headers = CIMultiDictProxy(CIMultiDict(self._fields))
        self._fields = []
        self._head_bytes = 0
        if status < 200:
            return  # an interim response: its fields say nothing about the final one
        self.status, self.headers = status, headers
        self.keep_alive = parser.get_http_version() == "1.1" and (
            "close" not in _tokens(headers.getall("Connection", ()))
        )
        if status in (204, 304):
            self._framed = True
            return
        if "Content-Encoding" in headers:
            codings = _tokens(headers.getall("Content-Encoding"))
            if codings - {"identity"}:
                # The proxy asks for identity only (Accept-Encoding) and reads what it forwards.
                raise MalformedResponse(f"content coding {sorted(codings)} was not asked for")
        if "Transfer-Encoding" in headers:
            if "Content-Length" in headers:
                raise MalformedResponse("both Transfer-Encoding and Content-Length")
            transfer = ",".join(headers.getall("Transfer-Encoding"))
            if [t.strip(_OWS).lower() for t in transfer.split(",")] != ["chunked"]:
                raise MalformedResponse("a transfer coding other than chunked")
            self._framed = True
        elif "Content-Length" in headers:
            # llhttp accepted one Content-Length of decimal digits only.
            if int(headers["Content-Length"]) > self._limit:
                raise BodyTooLarge(f"body larger than {self._limit} bytes")
            self._framed = True
        else:
            # Neither: the body is what arrives until the upstream closes the connection.
            self._framed = False
            self.keep_alive = False

    def on_chunk_header(self) -> None:
        self._chunks += 1

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self._limit:
            raise BodyTooLarge(f"body larger than {self._limit} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._framed is None:  # an interim response ended
            self._interim += 1
            if self._interim > MAX_INTERIM:
                raise MalformedResponse(f"more than {MAX_INTERIM} interim responses")
            return
        self.complete = True


def _tokens(values: Iterable[str]) -> set[str]:
    return {t.strip(_OWS).lower() for v in values for t in v.split(",")} - {""}
