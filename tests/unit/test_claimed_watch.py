"""A claimed resource's watch from the cache (vwserver.proxy.cached_claimed.ClaimedWatch) and
the reference index's history (vwserver.cache.related_index.History) — pure, no I/O.

The property tests run random reference graphs against a model of the cache: Secrets created,
relabelled and deleted (the resource's changes), referencing objects that start and stop naming
them or leave the slice (the index's transitions), and a watch that takes these items in the
fan-out's order, at random moments. Whatever the interleaving:

* the client's state (the watch's events applied in order) ends as the slice's visible set —
  a Secret is visible iff a visible object names it or it matches the selector rule;
* an ADDED or MODIFIED carries a version visible through the slice when it is sent, a DELETED
  names only an object the client holds, never an ADDED of one it holds (no existence oracle,
  and an informer's store stays consistent);
* a watch from a resourceVersion (a LIST, changes, then the WATCH) catches up from the window's
  changes and the index's history to the same visible set, and its DELETED events name only
  objects that were visible at some point since (its ADDED may name an object the client
  holds: its state is not known — client-go's informer takes that as an update).
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.related_rules import MONGO, SECRET_RULES, SECRETS
from vwserver.cache.entries import Change, Entry, Key, entry
from vwserver.cache.related_index import History
from vwserver.cache.views import ClientFilter
from vwserver.holds import Member
from vwserver.proxy.cached_claimed import ClaimedWatch, Event
from vwserver.related import (
    ClaimedView,
    ReferenceIndex,
    ReferrerKey,
    Transition,
    parse_rules,
    references_of,
)
from vwserver.selector import Selector

RULES = parse_rules(SECRET_RULES)
NAMESPACES = ("a", "b")
NAMES = ("s1", "s2", "s3")
REFERRERS = ("db1", "db2")


def secret(ns: str, name: str, rv: int, region: str | None) -> Entry:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "resourceVersion": str(rv),
        "annotations": {"kcp.io/cluster": "c"},
    }
    if region:
        meta["labels"] = {"region": region}
    return entry(json.dumps({"kind": "Secret", "metadata": meta}).encode())


class Model:
    """The cache's store of Secrets and the slice's index, and the items a watch's
    subscription and listener would get, in the fan-out's order."""

    def __init__(self) -> None:
        self.index = ReferenceIndex()
        self.store: dict[Key, Entry] = {}
        self.rv = 1
        self.view = Member(
            selector=Selector(),
            id="c/eu",
            claimed=ClaimedView(SECRETS, RULES.for_claim(*SECRETS), index=self.index, cluster="c"),
        )
        self.changes: list[Change] = []
        self.history = History()

    def visible(self, item: Entry) -> bool:
        assert self.view.claimed is not None
        return self.view.claimed.sees(item.key, item.meta.labels)

    def visible_now(self) -> set[Key]:
        return {k for k, e in self.store.items() if self.visible(e)}

    def secret_op(self, ns: str, name: str, region: str | None, delete: bool) -> Change | None:
        key = ("c", ns, name)
        prev = self.store.get(key)
        self.rv += 1
        if delete:
            if prev is None:
                return None
            del self.store[key]
            gone = secret(ns, name, self.rv, prev.meta.labels.get("region"))
            change = Change("DELETED", self.rv, prev, None, deleted=gone)
        else:
            new = self.store[key] = secret(ns, name, self.rv, region)
            change = Change("MODIFIED" if prev else "ADDED", self.rv, prev, new)
        self.changes.append(change)
        return change

    def ref_op(
        self, ns: str, referrer: str, shown: bool, names: frozenset[str]
    ) -> list[Transition]:
        obj = {"spec": {"users": [{"secret": n} for n in sorted(names)]}}
        refs = references_of(RULES, group=MONGO[0], resource=MONGO[1], obj=obj) if shown else {}
        self.rv += 1
        key: ReferrerKey = (*MONGO, "c", ns, referrer)
        out = self.index.update(key, refs)
        self.history.add(out, rv=self.rv)
        return out


class Client:
    """An informer's store, fed the watch's events; checks each event as it arrives."""

    def __init__(self, model: Model, held: set[Key]) -> None:
        self.model = model
        self.state = set(held)

    def apply(self, events: list[Event], *, may_delete: set[Key] | None = None) -> None:
        for kind, item, _ in events:
            key = item.key
            if kind == "DELETED":
                if may_delete is None:
                    assert key in self.state, ("DELETED of an object the client lacks", key)
                else:
                    assert key in may_delete, ("DELETED of an object never visible", key)
                self.state.discard(key)
            else:
                assert self.model.visible(item), (kind, "of an invisible version", key)
                if may_delete is None:
                    assert (key in self.state) == (kind == "MODIFIED"), (kind, key)
                else:  # catching up, the client's state unknown: ADDED (an informer updates)
                    assert kind == "ADDED", (kind, key)
                self.state.add(key)


secret_ops = st.tuples(
    st.just("secret"),
    st.sampled_from(NAMESPACES),
    st.sampled_from(NAMES),
    st.sampled_from(("eu", "us", None)),
    st.booleans(),
)
ref_ops = st.tuples(
    st.just("ref"),
    st.sampled_from(NAMESPACES),
    st.sampled_from(REFERRERS),
    st.booleans(),
    st.frozensets(st.sampled_from(NAMES), max_size=2),
)
consume_ops = st.tuples(st.just("consume"), st.integers(min_value=1, max_value=4))
ops = st.lists(st.one_of(secret_ops, ref_ops, consume_ops), max_size=60)


def run(model: Model, watch: ClaimedWatch, client: Client, plan: list[tuple[Any, ...]]) -> None:
    """``plan`` against the model; the watch takes its queued items at the ``consume``
    steps (and everything at the end). Items are queued as the fan-out orders them: a
    transition after every change queued before it."""
    queue: deque[Change | tuple[Key, Entry | None]] = deque()
    for op in plan:
        if op[0] == "secret":
            change = model.secret_op(op[1], op[2], op[3], op[4])
            if change is not None:
                queue.append(change)
        elif op[0] == "ref":
            transitions = model.ref_op(op[1], op[2], op[3], op[4])
            queue.extend((t.key, model.store.get(t.key)) for t in transitions)
        else:
            for _ in range(min(op[1], len(queue))):
                take(watch, client, queue.popleft())
    while queue:
        take(watch, client, queue.popleft())


def take(watch: ClaimedWatch, client: Client, item: Change | tuple[Key, Entry | None]) -> None:
    client.apply(watch.change(item) if isinstance(item, Change) else watch.transition(*item))


def start(model: Model, client_filter: ClientFilter) -> tuple[ClaimedWatch, Client]:
    held = {k for k in model.visible_now() if client_filter.matches(model.store[k].meta)}
    watch = ClaimedWatch(model.store.get, view=model.view, client=client_filter, held=held)
    return watch, Client(model, held)


@settings(max_examples=400, deadline=None)
@given(ops, ops, st.sampled_from((None, "a")))
def test_a_watch_ends_at_the_visible_set_whatever_the_interleaving(
    before: list[tuple[Any, ...]], during: list[tuple[Any, ...]], namespace: str | None
) -> None:
    model = Model()
    run(model, *start(model, ClientFilter()), before)  # a state to start from
    client_filter = ClientFilter(cluster="c", namespace=namespace)
    watch, client = start(model, client_filter)
    run(model, watch, client, during)
    want = {k for k in model.visible_now() if namespace is None or k[1] == namespace}
    assert client.state == want
    assert watch.held == want


@settings(max_examples=400, deadline=None)
@given(ops, ops)
def test_a_watch_from_a_list_catches_up_with_what_happened_since(
    before: list[tuple[Any, ...]], between: list[tuple[Any, ...]]
) -> None:
    """LIST at rv (the client's state), then changes and reference changes, then the WATCH
    from rv: it starts from the window's changes and the history's transitions since the
    LIST and reaches the visible set; a DELETED only for an object visible at some point."""
    model = Model()
    run(model, *start(model, ClientFilter()), before)
    listed_at, listed_seq = model.rv, model.history.seq
    model.history.listed(lowest=listed_at, highest=listed_at, seq=listed_seq)
    client = Client(model, model.visible_now())
    ever: set[Key] = set(client.state)
    window_start = len(model.changes)
    shadow, _ = start(model, ClientFilter())
    for op in between:  # what happens between the LIST and the WATCH; nobody watches
        if op[0] == "secret":
            model.secret_op(op[1], op[2], op[3], op[4])
        elif op[0] == "ref":
            model.ref_op(op[1], op[2], op[3], op[4])
        ever |= model.visible_now()
    missed = model.history.since(listed_at)
    assert missed is not None
    watch, _ = start(model, ClientFilter())
    events = watch.catch_up(model.changes[window_start:], missed, claim=SECRETS)
    client.apply(events, may_delete=ever)
    assert client.state == model.visible_now() == watch.held
    del shadow


def test_history_replays_after_the_lists_position() -> None:
    history = History(size=4)
    t = [Transition(SECRETS, ("c", "a", f"s{i}"), visible=True) for i in range(6)]
    history.add(t[:2], rv=10)
    history.listed(lowest=10, highest=12, seq=history.seq)
    history.add(t[2:3], rv=11)  # a change at rv 11 the LIST at 10-12 did not see yet
    assert history.since(11) == [t[2]]  # by the LIST's position, not by rv
    assert history.since(10) == [t[2]]
    assert history.since(9) == t[:3]  # 9 is no LIST's: by rv, those caused after it
    history.add(t[3:6], rv=20)  # 6 transitions, 4 kept: those of seq 1-2 forgotten
    assert history.since(11) == t[2:6]  # the LIST's position (2) is still covered
    assert history.since(5) is None  # what came after rv 5 is partly forgotten: 410
    assert history.since(20) == []
    history.add(t[:1], rv=21)  # seq 3 forgotten now
    assert history.since(11) is None
