"""Startup checks: every configured resource is served where the syncer will read and write it.

Why: a typo in a plural (``widget`` for ``widgets``) used to surface as a 404 retried forever by
a reflector, with nothing pointing at the config file. Before syncing, the syncer asks API
discovery — of each upstream endpoint (``<endpoint>/clusters/*``: the wildcard serves the
export's discovery, FIELD-NOTES) and of the downstream cluster for the downstream type — and
turns a *definite* answer into a :class:`~vwserver.errors.ConfigError` naming the field
(``$.resources[0].resource: "widget" is not served by …; did you mean "widgets"?``): the process
exits with code 2, as for any configuration error.

Definite means the server answered with discovery documents that lack the resource: an
``APIResourceList`` without it, or — after a 404 for the group version — an ``APIGroup`` without
the version or an ``APIGroupList`` without the group — and said so again on every re-ask over
:data:`CONFIRM_DELAYS` (about 7 s). Discovery lags behind serving: kcp answers a group version
whose CRD was created a moment ago with an *empty* ``APIResourceList`` (and 404 for the group)
for a few seconds while lists of the resource already work, and a kube-apiserver's discovery
controller catches up asynchronously too; a syncer deployed together with its CRD must not die
of that. Anything else (no answer, 5xx, 401/403, a 404 for ``/apis`` itself: an APIExport
virtual workspace can be published before it serves) is *not* a verdict: :func:`check_served`
raises the :class:`~vwserver.errors.ApiError` or :class:`~vwserver.errors.UpstreamUnavailable`,
and the caller retries with backoff while ``/readyz`` says why. An outage never ends the
process; a wrong config always does.

:func:`problems` is the pure part (documents in, errors out); :func:`check_served` does the GETs.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vwserver.clock import Clock
from vwserver.errors import ApiNotFound, ConfigError
from vwserver.k8s.client import JSON, KubeClient
from vwserver.k8s.resources import ResourceType
from vwserver.syncer.config import ResourceConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Wanted:
    """One resource type the syncer needs at one server, and the config field that names it."""

    field: str
    """``$.resources[0]`` or ``$.resources[0].downstream``: the fields below it are named."""
    type: ResourceType


def upstream_wanted(resources: Sequence[ResourceConfig]) -> list[Wanted]:
    return [
        Wanted(f"$.resources[{i}]", ResourceType(r.group, r.version, r.resource, r.kind))
        for i, r in enumerate(resources)
    ]


def downstream_wanted(resources: Sequence[ResourceConfig]) -> list[Wanted]:
    out = []
    for i, r in enumerate(resources):
        t = r.target
        field = f"$.resources[{i}].downstream" if r.downstream is not None else f"$.resources[{i}]"
        out.append(Wanted(field, ResourceType(t.group, t.version, t.resource, t.kind)))
    return out


@dataclass(frozen=True, slots=True)
class Discovery:
    """What a server answered for one group version: the ``APIResourceList`` (None after a
    404), and when that was 404 the ``APIGroup`` (None after a 404) and, when that was 404 too,
    the ``APIGroupList``."""

    resources: JSON | None
    group: JSON | None = None
    groups: JSON | None = None


def problems(wanted: Wanted, found: Discovery, *, where: str) -> list[ConfigError]:
    """Why ``wanted`` cannot be used at ``where`` (a URL, for messages), from discovery."""
    t, field = wanted.type, wanted.field
    gv = t.api_version
    if found.resources is None:
        if found.group is not None:
            versions = [
                str(v.get("version")) for v in found.group.get("versions") or [] if v.get("version")
            ]
            return [
                ConfigError(
                    f"{field}.version",
                    f'"{t.version}" of {t.group} is not served by {where} '
                    f"(served: {', '.join(versions) or 'none'})",
                )
            ]
        names = [str(g.get("name")) for g in (found.groups or {}).get("groups") or []]
        return [
            ConfigError(
                f"{field}.group",
                f'"{t.group}" is not served by {where}{_did_you_mean(t.group, names)}',
            )
        ]
    entries: list[Mapping[str, Any]] = [
        e for e in found.resources.get("resources") or [] if "/" not in str(e.get("name", ""))
    ]
    entry = next((e for e in entries if e.get("name") == t.resource), None)
    if entry is None:
        return [
            ConfigError(
                f"{field}.resource",
                f'"{t.resource}" is not served by {where} ({gv})'
                + _did_you_mean(t.resource, [str(e.get("name")) for e in entries], entries=entries),
            )
        ]
    out = []
    if entry.get("kind") and entry.get("kind") != t.kind:
        out.append(
            ConfigError(
                f"{field}.kind",
                f'"{t.kind}" does not match the kind "{entry.get("kind")}" that {where} serves '
                f"for {t.resource} ({gv})",
            )
        )
    if entry.get("namespaced") is False:
        out.append(
            ConfigError(
                field,
                f"{t.resource} ({gv}) is cluster-scoped at {where}; the syncer syncs namespaced "
                "resources only",
            )
        )
    return out


def has_status(wanted: Wanted, found: Discovery) -> bool:
    """Whether the resource has a ``status`` subresource (the syncer writes status there)."""
    names = {str(e.get("name")) for e in (found.resources or {}).get("resources") or []}
    return f"{wanted.type.resource}/status" in names


def _did_you_mean(
    word: str, candidates: Sequence[str], *, entries: Sequence[Mapping[str, Any]] = ()
) -> str:
    """``; did you mean "x"?`` — the resource whose singular, kind or short name ``word`` is,
    else the closest spelling — or ``""``."""
    lowered = word.lower()
    for e in entries:
        aliases = {str(e.get("singularName") or ""), str(e.get("kind") or "").lower()}
        aliases |= {str(s) for s in e.get("shortNames") or []}
        if lowered in aliases - {""}:
            return f'; did you mean "{e.get("name")}"?'
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f'; did you mean "{close[0]}"?' if close else ""


async def discover(client: KubeClient, base: str, t: ResourceType) -> Discovery:
    """The discovery documents of ``t``'s group version at ``base`` (a server or endpoint URL,
    with ``/clusters/*`` for a virtual workspace). Raises ApiError / UpstreamUnavailable when
    the answer is no verdict (see the module docstring)."""
    root = f"{base.rstrip('/')}/api" if not t.group else f"{base.rstrip('/')}/apis"
    gv_url = f"{root}/{t.version}" if not t.group else f"{root}/{t.group}/{t.version}"
    try:
        return Discovery(await client.request("GET", gv_url))
    except ApiNotFound:
        if not t.group:
            raise  # the core group always exists where the API is served: no verdict
    try:
        return Discovery(None, group=await client.request("GET", f"{root}/{t.group}"))
    except ApiNotFound:
        pass
    # A 404 for /apis itself is raised: the server does not serve the API (yet).
    return Discovery(None, groups=await client.request("GET", root))


CONFIRM_DELAYS = (1.0, 2.0, 4.0)
"""Seconds between re-asks before "not served" is a verdict (discovery lags behind serving)."""


async def check_served(
    client: KubeClient,
    base: str,
    wanted: Sequence[Wanted],
    *,
    where: str,
    status: bool,
    clock: Clock,
    confirm_delays: Sequence[float] = CONFIRM_DELAYS,
) -> None:
    """Every ``wanted`` type is served at ``base``; raises :class:`ConfigError` (the first
    problem) when discovery keeps saying otherwise over ``confirm_delays``, ApiError /
    UpstreamUnavailable when there is no answer. ``status``: the syncer writes status there
    (upstream): warn when there is no status subresource."""
    delays = iter(confirm_delays)
    while True:
        found = {}
        errors: list[ConfigError] = []
        for w in wanted:
            key = (w.type.group, w.type.version)
            if key not in found:
                found[key] = await discover(client, base, w.type)
            errors += problems(w, found[key], where=where)
        if not errors:
            break
        delay = next(delays, None)
        if delay is None:
            raise errors[0]
        log.info("%s (asking again in %.0fs: discovery may lag)", errors[0], delay)
        await clock.sleep(delay)
    for w in wanted:
        if status and not has_status(w, found[(w.type.group, w.type.version)]):
            log.warning(
                "%s (%s) has no status subresource at %s: status cannot be synced",
                w.type.resource,
                w.type.api_version,
                where,
            )
