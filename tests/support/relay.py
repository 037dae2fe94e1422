"""A TCP relay between a client and a server that a test switches between the ways a network
fails: forwarding, refusing, stalling and cutting.

TCP level, so TLS passes through unchanged (the client still verifies the server's certificate;
the relay's port differs from the server's, the host does not). Used where a test needs a
server to go away without stopping it: the syncer's downstream cluster, a Lease server, kcp
behind vwserver (``tests/chaos``).

* :meth:`Relay.up` — forward (also resumes stalled connections: their bytes arrive late).
* :meth:`Relay.down` — refuse: a new connection is accepted and closed at once (the client
  sees a dropped connection, as when a server goes away), every open one is aborted.
* :meth:`Relay.stall` — accept, but move no byte in either direction (a black hole: a hung
  peer, a partition that drops packets); open connections freeze where they are.
* :meth:`Relay.cut` — abort every open connection, keep the mode (a reset, a NAT or load
  balancer dropping its state): clients reconnect at once.

Counters let a test wait for "the client retried N times" instead of for some seconds.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class Relay:
    """A TCP relay to ``127.0.0.1:<target>`` on its own port (``port``: that one, else any
    free one). Starts down unless ``forwarding``. :attr:`target` may be set after the relay
    started (a server that needs the relay's port to start, e.g. for its published URLs)."""

    def __init__(self, target: int, *, port: int = 0, forwarding: bool = False) -> None:
        self.target = target
        self.port = port
        self.forwarding = forwarding
        self.refused = 0
        """Connections refused while down (each one a retry of the client)."""
        self.accepted = 0
        """Connections accepted while forwarding or stalled."""
        self.cuts = 0
        """Open connections aborted by :meth:`down` and :meth:`cut`."""
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def stalled(self) -> bool:
        return not self._flowing.is_set()

    @property
    def open_connections(self) -> int:
        """Client connections being relayed now."""
        return len(self._open) // 2

    async def __aenter__(self) -> Relay:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port or 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()
        self._flowing.set()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def up(self) -> None:
        self.forwarding = True
        self._flowing.set()

    def down(self) -> None:
        self.forwarding = False
        self._flowing.set()  # nothing is left to flow: every connection is aborted
        self._abort_open()

    def stall(self) -> None:
        self.forwarding = True
        self._flowing.clear()

    def cut(self) -> None:
        self._abort_open()

    def _down(self) -> bool:
        return not self.forwarding

    def _abort_open(self) -> None:
        writers = list(self._open)
        self._open.clear()
        self.cuts += len(writers) // 2
        for writer in writers:
            writer.transport.abort()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.forwarding:
            self.refused += 1
            writer.transport.abort()
            return
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        if self._down():  # went down while this one was connecting
            self.refused += 1
            for w in (writer, up_writer):
                w.transport.abort()
            return
        self._open |= {writer, up_writer}
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._tasks.difference_update(pumps)
            for w in (writer, up_writer):
                self._open.discard(w)
                w.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self._flowing.wait()  # stalled: the bytes wait here (and in the kernel)
                if writer.transport.is_closing():
                    return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()
