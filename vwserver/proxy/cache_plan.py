"""Which LIST and WATCH requests the shared cache answers, and how — pure, no I/O.

The cache answers the request shapes whose apiserver semantics it reproduces exactly — in every
representation but YAML: objects, PartialObjectMetadata(List) and Tables, all from the same
views — and every other shape keeps the pass-through path, where kcp itself decides (and
validates). That keeps the two paths equal by construction for the odd combinations of options
the apiserver refuses with its own messages, and leaves the cache the shapes informers and
kubectl actually send.

The apiserver's resourceVersion semantics (``k8s.io/apiserver`` storage and cacher):

======================  ======================================================================
LIST                    served
======================  ======================================================================
rv unset                consistent: at least the upstream's current resourceVersion (read
                        cheaply upstream, then the cache waits for its reflector to get there)
rv=0                    any: the cache's current state (a ``limit`` is ignored)
rv=N, NotOlderThan      at least N (the cache waits for N)
rv=N, Exact             exactly N: reconstructed from the window (410 Expired when older)
rv=N, no match          with ``limit``: Exact (legacy paging semantics); else NotOlderThan
continue=<token>        the token's resourceVersion, after the token's key
======================  ======================================================================

======================  ======================================================================
WATCH                   served
======================  ======================================================================
rv unset, rv=0          the cache's current state as ADDED events, then changes
                        (with sendInitialEvents and rv unset: consistent, as a LIST)
rv=N                    changes after N (410 Expired when N left the window; an N the cache
                        has not reached yet is no wait: the changes up to N are skipped)
sendInitialEvents=true  the state as ADDED, a BOOKMARK with ``k8s.io/initial-events-end``,
                        then changes (with resourceVersionMatch=NotOlderThan and bookmarks)
======================  ======================================================================
"""

from __future__ import annotations

import base64
import binascii
import enum
from dataclasses import dataclass

import msgspec

from vwserver.cache.entries import Key
from vwserver.errors import BadRequest
from vwserver.proxy.negotiation import Representation, Shape
from vwserver.proxy.options import Options, parse_bool
from vwserver.proxy.paths import ApiRequest, Verb

# A watch asks for changes after a resourceVersion; a bookmark every minute keeps an informer's
# resume point fresh (the apiserver sends one roughly every minute to watchers that allow them).
BOOKMARK_INTERVAL = 60.0
# The apiserver's default watch lifetime when the client gives no timeoutSeconds is a random
# duration in [minRequestTimeout, 2*minRequestTimeout) with minRequestTimeout=1800 s.
DEFAULT_WATCH_TIMEOUT = 1800
_CONTINUE_VERSION = "vwcache/1"
# metadata.namespace is a field of namespaced resources only, and whether a resource is
# namespaced is kcp's to know (its discovery): such selectors stay with kcp.
_FIELD_KEYS = ("metadata.name",)


class Consistency(enum.Enum):
    ANY = "any"  # rv=0: whatever the cache holds (once synced)
    CONSISTENT = "consistent"  # rv unset: at least the upstream's current resourceVersion
    NOT_OLDER = "not-older"  # at least ``rv``
    EXACT = "exact"  # exactly ``rv``


@dataclass(frozen=True, slots=True)
class ListPlan:
    consistency: Consistency
    rv: int
    """The resourceVersion for NOT_OLDER / EXACT (and a continue token's); else 0."""
    limit: int
    """0: everything."""
    after: Key | None
    """Resume after this key (a continue token)."""


@dataclass(frozen=True, slots=True)
class WatchPlan:
    changes_after: int | None
    """rv=N without sendInitialEvents: only the changes after N. None: the watch starts with the
    state as ADDED events, read as ``consistency`` / ``rv`` say."""
    consistency: Consistency
    rv: int
    initial_events_end: bool
    """sendInitialEvents=true: close the initial events with the initial-events-end bookmark."""
    bookmarks: bool
    timeout: int
    """Seconds until the watch ends cleanly (the client then re-watches)."""


@dataclass(frozen=True, slots=True)
class Continue:
    rv: int
    key: Key
    origin: str = ""
    """The shard id (:func:`vwserver.k8s.kcp.shard_id`) of the upstream whose cache issued the
    token: resourceVersions are per shard (each shard is its own etcd), so a token is good only
    on the endpoint of the shard it came from."""


def encode_continue(token: Continue) -> str:
    doc: dict[str, object] = {"v": _CONTINUE_VERSION, "rv": token.rv, "key": list(token.key)}
    if token.origin:
        doc["o"] = token.origin
    return base64.urlsafe_b64encode(msgspec.json.encode(doc)).decode()


def decode_continue(text: str) -> Continue | None:
    """A token this cache issued, or None (another token: the pass-through path's, kcp's)."""
    try:
        doc = msgspec.json.decode(base64.urlsafe_b64decode(text.encode()))
    except (binascii.Error, ValueError, msgspec.DecodeError):
        return None
    if not isinstance(doc, dict) or doc.get("v") != _CONTINUE_VERSION:
        return None
    rv, key = doc.get("rv"), doc.get("key")
    if not isinstance(rv, int) or rv < 0 or not isinstance(key, list) or len(key) != 3:
        raise BadRequest("continue key is not valid: malformed")
    if not all(isinstance(part, str) for part in key):
        raise BadRequest("continue key is not valid: malformed")
    origin = doc.get("o", "")
    if not isinstance(origin, str):
        raise BadRequest("continue key is not valid: malformed")
    return Continue(rv=rv, key=(key[0], key[1], key[2]), origin=origin)


def cacheable(
    api: ApiRequest, options: Options, representation: Representation, *, wildcard: bool
) -> bool:
    """Whether the cache can answer this request exactly (see the module docstring).
    ``wildcard``: the request addresses ``clusters/*``."""
    if api.verb not in (Verb.LIST, Verb.WATCH) or api.discovery or api.is_apibindings:
        return False
    if wildcard and api.namespace:
        return False  # kcp refuses a namespace across all logical clusters; it says how
    if api.legacy_watch or api.subresource:
        return False
    # Tables come from the cache's Table rows (kcp's cells, vwserver.cache.tables); YAML lists
    # are served by conversion on the other path and stay pass-through.
    shapes = (
        Shape.OBJECT,
        Shape.TABLE,
        Shape.PARTIAL_LIST if api.verb is Verb.LIST else Shape.PARTIAL,
    )
    if representation.yaml or representation.shape not in shapes:
        return False
    fields = options.get("fieldSelector") or ""
    if fields and not _simple_fields(fields):
        return False
    rv = options.get("resourceVersion")
    match = options.get("resourceVersionMatch")
    if rv is not None and rv != "" and not rv.isdigit():
        return False  # not an etcd revision: kcp answers it
    if api.verb is Verb.WATCH:
        return _cacheable_watch(options, rv=rv, match=match)
    if "sendInitialEvents" in options or "allowWatchBookmarks" in options:
        return False
    if match and not rv:
        return False  # the apiserver refuses it; let it say so
    if match == "Exact" and rv == "0":
        return False
    token = options.get("continue")
    if token:
        try:
            ours = decode_continue(token)
        except BadRequest:
            return True  # ours, but damaged: the cache answers the apiserver's 400
        return ours is not None and not rv and not match
    return True


def _cacheable_watch(options: Options, *, rv: str | None, match: str | None) -> bool:
    if "continue" in options or "limit" in options:
        return False
    initial = options.get("sendInitialEvents")
    if initial is None:
        return not match
    wants = parse_bool("sendInitialEvents", initial)
    bookmarks = options.flag("allowWatchBookmarks")
    # The apiserver's validation: sendInitialEvents needs allowWatchBookmarks=true and
    # resourceVersionMatch=NotOlderThan; anything else is its 422 to give.
    return wants and bookmarks and match == "NotOlderThan"


def _simple_fields(text: str) -> bool:
    """Only ``metadata.name`` terms without escapes: the field selector every resource
    supports (anything else: kcp decides)."""
    if "\\" in text:
        return False
    for term in text.split(","):
        for op in ("!=", "==", "="):
            key, found, _ = term.partition(op)
            if found:
                break
        if not found or key.strip() not in _FIELD_KEYS:
            return False
    return True


def list_plan(options: Options, *, origin: str = "") -> ListPlan:
    """The plan of a LIST that :func:`cacheable` accepted; ``origin``: the shard id of the
    upstream the request is for (a continue token of another shard's is a 400)."""
    limit = int(options.get("limit") or 0)
    token = options.get("continue")
    if token:
        resumed = decode_continue(token)
        assert resumed is not None, "cacheable() lets only the cache's own tokens through"
        if resumed.origin != origin:
            # Another shard's resourceVersion and keys: never a page of this shard's list.
            raise BadRequest("continue key is not valid: issued for another shard's endpoint")
        return ListPlan(
            consistency=Consistency.EXACT, rv=resumed.rv, limit=limit, after=resumed.key
        )
    rv = options.get("resourceVersion") or ""
    match = options.get("resourceVersionMatch") or ""
    if not rv:
        return ListPlan(consistency=Consistency.CONSISTENT, rv=0, limit=limit, after=None)
    if rv == "0" and match != "Exact":
        # The watch cache ignores a limit with resourceVersion=0 (cacher.computeListLimit): the
        # whole list, without a continue token (observed on kcp).
        return ListPlan(consistency=Consistency.ANY, rv=0, limit=0, after=None)
    exact = match == "Exact" or (not match and limit > 0)
    return ListPlan(
        consistency=Consistency.EXACT if exact else Consistency.NOT_OLDER,
        rv=int(rv),
        limit=limit,
        after=None,
    )


def watch_plan(options: Options) -> WatchPlan:
    """The plan of a WATCH that :func:`cacheable` accepted."""
    rv = options.get("resourceVersion") or ""
    if not rv and options.flag("sendInitialEvents"):
        # watch-list from "now": the apiserver waits until its cache is fresh (proxy.cached.
        # ready: briefly, then from the cache's state as it is).
        changes_after, consistency, at = None, Consistency.CONSISTENT, 0
    elif not rv or rv == "0":
        # A plain watch without a resourceVersion starts from the watch cache's state as it
        # is, like rv=0 (the apiserver serves it from its cache unless the
        # WatchFromStorageWithoutResourceVersion feature, off by default, is on).
        changes_after, consistency, at = None, Consistency.ANY, 0
    elif options.flag("sendInitialEvents"):  # the state at a resourceVersion not older than N
        changes_after, consistency, at = None, Consistency.NOT_OLDER, int(rv)
    else:
        # Changes after N need no wait for the cache to reach N: its subscriptions skip
        # changes and bookmarks at or before their start, so a watch from a resourceVersion a
        # LIST from kcp returned (newer than the cache) starts where the cache gets there —
        # from the cache, whose views show objects leaving a slice.
        changes_after, consistency, at = int(rv), Consistency.ANY, int(rv)
    return WatchPlan(
        changes_after=changes_after,
        consistency=consistency,
        rv=at,
        initial_events_end=options.flag("sendInitialEvents"),
        bookmarks=options.flag("allowWatchBookmarks"),
        timeout=int(options.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT),
    )
