"""``metav1.Status`` failures exactly as the apiserver (and kcp's virtual workspace) writes them.

A filtering proxy forwards or rewrites upstream errors, and clients branch on ``code``/``reason``,
so the fake upstream's failures must be byte-compatible with the real ones: Go struct field order,
Go's ``omitempty`` rules (a present-but-empty ``details`` is ``{}``; kcp's forwarding registry
omits ``reason`` on its own 400s) and the exact messages of ``k8s.io/apimachinery/pkg/api/errors``.
Each helper names the apiserver constructor it mirrors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec

from vwserver.k8s.status import not_found

JSON = dict[str, Any]
_encode = msgspec.json.Encoder().encode


class FakeApiError(Exception):
    """Ends a request with a ``metav1.Status`` body; also raised by the Python store API."""

    def __init__(self, code: int, body: bytes, message: str, *, retry_after: int | None = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.body = body
        self.message = message
        self.retry_after = retry_after


def status_error(
    code: int,
    reason: str | None,
    message: str,
    *,
    details: JSON | None = None,
    continue_token: str = "",
    retry_after: int | None = None,
) -> FakeApiError:
    """A failure Status in ``metav1.Status`` field order, with Go's omitempty rules.

    ``reason=None`` omits the reason, as kcp's forwarding registry does for its 400s; an empty
    ``details`` dict is kept (a non-nil ``*StatusDetails`` encodes as ``{}``).
    """
    body: JSON = {"kind": "Status", "apiVersion": "v1", "metadata": {}}
    if continue_token:
        body["metadata"] = {"continue": continue_token}
    body["status"] = "Failure"
    if message:
        body["message"] = message
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = details
    body["code"] = code
    return FakeApiError(code, _encode(body) + b"\n", message, retry_after=retry_after)


def _details(
    *, name: str = "", group: str = "", kind: str = "", causes: list[JSON] | None = None
) -> JSON:
    # StatusDetails field order: name, group, kind, uid, causes, retryAfterSeconds.
    out: JSON = {}
    if name:
        out["name"] = name
    if group:
        out["group"] = group
    if kind:
        out["kind"] = kind
    if causes:
        out["causes"] = causes
    return out


def bad_request(message: str) -> FakeApiError:
    return status_error(400, "BadRequest", message)


def not_found_error(group: str, resource: str, name: str) -> FakeApiError:
    """errors.NewNotFound, via vwserver's own byte-compatible :func:`not_found`."""
    qualified = f"{resource}.{group}" if group else resource
    return FakeApiError(
        404, not_found(resource=resource, group=group, name=name), f'{qualified} "{name}" not found'
    )


def invalid(
    group: str, kind: str, name: str, causes: Sequence[tuple[str, str, str]]
) -> FakeApiError:
    """``errors.NewInvalid``; causes are ``(type, field, body)`` like ``field.Error``."""
    rendered = [f"{fld}: {body}" for _, fld, body in causes]
    joined = rendered[0] if len(rendered) == 1 else "[" + ", ".join(rendered) + "]"
    qualified = f"{kind}.{group}" if group else kind
    return status_error(
        422,
        "Invalid",
        f'{qualified} "{name}" is invalid: {joined}',
        details=_details(
            name=name,
            group=group,
            kind=kind,
            causes=[{"reason": t, "message": b, "field": f} for t, f, b in causes],
        ),
    )


def conflict(group: str, resource: str, name: str, why: str) -> FakeApiError:
    qualified = f"{resource}.{group}" if group else resource
    return status_error(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified} "{name}": {why}',
        details=_details(name=name, group=group, kind=resource),
    )


def resource_expired(message: str, *, continue_token: str = "") -> FakeApiError:
    return status_error(410, "Expired", message, continue_token=continue_token)


def too_large_resource_version(requested: int, current: int) -> FakeApiError:
    # storage.NewTooLargeResourceVersionError: a 504 Timeout with a ResourceVersionTooLarge cause.
    details: JSON = {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }
    return status_error(
        504,
        "Timeout",
        f"Timeout: Too large resource version: {requested}, current: {current}",
        details=details,
        retry_after=1,
    )


RV_SET_ON_CREATE: Final = "resourceVersion should not be set on objects to be created"

# OptimisticLockErrorMsg in k8s.io/apiserver/pkg/registry/generic/registry/store.go
OPTIMISTIC_LOCK_MESSAGE: Final = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def already_exists(group: str, resource: str, name: str) -> FakeApiError:
    qualified = f"{resource}.{group}" if group else resource
    return status_error(
        409,
        "AlreadyExists",
        f'{qualified} "{name}" already exists',
        details=_details(name=name, group=group, kind=resource),
    )
