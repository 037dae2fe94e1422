"""Reviewed differences between a slice and kcp's own virtual workspace with the slice's
selector. Each entry is a case id of the harness and the reason the difference is right; the
harness fails when a listed case stops differing (so the list cannot go stale).
"""

from __future__ import annotations

ALLOWED: dict[str, str] = {
    "get-wildcard-object": (
        "kcp answers a GET of one object on clusters/* with 404 'the server could not find the "
        "requested resource'; a client that treats NotFound as 'gone' would act on an object "
        "that exists. The slice answers 405 MethodNotAllowed naming the rule (address one "
        "logical cluster), which no client mistakes for a deletion."
    ),
}
