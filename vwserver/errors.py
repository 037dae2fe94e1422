"""The one exception hierarchy of vwserver.

Every error vwserver raises on purpose derives from :class:`VWServerError`. Errors that end a
request carry what a Kubernetes client expects on the wire — an HTTP code and a ``reason`` of
``metav1.Status`` — so the HTTP layer turns any of them into a ``kind: Status`` body in one place
(:func:`vwserver.k8s.status.from_error`) instead of each handler inventing its own.

::

    VWServerError
    ├── ConfigError            bad configuration file or CLI input (never reaches the wire)
    ├── RequestError           anything that ends one HTTP request with a Status
    │   ├── SelectorError      400  a label selector that does not parse or validate
    │   ├── BadRequest         400  malformed path, query or body
    │   ├── Unauthorized       401  no credentials, or ones kcp does not accept (vwserver.auth)
    │   ├── Forbidden          403  a verb the endpoint does not allow on that resource, or a
    │   │                           caller without permission on the slice (vwserver.auth)
    │   ├── NotFound           404  unknown slice, or an object outside the slice
    │   ├── MethodNotAllowed   405  e.g. writes on the ``clusters/*`` wildcard
    │   ├── NotAcceptable      406  an Accept header naming no representation the proxy serves
    │   ├── Conflict           409  the object changed between check and write, or the
    │   │   │                       client's own precondition does not hold
    │   │   └── LeavingSlice        a write other than releasing the slice's own finalizers
    │   │                           on an object that is leaving the slice (vwserver.holds)
    │   ├── Expired            410  a resourceVersion or continue token older than the watch
    │   │                           cache's window (the apiserver's "too old resource version")
    │   ├── RequestEntityTooLarge 413  a request body over the limit
    │   ├── Invalid            422  a write would put the object outside the slice
    │   │   ├── HeldFinalizer       a write would remove a finalizer of a slice the object is
    │   │   │                       leaving (held for that slice's release), or
    │   │   │                       write an annotation only vwserver writes (vwserver.holds)
    │   │   └── GCFinalizer         a write would add or remove a finalizer of kcp's garbage
    │   │                           collector (``orphan``, ``foregroundDeletion``)
    │   ├── UpstreamUnavailable 503 upstream unreachable / not ready (sends Retry-After)
    │   │   └── UpstreamUnreachable  no answer from the upstream (counted as such in metrics)
    │   └── BadGateway         502  upstream answered with something we cannot use
    │       └── EventTooLarge       a watch event longer than vwserver.k8s.framing allows
    ├── ApiError               an API server refused a request of vwserver's own client
    │   │                      (vwserver.k8s.client): code, reason and message of its Status.
    │   │                      Built only by :func:`api_error`, the class chosen by the code:
    │   ├── ApiUnauthorized    401
    │   ├── ApiForbidden       403
    │   ├── ApiNotFound        404
    │   ├── ApiConflict        409  a stale resourceVersion, or the object exists already
    │   ├── ApiGone            410  the resourceVersion (or continue token) expired: relist
    │   ├── ApiInvalid         422
    │   ├── ApiTooManyRequests 429
    │   └── ApiServerError     5xx (also: an answer that cannot be decoded, as 502)
    ├── SyncError              one step of the syncer (``vwserver sync``) failed; retried, and
    │   │                      reported on the kcp object as a condition, never as a Status
    │   ├── OwnershipError     a downstream object or namespace exists but is not this syncer's
    │   └── ObjectTooLarge     an upstream object is over the syncer's per-object size limit
    └── DecommissionRefused    ``vwserver sync --decommission`` will not start: a replica of the
                               syncer still holds its Lease (or that cannot be checked)

Request errors are what vwserver *answers*; API errors are what it is *answered* (by kcp or a
downstream cluster) on its own calls: the two subtrees never mix, and an ``ApiError`` reaches a
client only translated by whoever caught it. Branch on the class (``except ApiNotFound``), never
on a numeric code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar


class VWServerError(Exception):
    """Base of every error vwserver raises deliberately."""


class ConfigError(VWServerError):
    """A configuration file or CLI argument is wrong; the message names the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class RequestError(VWServerError):
    """An error that ends one request with a Kubernetes ``Status`` of the class's code/reason."""

    code: ClassVar[int] = 500
    reason: ClassVar[str] = "InternalError"

    def __init__(
        self,
        message: str,
        *,
        details: dict[str, object] | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        self.retry_after = retry_after


class SelectorError(RequestError):
    """A label selector failed to parse or validate. As a request error it is a 400."""

    code = 400
    reason = "BadRequest"


class BadRequest(RequestError):
    code = 400
    reason = "BadRequest"


class Unauthorized(RequestError):
    """No credentials, or credentials kcp does not accept. The apiserver answers these with the
    bare message ``Unauthorized`` and no hint why (a token's validity is not disclosed)."""

    code = 401
    reason = "Unauthorized"


class Forbidden(RequestError):
    code = 403
    reason = "Forbidden"


class NotFound(RequestError):
    code = 404
    reason = "NotFound"


class MethodNotAllowed(RequestError):
    code = 405
    reason = "MethodNotAllowed"


class NotAcceptable(RequestError):
    code = 406
    reason = "NotAcceptable"


class Expired(RequestError):
    code = 410
    reason = "Expired"


class RequestEntityTooLarge(RequestError):
    code = 413
    reason = "RequestEntityTooLarge"


class Conflict(RequestError):
    code = 409
    reason = "Conflict"


class LeavingSlice(Conflict):
    """A write, through a slice, to an object that is leaving it: only the slice's own
    finalizers may still be removed."""


class Invalid(RequestError):
    code = 422
    reason = "Invalid"


class HeldFinalizer(Invalid):
    """A write through one slice would remove a finalizer another slice added and holds while
    the object is leaving that slice (:func:`vwserver.holds.guards`)."""


class GCFinalizer(Invalid):
    """A write through a slice would add or remove ``orphan`` or ``foregroundDeletion``, the
    finalizers of kcp's garbage collector (:func:`vwserver.holds.check_gc_finalizers`)."""


class BadGateway(RequestError):
    code = 502
    reason = "InternalError"


class UpstreamUnavailable(RequestError):
    code = 503
    reason = "ServiceUnavailable"


class UpstreamUnreachable(UpstreamUnavailable):
    """The upstream did not answer (connection failed, timed out or broke). A 503 like a slice
    that is not ready, but the upstream's fault: ``vwserver_upstream_errors_total`` counts it."""


class WatchSilent(UpstreamUnavailable):
    """A watch stream that had answered sent nothing (not even a bookmark) for its silence
    limit: the connection may be dead (a silent network drop), or the resource merely quiet on a
    server that sends no bookmarks. Either way the watch is started again; its answer tells."""


class EventTooLarge(BadGateway):
    """An upstream watch line grew past the bound of :mod:`vwserver.k8s.framing` without ending:
    no Kubernetes watch event is that long, so the stream is unusable."""


class ApiError(VWServerError):
    """A non-2xx answer of an API server to vwserver's own client, with its Status' fields.

    Construct it with :func:`api_error`, which picks the subclass for the code.
    """

    def __init__(self, *, code: int, reason: str = "", message: str = "", url: str = "") -> None:
        super().__init__(f"{code} {reason or 'error'} from {url}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.url = url

    @property
    def transient(self) -> bool:
        """Worth retrying later (server-side trouble, throttling, timeouts)."""
        return self.code in (408, 429) or self.code >= 500


class ApiUnauthorized(ApiError):
    """401: the credentials are not accepted."""


class ApiForbidden(ApiError):
    """403: the identity may not do this (RBAC, or kcp's workspace and binding authorizers)."""


class ApiNotFound(ApiError):
    """404: no such object (or workspace)."""


class ApiConflict(ApiError):
    """409: the write's resourceVersion is stale, or the object to create exists already."""


class ApiGone(ApiError):
    """410: the resourceVersion (or continue token) is older than the server's history."""


class ApiInvalid(ApiError):
    """422: the object was refused by validation or admission."""


class ApiTooManyRequests(ApiError):
    """429: throttled; retry later."""


class ApiServerError(ApiError):
    """5xx: the server failed, or its answer could not be used (then 502)."""


_API_ERRORS: dict[int, type[ApiError]] = {
    401: ApiUnauthorized,
    403: ApiForbidden,
    404: ApiNotFound,
    409: ApiConflict,
    410: ApiGone,
    422: ApiInvalid,
    429: ApiTooManyRequests,
}


def api_error(
    code: int, status: Mapping[str, Any] | None = None, *, url: str = "", body: bytes = b""
) -> ApiError:
    """The :class:`ApiError` for an HTTP ``code`` and the ``metav1.Status`` that came with it
    (a decoded body or a watch ``ERROR`` event's object); ``body``: the raw answer, whose start
    is the message when there is no Status."""
    status = status or {}
    cls = _API_ERRORS.get(code) or (ApiServerError if code >= 500 else ApiError)
    message = status.get("message")
    return cls(
        code=code,
        reason=str(status.get("reason") or ""),
        message=str(message) if message is not None else body[:200].decode(errors="replace"),
        url=url,
    )


class SyncError(VWServerError):
    """One step of the syncer failed; the controller retries it with backoff and reports it."""

    reason: ClassVar[str] = "SyncFailed"
    #: No retry can fix it until the object changes: retried on the long backoff only.
    permanent: ClassVar[bool] = False


class OwnershipError(SyncError):
    """A downstream object or namespace exists but belongs to someone else: never touched."""

    reason = "NotOwned"


class ObjectTooLarge(SyncError):
    """An upstream object is larger than the syncer's per-object limit: never held in memory
    beyond its metadata, never copied, reported until the consumer shrinks it."""

    reason = "ObjectTooLarge"
    permanent = True


class InvalidRelated(SyncError):
    """A related object cannot be copied as configured (its copy's name, a syncer's copy named
    as a source): retrying cannot help until it or the config changes."""

    reason = "Invalid"
    permanent = True


class DecommissionRefused(VWServerError):
    """``vwserver sync --decommission`` refuses to start: a replica of the syncer still holds
    its Lease (it would put every removed finalizer back), or the Lease cannot be read."""
