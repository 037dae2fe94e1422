"""The proxy's HTTP/1.1 for GETs of one object (vwserver.proxy.http1): requests it writes,
responses it reads (llhttp, fed piece by piece) — and what it refuses to read."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vwserver.proxy.http1 import (
    MAX_HEAD,
    MAX_INTERIM,
    BodyTooLarge,
    InvalidField,
    MalformedResponse,
    ResponseReader,
    request_head,
)


def test_request_head() -> None:
    head = request_head(
        target="/clusters/c/api/v1/namespaces/n/configmaps/x?resourceVersion=1",
        host="127.0.0.1:6443",
        fields=[("Accept", "application/json"), ("Authorization", "Bearer t\tx")],
    )
    assert head == (
        b"GET /clusters/c/api/v1/namespaces/n/configmaps/x?resourceVersion=1 HTTP/1.1\r\n"
        b"Host: 127.0.0.1:6443\r\n"
        b"Accept: application/json\r\n"
        b"Authorization: Bearer t\tx\r\n"
        b"\r\n"
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("User-Agent", "kubectl\r\nImpersonate-User: admin"),
        ("User-Agent", "a\nb"),
        ("User-Agent", "a\x00b"),
        ("User-Agent", "a\x7fb"),
        ("User-Agent", "snow\u2603man"),  # not one byte per character on the wire
        ("Bad Name", "x"),
        ("Bad:Name", "x"),
        ("", "x"),
    ],
)
def test_request_head_refuses_a_field_that_is_not_one_line(name: str, value: str) -> None:
    with pytest.raises(InvalidField) as caught:
        request_head(target="/api", host="h", fields=[("Accept", "*/*"), (name, value)])
    assert caught.value.name == name


@pytest.mark.parametrize("target", ["api", "/a b", "/a\r\nX: y", "/a\tb", ""])
def test_request_head_refuses_a_target_that_is_not_one_token(target: str) -> None:
    with pytest.raises(ValueError, match="request target"):
        request_head(target=target, host="h", fields=[])


def test_request_head_names_the_host_when_it_is_the_bad_field() -> None:
    with pytest.raises(InvalidField) as caught:
        request_head(target="/api", host="h\r\nX: y", fields=[])
    assert caught.value.name == "Host"


def read(raw: bytes, *, limit: int = 1 << 20, eof: bool = False) -> ResponseReader:
    """``raw`` read in one piece (and then the connection's orderly end, with ``eof``)."""
    reader = ResponseReader(limit=limit)
    reader.feed(raw)
    if eof:
        reader.at_eof()
    return reader


def test_a_kcp_answer() -> None:
    reader = read(
        b"HTTP/1.1 200 OK\r\n"
        b"Audit-Id: 0b6b4d5c\r\n"
        b"Cache-Control: no-cache, private\r\n"
        b"Content-Type: application/json\r\n"
        b'Warning: 299 - "a"\r\n'
        b'Warning: 299 - "b"\r\n'
        b"Date: Tue, 01 Dec 2026 16:00:00 GMT\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunked(b'{"kind":', b'"Widget"}')
    )
    assert reader.complete
    assert (reader.status, reader.body) == (200, b'{"kind":"Widget"}')
    assert reader.keep_alive
    assert not reader.trailing
    assert reader.headers["content-type"] == "application/json"
    assert reader.headers.getall("Warning") == ['299 - "a"', '299 - "b"']


def test_whitespace_around_values_is_stripped_only() -> None:
    reader = read(b"HTTP/1.1 200 OK\r\nX: \t a \t b \t\r\nEmpty:\r\nContent-Length: 0\r\n\r\n")
    assert reader.headers["X"] == "a \t b"
    assert reader.headers["Empty"] == ""
    assert reader.complete


def test_obs_text_is_latin_1() -> None:
    reader = read(b"HTTP/1.1 200 OK\r\nX: caf\xe9\r\nContent-Length: 0\r\n\r\n")
    assert reader.headers["X"] == "caf\xe9"


@pytest.mark.parametrize(
    ("raw", "body", "keep_alive"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok", True),
        (
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbye",
            b"bye",
            False,
        ),
        (
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 1\r\n\r\nx",
            b"x",
            False,
        ),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", b"x", False),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b"", True),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n", b"", True),
        (b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", b"", True),
        (b"HTTP/1.1 500 \r\nTransfer-Encoding: Chunked\r\n\r\n0\r\n\r\n", b"", True),
        (
            b"HTTP/1.1 200 OK\r\nContent-Encoding: identity\r\nContent-Length: 1\r\n\r\nx",
            b"x",
            True,
        ),
    ],
)
def test_framed_bodies(raw: bytes, body: bytes, keep_alive: bool) -> None:
    reader = read(raw)
    assert reader.complete
    assert (reader.body, reader.keep_alive, reader.trailing) == (body, keep_alive, False)


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\n\r\nuntil the end",
        b"HTTP/1.1 200 OK\r\nContent-Encoding: identity\r\n\r\nx",
    ],
)
def test_a_body_without_framing_ends_at_the_close(raw: bytes) -> None:
    reader = read(raw)
    assert not reader.complete
    assert reader.at_eof()
    assert reader.body == raw.split(b"\r\n\r\n", 1)[1]
    assert not reader.keep_alive


def test_a_framed_body_is_not_completed_by_the_close() -> None:
    reader = read(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc")
    assert not reader.at_eof()


@pytest.mark.parametrize(
    "after",
    [b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil", b"X", b"HTTP/1.1 200"],
)
def test_bytes_after_the_response_are_trailing(after: bytes) -> None:
    reader = read(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst" + after)
    assert (reader.complete, reader.body, reader.trailing) == (True, b"first", True)
    later = read(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
    assert later.feed(after)
    assert later.trailing


def test_bytes_after_a_response_that_closes_are_trailing() -> None:
    reader = read(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nokMORE")
    assert (reader.complete, reader.body, reader.trailing, reader.keep_alive) == (
        True,
        b"ok",
        True,
        False,
    )


def test_interim_responses_are_skipped() -> None:
    reader = read(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal"
    )
    assert (reader.status, reader.body, reader.complete) == (200, b"final", True)
    assert "Link" not in reader.headers


def test_interim_responses_are_bounded() -> None:
    with pytest.raises(MalformedResponse, match="interim"):
        read(b"HTTP/1.1 100 Continue\r\n\r\n" * (MAX_INTERIM + 1))


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"HTTP/2 200 OK",
        b"HTTP/2.0 200 OK",
        b"HTTP/1.1 20 OK",
        b"HTTP/1.1 600 Nope",
        b"http/1.1 200 OK",
        b"HTTP/1.1  200 OK",
        b"ICY 200 OK",
        b"RTSP/1.0 200 OK",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade",
        b"\r\nHTTP/1.1 200 OK",
        # fields
        b"HTTP/1.1 200 OK\r\n folded: x",
        b"HTTP/1.1 200 OK\r\nX: a\r\n  continued",
        b"HTTP/1.1 200 OK\r\nX : a",
        b"HTTP/1.1 200 OK\r\nX\x00Y: a",
        b"HTTP/1.1 200 OK\r\nX: a\x00b",
        b"HTTP/1.1 200 OK\r\nX: a\x7fb",
        b"HTTP/1.1 200 OK\r\nX: a\nContent-Length: 0",
        b"HTTP/1.1 200 OK\r\nX: a\rb",
        b"HTTP/1.1 200 OK\r\nno colon",
        b"HTTP/1.1 200 OK\r\n: no name",
        # framing
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6",
        b"HTTP/1.1 200 OK\r\nContent-Length: 12, 12",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1",
        b"HTTP/1.1 200 OK\r\nContent-Length: +5",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0x10",
        b"HTTP/1.1 200 OK\r\nContent-Length: \xd9\xa3",  # a non-ASCII digit
        b"HTTP/1.1 200 OK\r\nContent-Length: ",
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 5",
        b"HTTP/1.1 200 OK\r\nContent-Encoding: identity, br\r\nContent-Length: 5",
    ],
)
def test_heads_refused(raw: bytes) -> None:
    with pytest.raises(MalformedResponse):
        read(raw + b"\r\n\r\n")


def test_a_length_over_the_limit_is_refused_before_the_body() -> None:
    with pytest.raises(BodyTooLarge):
        read(b"HTTP/1.1 200 OK\r\nContent-Length: 1234567890123456789\r\n\r\n")
    with pytest.raises(BodyTooLarge):
        read(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n", limit=10)


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n" + b"x" * 11,
        b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 11,
    ],
)
def test_bodies_over_the_limit_are_refused(raw: bytes) -> None:
    with pytest.raises(BodyTooLarge):
        read(raw, limit=10)


def chunked(*chunks: bytes, trailer: bytes = b"") -> bytes:
    return (
        b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks if c) + b"0\r\n" + trailer + b"\r\n"
    )


CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_chunked_extensions_and_trailers_are_skipped() -> None:
    reader = read(
        CHUNKED + b"5;name=value\r\nhello\r\n1;a\r\n!\r\n0;end\r\nX-Trailer: 1\r\nY: 2\r\n\r\n"
    )
    assert (reader.complete, reader.body, reader.trailing) == (True, b"hello!", False)
    assert "X-Trailer" not in reader.headers


@given(
    body_parts=st.lists(st.binary(min_size=1, max_size=40), max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_chunked_in_any_pieces(body_parts: list[bytes], cuts: list[int]) -> None:
    raw = CHUNKED + chunked(*body_parts, trailer=b"T: x\r\n")
    reader = ResponseReader(limit=1 << 20)
    done = False
    previous = 0
    for cut in sorted({min(c, len(raw)) for c in cuts} | {len(raw)}):
        assert not done
        done = reader.feed(raw[previous:cut])
        previous = cut
    assert done
    assert reader.body == b"".join(body_parts)
    assert not reader.trailing


@pytest.mark.parametrize(
    "partial",
    [b"5", b"5\r", b"5\r\nhel", b"5\r\nhello", b"5\r\nhello\r\n0\r\n", b"0\r\nX: y\r\n"],
)
def test_chunked_waits_for_more(partial: bytes) -> None:
    reader = read(CHUNKED + partial)
    assert not reader.complete
    assert not reader.at_eof()


@pytest.mark.parametrize(
    "raw",
    [
        b"g\r\nx\r\n0\r\n\r\n",
        b"-1\r\nx\r\n0\r\n\r\n",
        b"+1\r\nx\r\n0\r\n\r\n",
        b"\r\n",
        b" 1\r\nx\r\n0\r\n\r\n",
        b"1 ;a\r\nx\r\n0\r\n\r\n",
        b"0x1\r\nx\r\n0\r\n\r\n",
        b"1\r\nxy\r\n0\r\n\r\n",  # more data than the size says
        b"1\r\nx\n0\r\n\r\n",
        b"1\nx\r\n0\r\n\r\n",
        b"1;a\rb\r\nx\r\n0\r\n\r\n",
        b"10000000000000000\r\n",  # 17 hex digits: over 64 bits
    ],
)
def test_chunked_refused(raw: bytes) -> None:
    with pytest.raises(MalformedResponse):
        ResponseReader(limit=1 << 62).feed(CHUNKED + raw)


def test_chunked_limit_is_checked_as_the_data_arrives() -> None:
    reader = read(CHUNKED + b"5\r\nhello\r\n", limit=10)
    with pytest.raises(BodyTooLarge):
        reader.feed(b"6\r\nhello!")


def test_heads_framing_and_trailers_are_bounded() -> None:
    with pytest.raises(MalformedResponse, match="head too large"):
        read(b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 20_000 + b"\r\n")
    with pytest.raises(MalformedResponse, match="head too large"):
        read(b"HTTP/1.1 200 OK\r\nX: " + b"y" * (MAX_HEAD + 1))  # a field still arriving
    with pytest.raises(MalformedResponse, match="framing"):
        read(CHUNKED + b"1;" + b"x" * (2 * MAX_HEAD))  # an extension that never ends
    with pytest.raises(MalformedResponse, match="trailer"):
        read(CHUNKED + b"0\r\n" + b"X: y\r\n" * 20_000)
