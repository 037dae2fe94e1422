"""Header bytes against real kcp (issue #22, findings 9 and 13): vwserver answers a bearer token
that is not UTF-8 with exactly kcp's own ``401`` body, asks kcp nothing about it, logs nothing
of it, and names no server software — over raw TLS sockets, so that the bytes arrive as written.

vwserver is the authenticating proxy of :mod:`tests.e2e.test_auth_kcp` (``secured``: a real
Guard whose TokenReviews and SubjectAccessReviews go to kcp).
"""

from __future__ import annotations

import logging
import ssl
import uuid
from urllib.parse import urlsplit

import pytest

from tests.e2e.test_auth_kcp import SLICE_A, Secured, secured  # noqa: F401 (the fixture)
from tests.security.support import LogCapture
from tests.security.test_header_bytes import UNAUTHORIZED, judge
from tests.support.raw_http import Answer, answer_to

pytestmark = pytest.mark.e2e

TIMEOUT = 30.0


async def exchange(url: str, ctx: ssl.SSLContext, *fields: bytes) -> Answer:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    head = [f"GET {parts.path} HTTP/1.1".encode(), f"Host: {parts.netloc}".encode(), *fields]
    raw = b"\r\n".join([*head, b"Connection: close", b"", b""])
    return await answer_to(parts.hostname, parts.port, raw, timeout=TIMEOUT, tls=ctx)


@pytest.mark.parametrize(
    "bad", [b"\xff\xfe", b"\x80", "é".encode()], ids=["not-utf8", "continuation", "utf8"]
)
async def test_a_token_that_is_not_ascii_gets_kcps_own_401_and_is_never_logged(
    secured: Secured,  # noqa: F811
    bad: bytes,
) -> None:
    world, kcp = secured.world, secured.kcp
    token = bad + f"mark{uuid.uuid4().hex}".encode()
    field = b"Authorization: Bearer " + token
    # kcp itself: the apiserver's bare Unauthorized
    direct = await exchange(
        f"{world.provider.url}/api", kcp.ssl_context(), field, b"Accept: application/json"
    )
    assert direct.status == 401, direct
    url = secured.url(SLICE_A, "*", "/apis/example.io/v1alpha1/widgets")
    with LogCapture(logging.DEBUG) as logs:
        proxied = await exchange(url, secured.ssl(), field)
    assert (proxied.status, proxied.body) == (401, direct.body) == (401, UNAUTHORIZED)
    assert "server" not in proxied.headers
    judge(logs, since=0, secret=token)
    # a good token with a malformed field beside it: a 400 naming the field, kcp never asked
    alice = f"Authorization: Bearer {world.tokens['alice']}".encode()
    with LogCapture(logging.DEBUG) as logs:
        refused = await exchange(url, secured.ssl(), alice, b"Impersonate-User: " + token)
        listed = await exchange(url, secured.ssl(), alice)
    assert refused.status == 400 and "Impersonate-User" in refused.status_doc()["message"]
    assert "server" not in refused.headers
    judge(logs, since=0, secret=token)
    assert listed.status == 200, listed
