"""The proxy's HTTP/1.1 for GETs of one object (vwserver.proxy.http1): requests it writes,
response heads and chunked bodies it reads — and what it refuses to read."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vwserver.proxy.http1 import (
    MAX_HEAD,
    BodyTooLarge,
    ChunkedReader,
    Framing,
    InvalidField,
    MalformedResponse,
    parse_head,
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


def test_parse_head_of_a_kcp_answer() -> None:
    head = parse_head(
        b"HTTP/1.1 200 OK\r\n"
        b"Audit-Id: 0b6b4d5c\r\n"
        b"Cache-Control: no-cache, private\r\n"
        b"Content-Type: application/json\r\n"
        b'Warning: 299 - "a"\r\n'
        b'Warning: 299 - "b"\r\n'
        b"Date: Tue, 01 Dec 2026 16:00:00 GMT\r\n"
        b"Transfer-Encoding: chunked"
    )
    assert head.status == 200
    assert head.framing is Framing.CHUNKED
    assert head.keep_alive
    assert head.headers["content-type"] == "application/json"
    assert head.headers.getall("Warning") == ['299 - "a"', '299 - "b"']


def test_parse_head_strips_whitespace_around_values_only() -> None:
    head = parse_head(b"HTTP/1.1 200 OK\r\nX: \t a \t b \t\r\nEmpty:\r\nContent-Length: 0")
    assert head.headers["X"] == "a \t b"
    assert head.headers["Empty"] == ""
    assert (head.framing, head.length) == (Framing.LENGTH, 0)


def test_parse_head_obs_text_is_latin_1() -> None:
    head = parse_head(b"HTTP/1.1 200 OK\r\nX: caf\xe9\r\nContent-Length: 0")
    assert head.headers["X"] == "caf\xe9"


@pytest.mark.parametrize(
    ("raw", "framing", "length", "keep_alive"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 12", Framing.LENGTH, 12, True),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 12, 12\r\nContent-Length: 12",
            Framing.LENGTH,
            12,
            True,
        ),
        (
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\nConnection: close",
            Framing.LENGTH,
            3,
            False,
        ),
        (
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 1",
            Framing.LENGTH,
            1,
            False,
        ),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 1", Framing.LENGTH, 1, False),
        (b"HTTP/1.1 200 OK", Framing.CLOSE, 0, False),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: identity", Framing.CLOSE, 0, False),
        (b"HTTP/1.1 204 No Content", Framing.NONE, 0, True),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5", Framing.NONE, 0, True),
        (b"HTTP/1.1 100 Continue", Framing.NONE, 0, True),
        (b"HTTP/1.1 103 Early Hints\r\nLink: </a>", Framing.NONE, 0, True),
        (b"HTTP/1.1 200", Framing.CLOSE, 0, False),
        (b"HTTP/1.1 500 \r\nTransfer-Encoding: Chunked", Framing.CHUNKED, 0, True),
    ],
)
def test_parse_head_framing(raw: bytes, framing: Framing, length: int, keep_alive: bool) -> None:
    head = parse_head(raw)
    assert (head.framing, head.length, head.keep_alive) == (framing, length, keep_alive)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"HTTP/2 200 OK",
        b"HTTP/1.1 20 OK",
        b"HTTP/1.1 600 Nope",
        b"http/1.1 200 OK",
        b"HTTP/1.1  200 OK",
        b"ICY 200 OK",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket",
        # fields
        b"HTTP/1.1 200 OK\r\n folded: x",
        b"HTTP/1.1 200 OK\r\nX: a\r\n  continued",
        b"HTTP/1.1 200 OK\r\nX : a",
        b"HTTP/1.1 200 OK\r\nX\x00Y: a",
        b"HTTP/1.1 200 OK\r\nX: a\x00b",
        b"HTTP/1.1 200 OK\r\nX: a\nContent-Length: 0",
        b"HTTP/1.1 200 OK\r\nX: a\rb",
        b"HTTP/1.1 200 OK\r\nno colon",
        b"HTTP/1.1 200 OK\r\n: no name",
        b"HTTP/1.1 200 OK\r\n\r\nX: after the end",
        # framing
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1",
        b"HTTP/1.1 200 OK\r\nContent-Length: +5",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0x10",
        b"HTTP/1.1 200 OK\r\nContent-Length: \xd9\xa3",  # a non-ASCII digit
        b"HTTP/1.1 200 OK\r\nContent-Length: ",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1234567890123456789",
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 5",
        b"HTTP/1.1 200 OK\r\nContent-Encoding: identity, br\r\nContent-Length: 5",
    ],
)
def test_parse_head_refuses(raw: bytes) -> None:
    with pytest.raises(MalformedResponse):
        parse_head(raw)


def chunked(*chunks: bytes, trailer: bytes = b"") -> bytes:
    return (
        b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks if c) + b"0\r\n" + trailer + b"\r\n"
    )


def decode_all(raw: bytes, *, limit: int = 1 << 20) -> tuple[bytes, int]:
    reader = ChunkedReader(limit=limit)
    assert reader.advance(raw)
    return reader.body, reader.consumed


def test_chunked_body_and_where_it_ends() -> None:
    raw = chunked(b'{"kind":', b'"Widget"}') + b"NEXT"
    assert decode_all(raw) == (b'{"kind":"Widget"}', len(raw) - 4)


def test_chunked_extensions_and_trailers_are_skipped() -> None:
    raw = b"5 ;name=value\r\nhello\r\n1;a\r\n!\r\n0;end\r\nX-Trailer: 1\r\nY: 2\r\n\r\n"
    assert decode_all(raw) == (b"hello!", len(raw))


@given(
    body_parts=st.lists(st.binary(min_size=1, max_size=40), max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_chunked_in_any_pieces_with_compaction(body_parts: list[bytes], cuts: list[int]) -> None:
    raw = chunked(*body_parts, trailer=b"T: x\r\n")
    buffer = bytearray()
    reader = ChunkedReader(limit=1 << 20)
    done = False
    previous = 0
    for cut in [*sorted({min(c, len(raw)) for c in cuts}), len(raw)]:
        buffer += raw[previous:cut]
        previous = cut
        done = reader.advance(buffer)
        if done:
            break
        reader.compact(buffer)
    assert done
    assert reader.body == b"".join(body_parts)
    assert reader.consumed == len(buffer)


@pytest.mark.parametrize(
    "partial",
    [b"", b"5", b"5\r", b"5\r\nhel", b"5\r\nhello", b"5\r\nhello\r\n0\r\n", b"0\r\nX: y\r\n"],
)
def test_chunked_waits_for_more(partial: bytes) -> None:
    assert not ChunkedReader(limit=100).advance(partial)


@pytest.mark.parametrize(
    "raw",
    [
        b"g\r\nx\r\n0\r\n\r\n",
        b"-1\r\nx\r\n0\r\n\r\n",
        b"+1\r\nx\r\n0\r\n\r\n",
        b"\r\n",
        b" 1\r\nx\r\n0\r\n\r\n",
        b"0x1\r\nx\r\n0\r\n\r\n",
        b"1\r\nxy\r\n0\r\n\r\n",  # more data than the size says
        b"1\r\nx\n0\r\n\r\n",
        b"1\nx\r\n0\r\n\r\n",
        b"1;a\rb\r\nx\r\n0\r\n\r\n",
        b"1000000000000000\r\n",  # 16 hex digits
    ],
)
def test_chunked_refuses(raw: bytes) -> None:
    with pytest.raises(MalformedResponse):
        ChunkedReader(limit=1 << 62).advance(raw)


def test_chunked_limit_is_checked_before_the_data_arrives() -> None:
    reader = ChunkedReader(limit=10)
    assert not reader.advance(b"5\r\nhello\r\n")
    with pytest.raises(BodyTooLarge):
        reader.advance(b"5\r\nhello\r\n6\r\n")


def test_chunked_size_line_and_trailers_are_bounded() -> None:
    with pytest.raises(MalformedResponse, match="chunk-size line"):
        ChunkedReader(limit=10).advance(b"1;" + b"x" * 5000)
    reader = ChunkedReader(limit=10)
    assert not reader.advance(b"0\r\nX: " + b"y" * 100)
    with pytest.raises(MalformedResponse, match="trailer"):
        reader.advance(b"0\r\nX: " + b"y" * MAX_HEAD)
