"""Kubernetes ``metav1.Status`` bodies, byte-compatible with what the Go apiserver writes.

Clients (kubectl, client-go) show ``message`` and branch on ``reason`` and ``code``; kubectl also
prints ``details``. Keeping our own Status bodies in the apiserver's exact shape — key order,
omitted empty fields, trailing newline — matters for one more reason: a GET of an object outside
the slice must be indistinguishable from a GET of a missing object (otherwise the answer would
tell the caller that an object outside its slice exists), so the proxy answers *both* with
:func:`not_found`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from vwserver.errors import RequestError

_encoder = msgspec.json.Encoder()


def status_body(
    *,
    code: int,
    reason: str,
    message: str,
    details: dict[str, Any] | None = None,
) -> bytes:
    """Encode a failure Status like ``k8s.io/apimachinery``'s JSON serializer does."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details:
        body["details"] = details
    body["code"] = code
    return _encoder.encode(body) + b"\n"


def not_found(*, resource: str, group: str, name: str) -> bytes:
    """The apiserver's NotFound for one object, e.g. ``widgets.example.io "w1" not found``."""
    qualified = f"{resource}.{group}" if group else resource
    return status_body(
        code=404,
        reason="NotFound",
        message=f'{qualified} "{name}" not found',
        details={"name": name, "group": group, "kind": resource}
        if group
        else {
            "name": name,
            "kind": resource,
        },
    )


def from_error(error: RequestError) -> bytes:
    """The Status body for a :class:`~vwserver.errors.RequestError`."""
    details = dict(error.details or {})
    if error.retry_after is not None:
        details["retryAfterSeconds"] = error.retry_after
    return status_body(
        code=error.code, reason=error.reason, message=error.message, details=details or None
    )
