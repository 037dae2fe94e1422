"""Slice authorization by kcp's SubjectAccessReview, cached.

The permission to use a slice is RBAC in the slice's workspace, modelled like kcp's own
``apiexports/content`` (and like the Go filtered-APIExport peer): verb ``<request verb>`` on
group ``sync.edge-connect.eu``, resource ``filteredapiexportendpointslices``, subresource
``content``, resourceName ``<slice>``. A provider grants a team one slice with one Role, and
kcp's RBAC, workspace-access and scope rules all apply because kcp evaluates the review.

Verified against kcp v0.32: the review is answered by kcp's whole authorizer chain, so a user
also needs verb ``access`` on non-resource URL ``/`` in that workspace (kcp's workspace content
authorizer; service accounts of the workspace have it implicitly), and a caller whose ``extra``
scopes it to another workspace is denied. ``manifests/rbac/`` has an example.

Grants are cached for minutes, denials for seconds: a new grant should take effect almost at
once, a revoked one within the allow TTL (the same trade-off kube-apiserver's webhook authorizer
makes with its authorized/unauthorized cache TTLs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from vwserver.auth.cache import Clock, TTLCache
from vwserver.auth.identity import Identity
from vwserver.auth.reviews import post_review, review_allows
from vwserver.config.base import DEFAULT_ALLOW_TTL, DEFAULT_DENY_TTL, DEFAULT_MAX_ENTRIES
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kcp import SLICES

CONTENT_GROUP = SLICES.group
CONTENT_RESOURCE = SLICES.resource
CONTENT_SUBRESOURCE = "content"

_Key = tuple[Identity, str, str, str]


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str = ""
    """kcp's ``status.reason`` (and ``evaluationError``), e.g. ``access denied``."""


class AccessReviewer:
    """Asks kcp whether an identity may use a slice with a verb."""

    def __init__(
        self,
        *,
        client: KubeClient,
        allow_ttl: float = DEFAULT_ALLOW_TTL,
        deny_ttl: float = DEFAULT_DENY_TTL,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Clock = time.monotonic,
    ) -> None:
        self._client = client
        self._allow_ttl = allow_ttl
        self._deny_ttl = deny_ttl
        self._cache: TTLCache[_Key, Decision] = TTLCache(max_entries=max_entries, clock=clock)

    @property
    def cache(self) -> TTLCache[_Key, Decision]:
        return self._cache

    async def review(
        self, identity: Identity, *, cluster: str, slice_name: str, verb: str
    ) -> Decision:
        """May ``identity`` do ``verb`` on the content of slice ``cluster``/``slice_name``?"""

        async def load() -> tuple[Decision, float]:
            decision = await self._review(
                identity, cluster=cluster, slice_name=slice_name, verb=verb
            )
            return decision, self._allow_ttl if decision.allowed else self._deny_ttl

        return await self._cache.get_or_load((identity, cluster, slice_name, verb), load)

    async def _review(
        self, identity: Identity, *, cluster: str, slice_name: str, verb: str
    ) -> Decision:
        spec: dict[str, object] = {
            "user": identity.user,
            "groups": list(identity.groups),
            "resourceAttributes": {
                "verb": verb,
                "group": CONTENT_GROUP,
                "resource": CONTENT_RESOURCE,
                "subresource": CONTENT_SUBRESOURCE,
                "name": slice_name,
            },
        }
        if identity.uid:
            spec["uid"] = identity.uid
        if identity.extra:
            spec["extra"] = identity.extra_dict()
        status = await post_review(
            self._client,
            cluster=cluster,
            api="authorization.k8s.io/v1",
            resource="subjectaccessreviews",
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": spec,
            },
        )
        reason = str(status.get("reason") or "")
        if error := status.get("evaluationError"):
            reason = f"{reason}; {error}" if reason else str(error)
        return Decision(allowed=review_allows(status), reason=reason)
