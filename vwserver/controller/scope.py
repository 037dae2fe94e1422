"""Shard-scoped replicas: which shards a vwserver replica serves, and which part of a slice's
status is its own — pure, no I/O.

The scale-out model (README, "Sharded kcp"): like kcp's per-shard virtual-workspace servers, one
vwserver Deployment per shard (or set of shards), each serving and publishing only its shards'
endpoints (``controller.shards`` in the config). Several such Deployments write into the same
slice's status, so each one writes under a field manager of its own (``vwserver-<name>``) and
changes only its part:

* its ``status.endpoints`` entries (a list map keyed by ``url`` in the schema),
* its conditions, whose types carry the replica set's name as prefix (``<name>/Ready``), so that
  two replica sets never set the same condition to different values,
* ``observedGeneration`` (the same value from every replica set: no conflict; compared by value,
  as whoever wrote it first may be its only recorded owner).

What a replica set owns is read from the slice's ``managedFields`` (its manager's entry for the
``status`` subresource). A replica compares its desired part with what it owns, so an idle
replica writes nothing; a write is a merge patch of the whole status — the other managers'
entries as they are, its own replaced — made conditional on the object's resourceVersion (a
concurrent write of another replica set is a 409 and a retry, never lost). An entry it owns and
no longer wants (its config stopped serving a shard, the last binding there went, the replica set
is retired) is thereby removed, and only that entry.

Kubernetes/kcp facts (v0.32.3, tests/shards/test_scaleout_shards.py): ``managedFields[].fieldsV1``
names list-map entries as ``k:{"url":"..."}`` and condition entries as ``k:{"type":"..."}``; an
update records under its ``fieldManager`` the fields whose value it changed, and the others keep
their owners. Server-side apply is not used: through kcp's APIExport virtual workspace an apply
is stored as ``operation: Update`` under the manager's name, and an apply of an empty status by
that manager did not remove its endpoint (observed in that test before this module wrote merge
patches).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FIELD_MANAGER_PREFIX = "vwserver-"


@dataclass(frozen=True, slots=True)
class ShardScope:
    """The shards one replica set serves: ``name`` (a DNS label, validated by the config) and the
    shards' virtual-workspace base URLs (kcp's ``Shard.spec.virtualWorkspaceURL``)."""

    name: str
    virtual_workspace_urls: tuple[str, ...]

    def serves(self, upstream: str) -> bool:
        """Whether the APIExport VW URL ``upstream`` (``<shard VW URL>/services/apiexport/...``)
        is on one of this replica's shards."""
        for base in self.virtual_workspace_urls:
            prefix = base.rstrip("/")
            if upstream == prefix or upstream.startswith(prefix + "/"):
                return True
        return False

    @property
    def field_manager(self) -> str:
        return FIELD_MANAGER_PREFIX + self.name

    def condition_type(self, type_: str) -> str:
        """The type of condition ``type_`` as this replica set writes it (``<name>/<type>``)."""
        return f"{self.name}/{type_}"


@dataclass(frozen=True, slots=True)
class Owned:
    """What one field manager owns of a slice's status."""

    endpoints: frozenset[str] = frozenset()
    conditions: frozenset[str] = frozenset()


def owned(obj: Mapping[str, Any], manager: str) -> Owned:
    """What ``manager`` owns of ``obj``'s status (its entries for the status subresource)."""
    endpoints: set[str] = set()
    conditions: set[str] = set()
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        if entry.get("manager") != manager or entry.get("subresource") != "status":
            continue
        status = ((entry.get("fieldsV1") or {}).get("f:status")) or {}
        endpoints.update(_keys(status.get("f:endpoints"), "url"))
        conditions.update(_keys(status.get("f:conditions"), "type"))
    return Owned(endpoints=frozenset(endpoints), conditions=frozenset(conditions))


def _keys(fields: Any, key: str) -> list[str]:
    """The ``key`` values of a list map's entries in a ``fieldsV1`` set (``k:{"url":"..."}``)."""
    values = []
    for name in fields or {}:
        if not name.startswith("k:"):
            continue
        try:
            decoded = json.loads(name[2:])
        except ValueError:
            continue
        if isinstance(decoded, dict) and isinstance(decoded.get(key), str):
            values.append(decoded[key])
    return values


def own_part(status: Mapping[str, Any], mine: Owned) -> dict[str, Any]:
    """The part of ``status`` that ``mine`` says one manager owns, shaped like what it applies
    (so that "unchanged" is a plain comparison with its desired part)."""
    part: dict[str, Any] = {}
    if "observedGeneration" in status:
        part["observedGeneration"] = status["observedGeneration"]
    part["conditions"] = [
        c for c in status.get("conditions") or [] if c.get("type") in mine.conditions
    ]
    part["endpoints"] = [e for e in status.get("endpoints") or [] if e.get("url") in mine.endpoints]
    return part


def same_part(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether a manager's owned part equals its desired part, whatever the order of the list
    maps' entries (an apply merges entries of several managers into one list)."""
    return _normal(current) == _normal(wanted)


def _normal(status: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(status)
    out["conditions"] = sorted(status.get("conditions") or [], key=lambda c: str(c.get("type")))
    out["endpoints"] = sorted(status.get("endpoints") or [], key=lambda e: str(e.get("url")))
    return out


def merged(status: Mapping[str, Any], mine: Owned, wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The whole status with one manager's part (``mine``, as it is now) replaced by ``wanted``
    (its desired part; without ``observedGeneration``: the current one stays)."""
    endpoints = list(wanted.get("endpoints") or [])
    urls = {e.get("url") for e in endpoints}
    conditions = list(wanted.get("conditions") or [])
    types = {c.get("type") for c in conditions}
    out: dict[str, Any] = dict(status)
    out["endpoints"] = [
        e
        for e in status.get("endpoints") or []
        if e.get("url") not in mine.endpoints and e.get("url") not in urls
    ] + endpoints
    out["conditions"] = [
        c
        for c in status.get("conditions") or []
        if c.get("type") not in mine.conditions and c.get("type") not in types
    ] + conditions
    if "observedGeneration" in wanted:
        out["observedGeneration"] = wanted["observedGeneration"]
    return out


def scoped_urls(
    urls: Sequence[str], upstreams: Sequence[str], scope: ShardScope | None
) -> list[str]:
    """Of a slice's public ``urls`` (one per upstream, in order), those of upstreams ``scope``
    serves (all without a scope)."""
    if scope is None:
        return list(urls)
    return [url for url, upstream in zip(urls, upstreams, strict=True) if scope.serves(upstream)]
