"""The client's request header fields, checked by their syntax before the proxy reads any — pure.

aiohttp's parser refuses control characters in a field but hands every other byte over, decoded
as UTF-8 with ``surrogateescape``: a byte that is not UTF-8 becomes a lone surrogate
(``\\xff`` → ``"\\udcff"``), which no encoder takes (an ``.encode()`` raises with the character in
its message, once a 500 with a token byte in the log), and obs-text that *is* UTF-8 still means
other bytes once re-encoded as latin-1 on the way upstream. The proxy reads ``Accept``,
``Content-Type``, ``Accept-Encoding`` and ``Authorization``, sends ``User-Agent`` on, and must
decide about the rest (``Impersonate-*``, ``X-Remote-*``: refused, see below): so it requires of
*every* field what RFC 9110 §5.5 allows without the obsolete part — visible ASCII, spaces and
tabs (real clients send nothing else; kcp itself would accept obs-text) — and refuses a request
with any other field value with a 400 Status that names the field, never its value.

``Authorization`` is the guard's: a malformed one is no credential, a 401 like a token kcp does
not know (:func:`vwserver.auth.guard.bearer_token`), so that a client learns the same whatever
it got wrong about its token.

A request that asks to be served as someone else is refused (:func:`refuse_impersonation`):
``Impersonate-User``, ``-Group``, ``-Uid``, ``-Extra-<key>`` (``kubectl --as``, ``--as-group``,
``--as-uid``; the apiserver acts as that user if the caller may impersonate) and an
authenticating proxy's ``X-Remote-User``, ``-Group``, ``-Extra-<key>`` (kcp's front-proxy and
the apiserver's request-header authenticator take them as the identity). vwserver answers for
the authenticated caller only: it cannot pass another identity on (kcp sees vwserver, or the
caller's own token), and dropping the fields — what it once did — answered ``kubectl --as=x``
as the caller himself, a request other than the one sent. The refusal is a 403 decided by the
request's field names alone, before authentication: it says nothing about the caller, the
slice or kcp.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from vwserver.errors import BadRequest, Forbidden

# RFC 9110 §5.5 field-value without obs-text: VCHAR, SP and HTAB.
_VALUE = re.compile(r"[\t\x20-\x7e]*")
# RFC 9110 §5.6.2 token (aiohttp's parser refuses other names; checked again because the name
# goes into the answer).
_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
GUARDED = "authorization"
"""The field the guard judges (401, not 400)."""
IMPERSONATION_PREFIXES = ("impersonate-", "x-remote-")
"""Field names (lower case) that ask for another identity: refused."""


def check(fields: Iterable[tuple[str, str]]) -> None:
    """Raise :class:`BadRequest` for the first field whose name or value is not well-formed."""
    for name, value in fields:
        if not _NAME.fullmatch(name):
            raise BadRequest("a request header field name is not valid")
        if name.lower() != GUARDED and not _VALUE.fullmatch(value):
            raise BadRequest(
                f"the {name} header is not valid: only visible ASCII characters, spaces and "
                "tabs are accepted"
            )


def refuse_impersonation(names: Iterable[str]) -> None:
    """Raise :class:`Forbidden` for the first field name that asks for another identity
    (:data:`IMPERSONATION_PREFIXES`, any case; the name is in the message, never the value)."""
    for name in names:
        if name.lower().startswith(IMPERSONATION_PREFIXES):
            raise Forbidden(
                f"impersonation is not supported through a slice: the {name} header is refused; "
                "send the request as the user you are"
            )
