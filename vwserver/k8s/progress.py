"""Progress on demand: when a list+watch loop must learn quickly how far the server has got.

A consistent read served from a watch cache needs the cache's own stream to reach the server's
current resourceVersion X (:mod:`vwserver.proxy.cached`). On kcp X is the shard's etcd revision:
writes to every other resource move it without an event on this resource's stream, which then
reaches X only with a BOOKMARK. This module decides, purely from the time, when the loop's
watches are made short so that the server sends that bookmark within seconds instead of a
minute; :class:`~vwserver.k8s.reflector.RawReflector` does the I/O.

kcp facts (v0.32.3, its apiserver's watch cache, ``k8s.io/apiserver/pkg/storage/cacher``;
measured by ``scripts/kcp/freshness_signals.py``, relied on by
tests/e2e/test_consistent_list_kcp.py):

* A watch with ``allowWatchBookmarks=true`` and ``timeoutSeconds=N`` is sent one BOOKMARK
  2 s before its deadline (``cacheWatcher.nextBookmarkTime``), by the cacher's bookmark timer
  that ticks every 1 s ± 25 %: with N = 3 it arrives 1-2.3 s after the watch started. With
  N <= 2 the pre-deadline moment has passed when the watch is registered: none. Otherwise
  bookmarks come about once a minute.
* The bookmark carries the watch cache's resourceVersion at that moment, and is sent only when
  that is beyond the watch's starting resourceVersion (a watch from the current resourceVersion
  of an idle shard gets none, and just ends at N s). It travels the watcher's own ordered
  channel: every event of the resource up to its resourceVersion was sent before it.
* The watch cache follows the shard's revision beyond the resource's own events when asked:
  a consistent LIST (no resourceVersion; the one-item LIST that reads X) makes the cacher ask
  etcd for a progress notification and wait for it, so after it the watch cache — and the next
  pre-deadline bookmark — is at X at least.
* Nothing quicker reaches the loop's own stream: ``sendInitialEvents=false`` is an ordinary
  watch (no bookmark until the pre-deadline one), ``resourceVersionMatch`` is refused on a watch
  without ``sendInitialEvents=true``, and ``sendInitialEvents=true`` sends the whole state before
  its bookmark — a full list. Another watch's bookmark is not ordered with this stream.

So: once a reader found the server ahead of the stream (:meth:`~vwserver.k8s.reflector.
RawReflector.want_progress`), the loop's watches ask for :data:`PROGRESS_TIMEOUT` seconds
during :data:`PROGRESS_WINDOW` seconds — a long watch running then is cut and resumed from its
last resourceVersion (nothing lost, nothing replayed) — and each of them brings a bookmark at
the server's revision as of the last consistent read. A loop nobody asks stays on long
watches: it costs the server one watch per :data:`PROGRESS_TIMEOUT` seconds only while readers
need it.
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
