"""The client's request header fields, checked by their syntax before the proxy reads any — pure.

aiohttp's parser refuses control characters in a field but hands every other byte over, decoded
as UTF-8 with ``surrogateescape``: a byte that is not UTF-8 becomes a lone surrogate
(``\\xff`` → ``"\\udcff"``), which no encoder takes (an ``.encode()`` raises with the character in
its message, once a 500 with a token byte in the log), and obs-text that *is* UTF-8 still means
other bytes once re-encoded as latin-1 on the way upstream. The proxy reads ``Accept``,
``Content-Type``, ``Accept-Encoding`` and ``Authorization``, sends ``User-Agent`` on, and must
decide about the rest (``Impersonate-*``, ``X-Remote-*``: never forwarded): so it requires of
*every* field what RFC 9110 §5.5 allows without the obsolete part — visible ASCII, spaces and
tabs (real clients send nothing else; kcp itself would accept obs-text) — and refuses a request
with any other field value with a 400 Status that names the field, never its value.

``Authorization`` is the guard's: a malformed one is no credential, a 401 like a token kcp does
not know (:func:`vwserver.auth.guard.bearer_token`), so that a client learns the same whatever
it got wrong about its token.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from vwserver.errors import BadRequest

# RFC 9110 §5.5 field-value without obs-text: VCHAR, SP and HTAB.
_VALUE = re.compile(r"[\t\x20-\x7e]*")
# RFC 9110 §5.6.2 token (aiohttp's parser refuses other names; checked again because the name
# goes into the answer).
_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
GUARDED = "authorization"
"""The field the guard judges (401, not 400)."""


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
