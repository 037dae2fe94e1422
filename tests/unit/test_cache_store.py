"""The shared cache's store (vwserver.cache.store) against a brute-force replay.

Random histories — a list, then creates, updates, relabels, deletes across clusters and
namespaces and bookmarks, with gaps between resourceVersions (kcp's are a shard's etcd
revisions, shared with everything else on the shard) — are fed to a Store with a small window.
Every state the history passed through is kept by the test; then, for every resourceVersion:

* ``state_at(R)`` equals the replayed state at R, and ``changes_since(R)`` the changes after R;
* both raise Expired exactly when R is older than ``oldest_rv``, and ``oldest_rv`` is the list's
  resourceVersion until the window drops a change, then the dropped change's;
* walking ``page()`` with any limit and filter returns the filtered ``state_at(R)``, also while
  the store keeps changing between pages (a paged LIST is consistent at its first page's rv).

The helpers here build objects the way kcp sends them; test_cache_views.py reuses them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vwserver.cache.entries import Change, ChangeType, Entry, Interner, Key, decode_meta, entry
from vwserver.cache.store import Expired, Store

CLUSTERS = ("c1", "c2")
NAMESPACES = ("a", "b")
NAMES = ("x", "y", "z")
KEYS: list[Key] = [(c, n, m) for c in CLUSTERS for n in NAMESPACES for m in NAMES]
Labels = dict[str, str]


def obj(key: Key, labels: Labels, rv: int, *, spec: int = 0) -> dict[str, Any]:
    cluster, namespace, name = key
    return {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": {
            "annotations": {"kcp.io/cluster": cluster},
            "labels": labels,
            "name": name,
            "namespace": namespace,
            "resourceVersion": str(rv),
            "uid": f"uid-{cluster}-{namespace}-{name}",
        },
        "spec": {"size": spec},
    }


def make(key: Key, labels: Labels, rv: int, *, spec: int = 0) -> Entry:
    return entry(json.dumps(obj(key, labels, rv, spec=spec)).encode())


def rewritten(item: Entry, rv: int) -> Entry:
    """What the apiserver's DELETED carries: the last content at the deletion's rv."""
    doc = json.loads(item.raw)
    doc["metadata"]["resourceVersion"] = str(rv)
    return entry(json.dumps(doc).encode())


# --- random histories ---------------------------------------------------------------------------

labels_strategy = st.fixed_dictionaries(
    {},
    optional={
        "env": st.sampled_from(["prod", "dev"]),
        "region": st.sampled_from(["eu", "us"]),
    },
)
Op = tuple[str, Key, Labels, int]  # ("put" | "delete" | "bookmark", key, labels, rv gap)
ops_strategy = st.lists(
    st.tuples(
        st.sampled_from(["put", "put", "put", "delete", "bookmark"]),
        st.sampled_from(KEYS),
        labels_strategy,
        st.integers(1, 3),
    ),
    max_size=40,
)
initial_strategy = st.dictionaries(st.sampled_from(KEYS), labels_strategy, max_size=8)


@dataclass
class History:
    """A store fed with a history, and the brute-force record of that history."""

    store: Store
    list_rv: int
    states: list[tuple[int, dict[Key, Entry]]] = field(default_factory=list)
    """(rv, state after everything up to rv), one per event or bookmark, in order."""
    changes: list[Change] = field(default_factory=list)
    """Every change the store reported, in order."""
    current: dict[Key, Entry] = field(default_factory=dict)
    rv: int = 0
    spec: int = 0

    def at(self, rv: int) -> dict[Key, Entry]:
        """The replayed state at ``rv``."""
        state: dict[Key, Entry] = {}
        for at_rv, snapshot in self.states:
            if at_rv > rv:
                break
            state = snapshot
        return state

    def step(self, op: Op) -> None:
        what, key, labels, gap = op
        self.rv += gap
        self.spec += 1
        if what == "put":
            new = make(key, labels, self.rv, spec=self.spec)
            kind: ChangeType = "MODIFIED" if key in self.current else "ADDED"
            change = self.store.apply(kind, new)
            assert change is not None and change.new is new and change.type == kind
            assert change.prev is self.current.get(key)
            self.current[key] = new
            self.changes.append(change)
        elif what == "delete":
            prev = self.current.pop(key, None)
            if prev is None:
                self.rv -= gap  # the upstream sends nothing for an object that does not exist
                return
            change = self.store.apply("DELETED", rewritten(prev, self.rv))
            assert change is not None and change.prev is prev and change.new is None
            self.changes.append(change)
        else:
            self.store.bookmark(self.rv)
        assert self.store.rv == self.rv
        self.states.append((self.rv, dict(self.current)))

    def expected_oldest(self) -> int:
        window = self.store.capacity
        if len(self.changes) <= window:
            return self.list_rv
        return self.changes[len(self.changes) - window - 1].rv


def history(initial: dict[Key, Labels], ops: list[Op], *, window: int) -> History:
    store = Store(window=window)
    items = [make(key, labels, rv) for rv, (key, labels) in enumerate(initial.items(), start=2)]
    list_rv = 2 + len(items) + 5
    store.replace(list(reversed(items)), list_rv)  # any order: the store sorts
    h = History(store=store, list_rv=list_rv, rv=list_rv)
    h.current = {item.key: item for item in items}
    h.states.append((list_rv, dict(h.current)))
    for op in ops:
        h.step(op)
    return h


def by_key(
    state: dict[Key, Entry], accept: Callable[[Entry], bool] = lambda e: True
) -> list[Entry]:
    return [state[k] for k in sorted(state) if accept(state[k])]


# --- properties ---------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(initial=initial_strategy, ops=ops_strategy, window=st.integers(1, 12))
def test_state_at_and_changes_since_replay_the_history(
    initial: dict[Key, Labels], ops: list[Op], window: int
) -> None:
    h = history(initial, ops, window=window)
    store = h.store
    assert store.oldest_rv == h.expected_oldest()
    assert store.window_size == min(window, len(h.changes))
    assert store.snapshot() == by_key(h.current)
    assert len(store) == len(h.current)
    assert store.raw_bytes == sum(len(e.raw) for e in h.current.values())
    for rv in range(0, store.rv + 3):
        if rv < store.oldest_rv:
            message = f"too old resource version: {rv} ({store.oldest_rv})"
            with pytest.raises(Expired) as caught:
                store.state_at(rv)
            assert str(caught.value) == message
            with pytest.raises(Expired):
                store.changes_since(rv)
            with pytest.raises(Expired):
                store.page(rv, after=None, limit=1, accept=lambda e: True)
            continue
        assert store.state_at(rv) == by_key(h.at(rv)), rv
        assert store.changes_since(rv) == [c for c in h.changes if c.rv > rv]


@settings(max_examples=300, deadline=None)
@given(
    initial=initial_strategy,
    before=ops_strategy,
    during=ops_strategy,
    window=st.integers(1, 40),
    limit=st.integers(0, 4),
    wanted=st.sampled_from([None, "prod", "dev"]),
    back=st.integers(0, 10),
)
def test_pages_at_a_resource_version_stay_consistent_while_the_store_changes(
    initial: dict[Key, Labels],
    before: list[Op],
    during: list[Op],
    window: int,
    limit: int,
    wanted: str | None,
    back: int,
) -> None:
    h = history(initial, before, window=window)
    store = h.store
    rv = max(store.oldest_rv, store.rv - back)  # a list at a resourceVersion in the window

    def accept(e: Entry) -> bool:
        return wanted is None or e.meta.labels.get("env") == wanted

    expected = by_key(h.at(rv), accept)
    seen: list[Entry] = []
    after: Key | None = None
    pending = list(during)
    while True:
        try:
            items, last = store.page(rv, after=after, limit=limit, accept=accept)
        except Expired:
            assert rv < store.oldest_rv  # the window moved past the list: 410, as etcd does
            return
        assert limit == 0 or len(items) <= limit
        assert after is None or items  # a continue key promises more
        assert all(after is None or e.key > after for e in items)
        seen += items
        if last is None:
            break
        assert last == items[-1].key and len(items) == limit  # only full pages continue
        after = last
        if pending:  # the upstream moves on between two pages
            h.step(pending.pop(0))
    assert seen == expected


def test_page_costs_do_not_grow_with_the_collection() -> None:
    """Paging 100k objects: each page is a binary search plus the entries it examines, and a
    page at an older rv undoes only the changes since then (counted through the filter)."""
    store = Store(window=16)
    keys = [(f"c{i % 7}", f"ns{i % 13}", f"w{i:06d}") for i in range(100_000)]
    store.replace([make(k, {"env": "prod"}, 5) for k in keys], 10)
    store.apply("MODIFIED", make(keys[50_000], {"env": "dev"}, 11))
    calls = 0

    def counting(e: Entry) -> bool:
        nonlocal calls
        calls += 1
        return e.meta.labels.get("env") == "prod"

    ordered = sorted(keys)
    items, last = store.page(10, after=ordered[70_000], limit=500, accept=counting)
    assert [e.key for e in items] == ordered[70_001:70_501]
    assert last == ordered[70_500]
    assert calls == 501  # the 500 on the page and the one that says "more follow"
    calls = 0
    items, last = store.page(10, after=None, limit=0, accept=counting)  # the whole state at 10
    assert calls == 100_000 and len(items) == 100_000
    assert store.get(keys[50_000]) is not None
    assert store.get(keys[50_000]).meta.labels == {"env": "dev"}  # type: ignore[union-attr]
    assert next(e for e in items if e.key == keys[50_000]).meta.labels == {"env": "prod"}


# --- single rules -------------------------------------------------------------------------------


def test_replays_and_stale_events_change_nothing() -> None:
    store = Store()
    a = make(KEYS[0], {}, 5)
    store.replace([a], 10)
    assert store.apply("MODIFIED", make(KEYS[0], {"env": "dev"}, 9)) is None  # before the list
    assert store.apply("ADDED", make(KEYS[1], {}, 10)) is None  # at the list's rv: included
    change = store.apply("MODIFIED", make(KEYS[0], {"env": "prod"}, 12))
    assert change is not None and change.prev is a
    assert store.apply("MODIFIED", make(KEYS[0], {"env": "dev"}, 12)) is None  # replayed
    assert store.get(KEYS[0]) is change.new and store.rv == 12 and store.window_size == 1


def test_an_added_for_a_stored_key_replaces_it_and_a_modified_for_a_new_key_creates_it() -> None:
    store = Store()
    store.replace([make(KEYS[0], {}, 5)], 10)
    replaced = store.apply("ADDED", make(KEYS[0], {"env": "dev"}, 11))
    created = store.apply("MODIFIED", make(KEYS[1], {}, 12))
    assert replaced is not None and replaced.type == "MODIFIED" and replaced.prev is not None
    assert created is not None and created.type == "ADDED" and created.prev is None
    assert [e.key for e in store.snapshot()] == [KEYS[0], KEYS[1]]


def test_deleting_an_unknown_object_advances_the_resource_version_only() -> None:
    store = Store()
    store.replace([], 10)
    assert store.apply("DELETED", make(KEYS[0], {}, 11)) is None
    assert store.rv == 11 and store.window_size == 0 and len(store) == 0


def test_a_relist_starts_the_window_over() -> None:
    store = Store(window=4)
    store.replace([make(KEYS[0], {}, 5)], 10)
    store.apply("MODIFIED", make(KEYS[0], {"env": "dev"}, 11))
    store.replace([make(KEYS[1], {}, 30)], 40)
    assert store.oldest_rv == 40 and store.rv == 40 and store.window_size == 0
    assert [e.key for e in store.state_at(40)] == [KEYS[1]]
    with pytest.raises(Expired):
        store.changes_since(11)
    assert store.changes_since(40) == []


def test_bookmarks_only_advance() -> None:
    store = Store()
    store.replace([], 10)
    store.bookmark(20)
    store.bookmark(15)
    assert store.rv == 20
    assert store.apply("ADDED", make(KEYS[0], {}, 18)) is None  # older than a bookmark: replay


def test_the_window_shares_the_stored_entries() -> None:
    """Memory: a change references the entries the state holds, it copies nothing."""
    store = Store()
    store.replace([], 1)
    first = make(KEYS[0], {}, 2)
    second = make(KEYS[0], {"env": "dev"}, 3)
    c1 = store.apply("ADDED", first)
    c2 = store.apply("MODIFIED", second)
    assert c1 is not None and c2 is not None
    assert c1.new is first and c2.prev is first and c2.new is second
    assert store.get(KEYS[0]) is second


def test_entries_decode_kcp_metadata() -> None:
    raw = json.dumps(obj(("c1", "ns", "w"), {"env": "prod"}, 7)).encode()
    meta = decode_meta(raw)
    assert (meta.cluster, meta.namespace, meta.name, meta.resource_version) == ("c1", "ns", "w", 7)
    assert meta.labels == {"env": "prod"} and meta.finalizers == ()
    page = b'{"items":[' + raw + b"]}"
    item = entry(msgspec.json.decode(page, type=dict[str, list[msgspec.Raw]])["items"][0])
    assert type(item.raw) is bytes and item.raw == raw  # copied out of the page
    assert item.key == ("c1", "ns", "w")


def test_an_interner_shares_repeated_metadata_and_stays_bounded() -> None:
    interner = Interner(limit=4)
    a = entry(json.dumps(obj(KEYS[0], {"env": "prod"}, 3)).encode(), interner=interner)
    b = entry(json.dumps(obj(KEYS[7], {"env": "prod"}, 4)).encode(), interner=interner)
    assert a.meta.labels == b.meta.labels == {"env": "prod"}
    assert a.meta.labels is b.meta.labels  # one dict for every object with these labels
    assert a.meta.namespace is b.meta.namespace and a.meta.cluster == "c1"
    assert entry(a.raw).meta == a.meta  # sharing changes nothing a reader sees
    for i in range(5):  # more distinct label sets than the table may hold: it starts over
        entry(json.dumps(obj(KEYS[1], {"n": str(i)}, 5 + i)).encode(), interner=interner)
        assert len(interner) <= 4


def test_holds_cluster_is_true_only_for_a_cluster_with_a_current_object() -> None:
    """Whether the cache holds any object of a logical cluster (what a named-cluster read from
    the cache needs to know before it answers without asking kcp)."""
    store = Store()
    store.replace([make(("b", "ns", "x"), {}, 5), make(("d", "", "y"), {}, 6)], 6)
    assert [store.holds_cluster(c) for c in ("a", "b", "c", "d", "e", "")] == [
        False,
        True,
        False,
        True,
        False,
        False,
    ]
    store.apply("DELETED", make(("b", "ns", "x"), {}, 7))
    assert not store.holds_cluster("b")
    assert store.holds_cluster("d")
