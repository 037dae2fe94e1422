"""POST one review object to kcp and map failures onto request errors.

Shared by :mod:`~vwserver.auth.tokens` and :mod:`~vwserver.auth.access`. A review that cannot
be completed is *not* an answer about the caller: it must not turn into a cached 401/403 that
would lock a legitimate user out, and its details (vwserver's own identity and permissions)
are for the log, not for a possibly unauthenticated client. So: kcp unreachable or overloaded →
503 with Retry-After; kcp refusing vwserver's review (missing RBAC, see ``manifests/rbac/``) →
502, logged with kcp's message.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from vwserver.errors import BadGateway, UpstreamUnavailable
from vwserver.k8s import kcp
from vwserver.k8s.client import ApiError, KubeClient
from vwserver.k8s.resources import ResourceType

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 1


async def post_review(
    client: KubeClient,
    *,
    cluster: str,
    api: str,
    resource: str,
    body: dict[str, Any],
    log_refusal: bool = True,
) -> dict[str, Any]:
    """Create ``body`` at ``/clusters/<cluster>/apis/<api>/<resource>``; the answer's ``status``.

    The answer is never logged: kcp echoes a TokenReview's ``spec.token`` in it.
    ``log_refusal=False``: the caller logs a refusal itself (the slice controller's consent
    reviews name workspaces a tenant chose: logged once per slice, not on every retry).
    """
    group, _, version = api.rpartition("/")
    path = ResourceType(group, version, resource, kind="").collection(kcp.workspace(cluster))
    try:
        answer = await client.request("POST", path, body=body)
    except ApiError as e:
        if e.transient:
            raise UpstreamUnavailable(
                f"cannot check credentials now: kcp answered {e.code} to a {resource} review",
                retry_after=RETRY_AFTER_SECONDS,
            ) from e
        # Only a Status message is logged (it names vwserver's identity and the missing
        # permission); any other body might echo the review, token included.
        if log_refusal:
            log.error(
                "kcp refused vwserver's %s in logical cluster %s: %d %s",
                resource,
                cluster,
                e.code,
                e.message if e.reason else "(no Status)",
            )
        raise BadGateway(
            f"cannot check credentials: kcp refused the {resource} review ({e.code})"
        ) from e
    except UpstreamUnavailable as e:
        raise UpstreamUnavailable(
            f"cannot check credentials now: {e.message}", retry_after=RETRY_AFTER_SECONDS
        ) from e
    status = answer.get("status")
    return status if isinstance(status, dict) else {}


def review_allows(status: Mapping[str, Any]) -> bool:
    """A SubjectAccessReview's answer: ``allowed: true`` is the only grant (absent means no),
    ``denied: true`` an explicit veto."""
    return status.get("allowed") is True and status.get("denied") is not True
