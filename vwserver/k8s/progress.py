"""Progress on demand: when a list+watch loop must learn quickly how far the server has got.

A consistent read served from a watch cache needs the cache's own stream to reach the server's
current resourceVersion X (:mod:`vwserver.proxy.cached`). On kcp X is the shard's etcd revision:
writes to every other resource move it without an event on this resource's stream, which then
reaches X only with a BOOKMARK. This module decides, purely from the time, when the loop's
watches are made short so that the server sends that bookmark within seconds instead of a
minute; :class:`~vwserver.k8s.reflector.RawReflector` does the I/O.

kcp facts (v0.32.3, its apiserver's watch cache, ``k8s.io/apiserver/pkg/storage/cacher``;
measured on kcp's APIExport VW, ``clusters/*``, with ``FRESHNESS_ONLY=bookmarks
scripts/kcp/freshness_signals.py``: a watch from the resourceVersion of before three ConfigMap
writes in another workspace; relied on by tests/e2e/test_consistent_list_kcp.py):

* A watch with ``allowWatchBookmarks=true`` and ``timeoutSeconds=N`` is sent a BOOKMARK 2 s
  before its deadline (``cacheWatcher.nextBookmarkTime``), by the cacher's bookmark timer that
  ticks every 1 s ± 25 %: N = 3 got it 0.9-1.6 s after the request (once a second one at
  2.0 s), N = 6 at 3.6-4.2 s; N = 1 and N = 2 got none (the pre-deadline moment has passed
  when the watch is registered) — the stream just ends at N s. Otherwise bookmarks come about
  once a minute.
* That bookmark carries the watch cache's resourceVersion, and only when it is beyond the
  watch's starting one: after the writes and a consistent one-item LIST that read X, the
  bookmark was at exactly X every time; without that LIST it never came (the stream ended at
  N s) — writes to other resources do not move this resource's watch cache, a consistent LIST
  of it does (the cacher asks etcd for a progress notification and waits for it: the ~90 ms a
  consistent read may wait after another resource's write). It travels the watcher's own
  ordered channel: every event of the resource up to its resourceVersion was sent before it.
* Nothing quicker reaches the loop's own stream: ``sendInitialEvents=false`` is refused (422)
  without ``resourceVersionMatch=NotOlderThan`` and with it is an ordinary watch (its bookmark
  came 2 s before the deadline too); ``resourceVersionMatch`` without ``sendInitialEvents`` is
  refused on a watch (422, "resourceVersionMatch is forbidden for watch unless
  sendInitialEvents is provided"); ``sendInitialEvents=true`` sends the whole state before its
  bookmark — a full list. Another watch's bookmark is not ordered with this stream.

So: once a reader found the server ahead of the stream (:meth:`~vwserver.k8s.reflector.
RawReflector.want_progress`), the loop's watches ask for :data:`PROGRESS_TIMEOUT` seconds
during :data:`PROGRESS_WINDOW` seconds — a long watch running then is cut and resumed from its
last resourceVersion (nothing lost, nothing replayed) — and each of them brings a bookmark at
the server's revision as of the last consistent read. A loop nobody asks stays on long
watches: it costs the server one watch per :data:`PROGRESS_TIMEOUT` seconds only while readers
need it. The bookmark is at the revision of the last consistent read of the resource — the
reader's own one-item LIST, or kcp's answer to the read that fell back — so a reader after it
is proven unless the shard wrote something since.
"""

from __future__ import annotations

from typing import Final

PROGRESS_TIMEOUT: Final = 3
"""``timeoutSeconds`` of a watch that must bring a bookmark soon: the shortest the server
sends a pre-deadline bookmark to (its deadline minus 2 s must still be ahead when it is
registered)."""

PROGRESS_WINDOW: Final = 60.0
"""Seconds after the last demand during which watches are short."""

NEVER: Final = float("-inf")


def demand(until: float, *, now: float, window: float = PROGRESS_WINDOW) -> float:
    """Until when watches are short after a reader asked for progress at ``now``."""
    return max(until, now + window)


def watch_timeout(*, now: float, until: float, long_timeout: int) -> int:
    """The next watch's ``timeoutSeconds``: short while progress is wanted, else the loop's own
    (jittered) ``long_timeout``, whichever is shorter."""
    if now < until:
        return min(PROGRESS_TIMEOUT, long_timeout)
    return long_timeout


def cut(*, now: float, until: float, watch_ends: float | None) -> bool:
    """Whether the running watch (server deadline at ``watch_ends``; None: none runs) is to be
    ended now and resumed as a short one: progress is wanted and its own pre-deadline bookmark
    is further away than a new short watch's."""
    if watch_ends is None or now >= until:
        return False
    return watch_ends > now + PROGRESS_TIMEOUT


def ended_early(*, lasted: float, timeout: int) -> bool:
    """Whether a watch that delivered nothing ended before half its ``timeoutSeconds``: a server
    that closes every watch at once (the loop backs off), not one whose deadline came on a
    quiet resource (the loop watches again at once)."""
    return lasted < timeout / 2
