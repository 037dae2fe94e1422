"""What a FilteredAPIExportEndpointSlice should look like — pure, no I/O, no clock.

The slice controller (:mod:`.slices`) gathers facts (the slice object, whether its APIExport was
found, the upstream virtual-workspace URLs of the export's endpoint slice) and this module turns
them into the slice's desired ``status`` and its :class:`~vwserver.routes.Route`. Keeping the
decision pure makes every condition and message testable without a kcp, and makes "patch status
only when it changed" a plain comparison.

Conditions (``metav1.Condition``): ``SelectorValid``, ``APIExportValid`` and ``Ready``, each with
a reason a program can branch on, a message a human can act on, and the generation it describes;
with the handoff ``HoldsReleased``, and with the watch cache ``UpstreamReachable`` (whether the
cache's watches of the slice's export in kcp work: with several shards one can fail while the
status is still written through another).

A slice serves its export only with the consent of the export's owner (:mod:`.consent`): the
controller reports the facts (the export's logical cluster, the owner's answer to the consent
review) and :func:`desired` decides. Anything short of consent is ``APIExportValid=False`` and a
not-ready route without an upstream URL — and one answer, ``NotPermitted`` with a message built
from the slice's own names only, whether the export exists or not, whether the workspace exists
or not, and whether kcp answered the review or refused it: until the owner consented, the status
must not tell whether anything exists elsewhere (the controller reads nothing of the export
before that either). Only after consent may it say that the export is missing or unusable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vwserver.controller import consent
from vwserver.controller.handoff import StuckHolds
from vwserver.controller.scope import ShardScope, scoped_urls
from vwserver.errors import ConfigError, SelectorError
from vwserver.holds import DEFAULT_HOLD_TIMEOUT_SECONDS, MAX_HOLD_TIMEOUT_SECONDS, slice_id
from vwserver.k8s import kcp
from vwserver.related import ClaimKey, RelatedRules, check_claims, parse_rules
from vwserver.routes import Route
from vwserver.selector import Selector

NOT_PERMITTED = "NotPermitted"
"""Reason: the export's owner has not (or not yet verifiably) granted the slice's workspace (see
:mod:`.consent`); also when kcp refused vwserver's review (the log says so, the status cannot
without telling whether the workspace exists)."""
TOO_MANY_SLICES = "TooManySlices"
"""Reason: the slice's workspace has more slices than the controller looks at."""
TOO_MANY_EXPORTS = "TooManyExports"
"""Reason: the workspace's slices name more distinct exports than the controller looks at."""
_READY_REASONS = (NOT_PERMITTED, TOO_MANY_SLICES, TOO_MANY_EXPORTS)
"""Refusal reasons that ``Ready`` repeats as they are (others are ``APIExportInvalid``)."""


@dataclass(frozen=True, slots=True)
class ExportLookup:
    """What the controller found for ``spec.export``.

    ``error`` is a human-readable reason the export is unusable (not found, not readable);
    ``urls`` are the APIExport virtual-workspace URLs (one per shard) — empty while no APIBinding
    to the export exists (kcp publishes a shard's URL only then).
    """

    error: str | None = None
    reason: str = ""
    export_cluster: str = ""
    """The export's logical cluster (its ``kcp.io/cluster`` annotation)."""
    urls: tuple[str, ...] = ()
    granted: bool | None = None
    """The export's workspace's answer to the consent review; None: not asked (the slice is in
    the export's own workspace, or the review could not be made)."""
    consent_error: str = ""
    """Why the consent review could not be made (kcp refused vwserver's review): for the log;
    the status says ``NotPermitted`` as for a refusal."""
    claimed: frozenset[ClaimKey] | None = None
    """(group, resource) of the export's ``spec.permissionClaims``; None: the export was not
    read (then no related-resource rule is checked against it)."""
    exported: frozenset[ClaimKey] = frozenset()
    """(group, resource) of the export's own ``spec.resources``."""


@dataclass(frozen=True, slots=True)
class Outcome:
    status: dict[str, Any]
    route: Route
    """The route to serve: ready, or not ready with the reason (answered 503)."""


@dataclass(frozen=True, slots=True)
class WatchHealth:
    """Of the watch cache's upstream watches of some export URLs: how many fail, of how many."""

    failing: int = 0
    total: int = 0


def slice_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(logical cluster, name) of a slice object."""
    return (kcp.logical_cluster(obj), str((obj.get("metadata") or {}).get("name", "")))


def export_ref(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(workspace path or logical cluster, export name); an empty path means the slice's own."""
    spec = obj.get("spec") or {}
    export = spec.get("export") or {}
    path = str(export.get("path") or "") or slice_key(obj)[0]
    return (path, str(export.get("name") or ""))


def parse_selector(obj: Mapping[str, Any]) -> tuple[Selector | None, str]:
    """The slice's selector, or (None, why it is invalid)."""
    raw = (obj.get("spec") or {}).get("objectSelector")
    if not raw:
        return None, (
            "spec.objectSelector is empty: a slice must select objects (an empty selector "
            "would expose the whole export)"
        )
    try:
        selector = Selector.from_label_selector(raw, field="spec.objectSelector")
    except SelectorError as e:
        return None, e.message
    if selector.is_empty:
        return None, "spec.objectSelector selects everything; give matchLabels or matchExpressions"
    return selector, ""


def parse_related(obj: Mapping[str, Any]) -> tuple[RelatedRules | None, str]:
    """The slice's ``spec.relatedResources`` rules, or (None, why they are invalid — the
    message names the field)."""
    try:
        return parse_rules((obj.get("spec") or {}).get("relatedResources")), ""
    except ConfigError as e:
        return None, str(e)


def desired(
    obj: Mapping[str, Any],
    *,
    lookup: ExportLookup,
    external_url: str,
    previous: Sequence[Mapping[str, Any]] = (),
    now: str,
    stuck_holds: Callable[[str], StuckHolds | None] | None = None,
    upstream_watches: Callable[[Sequence[str]], WatchHealth] | None = None,
    scope: ShardScope | None = None,
) -> Outcome:
    """The slice's desired status and route from the facts gathered about it.
    ``stuck_holds``: the handoff loop's count of objects that have been leaving a slice for too
    long (:meth:`vwserver.controller.handoff.Handoff.stuck`), for the ``HoldsReleased``
    condition (None: no such condition, the server runs no handoff). ``upstream_watches``: how
    many of the watch cache's upstream watches of the slice's export URLs fail, for the
    ``UpstreamReachable`` condition (None: no such condition, the server runs no cache).
    ``scope``: the shards this replica serves (None: all): only their endpoints and routes, and
    the conditions under the scope's types (:mod:`.scope`); the endpoint URLs are those of the
    whole slice (``/shards/<id>`` as soon as the export has two shards, whoever serves them),
    so that every replica set publishes the same URL for a shard."""
    cluster, name = slice_key(obj)
    generation = int((obj.get("metadata") or {}).get("generation") or 0)
    selector, selector_problem = parse_selector(obj)
    related, related_problem = parse_related(obj)
    conditions: list[dict[str, Any]] = []

    def condition(type_: str, ok: bool, reason: str, message: str) -> None:
        if scope is not None:
            type_ = scope.condition_type(type_)
        conditions.append(
            _condition(
                type_, ok, reason, message, generation=generation, now=now, previous=previous
            )
        )

    condition(
        "SelectorValid",
        selector is not None,
        "Valid" if selector is not None else "InvalidSelector",
        "the object selector is valid" if selector is not None else selector_problem,
    )
    path, export_name = export_ref(obj)
    # (reason, message) why the export cannot be served by this slice; None: it can.
    refusal = _export_refusal(lookup, slice_cluster=cluster, path=path, export_name=export_name)
    if related is not None and related and refusal is None and lookup.claimed is not None:
        # Only after consent may a message say what the export claims.
        related_problem = (
            check_claims(related, claimed=lookup.claimed, exported=lookup.exported) or ""
        )
        if related_problem:
            related = None
    if "relatedResources" in (obj.get("spec") or {}):
        condition(
            "RelatedResourcesValid",
            related is not None,
            "Valid" if related is not None else "InvalidRelatedResources",
            "the related-resource rules are valid" if related is not None else related_problem,
        )
    if refusal is not None:
        condition("APIExportValid", False, *refusal)
    else:
        how = "" if lookup.export_cluster == cluster else ", granted to this workspace"
        condition("APIExportValid", True, "Found", f"APIExport {path}/{export_name} found{how}")
    # Never an upstream URL in the route of a refused slice, ready or not.
    every = lookup.urls if refusal is None else ()
    upstreams = tuple(u for u in every if scope is None or scope.serves(u))
    not_ready: str | None = None
    ready_reason = ""
    if selector is None:
        not_ready, ready_reason = f"invalid selector: {selector_problem}", "InvalidSelector"
    elif related is None:
        not_ready = f"invalid related resources: {related_problem}"
        ready_reason = "InvalidRelatedResources"
    elif refusal is not None:
        ready_reason, not_ready = refusal
        if ready_reason not in _READY_REASONS:
            ready_reason = "APIExportInvalid"
    elif every and not upstreams:
        assert scope is not None
        ready_reason = "NoServedShard"
        not_ready = (
            f"no shard that replica set {scope.name} serves (controller.shards) holds an "
            f"APIBinding to APIExport {path}/{export_name}; other replica sets serve its "
            "other shards"
        )
    elif not upstreams:
        ready_reason = "APIExportNotReady"
        not_ready = (
            f"APIExport {path}/{export_name} has no virtual-workspace endpoint yet "
            "(kcp publishes one once an APIBinding to the export exists)"
        )
    urls = scoped_urls(
        kcp.slice_endpoint_urls(
            external_url=external_url, cluster=cluster, name=name, upstreams=every
        ),
        every,
        scope,
    )
    if stuck_holds is not None:
        stuck = stuck_holds(slice_id(cluster, name))
        if stuck is None:
            condition(
                "HoldsReleased",
                True,
                "NoStuckHolds",
                "no object has been leaving this slice for long with the slice's finalizers on it",
            )
        else:
            condition(
                "HoldsReleased",
                False,
                "StuckHolds",
                f"{stuck.count} object(s) have been leaving this slice since {stuck.oldest} or "
                "longer without the slice's finalizers being released; release them through the "
                "slice or end them with the sync.edge-connect.eu/release annotation, else each "
                f"hold ends {_hold_timeout(obj):.0f} s after its move (holdTimeoutSeconds)",
            )
    if upstream_watches is not None:
        health = upstream_watches(upstreams)
        if health.failing:
            condition(
                "UpstreamReachable",
                False,
                "WatchesFailing",
                f"{health.failing} of {health.total} of the watch cache's upstream watches of "
                "this slice's export fail; they are retried with backoff (vwserver's log has "
                "the details)",
            )
        else:
            condition(
                "UpstreamReachable",
                True,
                "Watching",
                f"the watch cache's {health.total} upstream watch(es) of this slice's export work",
            )
    if not_ready is None:
        condition("Ready", True, "Serving", f"serving {len(urls)} endpoint(s)")
    else:
        condition("Ready", False, ready_reason, not_ready)
    status = {
        "observedGeneration": generation,
        "conditions": conditions,
        "endpoints": [{"url": u} for u in urls] if not_ready is None else [],
    }
    route = Route(
        cluster=cluster,
        name=name,
        selector=selector if selector is not None else Selector(),
        upstream_url=upstreams[0] if upstreams else "",
        # Every upstream by shard id, also when only one is left: a client of a sharded export
        # holds a ``/shards/<id>`` URL, which must keep serving that shard when the other
        # shard's last binding goes and the published URL falls back to the plain one.
        shards={kcp.shard_id(u): u for u in upstreams},
        not_ready=not_ready,
        hold_timeout=_hold_timeout(obj),
        claimed=lookup.claimed or frozenset(),
        related=related if related is not None else RelatedRules(),
    )
    return Outcome(status=status, route=route)


def _hold_timeout(obj: Mapping[str, Any]) -> float:
    """``spec.holdTimeoutSeconds`` (kcp validated it: an integer from 1 to the maximum; one
    stored under an older schema is capped), or the default bound when it is not set."""
    value = (obj.get("spec") or {}).get("holdTimeoutSeconds")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return min(float(value), MAX_HOLD_TIMEOUT_SECONDS)
    return DEFAULT_HOLD_TIMEOUT_SECONDS


def _export_refusal(
    lookup: ExportLookup, *, slice_cluster: str, path: str, export_name: str
) -> tuple[str, str] | None:
    """(reason, message) why this slice may not serve the export, or None if it may."""
    if lookup.error is not None:
        return lookup.reason or "APIExportNotFound", lookup.error
    if consent.implied(slice_cluster=slice_cluster, export_cluster=lookup.export_cluster):
        return None
    if lookup.granted is True:
        return None
    # Refused, or not asked, or kcp refused the review: one answer (see the module docstring).
    return NOT_PERMITTED, consent.missing_grant(
        slice_cluster=slice_cluster, export_path=path, export_name=export_name
    )


def _condition(
    type_: str,
    ok: bool,
    reason: str,
    message: str,
    *,
    generation: int,
    now: str,
    previous: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    status = "True" if ok else "False"
    # lastTransitionTime changes only when the status does (metav1.Condition semantics), so an
    # unchanged slice produces an identical status and no write.
    before = next((c for c in previous if c.get("type") == type_), None)
    since = before.get("lastTransitionTime") if before and before.get("status") == status else now
    return {
        "type": type_,
        "status": status,
        "observedGeneration": generation,
        "lastTransitionTime": since or now,
        "reason": reason,
        "message": message,
    }


def status_changed(current: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> bool:
    return dict(current or {}) != dict(wanted)
