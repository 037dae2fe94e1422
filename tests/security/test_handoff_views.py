"""What a slice's clients see of an object moving between slices, over every read path's pure
decision — the class behind #22 findings 14-16: *the holding slice sees a graceful deletion,
for every client filter, in every read path; no other slice sees the object meanwhile*.

Random objects (labels now and before a move of the slice's own label, the other labels kept;
holds recorded or not, with or without ``leavingLabels``, by the slice or by its peer) and
random client label selectors — on the slice's label, on other labels, set-based, negated —
are judged by the shared cache's views (:func:`vwserver.cache.views.accepts`, what LIST pages
and watch transitions use) and by the path kcp answers (kcp asked with
:func:`vwserver.holds.leaving_safe` of the client's selector, then
:meth:`vwserver.proxy.filtering.Page.members`). Checked:

* both paths take exactly the same objects, and show them the same way (being deleted or not);
* an object the slice holds and is letting go of is shown to every client whose selector took
  it before the move, being deleted (never missing while the slice's finalizer is on it);
* an object outside the slice's selector is never shown to its clients without a deletion;
* no slice that does not hold it sees an object its holder is letting go of.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.holds_model import slice_members
from vwserver.cache.entries import entry
from vwserver.cache.views import ClientFilter, accepts, leaving, visible
from vwserver.holds import HOLDS_ANNOTATION, as_leaving, leaving_safe
from vwserver.proxy.filtering import decode_page
from vwserver.selector import Selector

SLICE, PEER = "ws/prod", "ws/dev"
SELECTORS = {SLICE: Selector.parse("env=prod"), PEER: Selector.parse("env=dev")}
CLIENTS = [
    "",
    "env=prod",
    "env=prod,app=w",
    "app=w",
    "app!=w",
    "env in (prod,dev)",
    "env!=dev",
    "env",
    "!env",
    "env notin (staging)",
]


member = slice_members(SELECTORS)


def item(labels: dict[str, str], holds: dict[str, Any] | None, finalizers: list[str]) -> bytes:
    annotations = {"kcp.io/cluster": "c1"}
    if holds is not None:
        annotations[HOLDS_ANNOTATION] = json.dumps(holds)
    metadata: dict[str, Any] = {
        "name": "moving",
        "namespace": "ns",
        "resourceVersion": "7",
        "labels": labels,
        "annotations": annotations,
    }
    if finalizers:
        metadata["finalizers"] = finalizers
    return json.dumps(
        {"apiVersion": "example.io/v1", "kind": "Widget", "metadata": metadata}
    ).encode()


holders = st.sampled_from(["none", "slice", "slice-recorded", "slice-recorded-legacy", "peer"])


@settings(max_examples=300, deadline=None)
@given(
    app=st.sampled_from([None, "w", "v"]),
    env_now=st.sampled_from([None, "prod", "dev", "staging"]),
    holder=holders,
    client_text=st.sampled_from(CLIENTS),
)
def test_both_read_paths_show_a_leaving_object_to_every_client_that_had_it(
    app: str | None, env_now: str | None, holder: str, client_text: str
) -> None:
    other = {"app": app} if app else {}
    before = {"env": "prod", **other}
    now = {**({"env": env_now} if env_now else {}), **other}
    holds: dict[str, Any] | None = None
    finalizers: list[str] = []
    if holder != "none":
        sid = PEER if holder == "peer" else SLICE
        hold: dict[str, Any] = {"finalizers": ["f"]}
        if holder.startswith("slice-recorded"):
            hold["leavingSince"] = "2026-12-01T12:00:00Z"
            if holder == "slice-recorded":
                hold["leavingLabels"] = before
        holds, finalizers = {sid: hold}, ["f"]
    raw = item(now, holds, finalizers)
    client = Selector.parse(client_text)
    view = member(SLICE)

    # the shared cache's views
    cached = entry(raw)
    taken = accepts(view, ClientFilter(labels=client))(cached)
    since = leaving(view, cached.meta)
    cache_shown = (
        (as_leaving(cached.raw, since, now=lambda: "now") if since is not None else raw)
        if taken
        else None
    )

    # the path kcp answers: kcp filters by the pushable part of the client's selector
    page_body = b'{"kind":"WidgetList","apiVersion":"example.io/v1","metadata":{},"items":['
    pushed = leaving_safe(client, slice_selector=SELECTORS[SLICE])
    page_body += (raw if pushed.matches(now) else b"") + b"]}"
    members = decode_page(page_body).members(view, client)
    assert len(members) <= 1
    kcp_shown = bytes(members[0]) if members else None

    assert (cache_shown is None) == (kcp_shown is None), (cache_shown, kcp_shown)
    for shown in (cache_shown, kcp_shown):
        if shown is None:
            continue
        meta = json.loads(shown)["metadata"]
        if not SELECTORS[SLICE].matches(meta.get("labels")):
            assert meta.get("deletionTimestamp"), f"outside the slice without a deletion: {meta}"
    if cache_shown is not None and kcp_shown is not None:
        a, b = json.loads(cache_shown)["metadata"], json.loads(kcp_shown)["metadata"]
        assert bool(a.get("deletionTimestamp")) == bool(b.get("deletionTimestamp"))

    letting_go = holder.startswith("slice") and (
        holder != "slice" or not SELECTORS[SLICE].matches(now)
    )
    if letting_go and client.matches(before):
        assert taken, f"a client of the holding slice lost the object: {client_text} {now}"
        assert cache_shown is not None and json.loads(cache_shown)["metadata"]["deletionTimestamp"]
    if letting_go or (holder == "peer" and not SELECTORS[PEER].matches(now)):
        other_slice = PEER if holder != "peer" else SLICE
        assert not visible(member(other_slice), cached.meta)
