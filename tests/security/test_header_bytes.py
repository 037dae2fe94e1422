"""Bytes a client may put into request header fields (issue #22, finding 9 and its class).

aiohttp hands header bytes to the app decoded as UTF-8 with ``surrogateescape``: ``\\xff``
arrives as the lone surrogate ``"\\udcff"``. A bearer token with such a byte once reached
``token.encode()``: a 500 with a traceback per request and the offending character in the
log. Now every field is judged by its syntax before the proxy reads any
(:mod:`vwserver.proxy.request_headers`): a malformed ``Authorization`` is no credential (401, the
apiserver's bare ``Unauthorized``, nothing sent to kcp's TokenReview), any other field with
bytes other than visible ASCII, spaces and tabs a 400 Status naming the field. Either way: no
ERROR record, no traceback, and nothing of the value in any log line in either log format.

Everything goes over raw sockets to the real listener (:func:`tests.support.serve.serve_app`) in
front of the fake kcp, which plays TokenReview and SubjectAccessReview too
(:func:`tests.integration.test_auth.proxy_env`), so that the bytes reach the server exactly as
written here. A hypothesis property sends random bytes in every field the proxy reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.integration.conftest import SLICE_CLUSTER
from tests.integration.test_auth import Env, proxy_env
from tests.security.support import LogCapture, env_int, status_problem
from tests.support.properties import bounded_settings
from tests.support.raw_http import Answer, answer_to
from vwserver.auth.certs import identity_from_peercert
from vwserver.auth.guard import AuthMode

EXAMPLES = env_int("VWSERVER_HEADER_EXAMPLES", 300)
WIDGETS = (
    f"/services/filtered-apiexport/{SLICE_CLUSTER}/prod/clusters/c1"
    "/apis/example.io/v1alpha1/namespaces/ns1/widgets"
)
ALICE = b"Authorization: Bearer alice-token"
# kube-apiserver's (and kcp's) answer to a token it does not accept, byte for byte.
UNAUTHORIZED = (
    b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
    b'"message":"Unauthorized","reason":"Unauthorized","code":401}\n'
)
# Every field the proxy reads, forwards, or must decide about.
FIELDS = (
    "Accept",
    "Content-Type",
    "Accept-Encoding",
    "User-Agent",
    "Impersonate-User",
    "Impersonate-Group",
    "Impersonate-Uid",
    "Impersonate-Extra-Scopes",
    "X-Remote-User",
    "X-Remote-Group",
    "X-Remote-Extra-Foo",
    "Cookie",
    "X-Custom",
)
VALID_VALUE = frozenset(b"\t" + bytes(range(0x20, 0x7F)))


def marker() -> bytes:
    """A unique ASCII string to put in a value and look for in the logs."""
    return f"mark{uuid.uuid4().hex}".encode()


def traces_of(value: bytes) -> list[str]:
    """How bytes of ``value`` would show in a log line: the ASCII runs of 8 or more bytes as
    they are, and each byte over 0x7f as surrogateescape, repr and latin-1 render it."""
    found = [run for run in value.decode("latin-1").split() if len(run) >= 8 and run.isascii()]
    for byte in {b for b in value if b > 0x7F}:
        found += [chr(0xDC00 + byte), f"\\udc{byte:02x}", f"\\x{byte:02x}", chr(byte)]
    return found


def request(method: str, *fields: bytes, body: bytes = b"") -> bytes:
    head = [f"{method} {WIDGETS} HTTP/1.1".encode(), b"Host: vwserver", *fields]
    if body or method == "POST":
        head.append(f"Content-Length: {len(body)}".encode())
    return b"\r\n".join(head) + b"\r\n\r\n" + body


async def exchange(env: Env, raw: bytes) -> Answer:
    host, _, port = env.base.removeprefix("http://").rpartition(":")
    return await answer_to(host, int(port), raw, timeout=10)


def judge(logs: LogCapture, *, since: int, secret: bytes) -> None:
    """No ERROR or traceback, and nothing of ``secret``, in what was logged since ``since``."""
    assert not logs.problems(since), logs.problems(since)
    traces = traces_of(secret)
    for line in logs.rendered(since):
        leaked = [t for t in traces if t in line]
        assert not leaked, f"{leaked} of the header value in the log: {line[:300]!r}"


@contextlib.asynccontextmanager
async def logged_env(mode: AuthMode = AuthMode.DELEGATED) -> AsyncIterator[tuple[Env, LogCapture]]:
    with LogCapture(logging.DEBUG) as logs:
        async with proxy_env(mode) as env:
            yield env, logs


# --- the finding: a bearer token that is not UTF-8 ---------------------------------------------


TOKENS = [
    pytest.param(b"\xff\xfe", id="not-utf8-prefix"),  # the finding
    pytest.param(b"\xff", id="one-bad-byte"),
    pytest.param(b"\x80", id="lone-continuation"),
    pytest.param(b"\xc0\xaf", id="overlong"),
    pytest.param(b"\xed\xa0\x80", id="utf8-encoded-surrogate"),
    pytest.param(b"\xf4\x90\x80\x80", id="beyond-u10ffff"),
    pytest.param("é".encode(), id="valid-utf8-not-ascii"),
    pytest.param(b"\xa0", id="latin1-nbsp"),
]


@pytest.mark.parametrize("mode", list(AuthMode))
@pytest.mark.parametrize("bad", TOKENS)
@pytest.mark.parametrize("where", ["before", "after"])
async def test_a_token_that_is_not_visible_ascii_is_a_401_and_never_logged(
    mode: AuthMode, bad: bytes, where: str
) -> None:
    secret = marker()
    token = bad + secret if where == "before" else secret + bad
    async with logged_env(mode) as (env, logs):
        answer = await exchange(env, request("GET", b"Authorization: Bearer " + token))
        assert (answer.status, answer.body) == (401, UNAUTHORIZED)
        assert "server" not in answer.headers
        assert env.auth.token_reviews == []  # nobody was asked about such a token
        assert env.vw_requests() == []
        judge(logs, since=0, secret=token)
        # the same server still serves a well-formed token
        ok = await exchange(env, request("GET", ALICE))
        assert ok.status == 200, ok


@pytest.mark.parametrize(
    "authorization",
    [
        pytest.param(b"B\xffearer sometoken", id="scheme-not-utf8"),
        pytest.param(b"Bearer\xffsometoken", id="separator-not-utf8"),
        pytest.param(b"Bearer some\xfftoken", id="inside"),
        pytest.param(b"Basic \xff\xfe", id="basic-not-utf8"),
        pytest.param(b"Bearer " + b"\xff" * 20000, id="long"),
    ],
)
async def test_a_malformed_authorization_field_is_a_401(authorization: bytes) -> None:
    async with logged_env() as (env, logs):
        answer = await exchange(env, request("GET", b"Authorization: " + authorization))
        assert (answer.status, answer.body) == (401, UNAUTHORIZED)
        assert env.auth.token_reviews == []
        judge(logs, since=0, secret=authorization)


# --- the class: every other field ---------------------------------------------------------------


@pytest.mark.parametrize("name", FIELDS)
@pytest.mark.parametrize(
    "bad", [pytest.param(b"\xff", id="not-utf8"), pytest.param("é".encode(), id="utf8")]
)
async def test_a_field_with_bytes_outside_visible_ascii_is_a_400_status(
    name: str, bad: bytes
) -> None:
    value = b"x" + bad + marker()
    async with logged_env() as (env, logs):
        for method in ("GET", "POST"):
            raw = request(method, ALICE, name.encode() + b": " + value, body=b"{}")
            answer = await exchange(env, raw)
            doc = answer.status_doc()
            assert (answer.status, doc["reason"]) == (400, "BadRequest"), doc
            assert doc["message"].startswith(f"the {name} header is not valid"), doc
            assert "server" not in answer.headers
        assert env.vw_requests() == []  # refused before anything went upstream
        assert env.auth.token_reviews == []
        judge(logs, since=0, secret=value)


@pytest.mark.parametrize(
    "field",
    [
        pytest.param(b"X-\xff: value", id="name-not-utf8"),
        pytest.param(b"X Y: value", id="name-with-space"),
        pytest.param(b"Accept: a\x00b", id="nul"),
        pytest.param(b"Accept: a\x7fb", id="del"),
        pytest.param(b"Accept: a\x1bb", id="escape"),
    ],
)
async def test_fields_the_parser_refuses_are_a_400_status_without_their_bytes(
    field: bytes,
) -> None:
    async with logged_env() as (env, logs):
        answer = await exchange(env, request("GET", ALICE, field))
        assert answer.status == 400, answer
        answer.status_doc()
        assert env.vw_requests() == []
        judge(logs, since=0, secret=field)


def test_a_certificate_name_that_is_not_printable_names_nobody() -> None:
    def cert(cn: str, *orgs: str) -> dict[str, object]:
        subject = [(("commonName", cn),), *((("organizationName", o),) for o in orgs)]
        return {"subject": tuple(tuple(rdn) for rdn in subject)}

    assert identity_from_peercert(cert("alice", "team")) is not None
    assert identity_from_peercert(cert("élise", "équipe")) is not None  # printable text
    for bad in (cert("alice\nbob"), cert("alice\udcff"), cert("alice", "x\x00"), cert("\x1b[2J")):
        assert identity_from_peercert(bad) is None, bad


# --- property: random bytes in every field the proxy reads ---------------------------------------

NAMES = st.sampled_from(["Authorization", *FIELDS])
# Anything but CR and LF, which end a field (the raw-socket attacks of test_hostile_clients
# cover broken framing).
VALUES = st.binary(max_size=64).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))


def expected(name: str, value: bytes) -> set[int]:
    """The statuses the proxy may answer a request with this one extra field."""
    if any((b < 0x20 and b != 0x09) or b == 0x7F for b in value):
        return {400}  # control characters: the HTTP parser refuses the request (a Status)
    invalid = any(b not in VALID_VALUE for b in value)
    if name == "Authorization":
        return {401}  # never alice's token: a credential nobody has
    if invalid:
        return {400}
    return set(range(200, 500)) - {401}  # with alice's token: anything but a refusal of it


@pytest.mark.parametrize("mode", list(AuthMode))
async def test_random_header_bytes_are_answered_with_a_status_and_never_logged(
    mode: AuthMode,
) -> None:
    loop = asyncio.get_running_loop()
    failures: list[str] = []
    async with logged_env(mode) as (env, logs):

        async def one(name: str, value: bytes) -> None:
            secret = marker()
            value = (b"Bearer " + secret + value) if name == "Authorization" else secret + value
            fields = [name.encode() + b": " + value]
            if name != "Authorization":
                fields.insert(0, ALICE)
            since = len(logs.records)
            answer = await exchange(env, request("GET", *fields))
            allowed = expected(name, value)
            problem = None
            if answer.status not in allowed:
                problem = f"status {answer.status}, expected one of {sorted(allowed)[:5]}"
            elif answer.status >= 300:
                problem = status_problem(
                    status=answer.status,
                    content_type=answer.headers.get("content-type", ""),
                    body=answer.body,
                    method="GET",
                )
            if "server" in answer.headers:
                problem = f"Server: {answer.headers['server']}"
            try:
                judge(logs, since=since, secret=value)
            except AssertionError as e:
                problem = str(e)
            if problem:
                failures.append(f"{name}: {value!r}: {problem}")

        @bounded_settings(EXAMPLES)
        @given(NAMES, VALUES)
        @example("Authorization", b"\xff\xfe")
        @example("Accept", b"application/json\xff")
        @example("Content-Type", b"\xc3\xa9")
        @example("User-Agent", b"\x80")
        def property_(name: str, value: bytes) -> None:
            asyncio.run_coroutine_threadsafe(one(name, value), loop).result(timeout=30)

        # hypothesis drives the examples from a worker thread; the server runs on this loop.
        await asyncio.to_thread(property_)
    assert not failures, f"{len(failures)} failure(s):\n" + "\n".join(failures[:20])
