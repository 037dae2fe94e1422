"""Where an upstream object lives downstream, and how the downstream copy points back — pure.

Two consumer workspaces may both have ``default/orders-db`` (the MongoDB example synced both into
one downstream namespace, and the second overwrote the first). Every (logical cluster, namespace)
pair therefore gets its own downstream namespace, named deterministically so that a restarted or
second replica of the syncer finds the same one::

    <prefix><cluster>-<namespace, shortened>-<10 base32 chars of sha256(cluster, namespace)>

The readable part helps humans; the digest (50 bits) makes the name unique. Because a digest is
not a proof, the namespace also carries the source as annotations and the controller refuses a
namespace whose annotations name another source (:func:`namespace_conflict`).

Downstream objects carry labels (short, selectable: syncer name, logical cluster, uid) and
annotations (complete: cluster, namespace, name, uid, syncer) that link them to their source.
Only an object whose labels say this syncer owns it is ever deleted by it.

Upstream, a syncer marks every object it syncs with its finalizer
``sync.edge-connect.eu/syncer-<name>``, written under its field manager (:func:`field_manager`).
That finalizer is also its claim on the object when several syncers see it
(:func:`finalizer_owner`): the only mark every syncer can read on the kcp object itself, set
before anything is created downstream — a claim only where ``managedFields`` say the syncer
wrote it, not where a consumer wrote the name.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from vwserver.k8s.kcp import SLICES, logical_cluster

GROUP = SLICES.group

LABEL_SYNCER = f"{GROUP}/syncer"
LABEL_CLUSTER = f"{GROUP}/cluster"
LABEL_UID = f"{GROUP}/uid"
LABEL_MANAGED = f"{GROUP}/managed"
#: On a related object's copy: which ``related[]`` entry made it (:mod:`~vwserver.syncer.
#: related_spec`'s ``label``); with :data:`LABEL_SYNCER` it selects one entry's copies.
LABEL_RELATED = f"{GROUP}/related"

ANN_CLUSTER = f"{GROUP}/cluster"
ANN_NAMESPACE = f"{GROUP}/namespace"
ANN_NAME = f"{GROUP}/name"
ANN_UID = f"{GROUP}/uid"
ANN_SYNCER = f"{GROUP}/syncer"
#: Digest of what the syncer last applied; a changed intent is applied even if the downstream
#: object happens to contain every desired field (removals, see sync_plan.needs_apply).
ANN_APPLIED = f"{GROUP}/applied"
#: On a related object's copy: ``<namespace>/<name>`` of the object it copies, on the origin
#: side (no :data:`ANN_NAME`: a copy of a related object is never taken for a primary's copy).
ANN_SOURCE = f"{GROUP}/source"

# Label and annotation keys that must never travel downstream: kcp's own (kcp.io/cluster,
# apis.kcp.io/..., the claimed-label keys ``claimed.internal.apis.kcp.io/<hash>``, tenancy),
# our own link keys (a consumer must not be able to forge ownership) and client bookkeeping.
_INTERNAL_DOMAIN = re.compile(r"(^|\.)kcp\.io$")
_ALWAYS_EXCLUDED_PREFIXES = (f"{GROUP}/", "kubectl.kubernetes.io/last-applied-configuration")

MAX_NAMESPACE = 63
_DIGEST_CHARS = 10


class ObjectKey(NamedTuple):
    """An upstream object: logical cluster, namespace ("" if cluster-scoped), name."""

    cluster: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.cluster}/{self.namespace}/{self.name}"


#: Every syncer's finalizer starts so; the rest is the syncer's name.
FINALIZER_PREFIX = f"{GROUP}/syncer-"


def finalizer(syncer: str) -> str:
    return f"{FINALIZER_PREFIX}{syncer}"


def field_manager(syncer: str) -> str:
    """The field manager of every write syncer ``syncer`` makes (server-side apply downstream,
    its finalizer upstream): what ``managedFields`` names as the author of those fields."""
    return f"vwserver-syncer-{syncer}"


def finalizer_owner(
    finalizers: Iterable[str], *, managed_fields: Iterable[Mapping[str, Any]] | None
) -> str | None:
    """The syncer that owns an upstream object: the one whose *claimed* finalizer comes first
    in ``metadata.finalizers``; None if no syncer's finalizer there is claimed.

    Claimed: ``managedFields`` says the syncer's own field manager (:func:`field_manager`)
    added the finalizer — the ``v:"<finalizer>"`` member of ``f:metadata.f:finalizers`` in an
    entry of that manager on the object itself (not a subresource). A finalizer a consumer put
    there (``kubectl edit``, a patch under any other manager) is no claim: a tenant cannot make
    a syncer stand back, or raise the provider's "contested" alarm, by writing two syncers'
    finalizer names. (The manager name is the author's own word: a consumer who writes with
    ``--field-manager vwserver-syncer-<name>`` on purpose still can; what he then disturbs is
    his own object.)

    Why first: the apiserver keeps the list in the order written, and a syncer only ever appends
    its finalizer with a write conditional on the resourceVersion it read, so the first claimed
    syncer finalizer is the claim that was made first — of two syncers racing for a new object,
    exactly one write succeeds and the other sees the winner's finalizer when it looks again.
    Every syncer reads the same list and the same ``managedFields``, so all of them agree
    without talking to each other.
    """
    claims = finalizer_claims(managed_fields)
    for name in finalizers:
        if name.startswith(FINALIZER_PREFIX) and len(name) > len(FINALIZER_PREFIX):
            syncer = name[len(FINALIZER_PREFIX) :]
            if name in claims.get(field_manager(syncer), ()):
                return syncer
    return None


def finalizer_claims(managed_fields: Iterable[Mapping[str, Any]] | None) -> dict[str, set[str]]:
    """Per field manager, the finalizers ``managedFields`` says it owns on the object itself
    (entries of a subresource, e.g. ``status``, cannot own finalizers and are skipped)."""
    claims: dict[str, set[str]] = {}
    for entry in managed_fields or ():
        if entry.get("subresource") or not isinstance(entry.get("manager"), str):
            continue
        fields = entry.get("fieldsV1") or {}
        owned = ((fields.get("f:metadata") or {}) if isinstance(fields, dict) else {}).get(
            "f:finalizers"
        )
        if not isinstance(owned, dict):
            continue
        for member in owned:
            # a member of a set-valued list is keyed by its value as JSON: v:"<finalizer>"
            if member.startswith('v:"') and member.endswith('"'):
                claims.setdefault(entry["manager"], set()).add(member[3:-1])
    return claims


def downstream_namespace(cluster: str, namespace: str, *, prefix: str = "") -> str:
    """The downstream namespace of (``cluster``, ``namespace``): ≤ 63 chars, a DNS label."""
    digest = hashlib.sha256(f"{cluster}\x00{namespace}".encode()).digest()
    tail = base64.b32encode(digest).decode().lower()[:_DIGEST_CHARS]
    readable = re.sub(r"[^a-z0-9-]", "-", f"{cluster}-{namespace}".lower())
    room = MAX_NAMESPACE - len(prefix) - 1 - _DIGEST_CHARS
    readable = readable[:room].strip("-")
    return f"{prefix}{readable}-{tail}" if readable else f"{prefix}{tail}"


def is_internal_key(key: str, *, extra_prefixes: Iterable[str] = ()) -> bool:
    """Whether a label/annotation key is kcp-internal or the syncer's own (never copied)."""
    domain, slash, _ = key.partition("/")
    if slash and _INTERNAL_DOMAIN.search(domain):
        return True
    return key.startswith((*_ALWAYS_EXCLUDED_PREFIXES, *extra_prefixes))


def user_metadata(
    values: Mapping[str, str] | None, *, extra_prefixes: Iterable[str] = ()
) -> dict[str, str]:
    """The labels or annotations of an upstream object that may be copied downstream."""
    prefixes = tuple(extra_prefixes)
    return {
        k: v for k, v in (values or {}).items() if not is_internal_key(k, extra_prefixes=prefixes)
    }


def link_labels(key: ObjectKey, *, uid: str, syncer: str) -> dict[str, str]:
    # Logical-cluster IDs and uids are valid label values (≤ 63 chars, alphanumerics and '-').
    return {LABEL_SYNCER: syncer, LABEL_CLUSTER: key.cluster, LABEL_UID: uid}


def link_annotations(key: ObjectKey, *, uid: str, syncer: str) -> dict[str, str]:
    return {
        ANN_CLUSTER: key.cluster,
        ANN_NAMESPACE: key.namespace,
        ANN_NAME: key.name,
        ANN_UID: uid,
        ANN_SYNCER: syncer,
    }


def namespace_metadata(cluster: str, namespace: str) -> dict[str, Any]:
    """Labels and annotations of a downstream namespace (shared by every syncer using it)."""
    return {
        "labels": {LABEL_MANAGED: "true", LABEL_CLUSTER: cluster},
        "annotations": {ANN_CLUSTER: cluster, ANN_NAMESPACE: namespace},
    }


def namespace_conflict(ns: Mapping[str, Any], *, cluster: str, namespace: str) -> str | None:
    """Why an existing downstream namespace may not hold objects of (cluster, namespace)."""
    annotations = (ns.get("metadata") or {}).get("annotations") or {}
    source = (annotations.get(ANN_CLUSTER), annotations.get(ANN_NAMESPACE))
    if source == (cluster, namespace):
        return None
    name = (ns.get("metadata") or {}).get("name", "")
    if source == (None, None):
        return f"namespace {name} exists and was not created by a syncer"
    return f"namespace {name} belongs to {source[0]}/{source[1]}, not {cluster}/{namespace}"


def source_key(obj: Mapping[str, Any]) -> ObjectKey | None:
    """The upstream object a downstream object was synced from, from its annotations."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    cluster, name = annotations.get(ANN_CLUSTER), annotations.get(ANN_NAME)
    if not cluster or not name:
        return None
    return ObjectKey(cluster, annotations.get(ANN_NAMESPACE, ""), name)


def owned_by(obj: Mapping[str, Any], syncer: str) -> bool:
    """Whether this syncer owns a downstream object (its labels say so)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_SYNCER) == syncer


def upstream_key(obj: Mapping[str, Any]) -> ObjectKey | None:
    """The key of an object read from kcp (``kcp.io/cluster`` annotation, namespace, name)."""
    meta = obj.get("metadata") or {}
    cluster = logical_cluster(obj)
    if not cluster or not meta.get("name"):
        return None
    return ObjectKey(cluster, meta.get("namespace", ""), meta["name"])
