"""The gate in front of every slice: authenticate the caller, then authorize the slice and verb.

The proxy calls :meth:`Guard.admit` once per request, after the path is parsed and the request is
classified (it needs the verb) and *before* the slice is looked up: a caller who may not use a
slice learns nothing about it, not even whether it exists or is ready (kube-apiserver likewise
answers 403, not 404, for objects one may not read). Nothing is sent upstream before it returns.

Authentication, in the apiserver's order: a verified client certificate first, then a bearer
token (TokenReview). No credentials at all is a 401, like a bad token — vwserver has no anonymous
access. The 401 carries the apiserver's bare ``Unauthorized`` Status and, like kcp (checked
against v0.32), no ``WWW-Authenticate`` header. A review kcp refuses in the slice's workspace
is such a 401 too (no existence oracle, see :mod:`~vwserver.auth.tokens`), unless vwserver
serves a ready slice in that workspace (``serves_cluster``): it exists, so the refusal is no
verdict on the token, and the answer is a 503 the client retries.

Modes (``auth.mode``):

``delegated`` (default)
    vwserver authenticates and authorizes the caller, then calls kcp with *its own* identity,
    which needs ``apiexports/content`` on the served exports. The caller needs only the slice
    permission; it can use exactly the slices it was granted and nothing else of the export.
``passthrough``
    the same checks, then the caller's own bearer token goes upstream, so kcp authorizes the
    caller on the export as well (it needs ``apiexports/content`` too, and vwserver's identity
    only needs to create reviews). Client certificates cannot be forwarded, so this mode needs
    a bearer token.

In both modes the client's ``Authorization`` header is never forwarded as it came (the upstream
client sends an allow-list of headers), and a request with ``Impersonate-*`` or ``X-Remote-*``
headers never gets here: the proxy refuses it first (403,
:func:`vwserver.proxy.request_headers.refuse_impersonation`), since the guard authenticates the
caller, not the identity those headers ask for.

The proxy takes a :class:`Gate` and has no default: :class:`Guard` is the real one, and
:class:`NoAuth` — every caller may use every slice — is a type of its own that cannot be made by
accident: its constructor demands the literal :data:`NO_AUTH_ACKNOWLEDGEMENT`. Only tests (and
benchmarks of the proxy itself) construct it; ``vwserver serve`` always builds a :class:`Guard`,
``insecureServing`` included (plain HTTP is not "no authentication").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum
from typing import Final, Literal, Protocol

from aiohttp import web

from vwserver.auth.access import CONTENT_GROUP, CONTENT_RESOURCE, AccessReviewer
from vwserver.auth.certs import client_certificate_identity
from vwserver.auth.identity import Identity
from vwserver.auth.reviews import RETRY_AFTER_SECONDS
from vwserver.auth.tokens import TokenReviewer, well_formed
from vwserver.errors import Forbidden, Unauthorized, UpstreamUnavailable

log = logging.getLogger(__name__)


class AuthMode(StrEnum):
    DELEGATED = "delegated"
    PASSTHROUGH = "passthrough"


class Gate(Protocol):
    """What the proxy asks, in this order, before anything of a slice request goes upstream."""

    @property
    def mode(self) -> AuthMode:
        """Whose identity the upstream sees (delegated: vwserver's)."""
        ...

    async def authenticate(self, request: web.Request, *, cluster: str) -> Identity:
        """Who the caller is, or :class:`Unauthorized`."""
        ...

    async def authorize(
        self, identity: Identity, *, slice_cluster: str, slice_name: str, verb: str
    ) -> None:
        """Nothing, or :class:`Forbidden`."""
        ...

    def upstream_token(self, request: web.Request) -> str | None:
        """The caller's token to send upstream instead of vwserver's, or None."""
        ...


def bearer_token(request: web.Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (the first such header, scheme
    case-insensitive, as the apiserver's bearer-token authenticator reads it), or None — also
    for a token that is not :func:`~vwserver.auth.tokens.well_formed` (bytes that are not
    visible ASCII: the caller is then unauthenticated, a 401, and the token goes nowhere)."""
    scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not well_formed(token):
        return None
    return token


class Guard:
    """Admits a request to a slice or raises :class:`Unauthorized` / :class:`Forbidden`."""

    def __init__(
        self,
        *,
        tokens: TokenReviewer,
        access: AccessReviewer,
        mode: AuthMode = AuthMode.DELEGATED,
        serves_cluster: Callable[[str], bool] | None = None,
    ) -> None:
        self._tokens = tokens
        self._access = access
        self.mode = mode
        self._serves_cluster = serves_cluster or (lambda cluster: False)
        """Whether a ready slice of a logical cluster is served (the route table's answer)."""

    async def admit(
        self, request: web.Request, *, slice_cluster: str, slice_name: str, verb: str
    ) -> Identity:
        """The caller's identity, if it may ``verb`` the content of the slice."""
        identity = await self.authenticate(request, cluster=slice_cluster)
        await self.authorize(
            identity, slice_cluster=slice_cluster, slice_name=slice_name, verb=verb
        )
        return identity

    async def authorize(
        self, identity: Identity, *, slice_cluster: str, slice_name: str, verb: str
    ) -> None:
        """Raise :class:`Forbidden` unless ``identity`` may ``verb`` the content of the slice."""
        decision = await self._access.review(
            identity, cluster=slice_cluster, slice_name=slice_name, verb=verb
        )
        if not decision.allowed:
            log.debug(
                "denied %s on slice %s/%s to %r: %s",
                verb,
                slice_cluster,
                slice_name,
                identity.user,
                decision.reason,
            )
            # The apiserver's wording for a denied subresource, plus the workspace.
            raise Forbidden(
                f'{CONTENT_RESOURCE}.{CONTENT_GROUP} "{slice_name}" is forbidden: '
                f'User "{identity.user}" cannot {verb} resource "{CONTENT_RESOURCE}/content" '
                f'in API group "{CONTENT_GROUP}" in logical cluster "{slice_cluster}"'
                + (f": {decision.reason}" if decision.reason else ""),
                details={"name": slice_name, "group": CONTENT_GROUP, "kind": CONTENT_RESOURCE},
            )

    async def authenticate(self, request: web.Request, *, cluster: str) -> Identity:
        """Who the caller is; ``cluster`` is where a token is reviewed (the slice's)."""
        token = bearer_token(request)
        if self.mode is AuthMode.DELEGATED:
            identity = client_certificate_identity(request)
            if identity is not None:
                return identity
        if token is None:
            raise Unauthorized("Unauthorized")
        result = await self._tokens.authenticate(token, cluster=cluster)
        if result.identity is None:
            if result.refused and self._serves_cluster(cluster):
                # A served slice's workspace exists, so kcp refusing to review there is kcp's
                # trouble (it refuses reviews for a few seconds while it restarts; or vwserver
                # lacks its reviewer RBAC there, logged): no verdict on the token, so no 401
                # that would make a client drop a valid token. Elsewhere a refusal stays a 401:
                # an unauthenticated caller must not learn which workspaces exist.
                raise UpstreamUnavailable(
                    "cannot check credentials now: kcp refused to review them",
                    retry_after=RETRY_AFTER_SECONDS,
                )
            log.debug("bearer token rejected by kcp: %s", result.error)
            raise Unauthorized("Unauthorized")
        return result.identity

    def upstream_token(self, request: web.Request) -> str | None:
        """The token the upstream request must carry instead of vwserver's (passthrough mode);
        None in delegated mode."""
        if self.mode is AuthMode.PASSTHROUGH:
            return bearer_token(request)
        return None


NO_AUTH_ACKNOWLEDGEMENT: Final = "no authentication: every caller may use every slice"
"""What :class:`NoAuth` must be given, word for word."""

NO_AUTH_USER = "(no authentication)"
"""The user name :class:`NoAuth` reports (request logs show it)."""


class NoAuth:
    """Admits every request to every slice without asking anyone: for tests of the proxy.

    Upstream requests carry vwserver's own identity (delegated). Constructing it takes the
    acknowledgement, so that "no authentication" is never a default or a forgotten argument::

        NoAuth(acknowledge=NO_AUTH_ACKNOWLEDGEMENT)
    """

    def __init__(
        self, *, acknowledge: Literal["no authentication: every caller may use every slice"]
    ) -> None:
        if acknowledge != NO_AUTH_ACKNOWLEDGEMENT:
            raise ValueError(f"NoAuth needs acknowledge={NO_AUTH_ACKNOWLEDGEMENT!r}")
        self._identity = Identity(user=NO_AUTH_USER)

    @property
    def mode(self) -> AuthMode:
        return AuthMode.DELEGATED

    async def authenticate(self, request: web.Request, *, cluster: str) -> Identity:
        return self._identity

    async def authorize(
        self, identity: Identity, *, slice_cluster: str, slice_name: str, verb: str
    ) -> None:
        return None

    def upstream_token(self, request: web.Request) -> str | None:
        return None
