"""kcp's TokenReview and SubjectAccessReview endpoints, in memory, for tests.

:mod:`vwserver.auth` asks kcp who a caller is and what it may do. The fast tests need a kcp that
answers those two questions the way kcp v0.32 does (checked against a running kcp):

* ``POST /clusters/<cluster>/apis/authentication.k8s.io/v1/tokenreviews`` answers 201 with the
  review, ``spec.token`` echoed back (kcp does that too: a client must never log the answer);
  an unknown token gets ``authenticated`` absent and ``error: invalid bearer token``; a known
  user's groups include ``system:authenticated``.
* ``POST /clusters/<cluster>/apis/authorization.k8s.io/v1/subjectaccessreviews`` allows what
  :meth:`FakeAuth.grant` granted in that cluster (by user or group, verbs or ``*``), and denies a
  user whose ``extra`` scopes (``authentication.kcp.io/scopes``) exclude the cluster.
* The same endpoint answers vwserver's consent review (:mod:`vwserver.controller.consent`):
  verb ``filter`` on ``apis.kcp.io`` ``apiexports`` named like the export, for the synthetic
  user of a slice's workspace, allowed where :meth:`FakeAuth.consent` granted it.
* The reviewer itself must present :attr:`FakeAuth.reviewer_token` (when set), else 403 like
  kcp's "cannot create resource tokenreviews".

Every review is recorded (:attr:`FakeAuth.token_reviews`, :attr:`FakeAuth.access_reviews`) so
tests can count what reached "kcp", and :attr:`FakeAuth.fail_with` injects an error status.
:meth:`FakeAuth.install` adds the routes to another app, e.g. a
:class:`~fakekcp.upstream.FakeUpstream`'s, so one fake origin plays all of kcp.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from vwserver.controller import consent
from vwserver.k8s.status import status_body

SCOPES_KEY = "authentication.kcp.io/scopes"


@dataclass(frozen=True)
class FakeUser:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Grant:
    cluster: str
    slice_name: str
    subject: tuple[str, str]  # ("User" | "Group", name)
    verbs: frozenset[str]


@dataclass
class FakeAuth:
    """In-memory users (by token) and slice grants; see the module docstring."""

    reviewer_token: str | None = None
    users: dict[str, FakeUser] = field(default_factory=dict)
    token_reviews: list[dict[str, Any]] = field(default_factory=list)
    access_reviews: list[dict[str, Any]] = field(default_factory=list)
    fail_with: int | None = None
    """Answer every review with this HTTP status (a Status body) instead."""
    _grants: list[_Grant] = field(default_factory=list)
    _consents: set[tuple[str, str, str]] = field(default_factory=set)

    def add_user(
        self,
        token: str,
        name: str,
        *,
        uid: str = "",
        groups: Iterable[str] = (),
        extra: Mapping[str, list[str]] | None = None,
    ) -> None:
        self.users[token] = FakeUser(name, uid, tuple(groups), dict(extra or {}))

    def grant(
        self,
        *,
        cluster: str,
        slice_name: str,
        user: str | None = None,
        group: str | None = None,
        verbs: Iterable[str] = ("*",),
    ) -> None:
        """Let ``user`` (or members of ``group``) use ``verbs`` on the slice's content."""
        if (user is None) == (group is None):
            raise ValueError("grant to exactly one of user or group")
        subject = ("User", user) if user is not None else ("Group", group or "")
        self._grants.append(_Grant(cluster, slice_name, subject, frozenset(verbs)))

    def revoke_all(self) -> None:
        self._grants.clear()

    def consent(self, *, export_cluster: str, export_name: str, slice_cluster: str) -> None:
        """The export's workspace grants the slice workspace (see ``manifests/rbac/``)."""
        self._consents.add((export_cluster, export_name, slice_cluster))

    def revoke_consent(self, *, export_cluster: str, export_name: str, slice_cluster: str) -> None:
        self._consents.discard((export_cluster, export_name, slice_cluster))

    def install(self, app: web.Application) -> None:
        base = "/clusters/{cluster}/apis"
        app.router.add_post(f"{base}/authentication.k8s.io/v1/tokenreviews", self._token_review)
        app.router.add_post(
            f"{base}/authorization.k8s.io/v1/subjectaccessreviews", self._access_review
        )

    def app(self) -> web.Application:
        """A standalone app serving only the review endpoints."""
        app = web.Application()
        self.install(app)
        return app

    # --- handlers --------------------------------------------------------------------------

    def _refusal(self, request: web.Request, resource: str, group: str) -> web.Response | None:
        if self.fail_with is not None:
            return _status(self.fail_with, "InternalError", "injected failure")
        if self.reviewer_token is None:
            return None
        if request.headers.get("Authorization") != f"Bearer {self.reviewer_token}":
            return _status(
                403,
                "Forbidden",
                f'{resource}.{group} is forbidden: User "reviewer?" cannot create resource '
                f'"{resource}" in API group "{group}" at the cluster scope: access denied',
            )
        return None

    async def _token_review(self, request: web.Request) -> web.Response:
        body = msgspec.json.decode(await request.read())
        self.token_reviews.append({"cluster": request.match_info["cluster"], **body})
        refusal = self._refusal(request, "tokenreviews", "authentication.k8s.io")
        if refusal is not None:
            return refusal
        token = body.get("spec", {}).get("token", "")
        user = self.users.get(token)
        status: dict[str, Any]
        if user is None:
            status = {"user": {}, "error": "invalid bearer token"}
        else:
            info: dict[str, Any] = {"username": user.name}
            if user.uid:
                info["uid"] = user.uid
            info["groups"] = [*user.groups, "system:authenticated"]
            if user.extra:
                info["extra"] = dict(user.extra)
            status = {"authenticated": True, "user": info, "audiences": ["https://kcp.default.svc"]}
        return _json(201, {**body, "metadata": {}, "status": status})

    async def _access_review(self, request: web.Request) -> web.Response:
        cluster = request.match_info["cluster"]
        body = msgspec.json.decode(await request.read())
        self.access_reviews.append({"cluster": cluster, **body})
        refusal = self._refusal(request, "subjectaccessreviews", "authorization.k8s.io")
        if refusal is not None:
            return refusal
        spec = body.get("spec", {})
        allowed = self._allowed(cluster, spec)
        status = {"allowed": allowed, "reason": "access granted" if allowed else "access denied"}
        return _json(201, {**body, "metadata": {}, "status": status})

    def _allowed(self, cluster: str, spec: Mapping[str, Any]) -> bool:
        scopes = (spec.get("extra") or {}).get(SCOPES_KEY)
        if scopes is not None and f"cluster:{cluster}" not in scopes:
            return False
        attrs = spec.get("resourceAttributes") or {}
        target = (attrs.get("group"), attrs.get("resource"), attrs.get("subresource"))
        if target == (consent.GROUP, consent.RESOURCE, None) and attrs.get("verb") == consent.VERB:
            user = spec.get("user")
            return any(
                (cluster, attrs.get("name"), user) == (c, n, consent.subject(slice_cluster))
                for c, n, slice_cluster in self._consents
            )
        if target != (
            "sync.edge-connect.eu",
            "filteredapiexportendpointslices",
            "content",
        ):
            return False
        subjects = {("User", spec.get("user", "")), *(("Group", g) for g in spec.get("groups", []))}
        verb = attrs.get("verb", "")
        return any(
            g.cluster == cluster
            and g.slice_name == attrs.get("name")
            and g.subject in subjects
            and ("*" in g.verbs or verb in g.verbs)
            for g in self._grants
        )


def _json(code: int, doc: Any) -> web.Response:
    return web.Response(status=code, body=msgspec.json.encode(doc), content_type="application/json")


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.Response(
        status=code,
        body=status_body(code=code, reason=reason, message=message),
        content_type="application/json",
    )
