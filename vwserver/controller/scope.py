"""Shard-scoped replicas: which shards a vwserver replica serves, and which part of a slice's
status is its own — pure, no I/O.

The scale-out model (README, "Sharded kcp"): like kcp's per-shard virtual-workspace servers, one
vwserver Deployment per shard (or set of shards), each serving and publishing only its shards'
endpoints (``controller.shards`` in the config). Several such Deployments write into the same
slice's status, so each one writes with server-side apply under a field manager of its own
(``vwserver-<name>``) and applies only its part:

* its ``status.endpoints`` entries (a list map keyed by ``url`` in the schema, so entries of
  different managers live side by side),
* its conditions, whose types carry the replica set's name as prefix (``<name>/Ready``), so that
  two replica sets never set the same condition to different values (which with ``force`` would
  flip ownership back and forth on every reconcile),
* ``observedGeneration`` (the same value from every manager: no conflict; compared by value,
  as whoever wrote it first may be its only recorded owner).

What a replica owns is read from the slice's ``managedFields`` (the entry of its manager for the
``status`` subresource): a replica compares its desired part with what it owns, so an idle
replica writes nothing, and an entry it no longer wants (its config stopped serving a shard, the
last binding there went) is dropped by the next apply, which leaves out the field.

Kubernetes fact: an apply that lists none of the fields a manager owned removes them (unless
another manager owns them too); ``managedFields[].fieldsV1`` names list-map entries as
``k:{"url":"..."}`` and condition entries as ``k:{"type":"..."}``. kcp fact (v0.32.3, seen in
tests/shards/test_scaleout_shards.py): an apply through the APIExport virtual workspace is
recorded on the shard under the manager's name with ``operation: Update`` (the VW computes the
apply and stores an update), with the apply's field sets — so the entry is found by manager and
subresource, whatever its operation.
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


def apply_body(
    *, api_version: str, kind: str, name: str, status: Mapping[str, Any]
) -> dict[str, Any]:
    """The server-side apply body of a slice's status (only the part one manager owns)."""
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "status": status}


def scoped_urls(
    urls: Sequence[str], upstreams: Sequence[str], scope: ShardScope | None
) -> list[str]:
    """Of a slice's public ``urls`` (one per upstream, in order), those of upstreams ``scope``
    serves (all without a scope)."""
    if scope is None:
        return list(urls)
    return [url for url, upstream in zip(urls, upstreams, strict=True) if scope.serves(upstream)]
