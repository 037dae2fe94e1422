"""Watch streams are newline-delimited JSON events: finding them in a read buffer, bounded.

Both readers of watches use this — the proxy's hot path (:mod:`vwserver.proxy.watch`, which
filters each event straight out of the buffer through a memoryview) and the control loops'
client (:meth:`vwserver.k8s.client.KubeClient.watch`). Reads are appended to one ``bytearray``;
:func:`complete` says how much of it is whole lines (and refuses a line that grows past
:data:`MAX_EVENT_BYTES` without ending), :func:`lines` where each event in that part is. Nothing
is copied: callers slice the buffer (or a memoryview of it) and then drop the consumed part.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from vwserver.errors import EventTooLarge

MAX_EVENT_BYTES: Final = 4 * 2**20
"""etcd refuses values over 1.5 MiB by default and the apiserver requests over 3 MiB; an event adds
a little envelope. Anything longer is not a Kubernetes watch event."""


def complete(buffer: bytearray) -> int:
    """How many bytes at the start of ``buffer`` are complete lines (0: none yet).

    Raises :class:`~vwserver.errors.EventTooLarge` if the unfinished line after them is already
    longer than :data:`MAX_EVENT_BYTES`: reading on would only grow the buffer.
    """
    end = buffer.rfind(b"\n") + 1
    if len(buffer) - end > MAX_EVENT_BYTES:
        raise EventTooLarge(f"upstream watch event larger than {MAX_EVENT_BYTES} bytes")
    return end


def lines(buffer: bytearray, end: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of every event line in ``buffer[:end]`` (``end`` from :func:`complete`),
    ``stop`` just past its newline. Keep-alive lines (empty, or one byte such as ``\\r``) are
    no events and are skipped; they stay part of the consumed bytes."""
    start = 0
    while start < end:
        stop = buffer.find(b"\n", start, end) + 1
        if stop - start > 2:
            yield start, stop
        start = stop
