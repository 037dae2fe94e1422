"""Bearer-token authentication by kcp's TokenReview API, cached.

vwserver has no token database: a caller presents the token it uses with kcp, and kcp says whose
it is. Verified against kcp v0.32: a TokenReview answers the same in any workspace for static
token-file users and for service-account tokens (which carry their workspace as a scope in
``extra``). vwserver sends it to the *slice's* logical cluster anyway, for two reasons: vwserver
needs permissions there already (the SubjectAccessReview goes there), so no extra workspace has
to grant it ``tokenreviews/create``; and should a kcp authenticate per workspace, the slice's
workspace is where the caller asks to be let in. The cache key therefore includes the cluster.

On a sharded kcp the review goes through the front-proxy (vwserver's kcp client), which routes
``/clusters/<slice cluster>`` to the shard that holds the slice's workspace. Verified on kcp
v0.32.3 (tests/shards/test_testbed_shards.py): a service-account token of a workspace on another
shard is authenticated there too, as the same user, with its home cluster in ``extra``
(``authentication.kcp.io/cluster-name``, scope ``cluster:<home>``) — the shards share the
service-account signing key; a static token-file user is known to every shard given the file.

A TokenReview kcp refuses *because of the workspace* (403: vwserver may not review there, or the
workspace does not exist; 404) is a rejected token: 401, like an invalid token, and cached the
same way (but for at most :data:`REFUSAL_TTL`). Otherwise a bogus token would tell an
unauthenticated caller which slice clusters exist (502 for a missing workspace, 401 for a real
one). The result says it was such a refusal (:attr:`TokenResult.refused`): where vwserver
serves a slice the workspace exists, and there the refusal is kcp's trouble, not the token's
(see :class:`~vwserver.auth.guard.Guard`). kcp's refusal is still logged (by
:func:`~vwserver.auth.reviews.post_review`), so a workspace missing vwserver's reviewer RBAC
shows in the log; kcp unreachable or overloaded stays a 503, and any other refusal a 502:
neither depends on the workspace.

A token is a run of visible ASCII characters (``0x21``-``0x7e``), :func:`well_formed`: every
token kcp issues or reads from a token file in practice is (JWTs, bootstrap and static tokens),
and only these mean the same bytes everywhere: aiohttp hands header bytes over decoded as UTF-8
with ``surrogateescape``, a TokenReview carries the token in JSON (which has no room for bytes
that are not UTF-8: they would turn into U+FFFD, another token) and passthrough mode sends it on
in a header. Anything else is "not authenticated" without a review (a 401, like a token kcp does
not know), never an encoding error: one such error once answered 500 and logged a token byte.

Tokens are never stored or logged: the cache is keyed by an HMAC of the token under a key that
lives only in this process, so even a memory dump does not allow testing guessed tokens offline.
Negative answers are cached too (shorter), so a client retrying a bad token in a loop costs kcp
one review per TTL.
"""

from __future__ import annotations

import hmac
import logging
import re
import secrets
import time
from dataclasses import dataclass

import msgspec

from vwserver.auth.cache import Clock, TTLCache
from vwserver.auth.identity import Identity
from vwserver.auth.reviews import post_review
from vwserver.config.base import DEFAULT_MAX_ENTRIES
from vwserver.config.base import DEFAULT_TOKEN_NEGATIVE_TTL as DEFAULT_NEGATIVE_TTL
from vwserver.config.base import DEFAULT_TOKEN_TTL as DEFAULT_TTL
from vwserver.errors import ApiForbidden, ApiNotFound, BadGateway
from vwserver.k8s.client import KubeClient

log = logging.getLogger(__name__)

# kcp's answers to a review that depend on the workspace it is posted to: forbidden there
# (including a workspace that does not exist) and not found.
_WORKSPACE_REFUSALS = (ApiForbidden, ApiNotFound)
#: Seconds a workspace's refusal is cached: kcp refuses reviews for a few seconds while it
#: (re)starts, and a valid token must not stay refused for the whole negative TTL after that.
REFUSAL_TTL = 1.0

_TOKEN = re.compile(r"[\x21-\x7e]+")
MALFORMED = "malformed token"
"""The :attr:`TokenResult.error` of a token that is not :func:`well_formed` (never reviewed)."""


def well_formed(token: str) -> bool:
    """Whether ``token`` is a run of visible ASCII characters (see the module docstring)."""
    return _TOKEN.fullmatch(token) is not None


class _UserInfo(msgspec.Struct):
    username: str = ""
    uid: str = ""
    groups: list[str] = msgspec.field(default_factory=list)
    extra: dict[str, list[str]] = msgspec.field(default_factory=dict)


class _TokenReviewStatus(msgspec.Struct):
    authenticated: bool = False
    user: _UserInfo = msgspec.field(default_factory=_UserInfo)
    error: str = ""


@dataclass(frozen=True, slots=True)
class TokenResult:
    """kcp's answer: the identity, or None with kcp's reason (for the log, not the client)."""

    identity: Identity | None
    error: str = ""
    refused: bool = False
    """kcp refused to review the token in that workspace (403/404): no answer about the token."""


class TokenReviewer:
    """Authenticates bearer tokens with TokenReviews posted by vwserver's own identity."""

    def __init__(
        self,
        *,
        client: KubeClient,
        ttl: float = DEFAULT_TTL,
        negative_ttl: float = DEFAULT_NEGATIVE_TTL,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Clock = time.monotonic,
    ) -> None:
        self._client = client
        self._ttl = ttl
        self._negative_ttl = negative_ttl
        self._cache: TTLCache[tuple[str, bytes], TokenResult] = TTLCache(
            max_entries=max_entries, clock=clock
        )
        self._hmac_key = secrets.token_bytes(32)

    @property
    def cache(self) -> TTLCache[tuple[str, bytes], TokenResult]:
        return self._cache

    async def authenticate(self, token: str, *, cluster: str) -> TokenResult:
        """Who ``token`` belongs to, asked in logical cluster ``cluster`` (cached); a token that
        is not :func:`well_formed` is nobody's, without asking kcp."""
        if not well_formed(token):
            return TokenResult(None, MALFORMED)
        # hmac.digest: OpenSSL's one-shot HMAC, a fraction of hmac.new's cost per request.
        digest = hmac.digest(self._hmac_key, token.encode(), "sha256")

        async def review() -> tuple[TokenResult, float]:
            result = await self._review(token, cluster=cluster)
            if result.identity is not None:
                return result, self._ttl
            if result.refused:
                return result, min(self._negative_ttl, REFUSAL_TTL)
            return result, self._negative_ttl

        return await self._cache.get_or_load((cluster, digest), review)

    async def _review(self, token: str, *, cluster: str) -> TokenResult:
        try:
            raw = await post_review(
                self._client,
                cluster=cluster,
                api="authentication.k8s.io/v1",
                resource="tokenreviews",
                body={
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenReview",
                    # No audiences: kcp then checks the token against its own API audiences,
                    # i.e. the caller uses the token it uses with kcp.
                    "spec": {"token": token},
                },
            )
        except BadGateway as e:
            refusal = e.__cause__
            if isinstance(refusal, _WORKSPACE_REFUSALS):
                error = f"kcp refused the review in {cluster} ({refusal.code})"
                return TokenResult(None, error, refused=True)
            raise
        try:
            status = msgspec.convert(raw, _TokenReviewStatus)
        except msgspec.ValidationError as e:
            log.error("unusable TokenReview status from kcp: %s", e)
            raise BadGateway("cannot check credentials: unusable TokenReview answer") from e
        if not status.authenticated or not status.user.username:
            # kcp's reason goes to a debug log line: never with the token in it, should an
            # authenticator quote what it was given.
            reason = status.error.replace(token, "<token>") if status.error else ""
            return TokenResult(None, reason or "not authenticated")
        user = status.user
        return TokenResult(
            Identity.create(user.username, uid=user.uid, groups=user.groups, extra=user.extra)
        )
